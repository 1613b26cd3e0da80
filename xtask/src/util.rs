//! Small helpers shared by the xtask subcommands: paths, running commands,
//! looking up programs, signals.
use std::{
    env,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

/// Root of the workspace (the directory holding the top-level Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// Absolute path of the release `infertrace` binary.
pub fn infertrace_bin() -> PathBuf {
    target_dir().join("release").join("infertrace")
}

/// What an idempotent `cargo xtask setup` step reports when it has nothing
/// to do.
pub const ALREADY: &str = "ok (already present)";

/// Where setup step 5 puts NVIDIA's real libcudart.so.12
/// (tests/cudasim/fetch-cudart.sh's default); step 6 copies it into the
/// Debian root.
pub fn real_cudart_path() -> PathBuf {
    workspace_root().join("target/cuda-real/libcudart.so.12")
}

/// The cargo that runs us (set by `cargo run`), or `cargo` from PATH.
pub fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub fn home() -> Result<PathBuf> {
    env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set")
}

/// `$CARGO_HOME/bin`, i.e. where `cargo install` puts binaries.
pub fn cargo_bin_dir() -> Result<PathBuf> {
    Ok(match env::var_os("CARGO_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("bin"),
        _ => home()?.join(".cargo").join("bin"),
    })
}

/// Make sure `$CARGO_HOME/bin` is on PATH for us and our children (the eBPF
/// build finds `bpf-linker` through PATH). Call before spawning threads.
pub fn ensure_cargo_bin_on_path() {
    let Ok(bin) = cargo_bin_dir() else { return };
    let path = env::var_os("PATH").unwrap_or_default();
    if env::split_paths(&path).any(|p| p == bin) {
        return;
    }
    let mut dirs: Vec<PathBuf> = vec![bin];
    dirs.extend(env::split_paths(&path));
    if let Ok(joined) = env::join_paths(dirs) {
        env::set_var("PATH", joined);
    }
}

/// Finds an executable on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = env::var_os("PATH")?;
    env::split_paths(&path).map(|dir| dir.join(name)).find(|p| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Renders a command line for messages.
pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&shell_quote(arg));
    }
    s
}

fn shell_quote(arg: &OsStr) -> String {
    let a = arg.to_string_lossy();
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@%".contains(c))
    {
        a.into_owned()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// Runs a command with inherited stdio; fails if it does not exit with 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout; fails if it does not exit with 0.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!("`{line}` failed ({}): {}", out.status, stderr.trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like `output`, but any failure is `None` (for cheap probes).
pub fn probe(cmd: &mut Command) -> Option<String> {
    cmd.stderr(Stdio::null());
    output(cmd).ok()
}

extern "C" {
    fn geteuid() -> u32;
    fn kill(pid: i32, sig: i32) -> i32;
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}

pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// Sends a signal to a process; errors are ignored (it may have exited).
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) only takes plain integers.
    unsafe {
        kill(pid as i32, sig);
    }
}

/// True when the environment says we run under CI.
pub fn in_ci() -> bool {
    matches!(env::var("CI").as_deref(), Ok(v) if !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The real interpreter behind `python3` on PATH (resolves pyenv shims, so
/// the pid we spawn is the Python process itself).
pub fn python3() -> Result<PathBuf> {
    let out = output(Command::new("python3").args(["-c", "import sys; print(sys.executable)"]))
        .context("python3 is needed (is it on PATH?)")?;
    let exe = PathBuf::from(out.trim());
    if exe.as_os_str().is_empty() {
        bail!("python3 did not report sys.executable");
    }
    Ok(exe)
}

/// A `kB` field of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field))?.split_whitespace().next()?.parse().ok()
}

/// The infertrace binary to trace with, built first when `build`; refused
/// unless we are root (`what` names the task in the message) or the
/// binary is missing.
pub fn tracer_for(what: &str, build: bool) -> Result<PathBuf> {
    if build {
        crate::tasks::build()?;
    }
    if !is_root() {
        bail!("{what} traces processes: run it as root");
    }
    let bin = infertrace_bin();
    if !bin.is_file() {
        bail!("{} does not exist (run `cargo xtask build`)", bin.display());
    }
    Ok(bin)
}
