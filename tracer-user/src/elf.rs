//! Reading ELF files of other processes (opened through `crate::procfs`):
//! the one symbol lookup of the tool, for the CUDA libraries and the Python
//! interpreter. Only what is asked for is read (`object`'s `ReadCache`), not
//! the whole file.

use std::{collections::HashMap, fs::File};

use object::{read::ReadCache, Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// What [`lookup`] found in one file.
#[derive(Debug, Default)]
pub struct ElfSymbols {
    /// Name -> link-time address, for the names asked for that the file
    /// defines (`.dynsym` first, then `.symtab`; a version suffix such as
    /// `@@libcudart.so.12` is not part of the name).
    pub addresses: HashMap<String, u64>,
    /// Loadable segments: (link-time address, size in memory, file offset).
    pub segments: Vec<(u64, u64, u64)>,
    /// `.data` and `.bss`: (link-time address, size).
    pub data_sections: Vec<(u64, u64)>,
}

impl ElfSymbols {
    /// The file offset of link-time address `addr` (what a uprobe takes).
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        let &(vaddr, _, off) = self.segments.iter().find(|(a, size, _)| *a <= addr && addr < a + size)?;
        Some(addr - vaddr + off)
    }
}

/// Looks up the `wanted` symbols, the segments and the data sections of an
/// ELF file. The error is the parser's, one line.
pub fn lookup(file: &File, wanted: &[&str]) -> Result<ElfSymbols, String> {
    let cache = ReadCache::new(file);
    let obj = object::File::parse(&cache).map_err(|e| e.to_string())?;
    let mut out = ElfSymbols::default();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if wanted.contains(&name) && !out.addresses.contains_key(name) {
            out.addresses.insert(name.to_owned(), sym.address());
        }
    }
    out.segments = obj.segments().map(|s| (s.address(), s.size(), s.file_range().0)).collect();
    for name in [".data", ".bss"] {
        if let Some(s) = obj.section_by_name(name) {
            out.data_sections.push((s.address(), s.size()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_symbols_and_offsets() {
        let exe = File::open("/proc/self/exe").unwrap();
        let found = lookup(&exe, &["main", "no_such_symbol_here"]).unwrap();
        let main = found.addresses.get("main").copied().expect("main");
        assert!(!found.addresses.contains_key("no_such_symbol_here"));
        assert!(found.file_offset(main).is_some());
        assert!(!found.segments.is_empty());
        assert!(lookup(&File::open("/proc/self/status").unwrap(), &["main"]).is_err());
    }
}
