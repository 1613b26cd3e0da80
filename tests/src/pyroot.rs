//! Debian sid's python3.14 and python3.15, in the root `cargo xtask setup`
//! builds with debootstrap (`target/pyroot-sid`, or `$INFERTRACE_PYROOT`),
//! run in a chroot: a target whose files live under another root
//! (/proc/PID/root), as in a container.
//!
//! The tests spawn interpreters by path with host paths in their arguments
//! (workload scripts, temporary directories) and compare the file names
//! Python reports with host paths. So each chroot interpreter is run
//! through a generated wrapper script (`target/pyroot-wrappers/python3.X`)
//! that, in a mount namespace of its own (nothing is left mounted when it
//! exits), binds into the root, at their own paths, exactly what the tests
//! hand to Python: /proc, /dev, the temporary directory base and
//! `tests/workloads`. Nothing else of the host is visible inside: in
//! particular not `target/cuda-real`, so a CUDA test of a chroot
//! interpreter loads the root's own copy ([`CUDART_IN_ROOT`]), and a tracer
//! that opened its maps' paths on the host instead of through
//! /proc/PID/root would fail. Every step of the wrapper `exec`s, so the
//! process a test spawns IS the interpreter (same pid; `/proc/PID/exe` is
//! the root's python3.X, `/proc/PID/root` the root); the only other
//! process is one short-lived `mount`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{in_path, workspace_root};

/// The real libcudart inside the root (`cargo xtask setup` copies
/// `target/cuda-real/libcudart.so.12` there): a path only a chroot
/// interpreter can open.
pub const CUDART_IN_ROOT: &str = "/opt/cuda-real/libcudart.so.12";

/// The minors of the root's interpreters.
pub const PYROOT_MINORS: [u32; 2] = [14, 15];

/// The root: `$INFERTRACE_PYROOT` (relative to the workspace when not
/// absolute) or `target/pyroot-sid`, as `cargo xtask setup` builds it.
pub fn pyroot() -> PathBuf {
    let ws = workspace_root();
    match std::env::var_os("INFERTRACE_PYROOT") {
        Some(p) if !p.is_empty() => ws.join(p),
        _ => ws.join("target/pyroot-sid"),
    }
}

/// How labels name the root: relative to the workspace when inside it.
pub fn pyroot_display() -> String {
    let root = pyroot();
    let ws = workspace_root();
    root.strip_prefix(&ws).unwrap_or(&root).display().to_string()
}

/// The host directories bound into the root at their own paths, parents
/// first. What the tests hand to Python and nothing more: /proc and /dev
/// (the process's own, so under `unshare -p --mount-proc` the namespace's
/// /proc), the temporary directory base (tests' [`crate::TempDir`]s and
/// the files they copy there, private tmpfs mounts under it included:
/// `rbind`) and the workload scripts.
fn bound_dirs() -> Vec<PathBuf> {
    let canon = |p: PathBuf| p.canonicalize().unwrap_or(p);
    let mut v = vec![
        PathBuf::from("/proc"),
        PathBuf::from("/dev"),
        canon(std::env::temp_dir()),
        canon(workspace_root().join("tests/workloads")),
    ];
    v.sort();
    v.dedup();
    v
}

/// Why the root's python3.`minor` cannot run here, or None.
fn unavailable(root: &Path, minor: u32) -> Option<String> {
    let setup = "build it with `cargo xtask setup` as root";
    if !root.join(format!("usr/bin/python3.{minor}")).is_file() {
        return Some(if root.is_dir() {
            format!("{} has no usr/bin/python3.{minor} ({setup})", root.display())
        } else {
            format!("{} does not exist ({setup})", root.display())
        });
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root (a mount namespace and chroot)".into());
    }
    for prog in ["unshare", "mount"] {
        if !in_path(prog) {
            return Some(format!("{prog} (util-linux)"));
        }
    }
    None
}

/// Single-quoted for sh.
fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// A path as an fstab field: space, tab, newline and backslash as `\ooo`.
fn fstab_escape(p: &Path) -> String {
    let mut s = String::new();
    for c in p.to_string_lossy().chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => s += &format!("\\{:03o}", c as u32),
            c => s.push(c),
        }
    }
    s
}

/// The fstab the wrapper mounts (`mount --fstab FILE --all`: one process
/// for every bind).
fn fstab(root: &Path, dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| {
            let inside = root.join(d.strip_prefix("/").unwrap_or(d));
            format!("{} {} none rbind 0 0\n", fstab_escape(d), fstab_escape(&inside))
        })
        .collect()
}

/// The wrapper script: re-executes itself in a private mount namespace,
/// mounts the binds, then chroots to `root` and runs its python3.`minor`
/// with the same arguments, in the same directory when the root has it
/// (a bound one), else in `/`.
fn wrapper(me: &Path, fstab: &Path, root: &Path, minor: u32) -> String {
    let (me, fstab, root) = (sh_quote(me), sh_quote(fstab), sh_quote(root));
    format!(
        r#"#!/bin/sh
# Generated by the infertrace end-to-end tests (tests/src/pyroot.rs): runs
# python3.{minor} of {root} with the directories of {fstab} bound in,
# in a mount namespace of its own. Every step execs: this process becomes
# the interpreter.
if [ "${{1-}}" != --infertrace-pyroot-ns ]; then
    exec unshare --mount --propagation private {me} --infertrace-pyroot-ns "$@"
fi
shift
mount --fstab {fstab} --all || exit 125
wd=$PWD
[ -d {root}"$wd" ] || wd=/
exec unshare --root={root} --wd="$wd" /usr/bin/python3.{minor} "$@"
"#
    )
}

/// Writes `text` to `path` through a rename (tests of several binaries may
/// write the same wrapper at once).
fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
    fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display()))
}

/// The wrapper running the root's python3.`minor` (written, its mount
/// points made in the root, and checked to report 3.`minor`), or why it
/// cannot run here.
pub fn chroot_python(minor: u32) -> Result<PathBuf, String> {
    let root = pyroot();
    if let Some(why) = unavailable(&root, minor) {
        return Err(why);
    }
    let root = root.canonicalize().map_err(|e| format!("{}: {e}", root.display()))?;
    let dirs = bound_dirs();
    for d in &dirs {
        let inside = root.join(d.strip_prefix("/").unwrap_or(d));
        fs::create_dir_all(&inside).map_err(|e| format!("creating the mount point {}: {e}", inside.display()))?;
    }
    let out = workspace_root().join("target/pyroot-wrappers");
    fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let table = out.join("fstab");
    write_atomically(&table, &fstab(&root, &dirs), 0o644)?;
    let exe = out.join(format!("python3.{minor}"));
    write_atomically(&exe, &wrapper(&exe, &table, &root, minor), 0o755)?;

    let o = Command::new(&exe)
        .args(["-c", "import sys; print(*sys.version_info[:2])"])
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let got = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() || got.trim() != format!("3 {minor}") {
        return Err(format!(
            "{} -c ... printed {:?} ({}): {}",
            exe.display(),
            got.trim(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(exe)
}

/// A copy of the root's libcudart ([`CUDART_IN_ROOT`]) in a directory of
/// its own inside the root, removed on drop: uprobes are set on a file, so
/// tests running at the same time must not share one (see
/// tests/workloads/cuda_patterns.py).
pub struct CudartInRoot {
    host_dir: PathBuf,
    /// The copy's path as the chroot interpreter sees it.
    pub inside: PathBuf,
}

impl CudartInRoot {
    pub fn new(root: &Path, tag: &str) -> Result<CudartInRoot, String> {
        let in_root = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
        let src = in_root(Path::new(CUDART_IN_ROOT));
        if !src.is_file() {
            return Err(format!("{} (`cargo xtask setup` copies it)", src.display()));
        }
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("infertrace-e2e-{tag}-{}-{seq}", std::process::id());
        let parent = Path::new(CUDART_IN_ROOT).parent().unwrap_or(Path::new("/"));
        let inside = parent.join(&name).join("libcudart.so.12");
        let host_dir = in_root(&parent.join(&name));
        fs::create_dir_all(&host_dir).map_err(|e| format!("creating {}: {e}", host_dir.display()))?;
        let copy = CudartInRoot { host_dir, inside };
        let dst = copy.host_dir.join("libcudart.so.12");
        fs::copy(&src, &dst).map_err(|e| format!("copying {} to {}: {e}", src.display(), dst.display()))?;
        Ok(copy)
    }
}

impl Drop for CudartInRoot {
    fn drop(&mut self) {
        if std::env::var_os("INFERTRACE_E2E_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.host_dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstab_fields_are_escaped() {
        let t = fstab(Path::new("/r"), &[PathBuf::from("/a b"), PathBuf::from("/c\\d")]);
        assert_eq!(t, "/a\\040b /r/a\\040b none rbind 0 0\n/c\\134d /r/c\\134d none rbind 0 0\n");
    }

    #[test]
    fn quoting_for_sh() {
        assert_eq!(sh_quote(Path::new("/it's")), r"'/it'\''s'");
    }
}
