//! The few things read from the interpreter's ELF file (through
//! `crate::os::elf`): a handful of symbol addresses, the loadable segments (for
//! the load bias) and the writable data sections (to find the version
//! string).

use std::{collections::HashMap, fs::File, path::Path};

use super::PythonError;
use crate::os::procfs::MapsLine;

/// Symbols looked up in every candidate file.
pub const WANTED: &[&str] = &["_PyRuntime", "Py_Version", "PyCode_Type", "Py_GetVersion", "_PyEval_EvalFrameDefault"];

#[derive(Debug, Default)]
pub struct ElfInfo {
    /// Symbol name -> link-time address (only names in [`WANTED`]).
    pub symbols: HashMap<&'static str, u64>,
    /// PT_LOAD segments: (file offset, virtual address).
    pub loads: Vec<(u64, u64)>,
    /// `.data` and `.bss`: (link-time address, size).
    pub data_sections: Vec<(u64, u64)>,
}

impl ElfInfo {
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// Load bias of this file in a process, from its mappings: the mapping
    /// whose file offset is a loadable segment's (page-aligned) offset.
    pub fn load_bias(&self, mappings: &[&MapsLine]) -> Option<u64> {
        let page = page_size();
        for m in mappings {
            for &(off, vaddr) in &self.loads {
                if off & !(page - 1) == m.offset {
                    return Some(m.start.wrapping_sub(vaddr & !(page - 1)));
                }
            }
        }
        None
    }
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Reads the symbols in [`WANTED`], the segments and data sections of an ELF
/// file ([`crate::os::elf::lookup`]).
pub fn inspect(file: File, path: &Path) -> Result<ElfInfo, PythonError> {
    let found = crate::os::elf::lookup(&file, &path.display().to_string(), WANTED).map_err(|message| PythonError::Elf { path: path.display().to_string(), message })?;
    let symbols = WANTED.iter().filter_map(|w| found.addresses.get(*w).map(|a| (*w, *a))).collect();
    let loads = found.segments.iter().map(|&(vaddr, _, off)| (off, vaddr)).collect();
    Ok(ElfInfo { symbols, loads, data_sections: found.data_sections })
}

/// Finds the CPython version string that `Py_GetVersion` leaves in its static
/// buffer ("3.10.13 (main, ...) [GCC ...]"): `major.minor.micro`, an
/// optional release suffix, then " (". Returns the first one found.
pub fn find_version_string(buf: &[u8]) -> Option<(u32, u32, u32, String)> {
    let mut i = 0;
    while i + 6 < buf.len() {
        let c = buf[i];
        if (c == b'2' || c == b'3') && buf[i + 1] == b'.' && (i == 0 || buf[i - 1] == 0) {
            if let Some(found) = parse_version_at(&buf[i..]) {
                return Some(found);
            }
        }
        i += 1;
    }
    None
}

fn parse_version_at(b: &[u8]) -> Option<(u32, u32, u32, String)> {
    let mut pos = 0;
    let num = |pos: &mut usize| -> Option<u32> {
        let start = *pos;
        while *pos < b.len() && b[*pos].is_ascii_digit() && *pos - start < 3 {
            *pos += 1;
        }
        if *pos == start {
            return None;
        }
        std::str::from_utf8(&b[start..*pos]).ok()?.parse().ok()
    };
    let major = num(&mut pos)?;
    (b.get(pos) == Some(&b'.')).then_some(())?;
    pos += 1;
    let minor = num(&mut pos)?;
    (b.get(pos) == Some(&b'.')).then_some(())?;
    pos += 1;
    let micro = num(&mut pos)?;
    let mut end = pos;
    while end < b.len() && end - pos < 32 && (b[end].is_ascii_alphanumeric() || b[end] == b'+' || b[end] == b'.') {
        end += 1;
    }
    if b.get(end..end + 2) != Some(b" (") {
        return None;
    }
    let text = String::from_utf8_lossy(&b[..end]).into_owned();
    Some((major, minor, micro, text))
}

/// `3.X` from a file name such as `libpython3.10.so.1.0`, `python3.11` or
/// `libpython3.7m.so`.
pub fn version_from_name(name: &str) -> Option<(u32, u32)> {
    let i = name.find("python")? + "python".len();
    let rest = &name[i..];
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_strings() {
        let mut buf = vec![0u8; 64];
        buf.extend_from_slice(b"3.2.0\0junk 3.1\0");
        buf.extend_from_slice(b"3.10.13 (main, May  9 2026, 07:33:46) [GCC 12.2.0]\0");
        let (a, b, c, s) = find_version_string(&buf).unwrap();
        assert_eq!((a, b, c, s.as_str()), (3, 10, 13, "3.10.13"));
        let (a, b, c, s) = find_version_string(b"3.13.0rc2+ (heads/3.13:abc) [Clang]").unwrap();
        assert_eq!((a, b, c, s.as_str()), (3, 13, 0, "3.13.0rc2+"));
        assert!(find_version_string(b"\x003.11.2\0").is_none());
        assert!(find_version_string(b"x2.7.18 (default").is_none());
    }

    #[test]
    fn names() {
        assert_eq!(version_from_name("libpython3.10.so.1.0"), Some((3, 10)));
        assert_eq!(version_from_name("libpython3.7m.so.1.0"), Some((3, 7)));
        assert_eq!(version_from_name("python3.11"), Some((3, 11)));
        assert_eq!(version_from_name("python2.7"), Some((2, 7)));
        assert_eq!(version_from_name("python3"), None);
        assert_eq!(version_from_name("uwsgi"), None);
    }
}
