//! The calibration, kept per boot: `/run/infertrace/calibration.json`
//! (`/run` is emptied at every boot), used again while the boot, the kernel
//! release and the tracer's version are the same. A calibration takes
//! about a third of a second of the tracer's start-up (docs/overhead.md);
//! the costs it measures belong to the machine and its kernel, not to a
//! run. Only a complete calibration (every cost measured) is kept.
//! `INFERTRACE_RECALIBRATE=1` calibrates anew (and keeps the new one).
//!
//! The directory is made 0700 and used only when it is owned by root or the
//! tracer's user and writable by nobody else; the file is read only when
//! it is a small regular file of that owner (no link is followed), and
//! written as a new file renamed into place.

use std::{ffi::OsStr, io::Write as _, path::Path};

use serde::{Deserialize, Serialize};

use crate::recording::{
    overhead::Calibration,
    safe_write::{create_dir_all, Dir, Place},
};

const DIR: &str = "/run/infertrace";
const NAME: &str = "calibration.json";
/// Set to calibrate anew whatever is kept.
pub const RECALIBRATE_ENV: &str = "INFERTRACE_RECALIBRATE";

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Kept {
    boot_id: String,
    kernel_release: String,
    tool_version: String,
    calibration: Calibration,
}

/// What identifies the machine's state a calibration holds for.
fn key() -> Option<(String, String)> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().to_owned();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?.trim().to_owned();
    (!boot.is_empty() && !release.is_empty()).then_some((boot, release))
}

fn dir(create: bool) -> Option<Dir> {
    let path = Path::new(DIR);
    if create && !path.exists() {
        create_dir_all(path, 0o700).ok()?;
    }
    let d = Dir::open(path).ok()?;
    d.check_owned().ok()?;
    Some(d)
}

/// The calibration kept for this boot, kernel and version, if any.
pub fn load() -> Option<Calibration> {
    load_from(dir(false)?, key()?)
}

fn load_from(d: Dir, (boot, release): (String, String)) -> Option<Calibration> {
    if std::env::var_os(RECALIBRATE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    let bytes = d.read_own_file(OsStr::new(NAME), 4096).ok()??;
    let kept: Kept = serde_json::from_slice(&bytes).ok()?;
    let c = kept.calibration;
    let complete = c.uprobe_ns > 0.0 && c.syscall_tracepoints_ns > 0.0 && c.uretprobe_ns >= 0.0;
    (kept.boot_id == boot && kept.kernel_release == release && kept.tool_version == env!("CARGO_PKG_VERSION") && complete).then_some(Calibration { cached: true, ..c })
}

/// Keeps `c` for the next runs on this boot (a complete calibration only).
pub fn store(c: &Calibration) {
    if c.uprobe_ns <= 0.0 || c.syscall_tracepoints_ns <= 0.0 || c.cached {
        return;
    }
    let (Some(d), Some(key)) = (dir(true), key()) else { return };
    store_in(&d, key, c);
}

fn store_in(d: &Dir, (boot_id, kernel_release): (String, String), c: &Calibration) {
    let kept = Kept { boot_id, kernel_release, tool_version: env!("CARGO_PKG_VERSION").to_owned(), calibration: c.clone() };
    let Ok(json) = serde_json::to_vec(&kept) else { return };
    let Ok(mut tmp) = d.create_temp(OsStr::new(NAME), 0o600) else { return };
    if tmp.file().write_all(&json).is_ok() {
        let _ = tmp.place(OsStr::new(NAME), Place::Replace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_for_the_same_boot_kernel_and_version_only() {
        let path = std::env::temp_dir().join(format!("infertrace-calib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        create_dir_all(&path, 0o700).unwrap();
        let d = Dir::open(&path).unwrap();
        let key = ("boot-a".to_owned(), "6.18".to_owned());
        let c = Calibration { uprobe_ns: 1500.0, uretprobe_ns: 900.0, syscall_tracepoints_ns: 120.0, took_ms: 330.0, cached: false };
        assert_eq!(load_from(Dir::open(&path).unwrap(), key.clone()), None, "nothing kept yet");
        store_in(&d, key.clone(), &c);
        assert_eq!(load_from(Dir::open(&path).unwrap(), key.clone()), Some(Calibration { cached: true, ..c.clone() }));
        assert_eq!(load_from(Dir::open(&path).unwrap(), ("boot-b".into(), "6.18".into())), None, "another boot");
        assert_eq!(load_from(Dir::open(&path).unwrap(), ("boot-a".into(), "6.19".into())), None, "another kernel");
        // A link planted at the name is not followed.
        std::fs::remove_file(path.join(NAME)).unwrap();
        std::fs::write(path.join("elsewhere"), serde_json::to_vec(&Kept { boot_id: key.0.clone(), kernel_release: key.1.clone(), tool_version: env!("CARGO_PKG_VERSION").into(), calibration: c }).unwrap()).unwrap();
        std::os::unix::fs::symlink(path.join("elsewhere"), path.join(NAME)).unwrap();
        assert_eq!(load_from(Dir::open(&path).unwrap(), key), None, "a link is refused");
        let _ = std::fs::remove_dir_all(&path);
    }
}
