//! Types shared by the kernel programs (`tracer-ebpf`) and the collector
//! (`tracer-user`). Every struct here crosses the kernel/user boundary: all are
//! `#[repr(C)]`, sized to multiples of 8 bytes and padded explicitly, so the
//! BPF and host layouts are identical.
#![no_std]

pub mod asyncio;
pub mod cpu_samples;
pub mod cuda;
pub mod maps;
pub mod memory;
pub mod process;
pub mod python;
pub mod sched;
pub mod syscalls;
pub mod timeline;

/// Indices into the `COUNTERS` per-CPU array: events the kernel side had to drop.
pub mod counters {
    /// A (pid, tid, syscall) stats entry could not be created: map full.
    pub const SYSCALL_STATS_FULL: u32 = 0;
    /// The per-thread in-flight syscall map was full at sys_enter.
    pub const SYSCALL_START_FULL: u32 = 1;
    /// A (pid, tid, syscall, errno) counter could not be created: map full.
    pub const SYSCALL_ERRNO_FULL: u32 = 2;
    /// The process-event ring buffer was full.
    pub const PROC_EVENTS_RINGBUF_FULL: u32 = 3;
    /// A followed child could not be added to the target set: map full.
    pub const TARGETS_FULL: u32 = 4;
    /// A thread state entry could not be created: map full.
    pub const THREADS_FULL: u32 = 5;
    /// An off-CPU stack or CPU sample aggregate could not be created (map
    /// full).
    pub const STACKS_LOST: u32 = 6;
    /// Python stacks cut at `PY_MAX_DEPTH` frames.
    pub const PY_STACKS_TRUNCATED: u32 = 7;
    /// A Python stack could not be stored (map full) or a slow-syscall aggregate could not be created.
    pub const PY_STACKS_LOST: u32 = 8;
    /// A CUDA call aggregate, launch counter or in-flight slot could not be
    /// created (map full), or a call's return was never seen (its entry slot
    /// was taken over by the thread's next call): calls missing from the
    /// CUDA call and launch tables.
    pub const CUDA_LOST: u32 = 9;
    /// A per-call CUDA event was dropped (`CUDA_EVENTS` ring buffer full):
    /// the call is counted in the aggregates, but the detector and the
    /// per-call columns (return codes, pinned/pageable) did not see it.
    pub const CUDA_EVENTS_LOST: u32 = 10;
    /// A code object's copy (what resolves its frames after the process
    /// exits) could not be stored: map full. Its frames still resolve while
    /// the process lives.
    pub const PY_CODES_FULL: u32 = 11;
    /// A target thread's sys_exit came without its sys_enter although the
    /// thread had entered syscalls before in this window: a syscall a
    /// seccomp filter refused (seccomp runs before the sys_enter tracepoint,
    /// sys_exit still fires: every container has such a filter), or a
    /// program the kernel skipped. The call is counted (from the exit's
    /// registers), with no time; not a loss.
    pub const SYSCALL_ENTER_UNSEEN: u32 = 12;
    /// An exec event for the agent's selection was dropped (`AGENT_EXECS` full).
    pub const AGENT_EXECS_FULL: u32 = 13;
    /// A kernel name was dropped (`CUDA_NAMES` ring buffer full): launches
    /// of that handle show it (`CUfunction 0x...`), not its name. Counted,
    /// nothing else is missing.
    pub const CUDA_NAMES_LOST: u32 = 14;
    /// A resident-memory sample was dropped (`MEM_SAMPLES` ring buffer
    /// full), or a process's memory state or growth aggregate could not be
    /// created (map full): the series misses a point, or growth a line.
    pub const MEM_LOST: u32 = 15;
    /// A native stack (user or kernel) could not be stored because its
    /// bucket in the stack map held another stack: the event is kept (its
    /// time, its Python frames), its native frames show as `[stack lost]`.
    pub const STACKS_COLLIDED: u32 = 16;
    pub const COUNT: u32 = 17;

    pub const NAMES: [&str; COUNT as usize] = [
        "syscall_stats_map_full",
        "syscall_start_map_full",
        "syscall_errno_map_full",
        "proc_events_ringbuf_full",
        "targets_map_full",
        "thread_map_full",
        "stacks_lost",
        "python_stacks_truncated",
        "python_stacks_lost",
        "cuda_lost",
        "cuda_events_lost",
        "python_code_copies_map_full",
        "syscall_enter_unseen",
        "agent_execs_full",
        "cuda_names_lost",
        "memory_lost",
        "native_stacks_collided",
    ];

    /// Whether counter `idx` counts lost events (the others count events
    /// that were kept but reported, like truncated stacks).
    pub const fn is_loss(idx: u32) -> bool {
        idx != PY_STACKS_TRUNCATED && idx != PY_CODES_FULL && idx != SYSCALL_ENTER_UNSEEN && idx != CUDA_NAMES_LOST && idx != STACKS_COLLIDED
    }
}

/// Flags stored as the value of the `TARGETS` map.
pub mod target_flags {
    /// The process was named with `-p` (running before the window opened).
    pub const EXPLICIT: u8 = 1;
    /// The process was added in the kernel because a target forked it.
    pub const FOLLOWED: u8 = 2;
    /// The command infertrace launched (joined the window before its exec).
    pub const LAUNCHED: u8 = 4;
}
