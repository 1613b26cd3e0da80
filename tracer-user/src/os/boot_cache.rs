//! Facts about this boot kept between runs: `/run/infertrace/NAME.json`
//! (`/run` is emptied at every boot), each used again while the boot, the
//! kernel release and the tracer's version are the same. What is kept
//! belongs to the machine and its running kernel, not to a run: the
//! overhead calibration (about a third of a second to measure), the
//! addresses of kernel functions the programs compare with (reading
//! `/proc/kallsyms` costs ~20 ms of system time).
//!
//! The directory is made 0700 and used only when it is owned by root or the
//! tracer's user and writable by nobody else; a file is read only when it
//! is a small regular file of that owner (no link is followed), and written
//! as a new file renamed into place. Anything amiss reads as "nothing
//! kept": the caller measures anew.

use std::{ffi::OsStr, io::Write as _, path::Path};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::recording::safe_write::{create_dir_all, Dir, Place};

const DIR: &str = "/run/infertrace";
/// Largest file read back.
const MAX_BYTES: u64 = 64 * 1024;

#[derive(Serialize, Deserialize)]
struct Kept<T> {
    boot_id: String,
    kernel_release: String,
    tool_version: String,
    value: T,
}

/// What identifies the machine's state a kept value holds for.
type Key = (String, String);

fn key() -> Option<Key> {
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

/// The value kept under `name` for this boot, kernel and version, if any.
pub fn load<T: DeserializeOwned>(name: &str) -> Option<T> {
    load_from(&dir(false)?, name, &key()?)
}

/// Keeps `value` under `name` for the next runs on this boot.
pub fn store<T: Serialize>(name: &str, value: &T) {
    let (Some(d), Some(key)) = (dir(true), key()) else { return };
    store_in(&d, name, key, value);
}

fn file_name(name: &str) -> String {
    format!("{name}.json")
}

fn load_from<T: DeserializeOwned>(d: &Dir, name: &str, (boot, release): &Key) -> Option<T> {
    let bytes = d.read_own_file(OsStr::new(&file_name(name)), MAX_BYTES).ok()??;
    let kept: Kept<T> = serde_json::from_slice(&bytes).ok()?;
    (kept.boot_id == *boot && kept.kernel_release == *release && kept.tool_version == env!("CARGO_PKG_VERSION")).then_some(kept.value)
}

fn store_in<T: Serialize>(d: &Dir, name: &str, (boot_id, kernel_release): Key, value: &T) {
    let kept = Kept { boot_id, kernel_release, tool_version: env!("CARGO_PKG_VERSION").to_owned(), value };
    let Ok(json) = serde_json::to_vec(&kept) else { return };
    let name = file_name(name);
    let Ok(mut tmp) = d.create_temp(OsStr::new(&name), 0o600) else { return };
    if tmp.file().write_all(&json).is_ok() {
        let _ = tmp.place(OsStr::new(&name), Place::Replace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_for_the_same_boot_kernel_and_version_only() {
        let path = std::env::temp_dir().join(format!("infertrace-boot-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        create_dir_all(&path, 0o700).unwrap();
        let d = Dir::open(&path).unwrap();
        let key: Key = ("boot-a".to_owned(), "6.18".to_owned());
        let value = vec![(1u64, 2u64), (3, 4)];
        assert_eq!(load_from::<Vec<(u64, u64)>>(&d, "ranges", &key), None, "nothing kept yet");
        store_in(&d, "ranges", key.clone(), &value);
        assert_eq!(load_from(&Dir::open(&path).unwrap(), "ranges", &key), Some(value.clone()));
        assert_eq!(load_from::<Vec<(u64, u64)>>(&d, "other", &key), None, "another name");
        assert_eq!(load_from::<Vec<(u64, u64)>>(&d, "ranges", &("boot-b".into(), "6.18".into())), None, "another boot");
        assert_eq!(load_from::<Vec<(u64, u64)>>(&d, "ranges", &("boot-a".into(), "6.19".into())), None, "another kernel");
        assert_eq!(load_from::<String>(&d, "ranges", &key), None, "another shape");
        // A link planted at the name is not followed.
        std::fs::rename(path.join("ranges.json"), path.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(path.join("elsewhere"), path.join("ranges.json")).unwrap();
        assert_eq!(load_from::<Vec<(u64, u64)>>(&Dir::open(&path).unwrap(), "ranges", &key), None, "a link is refused");
        let _ = std::fs::remove_dir_all(&path);
    }
}
