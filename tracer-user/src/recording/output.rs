//! Where `record` writes a recording: whole, or not at all.
//!
//! A regular file (or a new one) is never opened for writing: each write
//! goes to a temporary file beside it, `.NAME.tmp-PID` (PID: the tracer's),
//! which is synced and renamed over it, so a reader (or a tracer killed in
//! the middle) sees the previous content or the new one, never half a file,
//! and an existing file stays as it was until there is something to replace
//! it with. A temporary file left by a tracer killed while writing is
//! removed by the next `record` to the same output once its PID is gone.
//!
//! Anything else (a device such as `/dev/null`, a FIFO) is written in place,
//! and only once, at the end: it cannot be replaced by a rename.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use super::{Recording, RecordingError};

/// The output of one `record`, checked before tracing starts.
#[derive(Clone, Debug)]
pub struct Output {
    /// As the user gave it (for messages).
    path: PathBuf,
    /// The file itself: a symbolic link's target, so the link survives.
    target: PathBuf,
    /// Written beside and renamed over (a regular file, or a new one);
    /// otherwise written in place.
    replace: bool,
}

impl Output {
    /// Checks that `path` can be written without touching it: a regular
    /// file (or none yet) needs a directory where a temporary file can be
    /// created; anything else must open for writing. Removes the temporary
    /// files that dead tracers left beside it.
    pub fn prepare(path: &Path) -> io::Result<Output> {
        if path.is_dir() {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"));
        }
        let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        // A dangling link is replaced like a missing file.
        let target = if is_link { fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()) } else { path.to_owned() };
        let special = fs::metadata(&target).is_ok_and(|m| !m.is_file());
        let out = Output { path: path.to_owned(), target, replace: !special };
        if special {
            // O_NONBLOCK: a FIFO with no reader yet answers ENXIO instead of blocking.
            match OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&out.target) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
                Err(e) => return Err(e),
            }
            return Ok(out);
        }
        remove_stale_temps(&out.target);
        let tmp = out.temp_path();
        File::options().write(true).create(true).truncate(false).open(&tmp).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create a file in {}: {e}", parent_dir(&out.target).display()))
        })?;
        let _ = fs::remove_file(&tmp);
        Ok(out)
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the output can be replaced while recording (checkpoints):
    /// only a regular file, or a new one, can.
    pub fn replaceable(&self) -> bool {
        self.replace
    }

    /// The temporary file this process writes before renaming it over the
    /// output: `.NAME.tmp-PID`, in the output's directory.
    pub fn temp_path(&self) -> PathBuf {
        let name = self.target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "infertrace".into());
        parent_dir(&self.target).join(format!(".{name}{TMP_INFIX}{}", std::process::id()))
    }

    /// Writes `rec` whole, or leaves the output as it was (a regular file:
    /// no temporary file stays behind either). Errors name the output.
    pub fn write(&self, rec: &Recording) -> Result<(), RecordingError> {
        let werr = |source| RecordingError::Write { path: self.path.clone(), source };
        if !self.replace {
            let file = OpenOptions::new().write(true).truncate(true).open(&self.target).map_err(werr)?;
            return rec.write_to(file, &self.path);
        }
        let tmp = self.temp_path();
        let written = File::create(&tmp)
            .map_err(werr)
            .and_then(|file| rec.write_to(file, &self.path))
            .and_then(|()| fs::rename(&tmp, &self.target).map_err(werr));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        } else if let Ok(dir) = File::open(parent_dir(&self.target)) {
            // The rename itself, on disk (best effort: some filesystems refuse).
            let _ = dir.sync_all();
        }
        written
    }
}

/// Between the output's name and the PID in a temporary file's name.
const TMP_INFIX: &str = ".tmp-";

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Removes `.NAME.tmp-PID` files beside `target` whose PID is not running:
/// left by a tracer killed while writing. A live tracer's are kept.
fn remove_stale_temps(target: &Path) {
    let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) else { return };
    let prefix = format!(".{name}{TMP_INFIX}");
    let Ok(entries) = fs::read_dir(parent_dir(target)) else { return };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(pid) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("itr-output-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn prepare_touches_nothing_and_write_replaces() {
        let dir = scratch("replace");
        let path = dir.join("keep.itr");
        fs::write(&path, b"old").unwrap();
        let out = Output::prepare(&path).unwrap();
        assert!(out.replaceable());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(entries(&dir), ["keep.itr"]);
        assert_eq!(out.temp_path(), dir.join(format!(".keep.itr.tmp-{}", std::process::id())));
        out.write(&super::super::tests::sample()).unwrap();
        assert_eq!(Recording::read(&path).unwrap().syscalls.len(), 1);
        assert_eq!(entries(&dir), ["keep.itr"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_link_is_followed() {
        let dir = scratch("link");
        fs::write(dir.join("real.itr"), b"old").unwrap();
        std::os::unix::fs::symlink("real.itr", dir.join("link.itr")).unwrap();
        let out = Output::prepare(&dir.join("link.itr")).unwrap();
        out.write(&super::super::tests::sample()).unwrap();
        assert!(fs::symlink_metadata(dir.join("link.itr")).unwrap().file_type().is_symlink());
        assert!(Recording::read(&dir.join("real.itr")).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn stale_temps_of_dead_tracers_go() {
        let dir = scratch("stale");
        // PIDs above the kernel's maximum (4194304) never run.
        let dead = dir.join(".rec.itr.tmp-4999999");
        let other = dir.join(".other.itr.tmp-4999999");
        for p in [&dead, &other] {
            fs::write(p, b"x").unwrap();
        }
        Output::prepare(&dir.join("rec.itr")).unwrap();
        assert!(!dead.exists());
        assert!(other.exists(), "another output's temporary file is not ours to remove");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn devices_are_written_in_place() {
        let out = Output::prepare(Path::new("/dev/null")).unwrap();
        assert!(!out.replaceable());
        out.write(&super::super::tests::sample()).unwrap();
        let full = Output::prepare(Path::new("/dev/full")).unwrap();
        let err = full.write(&super::super::tests::sample()).unwrap_err();
        assert!(err.to_string().contains("/dev/full"), "{err}");
    }

    #[test]
    fn unwritable_places_fail_up_front() {
        assert!(Output::prepare(Path::new("/nonexistent-dir/x.itr")).is_err());
        let dir = scratch("isdir");
        assert_eq!(Output::prepare(&dir).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        let _ = fs::remove_dir_all(&dir);
    }
}
