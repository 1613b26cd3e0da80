//! Prerequisites: what a test needs from the machine, and the one way to
//! skip when something is missing ([`skip`]: a failure under `CI=true`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::bin;

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Effective uid 0.
    Root,
    /// The infertrace binary exists.
    Binary,
    Gcc,
    Strace,
    Bpftool,
    Setpriv,
    /// util-linux's `unshare` (new PID and mount namespaces).
    Unshare,
    /// Debian's `chromium` (headless: the HTML report opened in a real browser).
    Chromium,
}

/// Every executable named `prog` on PATH, in PATH order (as found, not
/// resolved).
pub fn which_all(prog: &str) -> Vec<PathBuf> {
    let Some(path) = std::env::var_os("PATH") else {
        return Vec::new();
    };
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .filter(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .collect()
}

/// The executable `prog` the shell would run (the first on PATH).
pub fn which(prog: &str) -> Option<PathBuf> {
    which_all(prog).into_iter().next()
}

/// An executable `prog` on PATH.
pub fn in_path(prog: &str) -> bool {
    which(prog).is_some()
}

fn missing(need: Need) -> Option<String> {
    match need {
        Need::Root => (unsafe { libc::geteuid() } != 0).then(|| "root (euid 0)".to_string()),
        Need::Binary => {
            let b = bin();
            (!b.is_file()).then(|| {
                format!(
                    "infertrace binary {} (build it or set INFERTRACE_BIN)",
                    b.display()
                )
            })
        }
        Need::Gcc => (!in_path("gcc")).then(|| "gcc".to_string()),
        Need::Strace => (!in_path("strace")).then(|| "strace".to_string()),
        Need::Bpftool => (!in_path("bpftool")).then(|| "bpftool".to_string()),
        Need::Setpriv => (!in_path("setpriv")).then(|| "setpriv".to_string()),
        Need::Unshare => (!in_path("unshare")).then(|| "unshare (util-linux)".to_string()),
        Need::Chromium => (!in_path("chromium")).then(|| "chromium (Debian; `cargo xtask setup` installs it)".to_string()),
    }
}

/// Checks the prerequisites of `test`. Returns true when all are present.
/// When some are missing: panics under `CI=true` (a CI run must not pass by
/// skipping), otherwise prints `SKIPPED <test>: <missing>` to stderr and
/// returns false, and the test returns early.
pub fn require(test: &str, needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter_map(|n| missing(*n)).collect();
    if missing.is_empty() {
        return true;
    }
    skip(test, &missing.join(", "));
    false
}

/// A prerequisite of `test` is missing: panics under `CI=true` (a CI run
/// must not pass by skipping), else prints `SKIPPED <test>: <what>`.
pub fn skip(test: &str, what: &str) {
    if ci() {
        panic!("{test}: missing prerequisite(s) under CI=true: {what}");
    }
    // Written to fd 2 directly, not through eprintln!, so that libtest's
    // output capture cannot hide the skip.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {what}");
}

/// Some of the variants `test` runs on are missing (interpreters, say),
/// named in `missing`: under `CI=true` that is a [`skip`] (a failure naming
/// them all) and this returns false; otherwise it prints
/// `note: <test>: <what> not found, not tested` for each one and returns
/// true (the test goes on with what is there). Nothing missing: true.
pub fn skip_some(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    if ci() {
        skip(test, &missing.join(", "));
        return false;
    }
    use std::io::Write;
    for m in missing {
        let _ = writeln!(std::io::stderr(), "note: {test}: {m} not found, not tested");
    }
    true
}

/// Whether this is a CI run (`CI=true`), where nothing may be skipped.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `require!(needs...)`: returns from the calling test when a prerequisite is
/// missing (after printing SKIPPED, or panics under CI=true).
#[macro_export]
macro_rules! require {
    ($name:expr, $($need:ident),+ $(,)?) => {
        if !$crate::require($name, &[$($crate::Need::$need),+]) {
            return;
        }
    };
}
