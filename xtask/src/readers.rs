//! `cargo xtask setup`, the profile readers the format tests use as
//! independent oracles (tests/tests/profile_formats.rs): the `perfetto`,
//! `protobuf` and `jsonschema` PyPI packages (Perfetto trace classes; the
//! speedscope schema's validator) and the `speedscope` npm package (its
//! file-format schema). `go tool pprof` comes from Debian's `golang-go`
//! (in `setup::APT_PACKAGES`). Also `onnxruntime`, `onnx` and `numpy` for
//! the native worker pool test (tests/tests/verdict_pools.rs), and
//! `cupy-cuda12x` (tests/tests/cuda_static.rs), `memray` (a peer of the
//! memory family, tests/tests/memory.rs) and `torch` (its allocator's USDT
//! probes, tests/tests/torch_allocator.rs). Each is installed only when
//! missing.
use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{probe, run, which, ALREADY};

const PY_MODULES: &[(&str, &str)] = &[
    (
        "perfetto",
        "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    ),
    ("protobuf", "google.protobuf"),
    ("jsonschema", "jsonschema"),
    // The onnxruntime service of tests/tests/verdict_pools.rs (native worker pools).
    ("onnxruntime", "onnxruntime"),
    ("onnx", "onnx"),
    ("numpy", "numpy"),
    // Real CuPy, whose extension modules link the CUDA runtime statically
    // (tests/tests/cuda_static.rs; runs without a GPU: its calls fail).
    ("cupy-cuda12x", "cupy"),
    // A peer for resident growth by line (tests/tests/memory.rs).
    ("memray", "memray"),
    // Real PyTorch (the PyPI wheel, CUDA build; runs on CPU here): its
    // libc10_cuda.so carries the USDT probes pytorch:malloc/free
    // (tests/tests/torch_allocator.rs).
    ("torch", "torch"),
];

fn py_importable(module: &str) -> bool {
    probe(Command::new("python3").args(["-c", &format!("import {module}")])).is_some()
}

fn speedscope_schema_present() -> bool {
    let Some(root) = probe(Command::new("npm").args(["root", "-g"])) else {
        return false;
    };
    std::path::Path::new(root.trim())
        .join("speedscope/dist/release/file-format-schema.json")
        .is_file()
}

pub fn readers() -> Result<String> {
    let mut done = Vec::new();
    let missing: Vec<&str> = PY_MODULES
        .iter()
        .filter(|(_, m)| !py_importable(m))
        .map(|(p, _)| *p)
        .collect();
    if !missing.is_empty() {
        let pip = || {
            let mut c = Command::new("python3");
            c.args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&missing)
            .env("PIP_ROOT_USER_ACTION", "ignore");
            c
        };
        if run(&mut pip()).is_err() {
            // Debian's system Python is "externally managed" (PEP 668).
            run(pip().arg("--break-system-packages"))?;
        }
        done.push(format!("pip {}", missing.join(" ")));
    }
    if !speedscope_schema_present() {
        if which("npm").is_none() {
            bail!("npm is not on PATH (Debian: apt-get install npm)");
        }
        run(Command::new("npm").args(["install", "-g", "--silent", "speedscope"]))?;
        done.push("npm speedscope".to_owned());
    }
    Ok(if done.is_empty() {
        ALREADY.to_owned()
    } else {
        format!("installed {}", done.join(", "))
    })
}
