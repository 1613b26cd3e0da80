//! Code objects read from the process and frame resolution: a frame the
//! kernel captured (code object address, instruction, `co_firstlineno`
//! checksum) becomes (qualified function, file, line), through a cache of
//! code objects and their line tables.

use std::collections::HashMap;

use tracer_common::python::PyCodeRaw;

use super::{
    captured::Captured,
    layout::{self, InstrKind},
    linetable,
    proc::{le_u32, le_u64, ReadMem},
    Interpreter, PythonError,
};
use crate::{engine::Topic, recording::{Frame, FrameKind}};

/// Function name of a frame whose code object could not be read (or no
/// longer matches what the kernel saw).
pub const UNKNOWN_FUNCTION: &str = "[unknown]";

/// Longest string / byte table read from the process.
const MAX_STRING: u64 = 1 << 16;
const MAX_TABLE: u64 = 1 << 20;
/// Code objects cached before the cache is reset.
const MAX_CACHED_CODES: usize = 1 << 16;

/// A code object as read from the process.
#[derive(Debug)]
pub(super) struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    name: String,
    filename: String,
    firstlineno: i32,
    table: Vec<u8>,
    /// Address of the first code unit (3.11+: `code + co_code_adaptive`).
    code_start: u64,
    /// Line per instruction value already asked for.
    lines: HashMap<u64, Option<u32>>,
    /// Decoded from a kernel copy that cut the file name or the line table.
    partial: bool,
}

/// Why a code object's frames could not be resolved (counted per code
/// object, reported per process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unresolved {
    /// The process was gone when its stacks were resolved and the kernel
    /// had no copy of the code object (its copy map was full).
    ExitedNoCopy,
    /// The kernel's copy lacked the code object itself (unreadable then).
    CopyUnreadable,
    /// A different code object is now at that address (the kernel's
    /// `co_firstlineno` differs) and there is no copy.
    Replaced,
    /// The process's memory could not be read there.
    Unreadable,
}

impl Unresolved {
    pub fn describe(self) -> &'static str {
        match self {
            Unresolved::ExitedNoCopy => "process gone and no kernel copy (copy map full)",
            Unresolved::CopyUnreadable => "kernel copy unreadable",
            Unresolved::Replaced => "code object freed and its address reused",
            Unresolved::Unreadable => "memory unreadable",
        }
    }
}

impl Interpreter {
    fn read_code(&self, m: &impl ReadMem, code: u64) -> Result<CodeInfo, PythonError> {
        let o = &self.offsets;
        let buf = m.bytes(code, o.code_read_len())?;
        if let Some(ty) = self.code_type {
            let got = le_u64(&buf, layout::OB_TYPE);
            if got != ty {
                return Err(self.layout_err(format!("{code:#x} is not a code object (type {got:#x})")));
            }
        }
        let name_ptr = le_u64(&buf, o.code_qualname.unwrap_or(o.code_name));
        let (name, name_cut) = match self.read_str(m, name_ptr) {
            Ok(n) => n,
            // A qualname can be missing on odd code objects; the name will do.
            Err(_) if o.code_qualname.is_some() => self.read_str(m, le_u64(&buf, o.code_name))?,
            Err(e) => return Err(e),
        };
        let (filename, file_cut) = self.read_str(m, le_u64(&buf, o.code_filename))?;
        let (table, table_cut) = self.read_bytes(m, le_u64(&buf, o.code_linetable))?;
        Ok(CodeInfo {
            name,
            filename,
            firstlineno: le_u32(&buf, o.code_firstlineno) as i32,
            table,
            code_start: code + o.code_adaptive.unwrap_or(0),
            lines: HashMap::new(),
            partial: name_cut || file_cut || table_cut,
        })
    }

    /// A `str` object (compact ASCII, compact, or legacy), and whether it
    /// was cut (a kernel copy shorter than the string: its text ends in `…`).
    pub(super) fn read_str(&self, m: &impl ReadMem, addr: u64) -> Result<(String, bool), PythonError> {
        let o = &self.offsets;
        let hdr = m.bytes(addr, o.unicode_compact_data as usize + 8)?;
        let len = le_u64(&hdr, layout::UNICODE_LENGTH);
        let state = le_u32(&hdr, layout::UNICODE_STATE);
        let kind = u64::from((state >> 2) & 7);
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        if len > MAX_STRING || !matches!(kind, 1 | 2 | 4) {
            return Err(self.layout_err(format!("{addr:#x} is not a str (length {len}, kind {kind})")));
        }
        let data = match (compact, ascii) {
            (true, true) => addr + o.unicode_ascii_data,
            (true, false) => addr + o.unicode_compact_data,
            // Legacy string: `data.any` follows the compact header.
            (false, _) => le_u64(&hdr, o.unicode_compact_data),
        };
        let want = (len * kind) as usize;
        let raw = m.bytes(data, want)?;
        let cut = raw.len() < want;
        let mut text: String = match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => char::decode_utf16(raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        };
        if cut {
            text.push('…');
        }
        Ok((text, cut))
    }

    /// A `bytes` object's contents, and whether they were cut (a kernel
    /// copy shorter than the object).
    fn read_bytes(&self, m: &impl ReadMem, addr: u64) -> Result<(Vec<u8>, bool), PythonError> {
        let len = m.u64(addr + layout::OB_SIZE)?;
        if len > MAX_TABLE {
            return Err(self.layout_err(format!("{addr:#x}: bytes of length {len}")));
        }
        let b = m.bytes(addr + layout::BYTES_DATA, len as usize)?;
        let cut = (b.len() as u64) < len;
        Ok((b, cut))
    }

    /// Takes the kernel's copy of code object `code` (`co_firstlineno`
    /// `checksum`): it resolves the object's frames from now on. The copy
    /// was taken when a stack held the object, so it wins over an earlier
    /// read of that address (a module's top-level code is freed once it
    /// has run, and the next one, with the same first line, often takes
    /// its place); a copy that cut the file name or the line table gives
    /// way to a complete read. Returns whether a code object left
    /// unresolved until now resolves from the copy (the stacks that hold
    /// it are worth resolving again).
    pub fn add_captured(&mut self, code: u64, checksum: u32, raw: &PyCodeRaw) -> bool {
        let key = (code, checksum);
        let copy = Captured::new(self.pid, raw);
        let decoded = if copy.has_code() { self.read_code(&copy, code).ok() } else { None };
        let Some(info) = decoded.filter(|c| c.firstlineno as u32 == checksum) else {
            self.bad_copies.insert(key);
            if let Some(cause) = self.unresolved.get_mut(&key) {
                *cause = Unresolved::CopyUnreadable;
            }
            return false;
        };
        if info.partial && matches!(self.codes.get(&key), Some(Some(c)) if !c.partial) {
            return false;
        }
        let info = if info.partial {
            match self.read_code(&self.mem, code) {
                Ok(live) if live.firstlineno as u32 == checksum => live,
                _ => info,
            }
        } else {
            info
        };
        if self.codes.len() >= MAX_CACHED_CODES {
            self.codes.clear();
        }
        let was_unresolved = self.unresolved.remove(&key).is_some() | matches!(self.codes.get(&key), Some(None));
        if info.partial {
            self.partial_codes.insert(key);
        } else {
            self.partial_codes.remove(&key);
        }
        self.codes.insert(key, Some(info));
        was_unresolved
    }

    /// Why code object `key` could not be read live.
    fn unresolved_cause(&self, key: (u64, u32), live: &Result<CodeInfo, PythonError>) -> Unresolved {
        if self.bad_copies.contains(&key) {
            return Unresolved::CopyUnreadable;
        }
        match live {
            Ok(_) => Unresolved::Replaced,
            Err(_) if !crate::os::procfs::is_alive(self.pid) => Unresolved::ExitedNoCopy,
            Err(_) => Unresolved::Unreadable,
        }
    }

    /// One note per cause of unresolved code objects and a detail for the
    /// objects resolved from cut copies; empty when all resolved fully.
    pub fn resolution_problems(&self) -> Vec<(Topic, String)> {
        let mut out = Vec::new();
        let mut by_cause = self.unresolved_more.clone();
        for cause in self.unresolved.values() {
            *by_cause.entry(*cause).or_insert(0) += 1;
        }
        if !by_cause.is_empty() {
            let total: u64 = by_cause.values().sum();
            let causes: Vec<String> = by_cause.iter().map(|(c, n)| format!("{n} {}", c.describe())).collect();
            out.push((Topic::General, format!(
                "{total} Python code objects could not be resolved (their frames show as [unknown]): {}",
                causes.join(", ")
            )));
        }
        if !self.partial_codes.is_empty() {
            out.push((Topic::Detail, format!(
                "{} Python code objects were resolved from kernel copies that cut their file name or line table (the process had exited): a file name ends in …, a line past the copy is unknown",
                self.partial_codes.len()
            )));
        }
        out
    }

    /// Resolves one frame captured by the kernel: the code object address,
    /// the raw value at `layout().frame_instr` (the int `f_lasti` up to
    /// 3.10, zero- or sign-extended; the instruction pointer from 3.11) and
    /// the `co_firstlineno` the kernel read (checksum). Code objects are
    /// cached by (address, checksum); when the code object now at that
    /// address has another `co_firstlineno` (freed, address reused), or
    /// cannot be read, the frame is `[unknown]` (kind Python, no file).
    pub fn resolve_frame(&mut self, code: u64, instr: u64, checksum: u32) -> Frame {
        let key = (code, checksum);
        if !self.codes.contains_key(&key) {
            if self.codes.len() >= MAX_CACHED_CODES {
                self.codes.clear();
            }
            let live = self.read_code(&self.mem, code);
            let info = match live {
                Ok(c) if c.firstlineno as u32 == checksum => Some(c),
                ref other => {
                    let cause = self.unresolved_cause(key, other);
                    if self.unresolved.len() < MAX_CACHED_CODES || self.unresolved.contains_key(&key) {
                        self.unresolved.insert(key, cause);
                    } else {
                        *self.unresolved_more.entry(cause).or_insert(0) += 1;
                    }
                    None
                }
            };
            self.codes.insert(key, info);
        }
        let kind = self.offsets.instr_kind;
        let format = self.offsets.line_format;
        let Some(Some(info)) = self.codes.get_mut(&key) else {
            return Frame {
                function: UNKNOWN_FUNCTION.to_string(),
                file: None,
                line: None,
                kind: FrameKind::Python,
                module: None,
            };
        };
        let line = match info.lines.get(&instr) {
            Some(&l) => l,
            None => {
                let addr = match kind {
                    InstrKind::LastiBytes => i64::from(instr as u32 as i32),
                    InstrKind::LastiUnits => i64::from(instr as u32 as i32) * 2,
                    InstrKind::Pointer => instr.wrapping_sub(info.code_start) as i64,
                };
                let l = if info.partial {
                    linetable::line_for_prefix(format, &info.table, info.firstlineno, addr)
                } else {
                    linetable::line_for(format, &info.table, info.firstlineno, addr)
                };
                if info.lines.len() < 4096 {
                    info.lines.insert(instr, l);
                }
                l
            }
        };
        Frame {
            function: info.name.clone(),
            file: Some(info.filename.clone()),
            line,
            kind: FrameKind::Python,
            module: None,
        }
    }
}
