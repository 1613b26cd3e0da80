//! Reading ELF files of other processes (opened through `crate::os::procfs`):
//! the one symbol lookup of the tool, for the CUDA libraries and the Python
//! interpreter. Only what is asked for is read (`object`'s `ReadCache`), not
//! the whole file, in 64 KiB blocks ([`BlockReader`]): the parser reads each
//! symbol name on its own, and a read per name (15,000 for libpython) kept
//! the session from everything else for ~0.2 s, a CUDA library dlopen'd
//! meanwhile included.

use std::{
    cell::Cell,
    collections::HashMap,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    ops::Range,
    os::unix::fs::FileExt,
};

use object::{
    elf,
    read::{
        elf::{FileHeader, ProgramHeader, SectionHeader, Sym},
        ReadCache, ReadRef,
    },
    Endianness,
};

use crate::os::procfs::{refused, Refused};

/// The largest symbol table (or its string table) read: far above any
/// real library's (libpython's `.symtab` is ~0.5 MiB, libcuda's `.dynsym`
/// smaller); a file claiming more is refused, not allocated for.
pub const TABLE_LIMIT: u64 = 64 << 20;
/// All the bytes read from one file for one lookup (headers, both symbol
/// tables and their strings).
pub const READ_BUDGET: u64 = 160 << 20;
/// The longest symbol name read.
const NAME_LIMIT: usize = 4096;

/// What [`lookup`] found in one file.
#[derive(Clone, Debug, Default)]
pub struct ElfSymbols {
    /// Name -> link-time address, for the names asked for that the file
    /// defines (`.dynsym` first, then `.symtab`; a version suffix such as
    /// `@@libcudart.so.12` is not part of the name).
    pub addresses: HashMap<String, u64>,
    /// Loadable segments: (link-time address, size in memory, file offset).
    pub segments: Vec<(u64, u64, u64)>,
    /// `.data` and `.bss`: (link-time address, size).
    pub data_sections: Vec<(u64, u64)>,
    /// The bytes of `.note.stapsdt` ([`sdt_notes`] only).
    pub sdt_notes: Option<Vec<u8>>,
}

impl ElfSymbols {
    /// The file offset of link-time address `addr` (what a uprobe takes).
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        let &(vaddr, _, off) = self.segments.iter().find(|(a, size, _)| *a <= addr && addr < a.saturating_add(*size))?;
        Some(addr - vaddr + off)
    }
}

/// Looks up the `wanted` symbols, the segments and the data sections of an
/// ELF file (`shown`: its name for messages). The error is one line. The
/// file is a target's, so nothing in it is trusted: it must be a regular
/// file; every table is bounded by the file's real size and by
/// [`TABLE_LIMIT`], all reads together by [`READ_BUDGET`]; a table over
/// its limit is refused and counted ([`refused`]).
/// A file already looked up (the same interpreter or runtime in every
/// process that maps it) is not read again: the answer is kept by the
/// file's identity and the names asked for ([`LookupCache`]).
pub fn lookup(file: &File, shown: &str, wanted: &[&str]) -> Result<ElfSymbols, String> {
    let key = LookupCache::key(file, wanted);
    if let Some(found) = key.and_then(|k| LookupCache::get(&k)) {
        return Ok(found);
    }
    let found = with_elf(file, shown, Want::Symbols(wanted)).map(|(found, _)| found.unwrap_or_default())?;
    if let Some(k) = key {
        LookupCache::put(k, &found);
    }
    Ok(found)
}

/// The answers of [`lookup`], by file and names asked for. A file is known
/// by its device, inode, size and change times (`ctime` moves with any
/// write, whatever `mtime` is set to), so a file rewritten in place is read
/// again. Only answers are kept, not refusals: each refusal is counted.
/// Bounded: emptied when [`LookupCache::MAX`] files are known.
struct LookupCache;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LookupKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// A hash of the names asked for.
    wanted: u64,
}

static LOOKUPS: std::sync::Mutex<Option<HashMap<LookupKey, ElfSymbols>>> = std::sync::Mutex::new(None);

impl LookupCache {
    const MAX: usize = 256;

    fn key(file: &File, wanted: &[&str]) -> Option<LookupKey> {
        use std::{hash::{Hash, Hasher}, os::unix::fs::MetadataExt};
        let m = file.metadata().ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        wanted.hash(&mut h);
        Some(LookupKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            wanted: h.finish(),
        })
    }

    fn get(k: &LookupKey) -> Option<ElfSymbols> {
        LOOKUPS.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?.get(k).cloned()
    }

    fn put(k: LookupKey, found: &ElfSymbols) {
        let mut g = LOOKUPS.lock().unwrap_or_else(|p| p.into_inner());
        let map = g.get_or_insert_with(HashMap::new);
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(k, found.clone());
    }
}

/// Checks, reading only the headers, that an ELF file's symbol tables are
/// within the file and the limits of [`lookup`] (for a file handed to
/// another parser: blazesym). A refusal is counted.
pub fn check_tables(file: &File, shown: &str) -> Result<(), String> {
    with_elf(file, shown, Want::Check).map(|_| ())
}

/// The link-time address of section `name` (`None` when the file has no
/// such section) and the loadable segments, as [`lookup`] reads them
/// (bounded, symbol tables checked; the symbols themselves not read).
pub fn section_and_segments(file: &File, shown: &str, name: &str) -> Result<(Option<u64>, ElfSymbols), String> {
    let (found, section) = with_elf(file, shown, Want::Section(name))?;
    Ok((section, found.unwrap_or_default()))
}

/// The largest `.note.stapsdt` read (libjvm's, 560 probes, is ~60 KiB).
pub const NOTES_LIMIT: u64 = 4 << 20;

/// The SDT notes of an ELF file (`.note.stapsdt`, at most
/// [`NOTES_LIMIT`]; `None` in `sdt_notes` when the file has none), the
/// address of `.stapsdt.base` (what the notes' addresses are relative to
/// when the file was prelinked), and the loadable segments; read as
/// [`lookup`] reads (bounded, symbol tables checked).
pub fn sdt_notes(file: &File, shown: &str) -> Result<(Option<u64>, ElfSymbols), String> {
    let (found, base) = with_elf(file, shown, Want::Notes)?;
    Ok((base, found.unwrap_or_default()))
}

/// The largest string table [`symbol_names_present`] reads.
pub const SCAN_LIMIT: u64 = 16 << 20;

/// Which of `names` the string tables of the file's symbol tables
/// (`.dynsym`'s, `.symtab`'s) hold, as a string or a string's tail (the
/// linker shares tails: `cudaLaunchKernel` in `__cudaLaunchKernel`): the
/// cheap test before a [`lookup`] (one pass over each table of at most
/// [`SCAN_LIMIT`], no symbol parsed). Quiet: a file that is not ELF, a
/// table out of bounds or over the limit finds nothing, counted nowhere
/// (most files asked about are not what is looked for).
pub fn symbol_names_present(file: &File, names: &[&str]) -> Vec<bool> {
    let mut seen = vec![false; names.len()];
    let Ok(reader) = BlockReader::new(file) else { return seen };
    if !reader.regular {
        return seen;
    }
    let len = reader.len;
    let cache = ReadCache::new(reader);
    let left = Cell::new(READ_BUDGET);
    let data = Bounded { cache: &cache, left: &left };
    match object::FileKind::parse(data) {
        Ok(object::FileKind::Elf64) => names_in::<elf::FileHeader64<Endianness>>(data, len, names, &mut seen),
        Ok(object::FileKind::Elf32) => names_in::<elf::FileHeader32<Endianness>>(data, len, names, &mut seen),
        _ => {}
    }
    seen
}

fn names_in<Elf: FileHeader<Endian = Endianness>>(data: Bounded<'_>, len: u64, names: &[&str], seen: &mut [bool]) {
    let Ok(header) = Elf::parse(data) else { return };
    let Ok(endian) = header.endian() else { return };
    let Ok(sections) = header.sections(endian, data) else { return };
    for section in sections.iter() {
        let kind = section.sh_type(endian);
        if kind != elf::SHT_SYMTAB && kind != elf::SHT_DYNSYM {
            continue;
        }
        let Ok(strings) = sections.section(object::SectionIndex(section.sh_link(endian) as usize)) else { continue };
        let (offset, size): (u64, u64) = (strings.sh_offset(endian).into(), strings.sh_size(endian).into());
        if size > SCAN_LIMIT || offset.checked_add(size).is_none_or(|end| end > len) {
            continue;
        }
        let Ok(bytes) = strings.data(endian, data) else { continue };
        for string in bytes.split(|b| *b == 0) {
            for (i, name) in names.iter().enumerate() {
                seen[i] |= string.ends_with(name.as_bytes());
            }
        }
    }
}

/// What [`with_elf`] reads beyond the headers.
#[derive(Clone, Copy)]
enum Want<'w> {
    /// Nothing: the symbol tables' bounds checked only.
    Check,
    /// These symbols, the segments and `.data`/`.bss`.
    Symbols(&'w [&'w str]),
    /// The address of this section, and the segments.
    Section(&'w str),
    /// `.note.stapsdt`'s bytes, `.stapsdt.base`'s address, the segments.
    Notes,
}

fn with_elf(file: &File, shown: &str, want: Want<'_>) -> Result<(Option<ElfSymbols>, Option<u64>), String> {
    let reader = BlockReader::new(file).map_err(|e| e.to_string())?;
    if !reader.regular {
        return Err(refused::refuse(shown, Refused::NotRegular("not a regular file")).to_string());
    }
    let len = reader.len;
    let cache = ReadCache::new(reader);
    let left = Cell::new(READ_BUDGET);
    let data = Bounded { cache: &cache, left: &left };
    let kind = object::FileKind::parse(data).map_err(|e| e.to_string())?;
    match kind {
        object::FileKind::Elf64 => lookup_in::<elf::FileHeader64<Endianness>>(data, len, shown, want),
        object::FileKind::Elf32 => lookup_in::<elf::FileHeader32<Endianness>>(data, len, shown, want),
        other => Err(format!("not an ELF file ({other:?})")),
    }
}

fn lookup_in<Elf: FileHeader<Endian = Endianness>>(
    data: Bounded<'_>,
    len: u64,
    shown: &str,
    want: Want<'_>,
) -> Result<(Option<ElfSymbols>, Option<u64>), String> {
    let header = Elf::parse(data).map_err(|e| e.to_string())?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    let sections = header.sections(endian, data).map_err(|e| e.to_string())?;
    // Every symbol table and its strings inside the file and within the
    // limit, before anything is read of them.
    for section in sections.iter() {
        let kind = section.sh_type(endian);
        if kind != elf::SHT_SYMTAB && kind != elf::SHT_DYNSYM {
            continue;
        }
        let strings = sections.section(object::SectionIndex(section.sh_link(endian) as usize)).map_err(|e| e.to_string())?;
        for (what, s) in [("ELF symbol table", section), ("ELF string table", strings)] {
            let (offset, size): (u64, u64) = (s.sh_offset(endian).into(), s.sh_size(endian).into());
            if size > TABLE_LIMIT {
                return Err(refused::refuse(shown, Refused::TooLarge { what, size, cap: TABLE_LIMIT }).to_string());
            }
            if s.sh_type(endian) != elf::SHT_NOBITS && offset.checked_add(size).is_none_or(|end| end > len) {
                let detail = format!("{what} at {offset:#x}+{size:#x} ends past the file's {len} bytes");
                return Err(refused::refuse(shown, Refused::Malformed { what: "ELF file", detail }).to_string());
            }
        }
    }
    let (wanted, section): (&[&str], Option<&str>) = match want {
        Want::Check => return Ok((None, None)),
        Want::Symbols(w) => (w, None),
        Want::Section(name) => (&[], Some(name)),
        Want::Notes => (&[], None),
    };
    let mut out = ElfSymbols::default();
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB].into_iter().filter(|_| !wanted.is_empty()) {
        let table = sections.symbols(endian, data, kind).map_err(|e| e.to_string())?;
        if table.is_empty() {
            continue;
        }
        // The string table, read once (a read per name would be one cache
        // entry per symbol).
        let strings = sections.section(table.string_section()).map_err(|e| e.to_string())?;
        let strings = strings.data(endian, data).map_err(|_| format!("{shown}: unreadable ELF string table"))?;
        for sym in table.symbols() {
            if sym.is_undefined(endian) {
                continue;
            }
            let address: u64 = sym.st_value(endian).into();
            if address == 0 {
                continue;
            }
            let Some(name) = name_at(strings, sym.st_name(endian)) else { continue };
            let name = name.split(|b| *b == b'@').next().unwrap_or(name);
            let Ok(name) = std::str::from_utf8(name) else { continue };
            if wanted.contains(&name) && !out.addresses.contains_key(name) {
                out.addresses.insert(name.to_owned(), address);
            }
        }
    }
    let segments = header.program_headers(endian, data).map_err(|e| e.to_string())?;
    out.segments = segments
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| (p.p_vaddr(endian).into(), p.p_memsz(endian).into(), p.p_offset(endian).into()))
        .collect();
    if let Some(name) = section {
        let address = sections.section_by_name(endian, name.as_bytes()).map(|(_, s)| s.sh_addr(endian).into());
        return Ok((Some(out), address));
    }
    if matches!(want, Want::Notes) {
        if let Some((_, s)) = sections.section_by_name(endian, b".note.stapsdt") {
            let (offset, size): (u64, u64) = (s.sh_offset(endian).into(), s.sh_size(endian).into());
            if size > NOTES_LIMIT {
                return Err(refused::refuse(shown, Refused::TooLarge { what: "ELF SDT notes", size, cap: NOTES_LIMIT }).to_string());
            }
            if offset.checked_add(size).is_none_or(|end| end > len) {
                let detail = format!("SDT notes at {offset:#x}+{size:#x} end past the file's {len} bytes");
                return Err(refused::refuse(shown, Refused::Malformed { what: "ELF file", detail }).to_string());
            }
            out.sdt_notes = Some(s.data(endian, data).map_err(|_| format!("{shown}: unreadable SDT notes"))?.to_vec());
        }
        let base = sections.section_by_name(endian, b".stapsdt.base").map(|(_, s)| s.sh_addr(endian).into());
        return Ok((Some(out), base));
    }
    for name in [".data", ".bss"] {
        if let Some((_, s)) = sections.section_by_name(endian, name.as_bytes()) {
            out.data_sections.push((s.sh_addr(endian).into(), s.sh_size(endian).into()));
        }
    }
    Ok((Some(out), None))
}

/// The NUL-terminated name at `offset` of a string table, at most
/// [`NAME_LIMIT`] bytes.
fn name_at(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let rest = strings.get(offset as usize..)?;
    let rest = &rest[..rest.len().min(NAME_LIMIT)];
    let end = rest.iter().position(|b| *b == 0)?;
    Some(&rest[..end])
}

/// The file as `object` reads it, every read bounded: none larger than
/// [`TABLE_LIMIT`], all of them together within a budget. (`object`
/// allocates a read's whole size before reading it: a header claiming
/// gigabytes would be allocated otherwise, a sparse file would even fill
/// it.)
#[derive(Clone, Copy)]
struct Bounded<'a> {
    cache: &'a ReadCache<BlockReader<'a>>,
    left: &'a Cell<u64>,
}

impl Bounded<'_> {
    fn charge(&self, size: u64) -> Result<(), ()> {
        if size > TABLE_LIMIT || size > self.left.get() {
            return Err(());
        }
        self.left.set(self.left.get() - size);
        Ok(())
    }
}

impl<'a> ReadRef<'a> for Bounded<'a> {
    fn len(self) -> Result<u64, ()> {
        self.cache.len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.charge(size)?;
        self.cache.read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let got = self.cache.read_bytes_at_until(range, delimiter)?;
        self.charge(got.len() as u64 + 1)?;
        Ok(got)
    }
}

/// Size of the blocks [`BlockReader`] reads and keeps.
const BLOCK: u64 = 64 * 1024;

/// `Read + Seek` over a file, by whole blocks kept once read: the many
/// small reads of a parser cost one `pread` per block.
struct BlockReader<'a> {
    file: &'a File,
    len: u64,
    regular: bool,
    pos: u64,
    blocks: HashMap<u64, Vec<u8>>,
}

impl<'a> BlockReader<'a> {
    fn new(file: &'a File) -> io::Result<Self> {
        let meta = file.metadata()?;
        Ok(BlockReader { file, len: meta.len(), regular: meta.is_file(), pos: 0, blocks: HashMap::new() })
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
        // A whole table: read as is, not kept twice (the caller keeps it).
        if out.len() as u64 >= BLOCK {
            let n = self.file.read_at(out, pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
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
        let found = lookup(&exe, "/proc/self/exe", &["main", "no_such_symbol_here"]).unwrap();
        let main = found.addresses.get("main").copied().expect("main");
        assert!(!found.addresses.contains_key("no_such_symbol_here"));
        assert!(found.file_offset(main).is_some());
        assert!(!found.segments.is_empty());
        assert!(lookup(&File::open("/proc/self/status").unwrap(), "/proc/self/status", &["main"]).is_err());
        check_tables(&exe, "/proc/self/exe").unwrap();
    }

    /// A sparse file whose `.dynsym` claims 10 GiB (the attack: the old
    /// lookup allocated and read it all) is refused from its headers, at
    /// once and without memory; so is a table claimed past the file's end.
    #[test]
    fn huge_or_truncated_symbol_tables_are_refused() {
        let dir = std::env::temp_dir().join(format!("infertrace-elf-bounds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let before = refused::counts();
        let huge = dir.join("libcudart.so.12");
        infertrace_e2e::sparse_elf(&huge, 10 << 30).unwrap();
        let f = File::open(&huge).unwrap();
        let t = std::time::Instant::now();
        let e = lookup(&f, "/huge", &["cudaMalloc"]).unwrap_err();
        assert!(e.contains("ELF symbol table of 10737418240 bytes is over the 67108864-byte limit"), "{e}");
        assert!(check_tables(&f, "/huge").is_err());
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
        // Within the limit but past the end of the (truncated) file.
        let cut = dir.join("cut.so");
        infertrace_e2e::sparse_elf(&cut, 1 << 20).unwrap();
        File::options().write(true).open(&cut).unwrap().set_len(8192).unwrap();
        let e = lookup(&File::open(&cut).unwrap(), "/cut", &["cudaMalloc"]).unwrap_err();
        assert!(e.contains("ends past the file's 8192 bytes"), "{e}");
        // A table just within the limit is read (zeros: no symbol).
        let ok = dir.join("ok.so");
        infertrace_e2e::sparse_elf(&ok, 24 * 1000).unwrap();
        let found = lookup(&File::open(&ok).unwrap(), "/ok", &["cudaMalloc"]).unwrap();
        assert!(found.addresses.is_empty());
        let after = refused::counts();
        assert!(after[1] >= before[1] + 2 && after[2] > before[2], "{before:?} -> {after:?}");
        // Not a regular file: refused before anything is read.
        let e = lookup(&File::open("/dev/null").unwrap(), "/dev/null", &["x"]).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn symbol_names_are_found_as_strings_or_tails() {
        let f = File::open("/proc/self/exe").unwrap();
        // Our own test binary has a `.symtab` naming `main` (and
        // `__libc_start_main`: `start_main` is a tail).
        assert_eq!(symbol_names_present(&f, &["main", "cudaLaunchKernel", "mai", "start_main"]), [true, false, false, true]);
        let not_elf = File::open("/proc/self/cmdline").unwrap();
        assert_eq!(symbol_names_present(&not_elf, &["main"]), [false]);
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
