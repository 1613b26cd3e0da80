//! Code objects read from the process and frame resolution: a frame the
//! kernel captured (code object address, instruction, `co_firstlineno`
//! checksum) becomes (qualified function, file, line), through a cache of
//! code objects and their line tables.

use std::collections::HashMap;

use super::{
    layout::{self, InstrKind},
    linetable,
    proc::{le_u32, le_u64},
    Interpreter, PythonError,
};
use crate::recording::{Frame, FrameKind};

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
}

impl Interpreter {
    fn read_code(&self, code: u64) -> Result<CodeInfo, PythonError> {
        let o = &self.offsets;
        let buf = self.mem.bytes(code, o.code_read_len())?;
        if let Some(ty) = self.code_type {
            let got = le_u64(&buf, layout::OB_TYPE);
            if got != ty {
                return Err(self.layout_err(format!("{code:#x} is not a code object (type {got:#x})")));
            }
        }
        let name_ptr = le_u64(&buf, o.code_qualname.unwrap_or(o.code_name));
        let name = match self.read_str(name_ptr) {
            Ok(n) => n,
            // A qualname can be missing on odd code objects; the name will do.
            Err(_) if o.code_qualname.is_some() => self.read_str(le_u64(&buf, o.code_name))?,
            Err(e) => return Err(e),
        };
        Ok(CodeInfo {
            name,
            filename: self.read_str(le_u64(&buf, o.code_filename))?,
            firstlineno: le_u32(&buf, o.code_firstlineno) as i32,
            table: self.read_bytes(le_u64(&buf, o.code_linetable))?,
            code_start: code + o.code_adaptive.unwrap_or(0),
            lines: HashMap::new(),
        })
    }

    /// A `str` object (compact ASCII, compact, or legacy).
    fn read_str(&self, addr: u64) -> Result<String, PythonError> {
        let o = &self.offsets;
        let hdr = self.mem.bytes(addr, o.unicode_compact_data as usize + 8)?;
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
        let raw = self.mem.bytes(data, (len * kind) as usize)?;
        Ok(match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => char::decode_utf16(raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        })
    }

    /// A `bytes` object's contents.
    fn read_bytes(&self, addr: u64) -> Result<Vec<u8>, PythonError> {
        let len = self.mem.u64(addr + layout::OB_SIZE)?;
        if len > MAX_TABLE {
            return Err(self.layout_err(format!("{addr:#x}: bytes of length {len}")));
        }
        self.mem.bytes(addr + layout::BYTES_DATA, len as usize)
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
            let info = self.read_code(code).ok().filter(|c| c.firstlineno as u32 == checksum);
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
                let l = linetable::line_for(format, &info.table, info.firstlineno, addr);
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
