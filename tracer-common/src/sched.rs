//! Wall-time accounting: a per-thread state machine driven by sched_switch
//! and sched_wakeup, aggregated in the kernel. (CPU samples: `cpu_samples`.)

use crate::syscalls::HIST_BUCKETS;

/// Thread states of the machine.
pub const STATE_UNKNOWN: u32 = 0;
pub const STATE_RUNNING: u32 = 1;
pub const STATE_RUNNABLE: u32 = 2;
pub const STATE_OFF_CPU: u32 = 3;
pub const STATE_DEAD: u32 = 4;

/// Off-CPU reasons (index into `ThreadState::off_cpu_ns`).
pub const REASON_OTHER: u32 = 0;
pub const REASON_IO: u32 = 1;
pub const REASON_LOCK: u32 = 2;
pub const REASON_POLL: u32 = 3;
pub const REASON_SLEEP: u32 = 4;
/// Waiting to take a CPython GIL (a futex inside the process's GIL state).
pub const REASON_GIL: u32 = 5;
pub const REASONS: usize = 6;

/// Size of the syscall-number -> reason table.
pub const REASON_TABLE_SIZE: u32 = 1024;

/// No stack captured (or capture failed).
pub const NO_STACK: i32 = -1;

/// Value of the `THREADS` map, keyed by tid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    pub pid: u32,
    pub tid: u32,
    pub state: u32,
    /// Reason of the current off-CPU interval.
    pub reason: u32,
    /// When the current state began.
    pub since_ns: u64,
    /// When the thread entered the window (its creation, or the window start).
    pub first_ns: u64,
    /// When the thread exited (0 while alive).
    pub end_ns: u64,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub off_cpu_ns: [u64; REASONS],
    /// Off-CPU and run-queue time spent while inside a syscall: the on-CPU
    /// part of syscall time is syscall time minus this.
    pub blocked_in_syscall_ns: u64,
    /// Stacks captured when the current off-CPU interval began.
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// 1 while the current off-CPU / run-queue interval began inside a syscall.
    pub in_syscall: u32,
    pub _pad: u32,
    /// Thread name, refreshed at each switch-out.
    pub comm: [u8; 16],
    /// Python stack (hash into `PY_STACKS`, 0 = none) when the current
    /// off-CPU interval began.
    pub py_stack: u64,
    /// When the stacks above were last captured, and in which syscall
    /// (`u32::MAX`: none): captures are rate-limited per thread.
    pub stack_ns: u64,
    pub stack_nr: u32,
    pub _pad2: u32,
    /// The kernel's own count of the thread's CPU time
    /// (`task_struct.se.sum_exec_runtime`) at its last switch-out or
    /// creation; `EXEC_UNKNOWN` when unreadable. Repairs intervals whose
    /// switch-in the tracepoint never reported (see `docs/wall-time.md`).
    pub exec_ns: u64,
}

/// `ThreadState::exec_ns` when the kernel's CPU-time counter is unreadable.
pub const EXEC_UNKNOWN: u64 = u64::MAX;

/// Splits `elapsed` ns spent in a state whose end we saw but whose
/// switch-in we missed: the thread ran `exec_delta` of it (capped), the rest
/// stays in the state. Returns (on-CPU ns, rest ns).
pub fn split_missed_switch_in(elapsed: u64, exec_then: u64, exec_now: u64) -> (u64, u64) {
    if exec_then == EXEC_UNKNOWN || exec_now == EXEC_UNKNOWN || exec_now < exec_then {
        return (0, elapsed);
    }
    let ran = (exec_now - exec_then).min(elapsed);
    (ran, elapsed - ran)
}

/// Key of the `REUSED_THREADS` map: an earlier life of a reused thread id
/// (value: its closed `ThreadState`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReusedKey {
    pub tid: u32,
    pub _pad: u32,
    pub first_ns: u64,
}

/// Key of the `OFFCPU_STACKS` map (value: ns).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub pid: u32,
    pub tid: u32,
    pub reason: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad: u32,
    pub py_stack: u64,
}

/// Key of the `RUNQ_HIST` map: (pid, log2 bucket) -> count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RunqKey {
    pub pid: u32,
    pub bucket: u32,
}

const _: () = assert!(HIST_BUCKETS <= 64);

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::ThreadState {}
    unsafe impl aya::Pod for super::OffCpuKey {}
    unsafe impl aya::Pod for super::RunqKey {}
    unsafe impl aya::Pod for super::ReusedKey {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<ThreadState>(), 16 + 8 * 5 + 8 * REASONS + 8 + 16 + 16 + 8 + 16 + 8);
        assert_eq!(core::mem::size_of::<OffCpuKey>(), 32);
        assert_eq!(core::mem::size_of::<RunqKey>(), 8);
        assert_eq!(core::mem::size_of::<ReusedKey>(), 16);
    }

    #[test]
    fn missed_switch_in_split() {
        // Ran 30 of the 100 ns: 30 on CPU, 70 left in the state.
        assert_eq!(split_missed_switch_in(100, 1_000, 1_030), (30, 70));
        // The counter can run ahead of the timestamps by a little: capped.
        assert_eq!(split_missed_switch_in(100, 1_000, 1_200), (100, 0));
        // Unknown or going backwards (a reused tid): nothing is moved.
        assert_eq!(split_missed_switch_in(100, EXEC_UNKNOWN, 1_200), (0, 100));
        assert_eq!(split_missed_switch_in(100, 1_000, EXEC_UNKNOWN), (0, 100));
        assert_eq!(split_missed_switch_in(100, 2_000, 1_000), (0, 100));
    }
}
