//! Code objects as the kernel copied them (`PY_CODES`, see
//! `tracer_common::python::PyCodeRaw`): the first bytes of the code object
//! and of the name, file name and line table it points to. They resolve
//! the frames of a process that has exited; `code` decodes them with the
//! same layout as live memory, through [`ReadMem`].

use std::io;

use tracer_common::python::PyCodeRaw;

use super::{proc::ReadMem, PythonError};

/// The regions of one copy: (address, bytes read there).
pub struct Captured<'a> {
    pid: u32,
    regions: [(u64, &'a [u8]); 4],
}

impl<'a> Captured<'a> {
    pub fn new(pid: u32, raw: &'a PyCodeRaw) -> Self {
        let part = |i: usize, buf: &'a [u8]| {
            let n = (raw.lens[i] as usize).min(buf.len());
            (raw.addrs[i], &buf[..n])
        };
        Captured {
            pid,
            regions: [
                part(0, &raw.code),
                part(1, &raw.name),
                part(2, &raw.filename),
                part(3, &raw.linetable),
            ],
        }
    }

    /// Whether the code object itself was copied (without it nothing can
    /// be decoded).
    pub fn has_code(&self) -> bool {
        !self.regions[0].1.is_empty()
    }
}

impl ReadMem for Captured<'_> {
    /// The copied bytes from `addr` on, at most `len` (fewer where the copy
    /// ends); an error where `addr` is in no copied region.
    fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, PythonError> {
        for (start, data) in self.regions {
            if start != 0 && addr >= start && addr < start + data.len() as u64 {
                let from = (addr - start) as usize;
                let to = data.len().min(from.saturating_add(len));
                return Ok(data[from..to].to_vec());
            }
        }
        Err(PythonError::Memory {
            pid: self.pid,
            addr,
            len,
            source: io::Error::new(io::ErrorKind::NotFound, "not in the kernel's copy of the code object"),
        })
    }

    fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        let b = self.bytes(addr, 8)?;
        let arr: [u8; 8] = b.as_slice().try_into().map_err(|_| PythonError::Memory {
            pid: self.pid,
            addr,
            len: 8,
            source: io::Error::from(io::ErrorKind::UnexpectedEof),
        })?;
        Ok(u64::from_le_bytes(arr))
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::python::{CODE_BYTES, FILENAME_BYTES, LINETABLE_BYTES, NAME_BYTES};

    use super::*;

    fn raw() -> PyCodeRaw {
        let mut r = PyCodeRaw {
            addrs: [0x1000, 0x2000, 0, 0x4000],
            lens: [CODE_BYTES as u32, 16, 0, 0],
            code: [0; CODE_BYTES],
            name: [0; NAME_BYTES],
            filename: [0; FILENAME_BYTES],
            linetable: [0; LINETABLE_BYTES],
        };
        r.code[8..16].copy_from_slice(&0xdead_beefu64.to_le_bytes());
        r.name[..4].copy_from_slice(b"abcd");
        r
    }

    #[test]
    fn reads_within_the_copied_regions_only() {
        let r = raw();
        let c = Captured::new(7, &r);
        assert!(c.has_code());
        assert_eq!(c.u64(0x1008).unwrap(), 0xdead_beef);
        // Fewer bytes where the copy ends.
        assert_eq!(c.bytes(0x2000, 100).unwrap().len(), 16);
        assert_eq!(&c.bytes(0x2000, 4).unwrap(), b"abcd");
        // Uncopied (len 0) regions and other addresses are errors.
        assert!(c.bytes(0x4000, 1).is_err());
        assert!(c.bytes(0x3000, 1).is_err());
        assert!(c.u64(0x2000 + 12).is_err(), "a u64 across the end of a copy");
    }
}
