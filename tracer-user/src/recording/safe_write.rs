//! Safe file creation in a directory the tracer opened itself: the one way
//! every file the tracer writes reaches the disk (`record -o`, its
//! checkpoints and snapshots, `report -o`, the agent's windows).
//!
//! - The directory is opened once ([`Dir::open`]); everything after goes
//!   through its descriptor (`openat`, `renameat`, `unlinkat`, `fstatat`),
//!   so a path swapped afterwards (a link planted where the directory was)
//!   is never followed.
//! - A file is created under a temporary name nobody can guess
//!   (`.STEM.tmp-PID-RANDOM`) with `O_CREAT|O_EXCL|O_NOFOLLOW`: a link, a
//!   FIFO or a file planted there fails the create instead of being opened.
//!   It is written, synced, and renamed within the directory to its name
//!   ([`TempFile::place`]); the directory is synced. A rename replaces a
//!   link at the name, it never writes through it; [`Place::New`] does not
//!   even replace it (`RENAME_NOREPLACE`).
//! - Who may have planted an entry: a directory others can write (group or
//!   world) without the sticky bit is refused ([`Dir::check_not_shared`]):
//!   anyone there could replace what the tracer wrote. In one others can
//!   write with the sticky bit (such as /tmp), a link or a special file is
//!   trusted only when it belongs to root, to the tracer's user or to the
//!   directory's owner ([`Dir::trusts`]: the kernel's `fs.protected_symlinks`
//!   rule, applied whatever that setting is).

use std::{
    ffi::{CString, OsStr, OsString},
    fs::{self, File},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::{OsStrExt, OsStringExt},
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// What `fstat`/`fstatat` said of an entry (the fields used here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub mode: u32,
    pub size: u64,
    pub nlink: u64,
}

impl Stat {
    // The field types differ between architectures (st_nlink is u32 on aarch64).
    #[allow(clippy::useless_conversion)]
    fn from_raw(st: &libc::stat) -> Stat {
        Stat {
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
            uid: st.st_uid,
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            nlink: u64::from(st.st_nlink),
        }
    }
    /// Of a path the kernel resolved (`fs::metadata`).
    pub fn of(m: &fs::Metadata) -> Stat {
        use std::os::unix::fs::MetadataExt;
        Stat { dev: m.dev(), ino: m.ino(), uid: m.uid(), mode: m.mode(), size: m.size(), nlink: m.nlink() }
    }
    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }
    /// In words, for messages: "a symbolic link", "a FIFO", ...
    pub fn kind_name(&self) -> &'static str {
        match self.kind() {
            libc::S_IFREG => "a regular file",
            libc::S_IFDIR => "a directory",
            libc::S_IFLNK => "a symbolic link",
            libc::S_IFIFO => "a FIFO",
            libc::S_IFCHR => "a character device",
            libc::S_IFBLK => "a block device",
            libc::S_IFSOCK => "a socket",
            _ => "a special file",
        }
    }
}

/// `fstat` of an open descriptor.
pub fn fstat(fd: &impl AsRawFd) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid descriptor and a buffer of the right size.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(Stat::from_raw(unsafe { &st.assume_init() }))
}

/// The tracer's effective user.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The most links [`Dir::open`] follows in one path (the kernel's limit).
const MAX_LINKS: usize = 40;

/// The names in `path` to walk, in order (`/` and `.` are not walked).
fn names_of(path: &Path) -> impl Iterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        std::path::Component::Normal(n) => Some(n.to_owned()),
        std::path::Component::ParentDir => Some(OsString::from("..")),
        _ => None,
    })
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    if name.is_empty() || name.as_bytes().contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// How [`TempFile::place`] puts a file at its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Replaces whatever is at the name (the entry itself: a link there is
    /// replaced, not followed).
    Replace,
    /// Only where nothing is at the name yet (`AlreadyExists` otherwise).
    New,
}

/// A directory opened by the tracer.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    stat: Stat,
}

/// Infix of temporary files: `.STEM.tmp-PID-RANDOM`.
pub const TMP_INFIX: &str = ".tmp-";

impl Dir {
    /// Opens the directory `path`. Links on the way are followed (the path
    /// is the user's choice), except one that someone else planted in a
    /// shared directory ([`Dir::trusts`], the `fs.protected_symlinks` rule,
    /// applied to every component of the path, not only the last, and
    /// whatever that setting is): with `/tmp/out -> /etc` made by another
    /// user, `/tmp/out/x.itr` is refused. The path is walked one component
    /// at a time through descriptors (`openat` with `O_NOFOLLOW`, each
    /// link read with `readlinkat` and checked before it is followed).
    /// Check what the directory is with the `check_` functions.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let start = |absolute: bool| -> io::Result<(OwnedFd, PathBuf)> {
            let (c, shown) = if absolute { (c"/", PathBuf::from("/")) } else { (c".", PathBuf::new()) };
            // SAFETY: a NUL-terminated path.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
            check(fd)?;
            // SAFETY: a descriptor just opened, owned by nobody else.
            Ok((unsafe { OwnedFd::from_raw_fd(fd) }, shown))
        };
        let (fd, shown) = start(path.is_absolute())?;
        let mut cur = Dir { stat: fstat(&fd)?, fd, path: shown };
        let mut todo: std::collections::VecDeque<OsString> = names_of(path).collect();
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            let st = cur.stat_at(&name)?.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
            if st.is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                if !cur.trusts(st.uid) {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{} is a link owned by uid {} in {}, a directory others can write: not followed (it may have been planted there)",
                            cur.path.join(&name).display(),
                            st.uid,
                            cur.path.display()
                        ),
                    ));
                }
                let target = PathBuf::from(OsString::from_vec(cur.read_link_at(&name)?));
                for n in names_of(&target).collect::<Vec<_>>().into_iter().rev() {
                    todo.push_front(n);
                }
                if target.is_absolute() {
                    let (fd, shown) = start(true)?;
                    cur = Dir { stat: fstat(&fd)?, fd, path: shown };
                }
                continue;
            }
            let c = cstr(&name)?;
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            let fd = unsafe { libc::openat(cur.fd.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
            check(fd)?;
            // SAFETY: a descriptor just opened, owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let shown = if name == ".." { cur.path.parent().map(Path::to_owned).unwrap_or_else(|| cur.path.join("..")) } else { cur.path.join(&name) };
            cur = Dir { stat: fstat(&fd)?, fd, path: shown };
        }
        cur.path = path.to_owned();
        Ok(cur)
    }

    /// What the link `name` here points at.
    fn read_link_at(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        let c = cstr(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: a valid directory descriptor, a NUL-terminated name, a buffer of buf.len() bytes.
        let n = unsafe { libc::readlinkat(self.fd.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stat(&self) -> Stat {
        self.stat
    }

    /// Whether users other than its owner can create entries in it.
    pub fn is_shared(&self) -> bool {
        self.stat.mode & 0o022 != 0
    }

    fn is_sticky(&self) -> bool {
        self.stat.mode & libc::S_ISVTX != 0
    }

    /// Refuses a directory others can write without the sticky bit: they
    /// could rename, replace or remove whatever is written there.
    pub fn check_not_shared(&self) -> io::Result<()> {
        if self.is_shared() && !self.is_sticky() {
            let who = if self.stat.mode & 0o002 != 0 { "world" } else { "group" };
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("it is {who}-writable (mode {:04o}) without the sticky bit: others could replace what is written there", self.stat.mode & 0o7777),
            ));
        }
        Ok(())
    }

    /// [`Self::check_not_shared`], and owned by root or the tracer's user.
    pub fn check_owned(&self) -> io::Result<()> {
        if self.stat.uid != 0 && self.stat.uid != euid() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("it is owned by uid {}, neither root nor this user (uid {})", self.stat.uid, euid()),
            ));
        }
        self.check_not_shared()
    }

    /// Whether an entry owned by `uid` here (a link, a special file) can be
    /// trusted: anything in a directory only its owner writes; in a shared
    /// one, what root, the tracer's user or the directory's owner made.
    pub fn trusts(&self, uid: u32) -> bool {
        !self.is_shared() || uid == 0 || uid == euid() || uid == self.stat.uid
    }

    /// Whether `path` still names this directory (not removed, not replaced).
    /// An `lstat` of the path, no descriptor: the answer holds when the
    /// process is out of descriptors (the window is then still written
    /// through the one held here), and a link planted at the path is not
    /// this directory's inode.
    pub fn still_at_path(&self) -> bool {
        let Ok(now) = fstat(&self.fd) else { return false };
        if now.nlink == 0 {
            return false;
        }
        fs::symlink_metadata(&self.path).is_ok_and(|m| {
            let s = Stat::of(&m);
            s.dev == self.stat.dev && s.ino == self.stat.ino
        })
    }

    /// The entry `name`, not following a link (None: no such entry).
    pub fn stat_at(&self, name: &OsStr) -> io::Result<Option<Stat>> {
        let c = cstr(name)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: a valid directory descriptor, a NUL-terminated name, a buffer of the right size.
        let rc = unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound { Ok(None) } else { Err(e) };
        }
        // SAFETY: fstatat succeeded, so it filled the buffer.
        Ok(Some(Stat::from_raw(unsafe { &st.assume_init() })))
    }

    /// Removes the entry `name` (a link itself, never its target).
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })
    }

    /// The names in the directory.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        // A directory stream of its own (fdopendir takes the descriptor).
        // SAFETY: duplicating a valid descriptor.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is ours; fdopendir owns it from here (closedir closes it).
        let stream = unsafe { libc::fdopendir(dup) };
        if stream.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `dup` is still ours to close.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: a fresh stream on a duplicate: rewind it to the start.
        unsafe { libc::rewinddir(stream) };
        let mut names = Vec::new();
        loop {
            // SAFETY: a valid stream; the entry is read before the next call.
            let ent = unsafe { libc::readdir(stream) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned an entry whose d_name is NUL-terminated.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                names.push(OsString::from_vec(name.to_vec()));
            }
        }
        // SAFETY: the stream is valid and closed once.
        unsafe { libc::closedir(stream) };
        Ok(names)
    }

    /// Creates a temporary file for `stem` (`.STEM.tmp-PID-RANDOM`), new,
    /// not through any link, with `mode` (less the umask).
    pub fn create_temp(&self, stem: &OsStr, mode: u32) -> io::Result<TempFile<'_>> {
        let stem = stem.to_string_lossy();
        let mut last = None;
        for _ in 0..8 {
            let name = OsString::from(format!(".{stem}{TMP_INFIX}{}-{:016x}", std::process::id(), random()));
            let c = cstr(&name)?;
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            let fd = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    mode,
                )
            };
            if fd >= 0 {
                // SAFETY: a descriptor just opened, owned by nobody else.
                let file = unsafe { File::from_raw_fd(fd) };
                return Ok(TempFile { dir: self, name, file, placed: false });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
    }

    /// Whether a temporary file can be created here (created and removed).
    pub fn probe(&self) -> io::Result<()> {
        self.create_temp(OsStr::new("infertrace-probe"), 0o600).map(drop)
    }

    /// Removes temporary files of `stem` (`stem` None: of any name) left by
    /// tracers that are gone: regular files of this user whose PID is not
    /// running. A live tracer's are kept.
    pub fn remove_stale_temps(&self, stem: Option<&OsStr>) {
        let Ok(names) = self.names() else { return };
        let prefix = stem.map(|s| format!(".{}{TMP_INFIX}", s.to_string_lossy()));
        for name in names {
            let Some(n) = name.to_str() else { continue };
            let pid = match &prefix {
                Some(p) => n.strip_prefix(p.as_str()),
                None => n.starts_with('.').then(|| n.rsplit_once(TMP_INFIX).map(|(_, rest)| rest)).flatten(),
            };
            let Some(pid) = pid.and_then(|rest| rest.split('-').next()).and_then(|p| p.parse::<u32>().ok()) else { continue };
            if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if self.stat_at(&name).ok().flatten().is_some_and(|s| s.is_file() && s.uid == euid()) {
                let _ = self.remove(&name);
            }
        }
    }

    /// Syncs the directory (its entries, on disk; best effort: some
    /// filesystems refuse).
    pub fn sync(&self) {
        // SAFETY: a valid descriptor.
        let _ = unsafe { libc::fsync(self.fd.as_raw_fd()) };
    }

    fn rename(&self, from: &OsStr, to: &OsStr, place: Place) -> io::Result<()> {
        let (f, t) = (cstr(from)?, cstr(to)?);
        let fd = self.fd.as_raw_fd();
        match place {
            // SAFETY: valid descriptors and NUL-terminated names.
            Place::Replace => check(unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) }),
            Place::New => {
                // SAFETY: as above.
                let rc = unsafe { libc::renameat2(fd, f.as_ptr(), fd, t.as_ptr(), libc::RENAME_NOREPLACE) };
                match check(rc) {
                    // A filesystem without RENAME_NOREPLACE: a hard link
                    // fails on an existing name too.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                        // SAFETY: as above; flags 0: the source is not followed.
                        check(unsafe { libc::linkat(fd, f.as_ptr(), fd, t.as_ptr(), 0) })?;
                        let _ = self.remove(from);
                        Ok(())
                    }
                    other => other,
                }
            }
        }
    }

    /// Opens an existing special file (a device, a FIFO) `name` here for
    /// writing in place, not through a link, and checks it is still `expect`
    /// (`nonblock`: a FIFO without a reader answers ENXIO instead of blocking).
    /// The content of the small regular file `name` written by root or the
    /// tracer's user (not through a link, never blocking on a FIFO); None
    /// when there is none. Refused: another kind of file, another owner,
    /// over `max` bytes.
    pub fn read_own_file(&self, name: &OsStr, max: u64) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read as _;
        let c = cstr(name)?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound { Ok(None) } else { Err(e) };
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let st = fstat(&file)?;
        let refuse = |why: String| Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
        if !st.is_file() {
            return refuse(format!("it is a {}, not a regular file", st.kind_name()));
        }
        if st.uid != 0 && st.uid != euid() {
            return refuse(format!("it is owned by uid {}, neither root nor this user", st.uid));
        }
        if st.size > max {
            return refuse(format!("it is {} bytes, over {max}", st.size));
        }
        let mut out = Vec::new();
        file.take(max).read_to_end(&mut out)?;
        Ok(Some(out))
    }

    pub fn open_special(&self, name: &OsStr, expect: &Stat, nonblock: bool) -> io::Result<File> {
        let c = cstr(name)?;
        let flags = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC | if nonblock { libc::O_NONBLOCK } else { 0 };
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        same_file(&file, expect)?;
        Ok(file)
    }
}

/// Refuses `file` unless it is the special file `expect` (not a regular
/// file swapped in since it was checked).
pub fn same_file(file: &File, expect: &Stat) -> io::Result<()> {
    let now = fstat(file)?;
    if now.is_file() || now.dev != expect.dev || now.ino != expect.ino {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "it was replaced since the start: not written to"));
    }
    Ok(())
}

/// A file being written under a temporary name; removed unless placed.
pub struct TempFile<'a> {
    dir: &'a Dir,
    name: OsString,
    file: File,
    placed: bool,
}

impl TempFile<'_> {
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// Syncs the file, renames it to `name` within the directory, and
    /// syncs the directory.
    pub fn place(&mut self, name: &OsStr, how: Place) -> io::Result<()> {
        self.file.sync_all()?;
        self.dir.rename(&self.name, name, how)?;
        self.placed = true;
        self.dir.sync();
        Ok(())
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if !self.placed {
            let _ = self.dir.remove(&self.name);
        }
    }
}

/// 64 unpredictable bits (getrandom; the clock if it fails).
fn random() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut v = 0u64;
    // SAFETY: an 8-byte buffer of our own.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        v = t ^ SEQ.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    }
    v
}

/// Creates `path` and missing parents with `mode` (less the umask).
pub fn create_dir_all(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(mode).create(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("itr-safe-write-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn a_planted_link_is_replaced_never_followed() {
        let base = scratch("link");
        let victim = base.join("victim");
        fs::write(&victim, b"secret").unwrap();
        let d = base.join("out");
        fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("w.itr")).unwrap();
        let dir = Dir::open(&d).unwrap();
        // New: the planted name is left alone.
        let mut t = dir.create_temp(OsStr::new("w.itr"), 0o640).unwrap();
        t.file.write_all(b"window").unwrap();
        assert_eq!(t.place(OsStr::new("w.itr"), Place::New).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
        t.place(OsStr::new("w-1.itr"), Place::New).unwrap();
        assert_eq!(fs::read(d.join("w-1.itr")).unwrap(), b"window");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "no temporary file is left");
        // Replace: the link itself is replaced.
        let mut t = dir.create_temp(OsStr::new("w.itr"), 0o640).unwrap();
        t.file.write_all(b"window").unwrap();
        t.place(OsStr::new("w.itr"), Place::Replace).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
        assert_eq!(fs::read(d.join("w.itr")).unwrap(), b"window");
        let st = dir.stat_at(OsStr::new("w.itr")).unwrap().unwrap();
        assert!(st.is_file());
        assert_eq!(st.mode & 0o077 & !0o040, 0, "mode {:o}", st.mode);
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn a_temporary_name_is_never_opened_through_a_link_or_fifo() {
        let d = scratch("tmp");
        let dir = Dir::open(&d).unwrap();
        let t = dir.create_temp(OsStr::new("x"), 0o600).unwrap();
        let name = t.name().to_owned();
        assert!(name.to_string_lossy().starts_with(&format!(".x.tmp-{}-", std::process::id())));
        drop(t);
        assert!(dir.names().unwrap().is_empty());
        // The O_EXCL|O_NOFOLLOW open itself: a FIFO or a link at the name fails at once.
        let c = CString::new(d.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        std::os::unix::fs::symlink("/etc/passwd", d.join("link")).unwrap();
        for n in ["fifo", "link"] {
            let c = cstr(OsStr::new(n)).unwrap();
            // SAFETY: as in create_temp.
            let fd = unsafe {
                libc::openat(dir.fd.as_raw_fd(), c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)
            };
            assert!(fd < 0, "{n} was opened");
        }
        let mut names: Vec<String> = dir.names().unwrap().into_iter().map(|n| n.to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["fifo", "link"]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn shared_directories_without_the_sticky_bit_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("shared");
        for (mode, ok) in [(0o755, true), (0o750, true), (0o777, false), (0o775, false), (0o1777, true), (0o1770, true)] {
            fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
            let dir = Dir::open(&d).unwrap();
            assert_eq!(dir.check_not_shared().is_ok(), ok, "mode {mode:o}");
            assert_eq!(dir.check_owned().is_ok(), ok, "mode {mode:o}");
            if !ok {
                let e = dir.check_not_shared().unwrap_err().to_string();
                assert!(e.contains("without the sticky bit") && e.contains(&format!("{mode:04o}")), "{e}");
            }
            // A link by another user is trusted only where others cannot write.
            assert_eq!(dir.trusts(65534), mode & 0o022 == 0, "mode {mode:o}");
            assert!(dir.trusts(0) && dir.trusts(euid()));
        }
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_removed_directory_is_noticed() {
        let d = scratch("gone");
        let dir = Dir::open(&d).unwrap();
        assert!(dir.still_at_path());
        fs::remove_dir(&d).unwrap();
        assert!(!dir.still_at_path());
        assert!(dir.create_temp(OsStr::new("x"), 0o600).is_err());
        fs::create_dir(&d).unwrap();
        assert!(!dir.still_at_path(), "another directory at the same path");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn stale_temps_of_dead_tracers_go() {
        let d = scratch("stale");
        // PIDs above the kernel's maximum (4194304) never run.
        for n in [".a.itr.tmp-4999999-00ff", ".b.itr.tmp-4999999", "a.itr"] {
            fs::write(d.join(n), b"x").unwrap();
        }
        let mine = format!(".a.itr.tmp-{}-0001", std::process::id());
        fs::write(d.join(&mine), b"x").unwrap();
        let dir = Dir::open(&d).unwrap();
        dir.remove_stale_temps(Some(OsStr::new("a.itr")));
        let mut left: Vec<String> = dir.names().unwrap().into_iter().map(|n| n.to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [mine.clone(), ".b.itr.tmp-4999999".into(), "a.itr".into()]);
        dir.remove_stale_temps(None);
        assert_eq!(dir.names().unwrap().len(), 2);
        let _ = fs::remove_dir_all(&d);
    }
}
