//! Event-loop selector calls (`record --async`): the kernel programs of
//! `tracer-ebpf/src/asyncio.rs` send one record per entry into and exit
//! from an epoll wait of a target thread through the `ASYNC_EVENTS` ring
//! buffer. Userspace turns consecutive records of an event-loop thread
//! into the loop's iterations: busy from a selector's return to the next
//! selector call, idle inside it.

/// The thread entered `epoll_wait`/`epoll_pwait`/`epoll_pwait2`.
pub const KIND_ENTER: u32 = 1;
/// The thread returned from it; `ret` is the number of ready events (0:
/// timeout) or a negative errno.
pub const KIND_EXIT: u32 = 2;

/// One ring-buffer record (48 bytes, no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectorEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The thread's `se.sum_exec_runtime` (ns on CPU, as of the last
    /// scheduler update: up to a tick stale), 0 when unknown.
    pub cpu_ns: u64,
    /// The thread's `sched_info.run_delay` (ns waited on a run queue), 0
    /// when unknown.
    pub run_delay_ns: u64,
    /// `KIND_EXIT`: the syscall's return value; `KIND_ENTER`: 0.
    pub ret: i64,
    pub pid: u32,
    pub tid: u32,
    pub kind: u32,
    /// The syscall number (from the tracepoint record).
    pub nr: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for SelectorEvent {}

/// The tracepoints (category `syscalls`) both programs attach to.
pub const SELECTOR_SYSCALLS: [&str; 3] = ["epoll_wait", "epoll_pwait", "epoll_pwait2"];
