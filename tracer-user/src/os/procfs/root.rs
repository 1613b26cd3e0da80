//! Files of another process, by the paths it sees: resolved inside its
//! root directory (`/proc/PID/root`, a container's filesystem) without
//! letting symlinks or `..` lead out of it.

use std::{
    collections::VecDeque,
    ffi::{CString, OsString},
    fs::{self, File},
    io,
    os::unix::{
        ffi::OsStrExt,
        fs::OpenOptionsExt,
        io::{AsRawFd, FromRawFd},
    },
    path::{Component, Path, PathBuf},
};

/// Upper bound on symlinks followed while resolving one path (as the kernel).
const MAX_SYMLINKS: usize = 40;

/// Open `path` (absolute, as seen by a process whose root directory is
/// `root`) for reading, without letting symlinks lead out of `root`: an
/// absolute symlink target is taken relative to `root` and `..` stops at it.
/// Uses openat2(RESOLVE_IN_ROOT) where the kernel has it, else resolves the
/// path component by component ([`resolve_in_root`]).
pub fn open_in_root(root: &Path, path: &Path) -> io::Result<File> {
    match openat2_in_root(root, path) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::EAGAIN)) => {}
        result => return result,
    }
    let resolved = resolve_in_root(root, path)?;
    fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(resolved)
}

fn openat2_in_root(root: &Path, path: &Path) -> io::Result<File> {
    let root_dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() { Path::new(".") } else { relative };
    let c_path =
        CString::new(relative.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zeroed is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
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
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Resolve `path` (absolute, as seen by a process whose root directory is
/// `root`) to a host path under `root` with no symlink left in it, following
/// symlinks one component at a time relative to `root`: an absolute target
/// restarts at `root`, `..` never climbs above it. Errors: a component does
/// not exist, a non-directory in the middle, too many symlinks (ELOOP).
pub fn resolve_in_root(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_components(&mut pending, path);
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(component) = pending.pop_front() {
        if component == ".." {
            resolved.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&resolved);
        candidate.push(&component);
        let meta = fs::symlink_metadata(&candidate)?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = fs::read_link(&candidate)?;
            if target.is_absolute() {
                resolved.clear();
            }
            let mut target_components = VecDeque::new();
            push_components(&mut target_components, &target);
            while let Some(c) = target_components.pop_back() {
                pending.push_front(c);
            }
        } else {
            if !pending.is_empty() && !meta.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            resolved.push(component);
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&resolved);
    Ok(out)
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
    use std::os::unix::fs::symlink;

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

        let resolve = |p: &str| resolve_in_root(&root, Path::new(p));
        assert_eq!(resolve("/usr/lib/abs").unwrap(), root.join("etc/passwd"));
        assert_eq!(resolve("/usr/lib/up/etc/passwd").unwrap(), root.join("etc/passwd"));
        assert_eq!(resolve("/../../../etc/passwd").unwrap(), root.join("etc/passwd"));
        assert_eq!(resolve("/usr/lib/libalias.so").unwrap(), root.join("usr/lib/libreal.so"));
        assert_eq!(resolve("/lib64/lib/libalias.so").unwrap(), root.join("usr/lib/libreal.so"));
        // ../../outside from usr/lib stops at the root: root/outside, absent.
        assert_eq!(resolve("/usr/lib/rel_escape").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(resolve("/usr/lib/up/outside").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(resolve("/loop1").unwrap_err().raw_os_error(), Some(libc::ELOOP));
        assert_eq!(resolve("/etc/passwd/x").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));

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
        // The manual fallback agrees with openat2.
        let manual = |p: &str| fs::read_to_string(resolve_in_root(&root, Path::new(p))?);
        assert_eq!(manual("/usr/lib/abs").unwrap(), "inside\n");
        assert_eq!(manual("/usr/lib/up/etc/passwd").unwrap(), "inside\n");
        let _ = fs::remove_dir_all(&base);
    }
}
