//! Workloads compiled from `tests/workloads/*.c`.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::locations::{workload_dir, workspace_root};

/// Compiles `tests/workloads/<name>.c` with `gcc -O2 -static` (static, so the
/// dynamic loader adds no syscalls of its own) into `target/e2e-workloads/`
/// and returns the absolute path of the executable. Rebuilt when the source
/// is newer. Needs `Need::Gcc`.
pub fn workload(name: &str) -> PathBuf {
    build(name, name, &["-O2"], &[])
}

/// Compiles `tests/workloads/<name>.c` like [`workload`] but with the extra
/// gcc `flags` (always `-static -Wall`), into `target/e2e-workloads/<name>-<tag>`.
/// Use a distinct `tag` per flag set. Rebuilt when the source is newer.
/// Needs `Need::Gcc`.
pub fn workload_with_flags(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    build(name, &format!("{name}-{tag}"), flags, &["-lpthread"])
}

/// `gcc FLAGS -static -Wall -o target/e2e-workloads/OUT_NAME <name>.c LIBS`,
/// unless the executable is newer than the source.
fn build(name: &str, out_name: &str, flags: &[&str], libs: &[&str]) -> PathBuf {
    let src = workspace_root()
        .join("tests/workloads")
        .join(format!("{name}.c"));
    let dir = workload_dir();
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join(out_name);
    let fresh = match (fs::metadata(&src), fs::metadata(&out)) {
        (Ok(s), Ok(o)) => o.modified().unwrap() >= s.modified().unwrap(),
        (Err(e), _) => panic!("workload source {}: {e}", src.display()),
        _ => false,
    };
    if !fresh {
        // Build under a unique name and rename, so concurrent builds are safe.
        let tmp = dir.join(format!(".{out_name}.{}.tmp", std::process::id()));
        let o = Command::new("gcc")
            .args(flags)
            .args(["-static", "-Wall", "-o"])
            .arg(&tmp)
            .arg(&src)
            .args(libs)
            .output()
            .expect("running gcc");
        assert!(
            o.status.success(),
            "gcc {flags:?} -static {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        fs::rename(&tmp, &out).unwrap();
    }
    out.canonicalize().unwrap()
}
