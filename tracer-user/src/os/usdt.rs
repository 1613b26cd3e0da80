//! USDT probes: the SystemTap SDT notes (`.note.stapsdt`) a library or
//! program carries for each `DTRACE_PROBE`/`STAP_PROBE` site (CPython's
//! `python:gc__start`, PyTorch's `pytorch:malloc` in `libc10_cuda.so`,
//! the JVM's). Each note names the probe, its address, its semaphore (a
//! counter the probe site tests: zero, the arguments are not even
//! computed) and where each argument is at the probe, in the assembler's
//! operand syntax (`8@%rdi`, `-4@112(%rsp)`, `8@$5`). What is read here:
//! the file offsets a uprobe and its reference counter take, and each
//! argument's location, for the kernel side to read.

use std::fs::File;

use crate::os::elf;

/// Where one argument is at the probe's address (x86-64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgLocation {
    /// In a register: its offset in `struct pt_regs`.
    Register { pt_regs_offset: u16 },
    /// In memory at a register plus a displacement.
    Memory { pt_regs_offset: u16, displacement: i64 },
    /// A constant.
    Constant(i64),
}

/// One argument: its size in bytes (1, 2, 4, 8), whether it is signed,
/// and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsdtArg {
    pub size: u8,
    pub signed: bool,
    pub location: ArgLocation,
}

/// One probe site of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// File offset of the probe's instruction (what a uprobe takes).
    pub offset: u64,
    /// File offset of its semaphore (a uprobe's reference counter), when
    /// it has one.
    pub semaphore_offset: Option<u64>,
    /// Its arguments, or why they cannot be read here (another
    /// architecture's syntax, an indexed operand: a caller that needs no
    /// arguments may still attach the probe).
    pub args: Result<Vec<UsdtArg>, String>,
    /// The arguments as the note spells them (for messages).
    pub arg_spec: String,
}

/// `NT_STAPSDT`.
const NT_STAPSDT: u32 = 3;

/// The probes of an ELF file (64-bit): none when it has no SDT notes.
pub fn probes(file: &File, shown: &str) -> Result<Vec<UsdtProbe>, String> {
    let (base, found) = elf::sdt_notes(file, shown)?;
    let Some(bytes) = found.sdt_notes.as_deref() else { return Ok(Vec::new()) };
    Ok(notes(bytes)
        .into_iter()
        .filter_map(|n| {
            // Prelinked files: the note's addresses are relative to the
            // `.stapsdt.base` it recorded.
            let shift = |addr: u64| match base {
                Some(b) if n.base != 0 => addr.wrapping_add(b).wrapping_sub(n.base),
                _ => addr,
            };
            let offset = found.file_offset(shift(n.pc))?;
            let semaphore_offset = (n.semaphore != 0).then(|| found.file_offset(n.semaphore)).flatten();
            let args = parse_args(&n.args);
            Some(UsdtProbe { provider: n.provider, name: n.name, offset, semaphore_offset, args, arg_spec: n.args })
        })
        .collect())
}

/// One `NT_STAPSDT` note, as written.
#[derive(Debug, PartialEq, Eq)]
struct RawNote {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
    args: String,
}

/// The `stapsdt` notes of a `.note.stapsdt` section (64-bit, little
/// endian); malformed notes end the walk (what came before is kept).
fn notes(mut bytes: &[u8]) -> Vec<RawNote> {
    let u32_at = |b: &[u8], i: usize| b.get(i..i + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    let u64_at = |b: &[u8], i: usize| b.get(i..i + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])));
    let pad4 = |n: usize| n.div_ceil(4) * 4;
    let mut out = Vec::new();
    while bytes.len() >= 12 {
        let (Some(namesz), Some(descsz), Some(kind)) = (u32_at(bytes, 0), u32_at(bytes, 4), u32_at(bytes, 8)) else { break };
        let (namesz, descsz) = (namesz as usize, descsz as usize);
        let name_end = 12 + pad4(namesz);
        let desc_end = name_end.saturating_add(pad4(descsz));
        if desc_end > bytes.len() || namesz > 64 {
            break;
        }
        let owner = &bytes[12..12 + namesz];
        let desc = &bytes[name_end..name_end + descsz];
        bytes = &bytes[desc_end..];
        if kind != NT_STAPSDT || owner.strip_suffix(&[0]).unwrap_or(owner) != b"stapsdt" || desc.len() < 24 {
            continue;
        }
        let (Some(pc), Some(base), Some(semaphore)) = (u64_at(desc, 0), u64_at(desc, 8), u64_at(desc, 16)) else { continue };
        let mut strings = desc[24..].split(|b| *b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
        let (Some(provider), Some(name)) = (strings.next(), strings.next()) else { continue };
        let args = strings.next().unwrap_or_default();
        out.push(RawNote { pc, base, semaphore, provider, name, args });
    }
    out
}

/// x86-64 registers by name (64, 32, 16, 8-bit forms): their offset in
/// `struct pt_regs`.
fn register(name: &str) -> Option<u16> {
    const REGS: [(&[&str], u16); 17] = [
        (&["r15", "r15d", "r15w", "r15b"], 0),
        (&["r14", "r14d", "r14w", "r14b"], 8),
        (&["r13", "r13d", "r13w", "r13b"], 16),
        (&["r12", "r12d", "r12w", "r12b"], 24),
        (&["rbp", "ebp", "bp", "bpl"], 32),
        (&["rbx", "ebx", "bx", "bl", "bh"], 40),
        (&["r11", "r11d", "r11w", "r11b"], 48),
        (&["r10", "r10d", "r10w", "r10b"], 56),
        (&["r9", "r9d", "r9w", "r9b"], 64),
        (&["r8", "r8d", "r8w", "r8b"], 72),
        (&["rax", "eax", "ax", "al", "ah"], 80),
        (&["rcx", "ecx", "cx", "cl", "ch"], 88),
        (&["rdx", "edx", "dx", "dl", "dh"], 96),
        (&["rsi", "esi", "si", "sil"], 104),
        (&["rdi", "edi", "di", "dil"], 112),
        (&["rip", "eip"], 128),
        (&["rsp", "esp", "sp", "spl"], 152),
    ];
    REGS.iter().find(|(names, _)| names.contains(&name)).map(|(_, off)| *off)
}

/// The arguments of an x86-64 note: space-separated `[-]SIZE@OPERAND`,
/// operands `%reg`, `$imm`, `disp(%reg)` (`(%reg)` with no displacement).
pub fn parse_args(spec: &str) -> Result<Vec<UsdtArg>, String> {
    spec.split_whitespace().map(parse_arg).collect()
}

fn parse_arg(arg: &str) -> Result<UsdtArg, String> {
    let bad = |why: &str| format!("USDT argument `{arg}`: {why}");
    let (size, operand) = arg.split_once('@').ok_or_else(|| bad("no `SIZE@`"))?;
    let size: i8 = size.parse().map_err(|_| bad("bad size"))?;
    let (signed, size) = (size < 0, size.unsigned_abs());
    if ![1, 2, 4, 8].contains(&size) {
        return Err(bad("size not 1, 2, 4 or 8"));
    }
    let location = if let Some(reg) = operand.strip_prefix('%') {
        ArgLocation::Register { pt_regs_offset: register(reg).ok_or_else(|| bad("unknown register"))? }
    } else if let Some(imm) = operand.strip_prefix('$') {
        ArgLocation::Constant(parse_int(imm).ok_or_else(|| bad("bad constant"))?)
    } else if let Some((disp, rest)) = operand.split_once("(%") {
        let reg = rest.strip_suffix(')').ok_or_else(|| bad("unclosed operand"))?;
        if reg.contains(',') {
            return Err(bad("indexed operands are not supported"));
        }
        let displacement = if disp.is_empty() { 0 } else { parse_int(disp).ok_or_else(|| bad("bad displacement"))? };
        ArgLocation::Memory { pt_regs_offset: register(reg).ok_or_else(|| bad("unknown register"))?, displacement }
    } else {
        return Err(bad("not an x86-64 operand"));
    };
    Ok(UsdtArg { size, signed, location })
}

/// A decimal or `0x` hexadecimal integer, maybe negative.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = match digits.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None => digits.parse::<i64>().ok()?,
    };
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_of_the_assembler() {
        let a = parse_args("8@%rdi -4@%esi 8@-16(%rbp) -4@112(%rsp) 8@$5 1@(%rax) 4@$-0x10").unwrap();
        assert_eq!(a[0], UsdtArg { size: 8, signed: false, location: ArgLocation::Register { pt_regs_offset: 112 } });
        assert_eq!(a[1], UsdtArg { size: 4, signed: true, location: ArgLocation::Register { pt_regs_offset: 104 } });
        assert_eq!(a[2].location, ArgLocation::Memory { pt_regs_offset: 32, displacement: -16 });
        assert_eq!(a[3].location, ArgLocation::Memory { pt_regs_offset: 152, displacement: 112 });
        assert_eq!(a[4].location, ArgLocation::Constant(5));
        assert_eq!(a[5].location, ArgLocation::Memory { pt_regs_offset: 80, displacement: 0 });
        assert_eq!(a[6].location, ArgLocation::Constant(-16));
        assert!(parse_args("").unwrap().is_empty());
        for bad in ["8@%xmm0", "3@%rax", "8@x0", "8@[sp, 8]", "8@8(%rax,%rbx,2)", "rax", "8@(%rax"] {
            assert!(parse_args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn notes_are_walked_and_odd_ones_skipped() {
        let note = |owner: &[u8], kind: u32, desc: &[u8]| {
            let mut v = Vec::new();
            v.extend((owner.len() as u32).to_le_bytes());
            v.extend((desc.len() as u32).to_le_bytes());
            v.extend(kind.to_le_bytes());
            v.extend(owner);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v.extend(desc);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v
        };
        let mut desc = Vec::new();
        desc.extend(0x1000u64.to_le_bytes());
        desc.extend(0x2000u64.to_le_bytes());
        desc.extend(0x3000u64.to_le_bytes());
        desc.extend(b"pytorch\0malloc\08@%rdi -4@%esi 8@%rdx 8@%rcx\0");
        let mut bytes = note(b"GNU\0", 1, &[0; 16]);
        bytes.extend(note(b"stapsdt\0", NT_STAPSDT, &desc));
        bytes.extend([1, 2, 3]);
        let n = notes(&bytes);
        assert_eq!(n.len(), 1);
        assert_eq!((n[0].pc, n[0].base, n[0].semaphore), (0x1000, 0x2000, 0x3000));
        assert_eq!((n[0].provider.as_str(), n[0].name.as_str()), ("pytorch", "malloc"));
        assert_eq!(parse_args(&n[0].args).unwrap().len(), 4);
        // A note claiming more than there is ends the walk.
        let mut cut = note(b"stapsdt\0", NT_STAPSDT, &desc);
        cut.truncate(cut.len() - 8);
        assert!(notes(&cut).is_empty());
    }

    /// Debian's python3 is built with `--with-dtrace`: its notes, read as
    /// `readelf -n` shows them (an independent reader).
    #[test]
    fn debians_python_has_its_probes() {
        let path = std::path::Path::new("/usr/bin/python3");
        let Ok(file) = File::open(path) else {
            infertrace_e2e::skip("debians_python_has_its_probes", "/usr/bin/python3 (Debian's python3)");
            return;
        };
        let found = probes(&file, "python3").expect("readable");
        let readelf = std::process::Command::new("readelf").args(["-n", "--wide"]).arg(path).output().expect("readelf (binutils)");
        let text = String::from_utf8_lossy(&readelf.stdout);
        let names: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("Name: ")).collect();
        if names.is_empty() {
            infertrace_e2e::skip("debians_python_has_its_probes", "a python3 built with SDT notes");
            return;
        }
        assert_eq!(found.len(), names.len(), "{found:?}");
        let gc = found.iter().find(|p| p.provider == "python" && p.name == "gc__start").expect("python:gc__start");
        assert!(gc.semaphore_offset.is_some(), "gc__start has a semaphore");
        assert_eq!(gc.args.as_ref().map(Vec::len), Ok(1));
        assert!(found.iter().all(|p| p.args.is_ok() && p.offset > 0), "{found:?}");
        // The semaphore's file offset, by `.probes`' address and offset in `readelf -S`.
        let sections = std::process::Command::new("readelf").args(["-S", "--wide"]).arg(path).output().expect("readelf");
        let sections = String::from_utf8_lossy(&sections.stdout);
        let probes_line = sections.lines().find(|l| l.contains(" .probes ")).expect(".probes section");
        let f: Vec<&str> = probes_line.split_whitespace().collect();
        let at = f.iter().position(|w| *w == ".probes").unwrap();
        let (addr, off) = (u64::from_str_radix(f[at + 2], 16).unwrap(), u64::from_str_radix(f[at + 3], 16).unwrap());
        let sema = text.lines().skip_while(|l| !l.contains("Name: gc__start")).find_map(|l| l.split("Semaphore: ").nth(1)).unwrap();
        let sema = u64::from_str_radix(sema.trim().trim_start_matches("0x"), 16).unwrap();
        assert_eq!(gc.semaphore_offset, Some(sema - addr + off));
    }
}
