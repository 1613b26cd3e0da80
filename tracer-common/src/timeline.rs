//! `record --timeline`: timestamped events the kernel programs submit to
//! the `TIMELINE_EVENTS` ring buffer when the load-time global
//! `TIMELINE_ENABLED` is set (off: one load and a branch per program run).

/// A thread-state interval ended: `state`/`reason` (`sched::STATE_*`,
/// `sched::REASON_*`) held from `begin_ns` to `end_ns`; the stacks are the
/// ones captured when an off-CPU interval began.
pub const KIND_STATE: u32 = 1;
/// A CPU sample at `begin_ns` (= `end_ns`) with its stacks.
pub const KIND_SAMPLE: u32 = 2;
/// A syscall slower than `--slow-syscall`: `state` holds its number.
pub const KIND_SYSCALL: u32 = 3;

/// A thread started (`sched_wakeup_new`) at `begin_ns`.
pub const KIND_THREAD_START: u32 = 4;
/// A thread exited (its last switch-out) at `begin_ns`.
pub const KIND_THREAD_EXIT: u32 = 5;

/// One ring-buffer record (56 bytes, no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    /// `KIND_STATE`: the state; `KIND_SYSCALL`: the syscall number.
    pub state: u32,
    pub reason: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad: u32,
    /// CLOCK_MONOTONIC (bpf_ktime_get_ns).
    pub begin_ns: u64,
    pub end_ns: u64,
    /// Python stack hash (`PY_STACKS`), 0 for none.
    pub py_stack: u64,
}

/// Size of the `TIMELINE_EVENTS` ring buffer.
pub const RING_BYTES: u32 = 8 << 20;

#[cfg(feature = "user")]
unsafe impl aya::Pod for TimelineEvent {}
