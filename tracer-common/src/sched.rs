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
/// Blocked on memory (the `memory` reason, docs/memory.md), by cause: in a
/// page fault (a page-in from a file or swap, or the mm lock a fault
/// takes) outside any syscall; in direct reclaim (global or a memory
/// cgroup's limit); in compaction; throttled above a cgroup's `memory.high`.
pub const REASON_MEM_FAULT: u32 = 6;
pub const REASON_MEM_RECLAIM: u32 = 7;
pub const REASON_MEM_COMPACTION: u32 = 8;
pub const REASON_MEM_THROTTLE: u32 = 9;
pub const REASONS: usize = 10;

/// Memory operations a thread can be inside (`ThreadState::mem_op`), each
/// one of the memory reasons above: `REASON_MEM_FAULT + op`.
pub const MEM_OP_NONE: u32 = 0;
pub const MEM_OP_RECLAIM: u32 = 1;
pub const MEM_OP_COMPACTION: u32 = 2;
pub const MEM_OP_THROTTLE: u32 = 3;

/// The off-CPU reason of a wait that began inside memory operation `op`.
#[inline(always)]
pub fn reason_of_mem_op(op: u32) -> u32 {
    REASON_MEM_FAULT + op
}

/// Whether `reason` is one of the memory reasons.
#[inline(always)]
pub fn is_memory_reason(reason: u32) -> bool {
    (REASON_MEM_FAULT..=REASON_MEM_THROTTLE).contains(&reason)
}

/// Size of the syscall-number -> reason table.
pub const REASON_TABLE_SIZE: u32 = 1024;

/// No stack captured (or capture failed).
pub const NO_STACK: i32 = -1;
/// A native stack was there but not stored: its bucket in the stack map
/// held another stack (EEXIST). Shown as a `[stack lost]` frame.
pub const STACK_COLLIDED: i32 = -17;

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
    /// The memory operation (`MEM_OP_*`) the thread is inside now, set and
    /// cleared by the reclaim and compaction tracepoints: a wait that
    /// begins inside one is a memory wait, whatever syscall it is in.
    pub mem_op: u32,
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
    /// While the current interval is a GIL wait: who held the GIL when it
    /// began (`GilHolderKey`'s holder fields; `holder_tid` 0: unknown).
    pub gil: GilHolder,
}

/// The GIL's holder, read when a thread begins to wait for the GIL: its
/// thread, its state then (`STATE_*`), the syscall it was blocked in
/// (`u32::MAX`: none), its stacks (its own off-CPU stacks when blocked;
/// its Python stack walked there and then when it runs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GilHolder {
    pub tid: u32,
    pub state: u32,
    pub nr: u32,
    pub user_stack: i32,
    pub py_stack: u64,
}

/// Key of the `GIL_HOLDERS` map: a waiter thread and the holder it waited
/// for -> `GilHolderTime`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GilHolderKey {
    pub pid: u32,
    pub tid: u32,
    pub holder: GilHolder,
}

/// Time the waiter spent waiting for the GIL while that holder held it,
/// and how many waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GilHolderTime {
    pub ns: u64,
    pub waits: u64,
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

/// Where the time a thread spends in its current state is counted
/// (`ThreadState::charge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// `on_cpu_ns`.
    OnCpu,
    /// `runqueue_ns`, and the run-queue histogram.
    Runqueue,
    /// `off_cpu_ns[reason]`, and the off-CPU stacks.
    OffCpu,
    /// Nowhere (unknown or dead).
    Nowhere,
}

/// Where time in `state` with off-CPU reason `reason` is counted. A thread
/// woken to take the GIL and waiting for a CPU still waits in take_gil: GIL
/// time, off CPU (documented in docs/python.md).
#[inline(always)]
pub fn charge_of(state: u32, reason: u32) -> Charge {
    match state {
        STATE_RUNNING => Charge::OnCpu,
        STATE_RUNNABLE if reason != REASON_GIL => Charge::Runqueue,
        STATE_RUNNABLE | STATE_OFF_CPU => Charge::OffCpu,
        _ => Charge::Nowhere,
    }
}

/// The off-CPU accounting, the same in the kernel (each interval that ends)
/// and in userspace (the intervals still open when the window closes). Plain
/// code: no loops, no allocation, inlined into the BPF programs.
impl ThreadState {
    /// A thread seen for the first time: in `state` since `since_ns`, no
    /// stacks yet, the kernel's CPU-time counter at `exec_ns`.
    #[inline(always)]
    pub fn new(pid: u32, tid: u32, state: u32, since_ns: u64, exec_ns: u64) -> ThreadState {
        ThreadState {
            pid,
            tid,
            state,
            reason: REASON_OTHER,
            since_ns,
            first_ns: since_ns,
            user_stack: NO_STACK,
            kernel_stack: NO_STACK,
            exec_ns,
            ..Default::default()
        }
    }

    /// Runnable or off CPU: a wait whose switch-in may have gone unreported.
    #[inline(always)]
    pub fn waiting(&self) -> bool {
        self.state == STATE_RUNNABLE || self.state == STATE_OFF_CPU
    }

    /// The end of a wait, `elapsed` ns after it began, seen with the kernel's
    /// CPU-time counter at `exec_now`: the part the thread actually ran
    /// (`split_missed_switch_in`) goes to `on_cpu_ns`. Returns the rest, the
    /// time still to count in the state.
    #[inline(always)]
    pub fn take_missed_run(&mut self, elapsed: u64, exec_now: u64) -> u64 {
        let (ran, rest) = split_missed_switch_in(elapsed, self.exec_ns, exec_now);
        self.on_cpu_ns += ran;
        rest
    }

    /// Counts `ns` spent in the current state in the thread's sums (time
    /// waiting inside a syscall in `blocked_in_syscall_ns` too) and says
    /// where it went: the caller adds the off-CPU stacks or run-queue
    /// histogram entry.
    #[inline(always)]
    pub fn charge(&mut self, ns: u64) -> Charge {
        let charge = charge_of(self.state, self.reason);
        match charge {
            Charge::OnCpu => self.on_cpu_ns += ns,
            Charge::Runqueue => {
                self.runqueue_ns += ns;
                if self.in_syscall != 0 {
                    self.blocked_in_syscall_ns += ns;
                }
            }
            Charge::OffCpu => {
                if let Some(slot) = self.off_cpu_ns.get_mut(self.reason as usize) {
                    *slot += ns;
                }
                if self.in_syscall != 0 {
                    self.blocked_in_syscall_ns += ns;
                }
            }
            Charge::Nowhere => {}
        }
        charge
    }

    /// Key of the off-CPU stacks aggregate of the current interval.
    #[inline(always)]
    pub fn offcpu_key(&self) -> OffCpuKey {
        OffCpuKey {
            pid: self.pid,
            tid: self.tid,
            reason: self.reason,
            user_stack: self.user_stack,
            kernel_stack: self.kernel_stack,
            _pad: 0,
            py_stack: self.py_stack,
        }
    }
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
    unsafe impl aya::Pod for super::GilHolderKey {}
    unsafe impl aya::Pod for super::GilHolderTime {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<GilHolder>(), 16 + 8);
        assert_eq!(core::mem::size_of::<ThreadState>(), 16 + 8 * 5 + 8 * REASONS + 8 + 16 + 16 + 8 + 16 + 8 + 24);
        assert_eq!(core::mem::size_of::<GilHolderKey>(), 8 + 24);
        assert_eq!(core::mem::size_of::<GilHolderTime>(), 16);
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

    fn thread(state: u32, reason: u32, in_syscall: u32) -> ThreadState {
        ThreadState { reason, in_syscall, py_stack: 9, ..ThreadState::new(10, 11, state, 1_000, 500) }
    }

    #[test]
    fn new_thread_has_no_stacks() {
        let t = ThreadState::new(10, 11, STATE_RUNNABLE, 1_000, 500);
        assert_eq!((t.pid, t.tid, t.state, t.reason), (10, 11, STATE_RUNNABLE, REASON_OTHER));
        assert_eq!((t.since_ns, t.first_ns, t.end_ns, t.exec_ns), (1_000, 1_000, 0, 500));
        assert_eq!((t.user_stack, t.kernel_stack, t.py_stack), (NO_STACK, NO_STACK, 0));
    }

    #[test]
    fn charge_by_state() {
        assert_eq!(charge_of(STATE_RUNNING, REASON_OTHER), Charge::OnCpu);
        assert_eq!(charge_of(STATE_RUNNABLE, REASON_OTHER), Charge::Runqueue);
        // Woken to take the GIL, waiting for a CPU: GIL time.
        assert_eq!(charge_of(STATE_RUNNABLE, REASON_GIL), Charge::OffCpu);
        assert_eq!(charge_of(STATE_OFF_CPU, REASON_IO), Charge::OffCpu);
        assert_eq!(charge_of(STATE_DEAD, REASON_OTHER), Charge::Nowhere);
        assert_eq!(charge_of(STATE_UNKNOWN, REASON_OTHER), Charge::Nowhere);

        let mut t = thread(STATE_RUNNING, REASON_OTHER, 1);
        assert_eq!(t.charge(7), Charge::OnCpu);
        // On CPU inside a syscall is not blocked time.
        assert_eq!((t.on_cpu_ns, t.blocked_in_syscall_ns), (7, 0));

        let mut t = thread(STATE_RUNNABLE, REASON_OTHER, 1);
        assert_eq!(t.charge(5), Charge::Runqueue);
        assert_eq!(t.charge(2), Charge::Runqueue);
        assert_eq!((t.runqueue_ns, t.blocked_in_syscall_ns, t.off_cpu_ns), (7, 7, [0; REASONS]));

        let mut t = thread(STATE_OFF_CPU, REASON_SLEEP, 0);
        assert_eq!(t.charge(4), Charge::OffCpu);
        assert_eq!((t.off_cpu_ns[REASON_SLEEP as usize], t.blocked_in_syscall_ns, t.runqueue_ns), (4, 0, 0));

        let mut t = thread(STATE_RUNNABLE, REASON_GIL, 1);
        assert_eq!(t.charge(3), Charge::OffCpu);
        assert_eq!((t.off_cpu_ns[REASON_GIL as usize], t.blocked_in_syscall_ns, t.runqueue_ns), (3, 3, 0));

        // A reason out of range is not counted (and does not panic).
        let mut t = thread(STATE_OFF_CPU, REASONS as u32, 1);
        assert_eq!(t.charge(3), Charge::OffCpu);
        assert_eq!((t.off_cpu_ns, t.blocked_in_syscall_ns), ([0; REASONS], 3));

        let mut t = thread(STATE_DEAD, REASON_OTHER, 1);
        assert_eq!(t.charge(3), Charge::Nowhere);
        assert_eq!((t.on_cpu_ns, t.runqueue_ns, t.off_cpu_ns, t.blocked_in_syscall_ns), (0, 0, [0; REASONS], 0));
    }

    #[test]
    fn missed_run_then_charge_adds_up() {
        // Off CPU for 100 ns by our events, but the counter says it ran 30.
        let mut t = thread(STATE_OFF_CPU, REASON_IO, 1);
        assert!(t.waiting());
        let rest = t.take_missed_run(100, 530);
        assert_eq!((rest, t.on_cpu_ns), (70, 30));
        assert_eq!(t.charge(rest), Charge::OffCpu);
        assert_eq!((t.off_cpu_ns[REASON_IO as usize], t.blocked_in_syscall_ns), (70, 70));
        assert_eq!(t.on_cpu_ns + t.off_cpu_ns.iter().sum::<u64>(), 100);
        // Unknown counter: everything stays in the state.
        let mut t = ThreadState { exec_ns: EXEC_UNKNOWN, ..thread(STATE_RUNNABLE, REASON_OTHER, 0) };
        assert_eq!(t.take_missed_run(100, 530), 100);
        assert_eq!(t.on_cpu_ns, 0);
        assert!(!thread(STATE_RUNNING, REASON_OTHER, 0).waiting());
        assert!(!thread(STATE_DEAD, REASON_OTHER, 0).waiting());
    }

    #[test]
    fn offcpu_key_of_the_interval() {
        let t = ThreadState { user_stack: 3, kernel_stack: 4, ..thread(STATE_OFF_CPU, REASON_LOCK, 0) };
        let k = t.offcpu_key();
        assert_eq!(k, OffCpuKey { pid: 10, tid: 11, reason: REASON_LOCK, user_stack: 3, kernel_stack: 4, _pad: 0, py_stack: 9 });
    }
}
