//! Files of another process, by the paths it sees: resolved inside its
//! root directory (`/proc/PID/root`, a container's filesystem) without
//! letting symlinks or `..` lead out of it.

use std::{
    collections::VecDeque,
    ffi::{CString, OsStr, OsString},
    fs::{self, File},
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path},
};

use super::refused::{refuse, Refused};

/// Upper bound on symlinks followed while resolving one path (as the kernel).
const MAX_SYMLINKS: usize = 40;

/// Open `path` (absolute, as seen by a process whose root directory is
/// `root`) for reading, without letting symlinks lead out of `root`: an
/// absolute symlink target is taken relative to `root` and `..` stops at
/// it. The one way to open a target's file:
/// - resolved and opened in one step, as an `O_PATH` descriptor (which
///   opens nothing: no FIFO blocks, no device acts): openat2
///   (`RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS`) where the kernel has it,
///   else component by component from descriptors ([`walk_in_root`]);
/// - `fstat` of that descriptor: anything but a regular file is refused
///   (counted, [`Refused::NotRegular`]);
/// - only then reopened for reading through `/proc/self/fd/N` of it (the
///   same inode, no path resolved again) with
///   `O_NONBLOCK|O_NOCTTY|O_CLOEXEC`.
///
/// Read the file through the returned descriptor only; where a library
/// wants a path, give it `/proc/self/fd/N` of this file.
pub fn open_in_root(root: &Path, path: &Path) -> io::Result<File> {
    let fd = path_in_root(root, path)?;
    let shown = path.display().to_string();
    let st = fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refuse(&shown, Refused::NotRegular(file_type(st.st_mode))));
    }
    reopen_regular(&fd, &shown, libc::O_RDONLY)
}

/// Whether `path` exists in `root` (symlinks confined to it; nothing opened
/// for reading).
pub fn exists_in_root(root: &Path, path: &Path) -> bool {
    path_in_root(root, path).is_ok()
}

/// The names in directory `path` of `root`, at most `cap` of them (`None`
/// when the directory cannot be listed). The second value tells whether
/// names were left out. Listed through the descriptor of the directory
/// resolved in the root.
pub fn list_in_root(root: &Path, path: &Path, cap: usize) -> Option<(Vec<OsString>, bool)> {
    let fd = path_in_root(root, path).ok()?;
    let st = fstat(&fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return None;
    }
    // /proc/self/fd/N of an O_PATH descriptor of a directory: that very
    // directory (a magic link, nothing resolved by name).
    let it = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let mut names = Vec::new();
    for e in it {
        if names.len() >= cap {
            return Some((names, true));
        }
        if let Ok(e) = e {
            names.push(e.file_name());
        }
    }
    Some((names, false))
}

/// Reads all of `file` (a regular file from [`open_in_root`]) when it is at
/// most `cap` bytes, by its real size and by what is read (a file that
/// grows meanwhile is cut: refused too). `what` names the kind of file.
pub fn read_capped(file: &File, shown: &str, what: &'static str, cap: u64) -> io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if size > cap {
        return Err(refuse(shown, Refused::TooLarge { what, size, cap }));
    }
    let mut out = Vec::with_capacity(size as usize);
    file.take(cap + 1).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(refuse(shown, Refused::TooLarge { what, size: out.len() as u64, cap }));
    }
    Ok(out)
}

/// Opens a path we resolved ourselves (`/proc/PID/map_files/...`, a magic
/// link to a mapped file) the same way: `stat` first (opens nothing), only a
/// regular file is opened, `O_NONBLOCK|O_NOCTTY|O_CLOEXEC`, and the opened
/// descriptor checked again.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let shown = path.display().to_string();
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated path; O_PATH opens nothing.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refuse(&shown, Refused::NotRegular(file_type(st.st_mode))));
    }
    reopen_regular(&fd, &shown, libc::O_RDONLY)
}

/// Reopens an `O_PATH` descriptor of a regular file for reading, through
/// `/proc/self/fd/N` (the inode itself), and checks the result is the same
/// regular file.
fn reopen_regular(fd: &OwnedFd, shown: &str, access: i32) -> io::Result<File> {
    let before = fstat(fd)?;
    let by_fd = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated path.
    let raw = unsafe { libc::open(by_fd.as_ptr(), access | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we now own.
    let file = unsafe { File::from_raw_fd(raw) };
    let after = fstat(&file)?;
    if after.st_mode & libc::S_IFMT != libc::S_IFREG || (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) {
        return Err(refuse(shown, Refused::NotRegular(file_type(after.st_mode))));
    }
    Ok(file)
}

fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; zeroed is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn file_type(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symlink",
        libc::S_IFREG => "a regular file that changed",
        _ => "of an unknown type",
    }
}

/// An `O_PATH` descriptor of `path` resolved inside `root` (see
/// [`open_in_root`]): openat2 where the kernel has it, else [`walk_in_root`].
fn path_in_root(root: &Path, path: &Path) -> io::Result<OwnedFd> {
    let root_fd = open_path(root, libc::O_DIRECTORY)?;
    // Set (to anything) by tests to take the path of a kernel without
    // openat2, or a seccomp profile that refuses it (a container runtime's).
    if std::env::var_os("INFERTRACE_TEST_NO_OPENAT2").is_some() {
        return walk_in_root(&root_fd, path);
    }
    match openat2_in_root(&root_fd, path) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::EAGAIN | libc::E2BIG)) => {}
        result => return result,
    }
    walk_in_root(&root_fd, path)
}

/// `O_PATH` descriptor of a path of ours (`/proc/PID/root`: a magic link,
/// followed on purpose).
fn open_path(path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn openat2_in_root(root_dir: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() { Path::new(".") } else { relative };
    let c_path =
        CString::new(relative.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zeroed is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid dirfd, NUL-terminated path, and `how` with its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root_dir.as_raw_fd(),
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat(dir, name, O_PATH|O_NOFOLLOW)`: one component, no link followed.
fn open_component(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid dirfd and NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The target of the symlink behind an `O_PATH|O_NOFOLLOW` descriptor.
fn read_link_fd(fd: &OwnedFd) -> io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid descriptor, empty path (the descriptor itself), buffer and its length.
    let n = unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from(std::ffi::OsStr::from_bytes(&buf)))
}

/// Resolves `path` (absolute, as seen by a process whose root directory is
/// `root_fd`) to an `O_PATH` descriptor, one component at a time, each
/// opened `O_PATH|O_NOFOLLOW` relative to the descriptor of its directory
/// (no path is ever resolved by name from the host's root): a symlink is
/// read through its descriptor and its target followed relative to the
/// root (an absolute target restarts at it, `..` never climbs above it).
/// Nothing is opened for reading, so no FIFO or device is ever opened.
/// Errors: a component does not exist, a non-directory in the middle, too
/// many symlinks (ELOOP).
fn walk_in_root(root_fd: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_components(&mut pending, path);
    // The directories entered below the root, innermost last.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(component) = pending.pop_front() {
        if component == ".." {
            dirs.pop();
            continue;
        }
        let fd = open_component(dirs.last().unwrap_or(root_fd), &component)?;
        let st = fstat(&fd)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = read_link_fd(&fd)?;
                if target.as_bytes().starts_with(b"/") {
                    dirs.clear();
                }
                let mut target_components = VecDeque::new();
                push_components(&mut target_components, Path::new(&target));
                while let Some(c) = target_components.pop_back() {
                    pending.push_front(c);
                }
            }
            libc::S_IFDIR => dirs.push(fd),
            _ if pending.is_empty() => return Ok(fd),
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }
    match dirs.pop() {
        Some(fd) => Ok(fd),
        None => root_fd.try_clone(),
    }
}

/// The normal and `..` components of `path`, in order (root and `.` dropped).
fn push_components(out: &mut VecDeque<OsString>, path: &Path) {
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push_back(s.to_owned()),
            Component::ParentDir => out.push_back(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    /// (dev, ino) of what an `O_PATH` descriptor names.
    fn id(fd: &impl AsRawFd) -> (u64, u64) {
        let st = fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    }

    fn id_of(p: &Path) -> (u64, u64) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", p.display());
    }

    #[test]
    fn symlinks_stay_in_root() {
        let base = std::env::temp_dir().join(format!("infertrace-root-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let root = base.join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::write(root.join("etc/passwd"), "inside\n").unwrap();
        fs::write(root.join("usr/lib/libreal.so"), "lib\n").unwrap();
        // Something outside the root that escapes would reach.
        fs::write(base.join("outside"), "outside\n").unwrap();
        symlink("/etc/passwd", root.join("usr/lib/abs")).unwrap();
        symlink("../../../../../../..", root.join("usr/lib/up")).unwrap();
        symlink("../../outside", root.join("usr/lib/rel_escape")).unwrap();
        symlink("libreal.so", root.join("usr/lib/libalias.so")).unwrap();
        symlink("/usr", root.join("lib64")).unwrap();
        symlink("loop2", root.join("loop1")).unwrap();
        symlink("loop1", root.join("loop2")).unwrap();

        // Both ways: openat2 (path_in_root) and the manual walk.
        let root_fd = open_path(&root, libc::O_DIRECTORY).unwrap();
        let both = |p: &str| -> [io::Result<OwnedFd>; 2] { [path_in_root(&root, Path::new(p)), walk_in_root(&root_fd, Path::new(p))] };
        for (p, want) in [
            ("/usr/lib/abs", "etc/passwd"),
            ("/usr/lib/up/etc/passwd", "etc/passwd"),
            ("/../../../etc/passwd", "etc/passwd"),
            ("/usr/lib/libalias.so", "usr/lib/libreal.so"),
            ("/lib64/lib/libalias.so", "usr/lib/libreal.so"),
            ("/usr/lib/up", ""),
            ("/", ""),
        ] {
            for r in both(p) {
                assert_eq!(id(&r.unwrap()), id_of(&root.join(want)), "{p}");
            }
        }
        // ../../outside from usr/lib stops at the root: root/outside, absent.
        for p in ["/usr/lib/rel_escape", "/usr/lib/up/outside"] {
            for r in both(p) {
                assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound, "{p}");
            }
        }
        for r in both("/loop1") {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ELOOP));
        }
        let walked = walk_in_root(&root_fd, Path::new("/etc/passwd/x"));
        assert_eq!(walked.unwrap_err().raw_os_error(), Some(libc::ENOTDIR));

        let read = |p: &str| {
            let mut s = String::new();
            io::Read::read_to_string(&mut open_in_root(&root, Path::new(p))?, &mut s)?;
            io::Result::Ok(s)
        };
        assert_eq!(read("/usr/lib/abs").unwrap(), "inside\n");
        assert_eq!(read("/usr/lib/up/etc/passwd").unwrap(), "inside\n");
        assert_eq!(read("/lib64/lib/libalias.so").unwrap(), "lib\n");
        assert!(read("/usr/lib/rel_escape").is_err());
        assert!(read("/usr/lib/up/outside").is_err());
        assert!(exists_in_root(&root, Path::new("/lib64/lib")));
        assert!(!exists_in_root(&root, Path::new("/usr/lib/rel_escape")));
        let (mut names, cut) = list_in_root(&root, Path::new("/lib64/lib"), 100).unwrap();
        names.sort();
        assert!(!cut);
        assert_eq!(names, ["abs", "libalias.so", "libreal.so", "rel_escape", "up"]);
        let (names, cut) = list_in_root(&root, Path::new("/usr/lib"), 2).unwrap();
        assert!(cut && names.len() == 2);
        assert!(list_in_root(&root, Path::new("/etc/passwd"), 10).is_none());
        let _ = fs::remove_dir_all(&base);
    }

    /// A FIFO, a device, a link to either and an oversized file are
    /// refused at once (counted), never opened for reading: the FIFO
    /// would block an open for reading until a writer came.
    #[test]
    fn refuses_fifos_devices_and_oversized_files() {
        let base = std::env::temp_dir().join(format!("infertrace-refuse-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("etc")).unwrap();
        mkfifo(&base.join("libcudart.so.12"));
        symlink("/libcudart.so.12", base.join("etc/link-to-fifo")).unwrap();
        // /dev/zero of the host is outside this root: a link to it is a
        // link to <root>/dev/zero, absent; the host's own device is
        // refused through the map_files-style opener.
        symlink("/dev/zero", base.join("etc/ld.so.cache")).unwrap();
        let before = super::super::refused::counts();
        let started = std::time::Instant::now();
        for p in ["/libcudart.so.12", "/etc/link-to-fifo"] {
            let e = open_in_root(&base, Path::new(p)).unwrap_err();
            assert!(super::super::refused::is_refusal(&e), "{p}: {e}");
            assert!(e.to_string().contains("FIFO"), "{e}");
        }
        assert_eq!(open_in_root(&base, Path::new("/etc/ld.so.cache")).unwrap_err().kind(), io::ErrorKind::NotFound);
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        // The manual walk hands back an O_PATH descriptor of the FIFO,
        // which opens nothing either.
        let root_fd = open_path(&base, libc::O_DIRECTORY).unwrap();
        let fd = walk_in_root(&root_fd, Path::new("/etc/link-to-fifo")).unwrap();
        assert_eq!(fstat(&fd).unwrap().st_mode & libc::S_IFMT, libc::S_IFIFO);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));

        // Sizes: a sparse file of 1 GiB against a 1 MiB cap.
        let big = base.join("big");
        File::create(&big).unwrap().set_len(1 << 30).unwrap();
        let f = open_in_root(&base, Path::new("/big")).unwrap();
        let e = read_capped(&f, "/big", "test file", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("over the 1048576-byte limit"), "{e}");
        fs::write(base.join("small"), b"12345").unwrap();
        let f = open_in_root(&base, Path::new("/small")).unwrap();
        assert_eq!(read_capped(&f, "/small", "test file", 5).unwrap(), b"12345");
        let after = super::super::refused::counts();
        assert!(after[0] >= before[0] + 3 && after[1] > before[1], "{before:?} -> {after:?}");
        let _ = fs::remove_dir_all(&base);
    }
}
