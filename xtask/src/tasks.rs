//! `cargo xtask build | demo | test`.
use std::{ffi::OsString, fs};

use anyhow::{bail, Context as _, Result};

use crate::{
    setup,
    util::{self, run},
};

/// Builds `target/release/infertrace` (the eBPF programs are compiled by
/// tracer-user/build.rs with the nightly toolchain and bpf-linker).
pub fn build() -> Result<()> {
    setup::setup()?;
    build_only()
}

/// The toolchain steps of setup only, then the build (deploy/Dockerfile).
pub fn build_toolchain_only() -> Result<()> {
    setup::setup_toolchain()?;
    build_only()
}

fn build_only() -> Result<()> {
    println!("build: cargo build --release -p tracer-user");
    run(util::cargo().current_dir(util::workspace_root()).args([
        "build",
        "--release",
        "-p",
        "tracer-user",
    ]))
    .context("building infertrace failed")?;
    let bin = util::infertrace_bin();
    if !bin.is_file() {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    println!("build: {}", bin.display());
    Ok(())
}

/// Records the built-in demo workload and prints infertrace's report.
pub fn demo() -> Result<()> {
    build()?;
    let root = util::workspace_root();
    let workload = root.join("tests/workloads/demo.py");
    if !workload.is_file() {
        bail!("{} is missing", workload.display());
    }
    if !util::is_root() {
        eprintln!(
            "WARNING: infertrace needs root (or CAP_BPF + CAP_PERFMON); the demo will likely fail"
        );
    }
    let out_dir = util::target_dir().join("demo");
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let recording = out_dir.join("demo.itr");
    // The GPU part of the demo runs on tests/cudasim, a timing SIMULATOR
    // with libcudart's soname (no GPU here), built into the demo's own dir.
    let cudasim = out_dir.join("cudasim");
    run(std::process::Command::new("sh")
        .arg(root.join("tests/cudasim/build.sh"))
        .arg(&cudasim))
    .context("building the CUDA simulator for the demo (needs gcc)")?;
    let python = util::python3()?;
    println!(
        "demo: infertrace record -o {} -- {} {}",
        recording.display(),
        python.display(),
        workload.display()
    );
    run(std::process::Command::new(util::infertrace_bin())
        .current_dir(&root)
        .env("CUDART", cudasim.join("libcudart.so.12"))
        .arg("record")
        .arg("-o")
        .arg(&recording)
        .arg("--")
        .arg(&python)
        .arg(&workload))
    .context("infertrace failed on the demo workload")?;
    println!("demo: recording kept at {}", recording.display());
    println!(
        "demo: render it again with `{} report {}`",
        util::infertrace_bin().display(),
        recording.display()
    );
    Ok(())
}

pub struct TestArgs {
    pub unit: bool,
    pub e2e: bool,
    /// Passed to the test binaries of both `cargo test` runs.
    pub harness_args: Vec<OsString>,
}

/// Unit tests, then the end-to-end tests (which need root).
pub fn test(args: TestArgs) -> Result<()> {
    let root = util::workspace_root();
    if args.e2e && !util::is_root() {
        if util::in_ci() {
            bail!(
                "the end-to-end tests load eBPF programs and need root: run `cargo xtask test` (or .ci/run) as root"
            );
        }
        eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
        eprintln!("!! WARNING: not running as root. The end-to-end tests load eBPF programs   !!");
        eprintln!("!! and will fail. Run `sudo -E cargo xtask test` (or as root) instead.     !!");
        eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
    }
    build()?;
    let mut failures = Vec::new();
    if args.unit {
        println!("test: unit tests (tracer-common, tracer-user)");
        let r = run(util::cargo()
            .current_dir(&root)
            .args([
                "test",
                "--release",
                // Every test binary runs: a failure in one does not hide another's.
                "--no-fail-fast",
                "-p",
                "tracer-common",
                "-p",
                "tracer-user",
                "--",
            ])
            .args(&args.harness_args));
        if let Err(e) = r {
            eprintln!("test: unit tests FAILED: {e:#}");
            failures.push("unit tests");
        }
    }
    if args.e2e {
        let bin = util::infertrace_bin();
        println!(
            "test: end-to-end tests (infertrace-e2e, INFERTRACE_BIN={})",
            bin.display()
        );
        let r = run(util::cargo()
            .current_dir(&root)
            .env("INFERTRACE_BIN", &bin)
            .args([
                "test",
                "--release",
                "--no-fail-fast",
                "-p",
                "infertrace-e2e",
                "--",
                "--test-threads=1",
            ])
            .args(&args.harness_args));
        if let Err(e) = r {
            eprintln!("test: end-to-end tests FAILED: {e:#}");
            failures.push("end-to-end tests");
        }
    }
    if !failures.is_empty() {
        bail!("{} failed", failures.join(" and "));
    }
    println!("test: all passed");
    Ok(())
}
