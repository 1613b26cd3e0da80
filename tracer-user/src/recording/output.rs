//! Where `record` (its checkpoints and SIGUSR1 snapshots too) and `report`
//! write: whole, or not at all, and never through something planted by
//! someone else (`super::safe_write` does the writing).
//!
//! - A regular file (or a new one) is never opened for writing: each write
//!   goes to a new temporary file beside it, `.NAME.tmp-PID-RANDOM`,
//!   created `O_CREAT|O_EXCL|O_NOFOLLOW` in the directory the tracer opened
//!   at the start, synced, and renamed over the name within that directory.
//!   A reader (or a tracer killed in the middle) sees the previous content
//!   or the new one, never half a file; an existing file stays as it was
//!   until there is something to replace it with. Temporary files left by
//!   a tracer killed while writing are removed by the next `record` to the
//!   same output once its PID is gone.
//! - The directory is refused when others can write it (group or world)
//!   without the sticky bit: they could swap what the tracer wrote.
//! - A symbolic link the user named (or reached through) is followed, one
//!   link at a time, only when it is trusted: owned by root, by the
//!   tracer's user or by the owner of its directory, or in a directory
//!   nobody else can write. A link in a shared directory (such as /tmp)
//!   owned by anyone else is refused with a one-line error: it may have
//!   been planted there, and following it would let its owner choose what
//!   a root tracer overwrites. A dangling trusted link is replaced like a
//!   missing file. Whatever appears at the name later (while recording) is
//!   replaced by the rename, never written through.
//! - Anything else the user named on purpose (a device such as `/dev/null`,
//!   a FIFO, `/dev/stdout`) is written in place, once, at the end: it
//!   cannot be replaced by a rename. The same trust applies: a FIFO or a
//!   device owned by someone else in a shared directory is refused. It is
//!   opened without following a link (except `/proc/self/fd`'s, which lead
//!   to the tracer's own descriptors) and must still be the file checked at
//!   the start: a regular file swapped in meanwhile is not written to.
//! - New files get mode 0666 less the umask, as before; the agent's windows
//!   are written 0640 (`cli::agent::windows`).

use std::{
    ffi::{OsStr, OsString},
    fs::{self, File},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{Recording, RecordingError};
use super::safe_write::{self, Dir, Place, Stat};

/// Upper bound on links followed from the path given (as the kernel).
const MAX_LINKS: usize = 40;

/// Mode of a new output (less the umask).
const MODE: u32 = 0o666;

/// The output of one `record` or `report`, checked before tracing starts.
#[derive(Clone, Debug)]
pub struct Output {
    /// As the user gave it (for messages).
    path: PathBuf,
    /// The directory of the file itself (a trusted link's target's).
    dir: Arc<Dir>,
    /// The file's name in `dir`.
    name: OsString,
    /// A special file written in place: what it was at the start, and the
    /// path to open it by when it is reached through a `/proc` magic link.
    special: Option<(Stat, Option<PathBuf>)>,
}

fn denied(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

impl Output {
    /// Checks that `path` can be written without touching it: a regular
    /// file (or none yet) needs a directory where a temporary file can be
    /// created; anything else must open for writing. Refuses links and
    /// special files planted by others, and shared directories without the
    /// sticky bit. Removes the temporary files that dead tracers left beside it.
    pub fn prepare(path: &Path) -> io::Result<Output> {
        if path.is_dir() {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"));
        }
        let mut cur = path.to_owned();
        for _ in 0..MAX_LINKS {
            let name = cur.file_name().map(OsStr::to_owned).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
            let dir = Dir::open(&parent_dir(&cur))?;
            let Some(st) = dir.stat_at(&name)? else { return Output::new_file(path, dir, name) };
            if st.is_file() {
                return Output::new_file(path, dir, name);
            }
            if st.is_dir() {
                return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"));
            }
            if !dir.trusts(st.uid) {
                return Err(denied(format!(
                    "{} is {} owned by uid {} in {}, a directory others can write: not {} (it may have been planted there)",
                    cur.display(),
                    st.kind_name(),
                    st.uid,
                    dir.path().display(),
                    if st.is_symlink() { "followed" } else { "written to" }
                )));
            }
            if !st.is_symlink() {
                // A device or FIFO named on purpose: written in place.
                let out = Output { path: path.to_owned(), dir: Arc::new(dir), name, special: Some((st, None)) };
                out.check_in_place()?;
                return Ok(out);
            }
            let link = fs::read_link(&cur)?;
            let next = if link.is_absolute() { link } else { parent_dir(&cur).join(link) };
            if fs::symlink_metadata(&next).is_ok() {
                cur = next;
                continue;
            }
            return match fs::metadata(&cur) {
                // A /proc magic link (/dev/stdout to a pipe): the tracer's own descriptor.
                Ok(m) if !m.is_file() && !m.is_dir() => {
                    let out = Output { path: path.to_owned(), dir: Arc::new(dir), name, special: Some((Stat::of(&m), Some(cur))) };
                    out.check_in_place()?;
                    Ok(out)
                }
                Ok(m) if m.is_dir() => Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory")),
                Ok(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} leads to a file without a name", cur.display()))),
                // A dangling link is replaced like a missing file.
                Err(_) => Output::new_file(path, dir, name),
            };
        }
        Err(io::Error::from_raw_os_error(libc::ELOOP))
    }

    /// A regular file or a new one, `name` in `dir`.
    fn new_file(path: &Path, dir: Dir, name: OsString) -> io::Result<Output> {
        dir.check_not_shared().map_err(|e| denied(format!("cannot write in {}: {e}", dir.path().display())))?;
        dir.remove_stale_temps(Some(&name));
        dir.create_temp(&name, MODE)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create a file in {}: {e}", dir.path().display())))?;
        Ok(Output { path: path.to_owned(), dir: Arc::new(dir), name, special: None })
    }

    /// Opens the special file this output is (`check`: at the start, where
    /// a FIFO without a reader must not block).
    fn open_in_place(&self, check: bool) -> io::Result<File> {
        let Some((st, by_path)) = &self.special else { return Err(io::Error::other("not a special file")) };
        match by_path {
            Some(p) => fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC | if check { libc::O_NONBLOCK } else { 0 })
                .open(p)
                .and_then(|f| safe_write::same_file(&f, st).map(|()| f)),
            None => self.dir.open_special(&self.name, st, check),
        }
    }

    /// Whether the special file opens for writing (without touching it).
    fn check_in_place(&self) -> io::Result<()> {
        match self.open_in_place(true) {
            // O_NONBLOCK: a FIFO with no reader yet answers ENXIO instead of blocking.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
            other => other.map(drop),
        }
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the output can be replaced while recording (checkpoints):
    /// only a regular file, or a new one, can.
    pub fn replaceable(&self) -> bool {
        self.special.is_none()
    }

    /// Writes `rec` whole, or leaves the output as it was (a regular file:
    /// no temporary file stays behind either). Errors name the output.
    pub fn write(&self, rec: &Recording) -> Result<(), RecordingError> {
        self.write_with(|file| rec.write_to(file, &self.path), |source| RecordingError::Write { path: self.path.clone(), source })
    }

    /// Writes `bytes` whole (a report), as [`Self::write`].
    pub fn write_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        self.write_with(
            |mut file| {
                file.write_all(bytes)?;
                if safe_write::fstat(&file)?.is_file() {
                    file.sync_all()?;
                }
                Ok(())
            },
            |e| e,
        )
    }

    fn write_with<E>(&self, write: impl FnOnce(File) -> Result<(), E>, err: impl Fn(io::Error) -> E) -> Result<(), E> {
        if self.special.is_some() {
            return write(self.open_in_place(false).map_err(&err)?);
        }
        let mut tmp = self.dir.create_temp(&self.name, MODE).map_err(&err)?;
        write(tmp.file().try_clone().map_err(&err)?)?;
        tmp.place(&self.name, Place::Replace).map_err(err)
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::{ffi::OsStrExt, fs::PermissionsExt};

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("itr-output-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// Makes `path` (not following a link) belong to `nobody`.
    fn give_to_nobody(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0, "lchown {} (the unit tests run as root)", path.display());
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
    fn a_link_planted_by_another_user_in_a_shared_directory_is_not_followed() {
        let dir = scratch("planted");
        let victim = dir.join("victim");
        fs::write(&victim, b"secret").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        let shared = dir.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let link = shared.join("rec.itr");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        give_to_nobody(&link);
        let e = Output::prepare(&link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("owned by uid 65534") && e.to_string().contains("not followed"), "{e}");
        // The same link of this user is followed; a FIFO of nobody's is refused too.
        let mine = shared.join("mine.itr");
        fs::write(dir.join("mine-target.itr"), b"old").unwrap();
        std::os::unix::fs::symlink(dir.join("mine-target.itr"), &mine).unwrap();
        Output::prepare(&mine).unwrap().write(&super::super::tests::sample()).unwrap();
        assert!(Recording::read(&dir.join("mine-target.itr")).is_ok());
        assert!(fs::symlink_metadata(&mine).unwrap().file_type().is_symlink());
        let fifo = shared.join("fifo.itr");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        give_to_nobody(&fifo);
        assert!(Output::prepare(&fifo).unwrap_err().to_string().contains("a FIFO owned by uid 65534"));
        // A link planted after the start is replaced, not written through.
        let later = shared.join("later.itr");
        let out = Output::prepare(&later).unwrap();
        std::os::unix::fs::symlink(&victim, &later).unwrap();
        give_to_nobody(&later);
        out.write(&super::super::tests::sample()).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
        assert!(Recording::read(&later).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_link_planted_in_the_middle_of_the_path_is_not_followed() {
        let dir = scratch("middle");
        let victim_dir = dir.join("private");
        fs::create_dir(&victim_dir).unwrap();
        fs::set_permissions(&victim_dir, fs::Permissions::from_mode(0o700)).unwrap();
        let shared = dir.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        // nobody's link to a directory: `shared/out/rec.itr` would land in `private`.
        let planted = shared.join("out");
        std::os::unix::fs::symlink(&victim_dir, &planted).unwrap();
        give_to_nobody(&planted);
        let e = Output::prepare(&planted.join("rec.itr")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("shared/out is a link owned by uid 65534") && e.to_string().contains("not followed"), "{e}");
        // Deeper, and through a relative path with `..`: refused too.
        let e = Output::prepare(&shared.join("out/../out/rec.itr")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(entries(&victim_dir).is_empty());
        // This user's link there, and any link in a directory only its owner writes, are followed.
        let mine = shared.join("mine");
        std::os::unix::fs::symlink(&victim_dir, &mine).unwrap();
        Output::prepare(&mine.join("rec.itr")).unwrap().write(&super::super::tests::sample()).unwrap();
        assert_eq!(entries(&victim_dir), ["rec.itr"]);
        let private_link = dir.join("via");
        std::os::unix::fs::symlink("shared/../private", &private_link).unwrap();
        give_to_nobody(&private_link);
        assert!(Output::prepare(&private_link.join("other.itr")).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_can_write_without_the_sticky_bit_is_refused() {
        let dir = scratch("open");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = Output::prepare(&dir.join("x.itr")).unwrap_err();
        assert!(e.to_string().contains("world-writable (mode 0777) without the sticky bit"), "{e}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        Output::prepare(&dir.join("x.itr")).unwrap();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn stale_temps_of_dead_tracers_go() {
        let dir = scratch("stale");
        // PIDs above the kernel's maximum (4194304) never run.
        let dead = dir.join(".rec.itr.tmp-4999999-0123");
        let other = dir.join(".other.itr.tmp-4999999-0123");
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
        // /dev/stdout: a link to /proc/self/fd/1, whatever that is.
        Output::prepare(Path::new("/dev/stdout")).unwrap();
    }

    #[test]
    fn unwritable_places_fail_up_front() {
        assert!(Output::prepare(Path::new("/nonexistent-dir/x.itr")).is_err());
        let dir = scratch("isdir");
        assert_eq!(Output::prepare(&dir).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        let _ = fs::remove_dir_all(&dir);
    }
}
