//! `cargo xtask setup`: everything a fresh Debian 12 machine needs to build
//! and test infertrace. Every step checks first and does nothing when the
//! thing is already there, so a second run takes a second or two.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::util::{self, output, probe, real_cudart_path, run, ALREADY};

/// Debian packages used by the tests and the benchmark. libc6-dev is only a
/// Recommends of gcc, but the test workloads are linked with `gcc -static`.
pub const APT_PACKAGES: &[&str] = &[
    "strace",
    "bpftool",
    "bpftrace",
    "jq",
    "linux-perf",
    "gcc",
    "libc6-dev",
    "make",
    "util-linux",
    "debootstrap",
    // `sys/sdt.h`: the stand-in of PyTorch's allocator with the same USDT
    // probes (tests/cudasim/torchsim.c, tests/tests/torch_allocator.rs).
    "systemtap-sdt-dev",
    // `infertrace top` runs in a tmux pane in its end-to-end test (tests/tests/top.rs).
    "tmux",
    // go tool pprof: reads the pprof output in tests/tests/profile_formats.rs.
    "golang-go",
    // infertrace agent: a real Prometheus scrapes it, and it traces a
    // podman container (runc: crun refuses hybrid cgroups) in the tests.
    "prometheus",
    "podman",
    "runc",
    // `report --format html` is opened in headless Chromium (tests/tests/html.rs).
    "chromium",
];

/// Where the LLVM prefix for bpf-linker lives (it must outlive the build:
/// bpf-linker keeps an rpath to it).
const PREFIX_DIR: &str = ".local/share/infertrace";

pub fn setup() -> Result<()> {
    let started = Instant::now();
    setup_toolchain()?;
    step("3/8", "Debian packages", apt_packages)?;
    step("4/8", "py-spy (Python fixtures)", py_spy)?;
    step(
        "5/8",
        "real libcudart.so.12 from PyPI (CUDA probe tests)",
        real_cudart,
    )?;
    // After step 5: the root gets a copy of that libcudart.
    step(
        "6/8",
        "Debian sid root with python3.14 and python3.15 (tests)",
        crate::pyroot::pyroot,
    )?;
    // After step 6: the image is imported from that root.
    step(
        "7/8",
        "podman image for the agent's container test",
        crate::podman::agent_image,
    )?;
    step(
        "8/8",
        "profile readers (perfetto, jsonschema, speedscope)",
        crate::readers::readers,
    )?;
    println!("setup: done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Steps 1 and 2: what building needs (no test fixture).
pub fn setup_toolchain() -> Result<()> {
    step("1/8", "nightly toolchain with rust-src", rust_src)?;
    step(
        "2/8",
        "bpf-linker (built against the nightly's LLVM)",
        bpf_linker,
    )
}

fn step(num: &str, what: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    let t = Instant::now();
    let msg = f().with_context(|| format!("setup step {num} ({what}) failed"))?;
    let secs = t.elapsed().as_secs_f64();
    if secs >= 1.0 {
        println!("setup [{num}] {what}: {msg} ({secs:.0}s)");
    } else {
        println!("setup [{num}] {what}: {msg}");
    }
    Ok(())
}

fn rustup() -> Command {
    Command::new("rustup")
}

// ---------------------------------------------------------------- step 1

fn rust_src() -> Result<String> {
    if util::which("rustup").is_none() {
        bail!("rustup is not on PATH; install it from https://rustup.rs first");
    }
    let toolchains = output(rustup().args(["toolchain", "list"]))?;
    let has_nightly = toolchains
        .lines()
        .any(|l| l.starts_with("nightly-") || l.starts_with("nightly "));
    if !has_nightly {
        // RUSTUP_AUTO_INSTALL=0 on these machines: install explicitly.
        run(rustup().args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
        return Ok("installed the nightly toolchain with rust-src".into());
    }
    let installed =
        output(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if installed
        .lines()
        .any(|l| l.split_whitespace().next() == Some("rust-src"))
    {
        return Ok(ALREADY.into());
    }
    run(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    Ok("installed rust-src for nightly".into())
}

// ---------------------------------------------------------------- step 2

struct NightlyLlvm {
    /// LLVM major version of the nightly, e.g. 22.
    major: u32,
    /// The real shared library in the nightly sysroot, e.g.
    /// `libLLVM.so.22.1-rust-1.97.0-nightly`.
    lib_name: String,
    lib_path: PathBuf,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let version = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .map(str::trim)
        .context("`rustc +nightly -vV` printed no `LLVM version:` line")?;
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("cannot parse LLVM version {version:?}"))?;
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    // `libLLVM.so.<ver>-rust-...` is the real library; the
    // `libLLVM-<major>-rust-....so` next to it is a linker script.
    let mut candidates: Vec<String> = fs::read_dir(&libdir)
        .with_context(|| format!("reading {}", libdir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_type().map(|t| t.is_symlink()).unwrap_or(true))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("libLLVM.so."))
        .collect();
    candidates.sort();
    let lib_name = candidates
        .pop()
        .with_context(|| format!("no libLLVM.so.* in {}", libdir.display()))?;
    let lib_path = libdir.join(&lib_name);
    Ok(NightlyLlvm {
        major,
        lib_name,
        lib_path,
    })
}

/// The libLLVM a dynamically linked bpf-linker loads, from `ldd`.
/// None when it is statically linked or ldd is unavailable.
fn linked_llvm(bin: &Path) -> Option<(String, bool)> {
    let out = probe(Command::new("ldd").arg(bin))?;
    out.lines().find_map(|l| {
        let l = l.trim();
        let name = l.split_whitespace().next()?;
        name.starts_with("libLLVM")
            .then(|| (name.to_string(), !l.contains("not found")))
    })
}

fn bpf_linker() -> Result<String> {
    let llvm = nightly_llvm()?;
    let bin = util::which("bpf-linker").unwrap_or_else(|| {
        util::cargo_bin_dir()
            .map(|d| d.join("bpf-linker"))
            .unwrap_or_default()
    });
    let reason = if !bin.is_file() {
        "not installed".to_string()
    } else {
        match probe(Command::new(&bin).arg("--version")) {
            None => format!("{} does not run", bin.display()),
            Some(version) => match linked_llvm(&bin) {
                Some((lib, _)) if lib != llvm.lib_name => {
                    format!(
                        "{} is linked to {lib}, the nightly ships {}",
                        bin.display(),
                        llvm.lib_name
                    )
                }
                _ => return Ok(format!("{ALREADY}: {}", version.trim())),
            },
        }
    };

    // Build it against the nightly's own libLLVM.
    let prefix = util::home()?
        .join(PREFIX_DIR)
        .join(format!("llvm-{}", llvm.major));
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    // Drop links left by an older nightly, then link the current one.
    for entry in fs::read_dir(&lib)?.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("libLLVM") {
            let p = entry.path();
            fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    for name in ["libLLVM.so", llvm.lib_name.as_str()] {
        let link = lib.join(name);
        std::os::unix::fs::symlink(&llvm.lib_path, &link).with_context(|| {
            format!("linking {} -> {}", link.display(), llvm.lib_path.display())
        })?;
    }
    println!(
        "setup [2/8] bpf-linker: {reason}; building it against {} (about 2 minutes)",
        llvm.lib_path.display()
    );
    run(util::cargo()
        .args([
            "install",
            "bpf-linker",
            "--version",
            "~0.13",
            "--force",
            "--no-default-features",
        ])
        .args(["--features", &format!("llvm-{}", llvm.major)])
        .env("LLVM_PREFIX", &prefix))
    .context("cargo install bpf-linker failed")?;
    let version = probe(Command::new("bpf-linker").arg("--version"))
        .context("bpf-linker was installed but `bpf-linker --version` fails")?;
    Ok(format!(
        "installed {} (LLVM prefix {})",
        version.trim(),
        prefix.display()
    ))
}

// ---------------------------------------------------------------- step 3

fn dpkg_installed(pkg: &str) -> bool {
    probe(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .map(|s| s.trim() == "install ok installed")
        .unwrap_or(false)
}

fn apt_packages() -> Result<String> {
    if util::which("dpkg-query").is_none() || util::which("apt-get").is_none() {
        return Ok(format!(
            "skipped: not a Debian system; install these yourself: {}",
            APT_PACKAGES.join(" ")
        ));
    }
    let mut missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    // Installing py-spy needs pip; Debian's python3 comes without it.
    if !py_spy_installed() && !pip_available() {
        missing.push("python3-pip");
    }
    if missing.is_empty() {
        return Ok(ALREADY.into());
    }
    if !util::is_root() {
        eprintln!(
            "WARNING: missing Debian packages: {0}\n         run as root: apt-get install -y {0}",
            missing.join(" ")
        );
        return Ok(format!(
            "MISSING {} (not root, not installed)",
            missing.join(" ")
        ));
    }
    let apt = || {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run(apt().args(["update", "-q"]))?;
    run(apt()
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing))?;
    Ok(format!("installed {}", missing.join(" ")))
}

// ---------------------------------------------------------------- step 4

fn py_spy_version() -> Option<String> {
    probe(Command::new("python3").args([
        "-c",
        "import importlib.metadata as m; print(m.version('py-spy'))",
    ]))
    .map(|s| s.trim().to_string())
}

fn py_spy_installed() -> bool {
    py_spy_version().is_some()
}

fn pip_available() -> bool {
    probe(Command::new("python3").args(["-m", "pip", "--version"])).is_some()
}

fn py_spy() -> Result<String> {
    if util::which("python3").is_none() {
        bail!("python3 is not on PATH");
    }
    if let Some(v) = py_spy_version() {
        return Ok(format!("{ALREADY}: py-spy {v}"));
    }
    if !pip_available() {
        bail!("`python3 -m pip` is not available (Debian: apt-get install python3-pip)");
    }
    let pip = || {
        let mut c = Command::new("python3");
        c.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "py-spy",
        ])
        .env("PIP_ROOT_USER_ACTION", "ignore");
        c
    };
    if run(&mut pip()).is_err() {
        // Debian's system Python is "externally managed" (PEP 668).
        println!("setup [4/8] pip refused; retrying with --break-system-packages");
        run(pip().arg("--break-system-packages"))?;
    }
    if util::which("pyenv").is_some() {
        // Make the new `py-spy` script visible through pyenv's shims.
        let _ = probe(Command::new("pyenv").arg("rehash"));
    }
    let v = py_spy_version().context("pip succeeded but py-spy is not importable metadata-wise")?;
    Ok(format!("installed py-spy {v}"))
}

/// NVIDIA's real libcudart.so.12 (nvidia-cuda-runtime-cu12 wheel) into
/// [`real_cudart_path`], for the CUDA probe tests; idempotent.
fn real_cudart() -> Result<String> {
    let root = crate::util::workspace_root();
    let lib = real_cudart_path();
    if lib.exists() {
        return Ok(ALREADY.to_owned());
    }
    let status = Command::new("sh")
        .arg(root.join("tests/cudasim/fetch-cudart.sh"))
        .current_dir(&root)
        .status()
        .context("running tests/cudasim/fetch-cudart.sh")?;
    if !status.success() || !lib.exists() {
        bail!(
            "tests/cudasim/fetch-cudart.sh failed ({status}); it needs `python3 -m pip` and PyPI"
        );
    }
    Ok(format!("fetched into {}", lib.display()))
}
