//! Tensors by line from PyTorch's caching allocator (issue 25, part 5):
//! its USDT probes `pytorch:malloc(ptr, device, size, stream)` and
//! `pytorch:free(ptr)` in `libc10_cuda.so`, attached with their semaphores
//! (the kernel's reference counters), their arguments read where the SDT
//! notes say.
//!
//! - On a stand-in with the same probes (tests/cudasim/torchsim.c, named
//!   libc10_cuda.so; NOT PyTorch: sys/sdt.h, Debian's systemtap-sdt-dev):
//!   exact tensor bytes held per line at the end and at most, the
//!   process's allocated bytes and peak, the calls counted at their lines,
//!   and the probes on before the library is loaded (found on
//!   `LD_LIBRARY_PATH`): its semaphores are raised when it is mapped.
//! - On the REAL torch wheel (installed by `cargo xtask setup`; no GPU
//!   needed): a process that imports torch has every `pytorch:malloc` and
//!   `pytorch:free` site of its libc10_cuda.so probed: `readelf -n` (the
//!   oracle) gives the sites and their semaphores' addresses, and the
//!   process sees those semaphores raised while the recording runs.
//!
//! Under CI=true a missing prerequisite (root, the binary, gcc, sys/sdt.h,
//! readelf, torch) fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

fn result_of(path: &Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}: {s}", path.display()))
}

/// `record -q --format json -o DIR/rec.itr -- PYTHON SCRIPT ARGS` with `env`.
fn record(dir: &TempDir, python: &Path, script: &str, args: &[String], env: &[(&str, &Path)]) -> Run {
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(dir.join("rec.itr")).arg("--").arg(python).arg(workspace_root().join("tests/workloads").join(script)).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = run_cmd(&mut cmd, Duration::from_secs(240));
    run.assert_ok();
    run
}

/// `torch_alloc.py ARGS` recorded on a private copy of the stand-in (other
/// tests' probes stay off it), found on `LD_LIBRARY_PATH` by the
/// collector's search before the workload loads it: the run, what the
/// workload measured, the directory (with `rec.itr`). None when a
/// prerequisite is missing ([`skip`]).
fn record_on_standin(test: &str, args: &[String]) -> Option<(Run, Value, TempDir)> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    if !Path::new("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists() && !Path::new("/usr/include/sys/sdt.h").exists() {
        skip(test, "sys/sdt.h (Debian: systemtap-sdt-dev; cargo xtask setup)");
        return None;
    }
    let sim = cuda_standin_dir(test)?;
    let python = python3_executable(test)?;
    let dir = TempDir::new("torch-usdt");
    let libdir = dir.join("torch");
    std::fs::create_dir_all(&libdir).unwrap();
    let lib = libdir.join("libc10_cuda.so");
    std::fs::copy(sim.join("torch/libc10_cuda.so"), &lib).unwrap_or_else(|e| panic!("copying the stand-in: {e}"));
    let result = dir.join("result.json");
    let run = record(&dir, &python, "torch_alloc.py", args, &[("TORCHSIM", &lib), ("LD_LIBRARY_PATH", &libdir), ("RESULT", &result)]);
    let measured = result_of(&result);
    Some((run, measured, dir))
}

#[test]
fn tensors_held_by_line_from_the_allocators_usdt_probes() {
    let test = "tensors_held_by_line_from_the_allocators_usdt_probes";
    let Some((run, measured, dir)) = record_on_standin(test, &[]) else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/torch_alloc.py"));
    // Probed before it was loaded: both semaphores up from the start.
    assert_eq!(measured["semaphores_at_load"].as_u64(), Some((1 << 16) | 1), "{measured}\n{}", run.describe());
    let libs: Vec<&Value> = cuda["libraries"].as_array().into_iter().flatten().filter(|l| l["path"].as_str().is_some_and(|p| p.ends_with("libc10_cuda.so"))).collect();
    assert_eq!(libs.len(), 1, "{:#}", cuda["libraries"]);
    assert_eq!(libs[0]["functions"], serde_json::json!(["pytorch:malloc", "pytorch:free"]), "{}", libs[0]);
    // The calls at their lines.
    const MIB: u64 = 1 << 20;
    for (marker, api, n, bytes) in [
        ("keep", "pytorch:malloc", 10, 10 * MIB),
        ("churn", "pytorch:malloc", 5, 20 * MIB),
        ("churn_free", "pytorch:free", 3, 0),
        ("transient", "pytorch:malloc", 100, 100 * 64 * 1024),
    ] {
        let r = call_row(cuda, &m, marker, api);
        assert_eq!((u(&r["count"]), u(&r["bytes"]), r["class"].as_str()), (n, bytes, Some("memory")), "@{marker}: {r}");
    }
    // Tensors held by line, at the end and at most; the process's
    // allocated bytes and peak (10 + 20 MiB before the 3 frees).
    let dm = cuda["device_memory"].as_array().and_then(|a| a.iter().find(|d| d["allocated_bytes"].is_u64()).cloned()).unwrap_or_else(|| panic!("no allocated_bytes: {:#}", cuda["device_memory"]));
    assert_eq!((u(&dm["allocated_bytes"]), u(&dm["peak_allocated_bytes"])), (18 * MIB, 30 * MIB), "{dm:#}");
    let held: BTreeMap<u64, (u64, u64, u64, u64)> = dm["tensor_lines"]
        .as_array()
        .expect("tensor_lines")
        .iter()
        .map(|l| (u(&l["site"]["line"]), (u(&l["held_bytes"]), u(&l["peak_held_bytes"]), u(&l["allocs"]), u(&l["frees"]))))
        .collect();
    let want: BTreeMap<u64, (u64, u64, u64, u64)> =
        [(m["keep"], (10 * MIB, 10 * MIB, 10, 0)), (m["churn"], (8 * MIB, 20 * MIB, 5, 3)), (m["transient"], (0, 64 * 1024, 100, 100))].into_iter().collect();
    assert_eq!(held, want, "{dm:#}");
    // The allocator reserved nothing from a device here (no cudaMalloc).
    assert_eq!(u(&dm["held_bytes"]), 0, "{dm:#}");
    let shown = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into_os_string()]);
    shown.assert_ok();
    assert!(shown.stdout.contains("GPU memory in tensors by line"), "{}", shown.stdout);
}

#[test]
fn steady_tensor_growth_is_a_finding_at_its_line() {
    let test = "steady_tensor_growth_is_a_finding_at_its_line";
    let Some((run, measured, _dir)) = record_on_standin(test, &["leak".to_owned()]) else { return };
    let report = run.json();
    let m = markers_of(&workspace_root().join("tests/workloads/torch_alloc.py"));
    let rate = measured["leak_bytes"].as_f64().unwrap_or(0.0) / measured["leak_s"].as_f64().unwrap_or(1.0);
    let found: Vec<&Value> = report.0["findings"].as_array().into_iter().flatten().filter(|f| f["kind"] == "gpu_memory_growth").collect();
    assert_eq!(found.len(), 1, "{:#}\n{measured}", report.0["findings"]);
    let f = found[0];
    assert_eq!((f["site"]["line"].as_u64(), u(&f["count"])), (Some(m["leak"]), u(&measured["leak_allocs"])), "{f}");
    let per_s = f["per_s"].as_f64().unwrap_or(0.0);
    assert!((per_s - rate).abs() <= 0.1 * rate, "slope {per_s:.0} B/s, the workload's own {rate:.0} B/s: {f}");
    assert_eq!(u(&f["bytes"]), u(&measured["leak_bytes"]) - 4 * (1 << 20), "grown from the first block to the last: {f}");
    eprintln!("{test}: slope {:.1} MiB/s, the workload's {:.1} MiB/s", per_s / 1048576.0, rate / 1048576.0);
}

/// `readelf -n FILE`: the (name, semaphore address) of each `pytorch` probe site.
fn readelf_pytorch_sites(file: &Path) -> Result<Vec<(String, u64)>, String> {
    let o = Command::new("readelf").arg("-n").arg(file).output().map_err(|e| format!("readelf: {e}"))?;
    if !o.status.success() {
        return Err(format!("readelf -n {}: {}", file.display(), String::from_utf8_lossy(&o.stderr)));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut provider = String::new();
    let mut name = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("Provider: ") {
            provider = p.to_owned();
        } else if let Some(n) = line.strip_prefix("Name: ") {
            name = n.to_owned();
        } else if let Some(sem) = line.split("Semaphore: ").nth(1) {
            if provider == "pytorch" {
                let addr = u64::from_str_radix(sem.trim().trim_start_matches("0x"), 16).map_err(|e| format!("{line}: {e}"))?;
                out.push((name.clone(), addr));
            }
        }
    }
    Ok(out)
}

/// The libc10_cuda.so of the torch `python` imports.
fn torch_allocator_lib(test: &str, python: &Path) -> Option<PathBuf> {
    let o = Command::new(python)
        .args(["-c", "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libc10_cuda.so'))"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(o) = o else {
        skip(test, &format!("PyTorch (the torch wheel) for {} (cargo xtask setup)", python.display()));
        return None;
    };
    let lib = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    if !lib.is_file() {
        skip(test, &format!("{} (a torch build without CUDA?)", lib.display()));
        return None;
    }
    Some(lib)
}

#[test]
fn real_torch_allocator_probes_found_and_switched_on() {
    let test = "real_torch_allocator_probes_found_and_switched_on";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let Some(lib) = torch_allocator_lib(test, &python) else { return };
    let sites = match readelf_pytorch_sites(&lib) {
        Ok(s) => s,
        Err(e) => {
            skip(test, &format!("readelf (binutils): {e}"));
            return;
        }
    };
    let count = |n: &str| sites.iter().filter(|(name, _)| name == n).count();
    assert!(count("malloc") >= 1 && count("free") >= 1, "{}: no pytorch:malloc/free notes: {sites:?}", lib.display());
    let mut semaphores: Vec<u64> = sites.iter().map(|(_, a)| *a).filter(|a| *a != 0).collect();
    semaphores.sort_unstable();
    semaphores.dedup();
    let dir = TempDir::new("torch-real");
    let result = dir.join("result.json");
    let args: Vec<String> = semaphores.iter().map(|a| format!("{a:x}")).collect();
    let run = record(&dir, &python, "torch_usdt.py", &args, &[("RESULT", &result)]);
    let measured = result_of(&result);
    // Raised in the process by the kernel, for the probes' reference counters.
    let later: Vec<u64> = measured["later"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    assert!(later.len() == semaphores.len() && later.iter().all(|v| *v >= 1), "semaphores {semaphores:x?}: {measured}\n{}", run.describe());
    let report = run.json();
    let note = format!("USDT pytorch:malloc ({} sites) and pytorch:free ({} sites) probed", count("malloc"), count("free"));
    let notes = report.0["cuda"]["notes"].to_string();
    assert!(notes.contains(&note), "expected the note {note:?} in the CUDA notes {notes}");
    let libs = &report.0["cuda"]["libraries"];
    let ours: Vec<&Value> = libs.as_array().into_iter().flatten().filter(|l| l["path"].as_str().is_some_and(|p| p.ends_with("/libc10_cuda.so"))).collect();
    assert_eq!(ours.len(), 1, "{libs:#}");
    assert_eq!(ours[0]["functions"], serde_json::json!(["pytorch:malloc", "pytorch:free"]));
    eprintln!("{test}: torch {}: {} malloc and {} free sites, semaphores {:?} after import, {later:?} later", measured["torch"], count("malloc"), count("free"), measured["after_import"]);
}
