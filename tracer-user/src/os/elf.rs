//! Reading ELF files of other processes (opened through `crate::os::procfs`):
//! the one symbol lookup of the tool, for the CUDA libraries and the Python
//! interpreter. Only what is asked for is read (`object`'s `ReadCache`), not
//! the whole file, in 64 KiB blocks ([`BlockReader`]): the parser reads each
//! symbol name on its own, and a read per name (15,000 for libpython) kept
//! the session from everything else for ~0.2 s, a CUDA library dlopen'd
//! meanwhile included.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
};

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
    let cache = ReadCache::new(BlockReader::new(file).map_err(|e| e.to_string())?);
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

/// Size of the blocks [`BlockReader`] reads and keeps.
const BLOCK: u64 = 64 * 1024;

/// `Read + Seek` over a file, by whole blocks kept once read: the many
/// small reads of a parser cost one `pread` per block.
struct BlockReader<'a> {
    file: &'a File,
    len: u64,
    pos: u64,
    blocks: HashMap<u64, Vec<u8>>,
}

impl<'a> BlockReader<'a> {
    fn new(file: &'a File) -> io::Result<Self> {
        Ok(BlockReader { file, len: file.metadata()?.len(), pos: 0, blocks: HashMap::new() })
    }

    fn block(&mut self, index: u64) -> io::Result<&[u8]> {
        if !self.blocks.contains_key(&index) {
            let start = index * BLOCK;
            let mut buf = vec![0u8; BLOCK.min(self.len.saturating_sub(start)) as usize];
            let mut filled = 0;
            while filled < buf.len() {
                match self.file.read_at(&mut buf[filled..], start + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            // A file that shrank since its length was read: what is there.
            buf.truncate(filled);
            self.blocks.insert(index, buf);
        }
        Ok(self.blocks.get(&index).map(Vec::as_slice).unwrap_or(&[]))
    }
}

impl Read for BlockReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let pos = self.pos;
        let block = self.block(pos / BLOCK)?;
        let at = (pos % BLOCK) as usize;
        let n = block.len().saturating_sub(at).min(out.len());
        out[..n].copy_from_slice(&block[at..at + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlockReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
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

    #[test]
    fn block_reader_reads_across_blocks() {
        let path = std::env::temp_dir().join(format!("infertrace-blocks-{}", std::process::id()));
        let data: Vec<u8> = (0..(3 * BLOCK as usize + 100)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let mut r = BlockReader::new(&f).unwrap();
        assert_eq!(r.seek(SeekFrom::End(0)).unwrap(), data.len() as u64);
        r.seek(SeekFrom::Start(BLOCK - 10)).unwrap();
        let mut buf = vec![0u8; 2 * BLOCK as usize + 50];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(buf, data[(BLOCK - 10) as usize..(3 * BLOCK + 40) as usize]);
        r.seek(SeekFrom::Start(data.len() as u64 - 5)).unwrap();
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, data[data.len() - 5..]);
        let _ = std::fs::remove_file(&path);
    }
}
