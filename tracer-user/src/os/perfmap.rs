//! JIT symbol maps: `/tmp/perf-PID.map`, the convention of `perf` for code
//! generated at run time (CPython 3.12+ with `-X perf` or
//! `PYTHONPERFSUPPORT=1`, oneDNN with `ONEDNN_JIT_PROFILE`, the JVM with a
//! perf-map agent, Node with `--perf-basic-prof`): one symbol per line,
//! `START SIZE NAME`, START and SIZE in hex (with or without `0x`).
//!
//! The file is the target's: read inside its root (a container's `/tmp`),
//! by its own pid there (`NSpid`), no link followed out of the root, at most
//! [`MAX_BYTES`] and [`MAX_SYMBOLS`]; a line that does not parse is
//! skipped.

use std::{
    fs::File,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::PathBuf,
};

use super::procfs;

/// A perf map bigger than this is not read (refused and counted).
pub const MAX_BYTES: u64 = 64 << 20;
/// Symbols kept from one map.
pub const MAX_SYMBOLS: usize = 1 << 20;
/// Longest name kept (longer ones are cut).
const MAX_NAME: usize = 512;

/// The symbols of one perf map, by start address.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PerfMap {
    /// (start, end, name), sorted by start.
    symbols: Vec<(u64, u64, String)>,
    /// The file's size when read: a map that grew is read again.
    bytes: u64,
}

impl PerfMap {
    /// Parses the text of a perf map (at most [`MAX_SYMBOLS`] symbols).
    pub fn parse(text: &[u8]) -> PerfMap {
        let mut symbols = Vec::new();
        for line in text.split(|b| *b == b'\n') {
            if symbols.len() >= MAX_SYMBOLS {
                break;
            }
            if let Some(s) = parse_line(line) {
                symbols.push(s);
            }
        }
        // Later lines win for one start (a JIT that reused an address).
        symbols.reverse();
        symbols.sort_by_key(|s| s.0);
        symbols.dedup_by_key(|s| s.0);
        PerfMap { symbols, bytes: text.len() as u64 }
    }

    /// The name of the symbol that holds `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= addr);
        let (start, end, name) = self.symbols.get(i.checked_sub(1)?)?;
        (*start <= addr && addr < *end).then_some(name.as_str())
    }
}

fn parse_line(line: &[u8]) -> Option<(u64, u64, String)> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.splitn(3, ' ');
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x").trim_start_matches("0X"), 16).ok();
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    if size == 0 || name.is_empty() {
        return None;
    }
    let end = start.checked_add(size)?;
    let mut name = name.to_owned();
    if name.len() > MAX_NAME {
        let mut cut = MAX_NAME;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
        name.push('…');
    }
    Some((start, end, name))
}

/// Where process `pid`'s perf map is, as it sees it: `/tmp/perf-N.map`
/// with N its pid in its own namespace.
fn path_of(pid: u32) -> PathBuf {
    let inner = procfs::nspid(pid, pid).and_then(|ids| ids.last().copied()).unwrap_or(pid);
    PathBuf::from(format!("/tmp/perf-{inner}.map"))
}

/// Where to read one process's perf map from, taken while it lives: its
/// root directory held open (a descriptor to the directory itself, valid
/// after the process exits: a JIT writes the map as it runs, and a
/// launched command's stacks may be named after it ended) and the map's
/// path inside it.
#[derive(Debug)]
pub struct Source {
    root: Option<File>,
    pid: u32,
    path: PathBuf,
    shown: String,
}

impl Source {
    /// The source of process `pid`'s perf map; `hold` keeps its root open
    /// (one descriptor) so that the map can be read after it exits.
    pub fn of(pid: u32, hold: bool) -> Source {
        let root = hold.then(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(format!("/proc/{pid}/root"))
                .ok()
        });
        let path = path_of(pid);
        let shown = format!("pid {pid}: {}", path.display());
        Source { root: root.flatten(), pid, path, shown }
    }

    fn root(&self) -> PathBuf {
        match &self.root {
            Some(f) => PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
            None => PathBuf::from(format!("/proc/{}/root", self.pid)),
        }
    }

    /// Reads the map unless it still has the size of `known` (`None`: it
    /// is unchanged, or there is none, or it is unreadable, or refused: too
    /// big, not a regular file).
    pub fn load_changed(&self, known: Option<&PerfMap>) -> Option<PerfMap> {
        let file = procfs::open_in_root(&self.root(), &self.path).ok()?;
        if known.is_some_and(|m| file.metadata().is_ok_and(|md| md.len() == m.bytes)) {
            return None;
        }
        let text = procfs::read_capped(&file, &self.shown, "perf map", MAX_BYTES).ok()?;
        Some(PerfMap::parse(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpython_and_hex_prefixed_lines() {
        let text = b"7f4e734b67b1 b py::spin_perf:/tmp/pm.py\n0x1000 0x20 jitted code with spaces\nbad line\n2000 0 empty\nzz 10 x\n3000 10 \n";
        let m = PerfMap::parse(text);
        assert_eq!(m.symbols.len(), 2, "{m:?}");
        assert_eq!(m.lookup(0x7f4e734b67b1), Some("py::spin_perf:/tmp/pm.py"));
        assert_eq!(m.lookup(0x7f4e734b67bb), Some("py::spin_perf:/tmp/pm.py"));
        assert_eq!(m.lookup(0x7f4e734b67bc), None);
        assert_eq!(m.lookup(0x101f), Some("jitted code with spaces"));
        assert_eq!((m.lookup(0x1020), m.lookup(0xfff), m.lookup(0)), (None, None, None));
    }

    #[test]
    fn later_lines_win_and_hostile_lines_are_bounded() {
        let m = PerfMap::parse(b"1000 10 old\n1000 10 new\nffffffffffffffff 10 wraps\n");
        assert_eq!((m.lookup(0x1000), m.symbols.len()), (Some("new"), 1));
        let long = format!("1000 10 {}\n", "é".repeat(1000));
        let m = PerfMap::parse(long.as_bytes());
        let name = m.lookup(0x1000).unwrap_or_default();
        assert!(name.len() <= MAX_NAME + '…'.len_utf8() && name.ends_with('…'), "{}", name.len());
    }
}
