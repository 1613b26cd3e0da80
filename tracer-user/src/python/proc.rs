//! Reading another process: its mappings, its memory, its mapped files.

use std::{
    fs::{self, File},
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::PythonError;
use crate::procfs::open_in_root;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub offset: u64,
    pub inode: u64,
    /// The path as the process sees it (`None` for anonymous memory; special
    /// mappings such as `[heap]` keep their bracketed name).
    pub path: Option<String>,
}

impl MapEntry {
    /// The path with a trailing ` (deleted)` removed.
    pub fn clean_path(&self) -> Option<&str> {
        self.path.as_deref().map(|p| p.strip_suffix(" (deleted)").unwrap_or(p))
    }

    pub fn basename(&self) -> Option<&str> {
        self.clean_path().map(|p| p.rsplit('/').next().unwrap_or(p))
    }

    /// A regular file mapping (not `[heap]`, `[vdso]`, anonymous...).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.as_deref().is_some_and(|p| p.starts_with('/'))
    }
}

/// Parses the text of `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<MapEntry> {
    let f = crate::procfs::MapsLine::parse(line)?;
    let path = f.path.map(|p| if f.deleted { format!("{p} (deleted)") } else { p });
    Some(MapEntry { start: f.start, end: f.end, readable: f.readable, writable: f.writable, offset: f.offset, inode: f.inode, path })
}

pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>, PythonError> {
    let path = format!("/proc/{pid}/maps");
    let text = fs::read_to_string(&path).map_err(|e| PythonError::io(&path, e))?;
    Ok(parse_maps(&text))
}

/// Opens the file behind a mapping: `/proc/PID/map_files/START-END` (the
/// mapped file itself, even deleted or in another mount namespace), else
/// the mapped path inside the process's root (`/proc/PID/root`, symlinks
/// confined to it). The opened file must have the mapping's inode.
pub fn open_mapped(pid: u32, m: &MapEntry) -> Result<(File, PathBuf), PythonError> {
    let shown = m.clean_path().unwrap_or("?").to_string();
    let map_file = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    if let Ok(f) = File::open(&map_file) {
        if f.metadata().is_ok_and(|md| md.ino() == m.inode) {
            return Ok((f, PathBuf::from(shown)));
        }
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let f = open_in_root(&root, Path::new(&shown)).map_err(|e| PythonError::io(&shown, e))?;
    let md = f.metadata().map_err(|e| PythonError::io(&shown, e))?;
    if md.ino() != m.inode {
        return Err(PythonError::io(
            &shown,
            io::Error::other(format!("file changed since it was mapped (inode {} != {})", md.ino(), m.inode)),
        ));
    }
    Ok((f, PathBuf::from(shown)))
}

/// Reads the memory of one process with `process_vm_readv`.
#[derive(Clone, Copy, Debug)]
pub struct Mem {
    pub pid: u32,
}

impl Mem {
    /// Fills `buf` from `addr`; a short read is an error.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), PythonError> {
        if buf.is_empty() {
            return Ok(());
        }
        let (pid, len) = (self.pid, buf.len());
        let err = |source: io::Error| PythonError::Memory { pid, addr, len, source };
        if addr == 0 {
            return Err(err(io::Error::from_raw_os_error(libc::EFAULT)));
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` describes `buf`, which is valid for writes of its
        // length; the remote side is only read by the kernel.
        let n = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        if (n as usize) < len {
            return Err(err(io::Error::from(io::ErrorKind::UnexpectedEof)));
        }
        Ok(())
    }

    pub fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, PythonError> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    /// Reads as much as is mapped of [addr, addr + len), page by page
    /// (for scanning regions whose tail may be unmapped).
    pub fn bytes_lossy(&self, addr: u64, len: usize) -> Vec<u8> {
        const PAGE: u64 = 4096;
        let mut out = Vec::with_capacity(len);
        let end = addr + len as u64;
        let mut a = addr;
        while a < end {
            let next = ((a / PAGE) + 1) * PAGE;
            let chunk = (next.min(end) - a) as usize;
            let mut buf = vec![0u8; chunk];
            if self.read(a, &mut buf).is_err() {
                break;
            }
            out.extend_from_slice(&buf);
            a += chunk as u64;
        }
        out
    }

    pub fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn u32(&self, addr: u64) -> Result<u32, PythonError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A NUL-terminated C string of at most `max` bytes.
    pub fn c_string(&self, addr: u64, max: usize) -> Result<String, PythonError> {
        let buf = self.bytes_lossy(addr, max);
        match buf.iter().position(|&b| b == 0) {
            Some(n) => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            None => Err(PythonError::Memory {
                pid: self.pid,
                addr,
                len: max,
                source: io::Error::new(io::ErrorKind::InvalidData, "unterminated string"),
            }),
        }
    }
}

/// Little-endian field readers over a byte slice (zero when out of range).
pub fn le_u64(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    b.get(o..o + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
}

pub fn le_u32(b: &[u8], off: u64) -> u32 {
    let o = off as usize;
    b.get(o..o + 4).map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap()))
}

/// Thread ids of a process (`/proc/PID/task`).
pub fn task_ids(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// `/proc/PID/task/TID/comm`, trimmed.
pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok().map(|s| s.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/python3.11
7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0 
7f00ab000000-7f00ab400000 r-xp 00100000 08:02 99 /opt/my dir/libpython3.12.so.1.0 (deleted)
7ffd1000-7ffd2000 r-xp 00000000 00:00 0                          [vdso]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].start, 0x55d0c0a00000);
        assert_eq!(m[0].basename(), Some("python3.11"));
        assert!(m[0].is_file() && m[0].readable && !m[0].writable);
        assert_eq!(m[1].path, None);
        assert!(m[1].writable && !m[1].is_file());
        assert_eq!(m[2].offset, 0x100000);
        assert_eq!(m[2].inode, 99);
        assert_eq!(m[2].clean_path(), Some("/opt/my dir/libpython3.12.so.1.0"));
        assert_eq!(m[2].basename(), Some("libpython3.12.so.1.0"));
        assert_eq!(m[3].path.as_deref(), Some("[vdso]"));
        assert!(!m[3].is_file());
    }

    #[test]
    fn reads_own_memory() {
        let data: [u8; 16] = *b"0123456789abcdef";
        let mem = Mem { pid: std::process::id() };
        let addr = data.as_ptr() as u64;
        assert_eq!(mem.bytes(addr, 16).unwrap(), data);
        assert_eq!(mem.u32(addr).unwrap(), u32::from_le_bytes(*b"0123"));
        let s = b"hello\0world";
        assert_eq!(mem.c_string(s.as_ptr() as u64, 11).unwrap(), "hello");
        assert!(mem.u64(0).is_err());
    }
}
