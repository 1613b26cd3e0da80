//! Struct member offsets from the kernel's BTF (/sys/kernel/btf/vmlinux).
//! The kernel programs are not CO-RE relocated, so the few kernel struct
//! fields they read (e.g. `task_struct.pid`) get their offsets from here at
//! load time. [`KernelBtf`] reads the file once per recording and keeps
//! both views of it: aya's (for loading `tp_btf` programs) and ours (aya's
//! `Btf` does not expose struct member offsets). Aya's is made again when a
//! program needs it after [`KernelBtf::release`]: it is ~2.5x the raw BTF
//! (13 MB for a 5.5 MB vmlinux), and the agent loads programs rarely once
//! started.

use std::{
    ops::Deref,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

#[derive(Debug, thiserror::Error)]
pub enum BtfOffsetError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("struct {0} not found in BTF")]
    NoStruct(String),
    #[error("member {member} not found in struct {strukt}")]
    NoMember { strukt: String, member: String },
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// Parsed BTF blob, just enough to walk types and names.
pub struct BtfOffsets {
    data: Arc<Vec<u8>>,
    types: (usize, usize),
    strings: (usize, usize),
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl BtfOffsets {
    pub fn load(path: &Path) -> Result<Self, BtfOffsetError> {
        let data = std::fs::read(path)
            .map_err(|source| BtfOffsetError::Read { path: path.display().to_string(), source })?;
        Self::parse(data)
    }

    pub fn parse(data: Vec<u8>) -> Result<Self, BtfOffsetError> {
        let m = BtfOffsetError::Malformed;
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != BTF_MAGIC {
            return Err(m("bad magic (only little-endian BTF is supported)"));
        }
        let hdr_len = u32_at(&data, 4).ok_or(m("header"))? as usize;
        let field = |i: usize| u32_at(&data, 8 + 4 * i).map(|v| v as usize).ok_or(m("header"));
        let (type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let types = (hdr_len + type_off, hdr_len + type_off + type_len);
        let strings = (hdr_len + str_off, hdr_len + str_off + str_len);
        if types.1 > data.len() || strings.1 > data.len() {
            return Err(m("section out of bounds"));
        }
        Ok(Self { data: Arc::new(data), types, strings })
    }

    fn name(&self, off: u32) -> &str {
        let start = self.strings.0 + off as usize;
        let bytes = self.data.get(start..self.strings.1).unwrap_or(&[]);
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..end]).unwrap_or("")
    }

    /// Byte offset of `member` in `struct strukt` (top-level members only).
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfOffsetError> {
        let mut pos = self.types.0;
        let mut found_struct = false;
        while pos + 12 <= self.types.1 {
            let name_off = u32_at(&self.data, pos).ok_or(BtfOffsetError::Malformed("type"))?;
            let info = u32_at(&self.data, pos + 4).ok_or(BtfOffsetError::Malformed("type"))?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let extra = match kind {
                1 | 14 | 17 => 4,         // int, var, decl_tag
                3 => 12,                  // array
                4 | 5 => 12 * vlen,       // struct, union
                6 | 13 => 8 * vlen,       // enum, func_proto
                15 | 19 => 12 * vlen,     // datasec, enum64
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type_tag
                _ => return Err(BtfOffsetError::Malformed("unknown type kind")),
            };
            if kind == KIND_STRUCT && self.name(name_off) == strukt {
                found_struct = true;
                for i in 0..vlen {
                    let m = pos + 12 + 12 * i;
                    let mname = u32_at(&self.data, m).ok_or(BtfOffsetError::Malformed("member"))?;
                    let moff = u32_at(&self.data, m + 8).ok_or(BtfOffsetError::Malformed("member"))?;
                    if self.name(mname) == member {
                        let bits = if kind_flag { moff & 0x00ff_ffff } else { moff };
                        return Ok(bits / 8);
                    }
                }
            }
            pos += 12 + extra;
        }
        if found_struct {
            Err(BtfOffsetError::NoMember { strukt: strukt.to_owned(), member: member.to_owned() })
        } else {
            Err(BtfOffsetError::NoStruct(strukt.to_owned()))
        }
    }
}

/// The kernel's BTF, read once: aya's parse and the member-offset index.
pub struct KernelBtf {
    pub path: PathBuf,
    pub btf: LazyBtf,
    pub offsets: BtfOffsets,
}

impl KernelBtf {
    /// Reads and parses `path`; the error is one line.
    pub fn load(path: &Path) -> Result<Self, String> {
        let data = std::fs::read(path).map_err(|e| e.to_string())?;
        let parsed = aya::Btf::parse(&data, aya::Endianness::default()).map_err(|e| e.to_string())?;
        let offsets = BtfOffsets::parse(data).map_err(|e| e.to_string())?;
        let btf = LazyBtf { raw: Arc::clone(&offsets.data), parsed: OnceLock::from(parsed) };
        Ok(KernelBtf { path: path.to_owned(), btf, offsets })
    }

    /// Drops aya's parse (the raw BTF and the offsets stay); the next
    /// program that needs it parses the raw BTF again.
    pub fn release(&mut self) {
        self.btf.parsed.take();
    }
}

/// Aya's parse of the kernel BTF, made from the raw BTF when first used.
pub struct LazyBtf {
    raw: Arc<Vec<u8>>,
    parsed: OnceLock<aya::Btf>,
}

impl Deref for LazyBtf {
    type Target = aya::Btf;

    fn deref(&self) -> &aya::Btf {
        self.parsed.get_or_init(|| {
            // The same bytes parsed without error in `KernelBtf::load`, and
            // the parse depends on nothing else.
            aya::Btf::parse(&self.raw, aya::Endianness::default()).expect("the kernel BTF parsed at load parses again")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_struct_pid_tgid_are_adjacent() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            infertrace_e2e::skip("task_struct_pid_tgid_are_adjacent", "kernel BTF (/sys/kernel/btf/vmlinux)");
            return;
        }
        let btf = BtfOffsets::load(path).unwrap();
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        assert_eq!(tgid, pid + 4);
        assert!(matches!(btf.member_offset("task_struct", "no_such_member"), Err(BtfOffsetError::NoMember { .. })));
        assert!(matches!(btf.member_offset("no_such_struct_xyz", "a"), Err(BtfOffsetError::NoStruct(_))));
    }

    #[test]
    fn rejects_garbage() {
        assert!(BtfOffsets::parse(vec![0; 10]).is_err());
        assert!(BtfOffsets::parse(vec![0; 64]).is_err());
    }
}
