//! Tables about the system the tracer runs on, shared by collectors and
//! reports: syscall and errno names, and the per-architecture constants the
//! kernel programs need; local date and time formatting. Imports nothing of
//! the collectors.

mod errno_names;
pub mod local_time;
mod syscall_names;

pub use errno_names::errno_name;

/// Name of syscall `nr` on `arch` (as strace prints it), `syscall_<nr>` when unknown.
pub fn syscall_name(arch: &str, nr: u32) -> String {
    let table: &[&str] = match arch {
        "x86_64" => &syscall_names::X86_64,
        "aarch64" => &syscall_names::AARCH64,
        _ => &[],
    };
    match table.get(nr as usize) {
        Some(n) if !n.is_empty() => (*n).to_owned(),
        _ => format!("syscall_{nr}"),
    }
}

/// Syscall numbers and `struct pt_regs` offsets the kernel programs need.
#[derive(Clone, Copy, Debug)]
pub struct ArchConstants {
    pub nr_exit: u32,
    pub nr_exit_group: u32,
    pub nr_futex: u32,
    /// (clone, fork, vfork, clone3); u32::MAX where the arch lacks one.
    pub nr_clone_family: (u32, u32, u32, u32),
    /// Offset of the original syscall number.
    pub regs_nr_offset: u64,
    /// Offset of the first syscall argument.
    pub regs_arg0_offset: u64,
    /// `mmap`'s number, and the offsets of its third (`prot`) and fifth
    /// (`fd`) arguments.
    pub nr_mmap: u32,
    pub regs_arg2_offset: u64,
    pub regs_arg4_offset: u64,
    /// Offsets of the user stack pointer and of the link register (u64::MAX:
    /// none, the return address is on the stack) for the CUDA uprobes.
    pub regs_sp_offset: u64,
    pub regs_lr_offset: u64,
    /// Offset of the instruction pointer (a USDT probe's own address).
    pub regs_ip_offset: u64,
}

/// The constants for the host architecture.
pub fn arch_constants() -> Option<ArchConstants> {
    match std::env::consts::ARCH {
        // pt_regs: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax ...
        "x86_64" => Some(ArchConstants {
            nr_exit: 60,
            nr_exit_group: 231,
            nr_futex: 202,
            nr_clone_family: (56, 57, 58, 435),
            regs_nr_offset: 15 * 8,
            regs_arg0_offset: 14 * 8,
            nr_mmap: 9,
            regs_arg2_offset: 12 * 8,
            regs_arg4_offset: 9 * 8,
            regs_sp_offset: 19 * 8,
            regs_lr_offset: u64::MAX,
            regs_ip_offset: 16 * 8,
        }),
        // pt_regs: regs[31], sp, pc, pstate, orig_x0, syscallno ...
        "aarch64" => Some(ArchConstants {
            nr_exit: 93,
            nr_exit_group: 94,
            nr_futex: 98,
            nr_clone_family: (220, u32::MAX, u32::MAX, 435),
            regs_nr_offset: 31 * 8 + 4 * 8,
            regs_arg0_offset: 0,
            nr_mmap: 222,
            regs_arg2_offset: 2 * 8,
            regs_arg4_offset: 4 * 8,
            regs_sp_offset: 31 * 8,
            regs_lr_offset: 30 * 8,
            regs_ip_offset: 32 * 8,
        }),
        _ => None,
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(syscall_name("x86_64", 0), "read");
        assert_eq!(syscall_name("x86_64", 110), "getppid");
        assert_eq!(syscall_name("x86_64", 230), "clock_nanosleep");
        assert_eq!(syscall_name("x86_64", 262), "newfstatat");
        assert_eq!(syscall_name("aarch64", 63), "read");
        assert_eq!(syscall_name("x86_64", 9999), "syscall_9999");
    }
}
