//! The CPython interpreters the tests run on, found through pyenv (its root
//! from `$PYENV_ROOT`, `pyenv root` or `~/.pyenv`) and PATH: no installation
//! path is assumed; and Debian sid's 3.14 and 3.15 in a chroot
//! ([`crate::pyroot`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::pyroot::{chroot_python, pyroot, pyroot_display, PYROOT_MINORS};
use crate::which_all;

/// A CPython the tests expect on this machine.
#[derive(Clone, Debug)]
pub struct PythonExe {
    /// How failure messages name it (`pyenv 3.12`, `system python3.11 (/usr/bin/python3.11)`).
    pub label: String,
    /// What to run: the interpreter, or for a chroot one the wrapper that
    /// becomes it (same pid, same arguments; see [`crate::pyroot`]).
    pub exe: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// The root directory the interpreter runs in (its /proc/PID/root),
    /// when not the host's: paths it opens are under it, and only what
    /// [`crate::pyroot`] binds in is shared with the host.
    pub root: Option<PathBuf>,
}

/// pyenv's root: `$PYENV_ROOT`, else what `pyenv root` prints (pyenv on
/// PATH), else `~/.pyenv` when it exists. `None`: no pyenv here.
pub fn pyenv_root() -> Option<PathBuf> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        if let Some(p) = std::env::var_os("PYENV_ROOT").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let from_pyenv = Command::new("pyenv")
            .arg("root")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .filter(|p| p.is_dir());
        from_pyenv.or_else(|| {
            let home = PathBuf::from(std::env::var_os("HOME")?).join(".pyenv");
            home.is_dir().then_some(home)
        })
    })
    .clone()
}

/// The newest pyenv build of `major.minor` (its `pythonX.Y`, `pythonX` or
/// `python`).
pub fn pyenv_python(major: u32, minor: u32) -> Option<PathBuf> {
    let dir = pyenv_root()?.join("versions");
    let prefix = format!("{major}.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let micro: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let bin = dir.join(&name).join("bin");
            let exe = [
                bin.join(format!("python{major}.{minor}")),
                bin.join(format!("python{major}")),
                bin.join("python"),
            ]
            .into_iter()
            .find(|p| p.is_file())?;
            Some((micro, exe))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// (major, minor) of the interpreter `exe`, by running it.
pub fn python_version(exe: &Path) -> Option<(u32, u32)> {
    let o = Command::new(exe)
        .args(["-c", "import sys; print(sys.version_info[0], sys.version_info[1])"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&o.stdout);
    let mut it = text.split_whitespace().map(|x| x.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// The system's own CPython (on Debian 12, its statically linked, stripped
/// python3.11): the first `python3` on PATH that is not pyenv's (pyenv's
/// shims and builds live under [`pyenv_root`]), resolved to the interpreter
/// itself, with its version.
pub fn system_python() -> Option<(PathBuf, (u32, u32))> {
    let pyenv = pyenv_root().and_then(|r| r.canonicalize().ok());
    which_all("python3").into_iter().find_map(|p| {
        let exe = p.canonicalize().ok()?;
        if pyenv.as_ref().is_some_and(|r| exe.starts_with(r)) {
            return None;
        }
        let v = python_version(&exe)?;
        Some((exe, v))
    })
}

/// Debian sid's python3.14 and python3.15 in [`pyroot`] (checked once per
/// process): those that run, and the labels of the others with the reason.
pub fn chroot_pythons() -> (Vec<PythonExe>, Vec<String>) {
    static FOUND: OnceLock<Vec<(u32, Result<PathBuf, String>)>> = OnceLock::new();
    let results = FOUND.get_or_init(|| PYROOT_MINORS.iter().map(|m| (*m, chroot_python(*m))).collect());
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (minor, r) in results {
        let label = format!("sid python3.{minor} (chroot {})", pyroot_display());
        match r {
            Ok(exe) => found.push(PythonExe { label, exe: exe.clone(), major: 3, minor: *minor, root: Some(pyroot()) }),
            Err(why) => missing.push(format!("{label}: {why}")),
        }
    }
    (found, missing)
}

/// [`chroot_pythons`] for `test`: those present; with none, or with some
/// missing under `CI=true`, the test is skipped (a failure under CI) and
/// this is empty.
pub fn chroot_pythons_or_skip(test: &str) -> Vec<PythonExe> {
    let (found, missing) = chroot_pythons();
    if found.is_empty() {
        crate::skip(test, &missing.join(", "));
        return Vec::new();
    }
    if crate::skip_some(test, &missing) {
        found
    } else {
        Vec::new()
    }
}

/// The supported CPythons every test of Python attribution runs on: pyenv's
/// 3.8 .. 3.13, the system's python3 (see [`system_python`]) and sid's 3.14
/// and 3.15 in a chroot ([`chroot_pythons`]). Returns those present and the
/// labels of those missing.
pub fn expected_pythons() -> (Vec<PythonExe>, Vec<String>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for minor in 8..=13 {
        match pyenv_python(3, minor) {
            Some(exe) => found.push(PythonExe { label: format!("pyenv 3.{minor}"), exe, major: 3, minor, root: None }),
            None => missing.push(match pyenv_root() {
                Some(root) => format!("pyenv CPython 3.{minor} under {}", root.display()),
                None => format!("pyenv CPython 3.{minor} (no pyenv: $PYENV_ROOT, `pyenv root`, ~/.pyenv)"),
            }),
        }
    }
    match system_python() {
        Some((exe, (3, minor))) if (8..=15).contains(&minor) => found.push(PythonExe {
            label: format!("system python3.{minor} ({})", exe.display()),
            exe,
            major: 3,
            minor,
            root: None,
        }),
        Some((exe, (major, minor))) => {
            missing.push(format!("a system python3 of 3.8 .. 3.15 ({} is {major}.{minor})", exe.display()))
        }
        None => missing.push("a system python3 (on PATH, outside pyenv)".into()),
    }
    let (chroot, not) = chroot_pythons();
    found.extend(chroot);
    missing.extend(not);
    (found, missing)
}

/// The unsupported CPythons pyenv may have, 2.7, 3.6 and 3.7 (infertrace
/// refuses them with a one-line message): those present, and the labels of
/// those missing.
pub fn unsupported_pythons() -> (Vec<PythonExe>, Vec<String>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (major, minor) in [(2, 7), (3, 6), (3, 7)] {
        let label = format!("pyenv {major}.{minor}");
        match pyenv_python(major, minor) {
            Some(exe) => found.push(PythonExe { label, exe, major, minor, root: None }),
            None => missing.push(format!("pyenv CPython {major}.{minor}")),
        }
    }
    (found, missing)
}
