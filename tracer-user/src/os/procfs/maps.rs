//! `/proc/PID/maps`, the one parser of that format here, and the one way to
//! open the file behind a mapping.

use std::{
    fs::File,
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::root::{open_in_root, open_regular};

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    pub offset: u64,
    /// Device as written (`fd:01`).
    pub dev: String,
    pub inode: u64,
    /// The pathname column with a trailing ` (deleted)` removed: `None` for
    /// anonymous memory; special mappings keep their name (`[heap]`,
    /// `[vdso]`); may hold spaces.
    pub path: Option<String>,
    /// The mapped file was deleted (the column ended in ` (deleted)`).
    pub deleted: bool,
}

impl MapsLine {
    /// Parses one line (`None` when malformed).
    pub fn parse(line: &str) -> Option<MapsLine> {
        let mut rest = line;
        let mut field = || {
            let s = rest.trim_start_matches(' ');
            let end = s.find(' ').unwrap_or(s.len());
            let (f, r) = s.split_at(end);
            rest = r;
            f
        };
        let range = field();
        let perms = field().as_bytes();
        let offset = field();
        let dev = field();
        let inode = field();
        let raw = rest.trim_start_matches(' ');
        let (start, end) = range.split_once('-')?;
        let (path, deleted) = match raw.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (raw, false),
        };
        Some(MapsLine {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            readable: perms.first() == Some(&b'r'),
            writable: perms.get(1) == Some(&b'w'),
            executable: perms.get(2) == Some(&b'x'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: dev.to_owned(),
            inode: inode.parse().ok()?,
            path: (!path.is_empty()).then(|| path.to_owned()),
            deleted,
        })
    }

    /// The path, or "" for anonymous memory.
    pub fn path(&self) -> &str {
        self.path.as_deref().unwrap_or("")
    }

    pub fn basename(&self) -> &str {
        let p = self.path();
        p.rsplit('/').next().unwrap_or(p)
    }

    /// A regular file mapping (not `[heap]`, `[vdso]`, anonymous...).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path().starts_with('/')
    }

    /// `(device, inode)` as /proc writes them: names the file across the
    /// lines and processes that map it (within one mount namespace view).
    pub fn file_key(&self) -> (String, u64) {
        (self.dev.clone(), self.inode)
    }
}

/// Parses the text of /proc/PID/maps (malformed lines skipped).
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    text.lines().filter_map(MapsLine::parse).collect()
}

/// The mappings of `pid`, their paths as the process sees them.
pub fn maps(pid: u32) -> io::Result<Vec<MapsLine>> {
    Ok(as_seen_by(pid, parse_maps(&super::maps_text(pid)?)))
}

/// `lines` of `pid`'s maps with their paths as the process sees them
/// (a chrooted process's paths lose its root's prefix: [`super::root_prefix`]).
pub fn as_seen_by(pid: u32, mut lines: Vec<MapsLine>) -> Vec<MapsLine> {
    if let Some(prefix) = super::root_prefix(pid) {
        for l in &mut lines {
            if let Some(p) = l.path.take() {
                l.path = Some(super::as_seen_by(Some(&prefix), p));
            }
        }
    }
    lines
}

/// The file behind a mapping, opened.
#[derive(Debug)]
pub struct MappedFile {
    pub file: File,
    /// `(st_dev, st_ino)` of the opened file: one file mapped by many
    /// processes (or through many paths) has one identity.
    pub identity: (u64, u64),
    /// `/proc/PID/map_files/START-END`: the mapped file itself while the
    /// process lives (even deleted, even in another mount namespace).
    pub map_files: PathBuf,
    /// The file was opened through `map_files` (then that path names it
    /// while the process lives; else it may not be readable: it needs
    /// CAP_SYS_ADMIN).
    pub via_map_files: bool,
}

impl MappedFile {
    /// A path naming exactly the opened file, for what takes paths (a
    /// uprobe, blazesym): `/proc/self/fd/N` of [`MappedFile::file`], valid
    /// while it is open. Never the mapped path: resolved again by name,
    /// it could lead elsewhere (a link swapped meanwhile, resolved against
    /// the host's root).
    pub fn by_fd(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// Opens the file behind mapping `line` of process `pid`: through
/// `/proc/PID/map_files/` when allowed (needs CAP_SYS_ADMIN), else by its
/// path inside `/proc/PID/root` with symlinks confined to that root
/// ([`open_in_root`]). Either way the opened file must be the mapped inode,
/// and a regular file (checked before it is opened for reading: a device
/// can be mapped too).
pub fn open_mapped(pid: u32, line: &MapsLine) -> io::Result<MappedFile> {
    open_mapped_via(pid, line, true)
}

/// [`open_mapped`], trying `map_files` only when `map_files_first`.
pub fn open_mapped_via(pid: u32, line: &MapsLine, map_files_first: bool) -> io::Result<MappedFile> {
    // Through the leader first: the usual case, without a look at its state.
    match open_mapped_in(Path::new(&format!("/proc/{pid}")), line, map_files_first) {
        Err(e) if !super::refused::is_refusal(&e) => match super::stand_in_thread(pid) {
            Some(tid) => open_mapped_in(Path::new(&format!("/proc/{pid}/task/{tid}")), line, map_files_first),
            None => Err(e),
        },
        done => done,
    }
}

/// [`open_mapped_via`] through `dir`, `/proc/PID` or `/proc/PID/task/TID`.
fn open_mapped_in(dir: &Path, line: &MapsLine, map_files_first: bool) -> io::Result<MappedFile> {
    let map_files = dir.join(format!("map_files/{:x}-{:x}", line.start, line.end));
    let root = dir.join("root");
    let path = Path::new(line.path());
    let direct = if map_files_first { open_regular(&map_files) } else { Err(io::ErrorKind::Unsupported.into()) };
    let (file, via_map_files) = match direct {
        Ok(f) if f.metadata().is_ok_and(|m| m.ino() == line.inode) => (f, true),
        Err(e) if super::refused::is_refusal(&e) => return Err(e),
        _ => {
            let f = open_in_root(&root, path)?;
            let ino = f.metadata()?.ino();
            if ino != line.inode {
                return Err(io::Error::other(format!(
                    "{} changed since it was mapped (inode {ino} != {})",
                    line.path(),
                    line.inode
                )));
            }
            (f, false)
        }
    };
    let meta = file.metadata()?;
    Ok(MappedFile { file, identity: (meta.dev(), meta.ino()), map_files, via_map_files })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process chrooted into a directory of ours (here: our own root
    /// seen through a prefix) gets its paths without the prefix.
    #[test]
    fn chroot_prefix_is_stripped() {
        use super::super::as_seen_by as strip;
        let p = Some("/srv/root");
        assert_eq!(strip(p, "/srv/root/usr/lib/libx.so".into()), "/usr/lib/libx.so");
        assert_eq!(strip(p, "/srv/rootfs/lib/x.so".into()), "/srv/rootfs/lib/x.so");
        assert_eq!(strip(p, "/usr/lib/x.so".into()), "/usr/lib/x.so");
        assert_eq!(strip(None, "/srv/root/x".into()), "/srv/root/x");
        // Our own process: no prefix.
        assert_eq!(super::super::root_prefix(std::process::id()), None);
    }

    #[test]
    fn maps_columns() {
        let f = MapsLine::parse("7f00-7f10 r-xp 00001000 fd:01 42   /opt/my lib/libx.so (deleted)").unwrap();
        assert_eq!((f.start, f.end, f.offset, f.inode, f.dev.as_str()), (0x7f00, 0x7f10, 0x1000, 42, "fd:01"));
        assert!(f.readable && !f.writable && f.executable && f.deleted && f.is_file());
        assert_eq!((f.path(), f.basename()), ("/opt/my lib/libx.so", "libx.so"));
        let anon = MapsLine::parse("7f10-7f20 rw-p 00000000 00:00 0").unwrap();
        assert_eq!((anon.path.as_deref(), anon.inode, anon.writable, anon.executable), (None, 0, true, false));
        assert!(!anon.is_file());
        let vdso = MapsLine::parse("7ffd-7ffe r-xp 00000000 00:00 0 [vdso]").unwrap();
        assert_eq!(vdso.path(), "[vdso]");
        assert!(!vdso.is_file());
        for bad in ["", "zz-10 r-xp 0 00:00 0", "7f00 r-xp 0 00:00 0", "7f00-7f10 r-xp 0 00:00 x"] {
            assert_eq!(MapsLine::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn opens_own_executable_mapping() {
        let me = std::process::id();
        let m = maps(me).unwrap();
        let exe = m.iter().find(|l| l.executable && l.is_file()).expect("an executable file mapping");
        let opened = open_mapped(me, exe).unwrap();
        assert_eq!(opened.identity.1, exe.inode);
        assert!(opened.via_map_files);
        let by_fd = std::fs::metadata(opened.by_fd()).unwrap();
        assert_eq!((by_fd.dev(), by_fd.ino()), opened.identity);
        let fallback = open_mapped_via(me, exe, false).unwrap();
        assert!(!fallback.via_map_files);
        assert_eq!(fallback.identity, opened.identity);
    }
}
