//! Timing our own calls with and without a probe on them: the function
//! the calibration uprobes ([`infertrace_calibration_target`]), its place
//! in our binary, and loops that time it and `getppid`. Used at startup by
//! the overhead family and by the CUDA launch slicer.

use std::{hint::black_box, time::Instant};

/// The function the calibration uprobes: never inlined, exported so that
/// it keeps a symbol and an address of its own.
#[no_mangle]
#[inline(never)]
pub extern "C" fn infertrace_calibration_target(x: u64) -> u64 {
    black_box(x).wrapping_add(1)
}

/// ns per call of `n` calls of the target.
pub fn time_target(n: u32) -> f64 {
    time_class(TrapClass::Stepped, n)
}

/// ns per call of `n` getppid calls.
pub fn time_getppid(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no arguments and cannot fail.
        black_box(unsafe { libc::getppid() });
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The fastest round: what the mechanism costs with nothing else in its
/// way (other load on the machine only ever adds time to a round).
pub fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().min_by(f64::total_cmp).unwrap_or(0.0)
}

/// How the kernel runs a probed instruction after its breakpoint traps,
/// which sets most of what a hit costs: x86_64 emulates jumps, calls,
/// conditional jumps and `nop` (cheap), and, since Linux 6.11, `push` of a
/// register; any other instruction is single-stepped out of line (a
/// second trap: 30 us against ~1 us for an emulated one on this VM,
/// Linux 6.18 under Firecracker). Told from a function's first bytes by
/// [`trap_class`]; each class is timed on a function of ours that starts
/// with such an instruction ([`time_class`]), so a kernel that emulates
/// fewer shows it in the timing, not in this table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrapClass {
    /// jmp, call, jcc, nop.
    Branch,
    /// push of a register.
    Push,
    /// Anything else: stepped.
    Stepped,
}

impl TrapClass {
    pub const ALL: [TrapClass; 3] = [TrapClass::Branch, TrapClass::Push, TrapClass::Stepped];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The class of the instruction that starts with `code` (its first bytes).
pub fn trap_class(code: &[u8]) -> TrapClass {
    if !cfg!(target_arch = "x86_64") {
        return TrapClass::Stepped;
    }
    match code {
        [0xeb | 0xe9 | 0xe8 | 0x90 | 0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => TrapClass::Branch,
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => TrapClass::Push,
        _ => TrapClass::Stepped,
    }
}

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl infertrace_trap_branch",
    ".type infertrace_trap_branch,@function",
    "infertrace_trap_branch:",
    "jmp 2f",
    "2:",
    "lea rax, [rdi + 1]",
    "ret",
    ".size infertrace_trap_branch, . - infertrace_trap_branch",
    ".globl infertrace_trap_push",
    ".type infertrace_trap_push,@function",
    "infertrace_trap_push:",
    "push rbp",
    "lea rax, [rdi + 1]",
    "pop rbp",
    "ret",
    ".size infertrace_trap_push, . - infertrace_trap_push",
    ".globl infertrace_trap_stepped",
    ".type infertrace_trap_stepped,@function",
    "infertrace_trap_stepped:",
    "lea rax, [rdi + 1]",
    "ret",
    ".size infertrace_trap_stepped, . - infertrace_trap_stepped",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    fn infertrace_trap_branch(x: u64) -> u64;
    fn infertrace_trap_push(x: u64) -> u64;
    fn infertrace_trap_stepped(x: u64) -> u64;
}

/// The function of ours that starts with an instruction of `class`.
#[cfg(target_arch = "x86_64")]
fn class_target(class: TrapClass) -> extern "C" fn(u64) -> u64 {
    extern "C" fn branch(x: u64) -> u64 {
        // SAFETY: takes and returns a register, touches nothing else.
        unsafe { infertrace_trap_branch(x) }
    }
    extern "C" fn push(x: u64) -> u64 {
        // SAFETY: as above (its push is popped before it returns).
        unsafe { infertrace_trap_push(x) }
    }
    extern "C" fn stepped(x: u64) -> u64 {
        // SAFETY: as above.
        unsafe { infertrace_trap_stepped(x) }
    }
    match class {
        TrapClass::Branch => branch,
        TrapClass::Push => push,
        TrapClass::Stepped => stepped,
    }
}

/// Elsewhere one function stands for every class.
#[cfg(not(target_arch = "x86_64"))]
fn class_target(_class: TrapClass) -> extern "C" fn(u64) -> u64 {
    infertrace_calibration_target
}

/// The address of the function that starts with an instruction of `class`
/// (the one to probe; [`class_target`]'s wrappers call it).
#[cfg(target_arch = "x86_64")]
fn class_address(class: TrapClass) -> u64 {
    let f: unsafe extern "C" fn(u64) -> u64 = match class {
        TrapClass::Branch => infertrace_trap_branch,
        TrapClass::Push => infertrace_trap_push,
        TrapClass::Stepped => infertrace_trap_stepped,
    };
    f as *const () as usize as u64
}

#[cfg(not(target_arch = "x86_64"))]
fn class_address(_class: TrapClass) -> u64 {
    infertrace_calibration_target as *const () as usize as u64
}

/// ns per call of `n` calls of the function of `class`.
pub fn time_class(class: TrapClass, n: u32) -> f64 {
    let f = class_target(class);
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(f(black_box(u64::from(i))));
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The file and offset of the function of `class` in this process.
pub fn class_location(class: TrapClass) -> Result<(String, u64), String> {
    location_of(class_address(class))
}

/// The file and offset of [`infertrace_calibration_target`] in this process.
pub fn target_location() -> Result<(String, u64), String> {
    class_location(TrapClass::Stepped)
}

fn location_of(addr: u64) -> Result<(String, u64), String> {
    let maps = crate::os::procfs::maps(std::process::id()).map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    let line = maps
        .iter()
        .find(|m| m.start <= addr && addr < m.end && m.is_file())
        .ok_or_else(|| "the calibration function is in no file mapping".to_string())?;
    Ok((line.path().to_owned(), addr - line.start + line.offset))
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes_tell_the_class() {
        assert_eq!(trap_class(&[0xe9, 0, 0, 0, 0]), TrapClass::Branch);
        assert_eq!(trap_class(&[0x0f, 0x84, 0, 0]), TrapClass::Branch);
        assert_eq!(trap_class(&[0x55]), TrapClass::Push);
        assert_eq!(trap_class(&[0x41, 0x57]), TrapClass::Push);
        // endbr64, mov: stepped.
        assert_eq!(trap_class(&[0xf3, 0x0f, 0x1e, 0xfa]), TrapClass::Stepped);
        assert_eq!(trap_class(&[0x48, 0x8b, 0x74, 0x24, 0x18]), TrapClass::Stepped);
        assert_eq!(trap_class(&[]), TrapClass::Stepped);
    }

    /// Our own class functions start as their class says, and work.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn each_class_function_starts_with_its_class() {
        for class in TrapClass::ALL {
            // SAFETY: reads the first bytes of our own function's code.
            let code = unsafe { std::slice::from_raw_parts(class_address(class) as *const u8, 4) };
            assert_eq!(trap_class(code), class, "{code:x?}");
            assert_eq!(class_target(class)(41), 42);
        }
    }
}
