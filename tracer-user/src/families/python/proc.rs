//! Reading another process: its mappings and mapped files (through
//! `crate::os::procfs`), its memory.

use std::{fs::File, io, path::PathBuf};

use super::PythonError;
use crate::os::procfs::{self, MapsLine};

pub fn read_maps(pid: u32) -> Result<Vec<MapsLine>, PythonError> {
    procfs::maps(pid).map_err(|e| PythonError::io(format!("/proc/{pid}/maps"), e))
}

/// Opens the file behind a mapping ([`procfs::open_mapped`]); also returns
/// the path as the process sees it (for messages).
pub fn open_mapped(pid: u32, m: &MapsLine) -> Result<(File, PathBuf), PythonError> {
    let shown = m.path().to_owned();
    let opened = procfs::open_mapped(pid, m).map_err(|e| PythonError::io(&shown, e))?;
    Ok((opened.file, PathBuf::from(shown)))
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

/// Where code objects are read from: the live process ([`Mem`]) or the
/// copy the kernel took of one (`super::captured::Captured`).
pub trait ReadMem {
    /// `len` bytes at `addr`. A copy may return fewer (the bytes it has);
    /// the live process never does (a short read is an error).
    fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, PythonError>;

    fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        let b = self.bytes(addr, 8)?;
        Ok(le_u64(&b, 0))
    }
}

impl ReadMem for Mem {
    fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, PythonError> {
        Mem::bytes(self, addr, len)
    }

    fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        Mem::u64(self, addr)
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

#[cfg(test)]
mod tests {
    use super::*;

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
