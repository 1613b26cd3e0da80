//! Exact syscall accounting, entirely in the kernel: per (pid, tid, nr)
//! count, errors, total/max latency and a log2 histogram. No per-syscall
//! event crosses to userspace.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use tracer_common::{
    counters,
    python::{SlowKey, SlowStats},
    target_flags,
    syscalls::{ErrnoKey, PendingRow, SyscallKey, SyscallPending, SyscallStart, SyscallStats, PENDING_ROWS},
};

use crate::{
    count_drop, emit_proc_event, global, is_target, python, syscall_slot, user_stack_id, window_closed, window_start_ns,
    SYSCALL_START, TARGETS,
};
use tracer_common::process::KIND_MAPPED;

#[map]
pub static SYSCALL_STATS: HashMap<SyscallKey, SyscallStats> = HashMap::with_max_entries(32768, 0);

/// Syscalls slower than `SLOW_SYSCALL_NS`, by stacks.
#[map]
pub static SLOW_SYSCALLS: HashMap<SlowKey, SlowStats> = HashMap::with_max_entries(8192, 0);

#[map]
pub static SYSCALL_ERRNO: HashMap<ErrnoKey, u64> = HashMap::with_max_entries(16384, 0);

/// One all-zero `SyscallStats`, the template for new entries (too big to
/// build on the 512-byte BPF stack).
#[map]
pub static ZERO_STATS: Array<SyscallStats> = Array::with_max_entries(1, 0);

/// The latest calls of the thread running on each CPU, not yet in
/// `SYSCALL_STATS` (see `SyscallPending`): a call's return is then an
/// array read, not a hash lookup. Used when `SYSCALL_PENDING_ON` is set.
#[map]
pub static SYSCALL_PENDING: PerCpuArray<SyscallPending> = PerCpuArray::with_max_entries(1, 0);

/// 1 when the scheduler programs are attached: `sched_switch` moves a
/// thread's pending calls into `SYSCALL_STATS` when it leaves its CPU (and
/// `sched_process_exit` when it exits), so that a CPU holds only the
/// calls of the thread running there. 0: every call goes to
/// `SYSCALL_STATS` directly.
#[unsafe(no_mangle)]
static SYSCALL_PENDING_ON: u32 = 0;

/// Syscall numbers of exit and exit_group for this arch (they never return).
#[unsafe(no_mangle)]
static NR_EXIT: u32 = 60;
#[unsafe(no_mangle)]
static NR_EXIT_GROUP: u32 = 231;
/// Numbers of the clone family (u32::MAX where the arch lacks one): their
/// return in a new child carries no matching sys_enter.
#[unsafe(no_mangle)]
static NR_CLONE: u32 = 56;
#[unsafe(no_mangle)]
static NR_FORK: u32 = 57;
#[unsafe(no_mangle)]
static NR_VFORK: u32 = 58;
#[unsafe(no_mangle)]
static NR_CLONE3: u32 = 435;
/// Number of futex (its first argument is kept: GIL detection).
#[unsafe(no_mangle)]
static NR_FUTEX: u32 = 202;
/// Offset of the first syscall argument in `struct pt_regs` (x86_64 `di`).
#[unsafe(no_mangle)]
static PT_REGS_ARG0_OFFSET: u64 = 112;
/// `mmap`'s number and the offsets of its `prot` and `fd` arguments in
/// `struct pt_regs`: a target's executable file mapping is reported to the
/// process follower (`KIND_MAPPED` in `PROC_EVENTS`) when the call returns.
#[unsafe(no_mangle)]
static NR_MMAP: u32 = 9;
#[unsafe(no_mangle)]
static PT_REGS_ARG2_OFFSET: u64 = 96;
#[unsafe(no_mangle)]
static PT_REGS_ARG4_OFFSET: u64 = 72;
const PROT_EXEC: u64 = 0x4;
/// `SyscallStart::arg0` of an `mmap` that maps a file executable.
const MMAP_EXEC_FILE: u64 = 1;
/// Syscalls at least this slow get a user and Python stack (0: off).
#[unsafe(no_mangle)]
static SLOW_SYSCALL_NS: u64 = 1_000_000;
/// Offset of the original syscall number in `struct pt_regs` for this arch
/// (x86_64 `orig_ax`, aarch64 `syscallno`).
#[unsafe(no_mangle)]
static PT_REGS_NR_OFFSET: u64 = 120;

/// `sys_enter(struct pt_regs *regs, long id)`
#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter(ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let tid = pid_tgid as u32;
    let id: i64 = ctx.arg(1);
    if id < 0 {
        return 0;
    }
    let nr = id as u32;
    let now = unsafe { bpf_ktime_get_ns() };
    if window_closed(now) {
        return 0;
    }
    if nr == global(&NR_EXIT) || nr == global(&NR_EXIT_GROUP) {
        // Never returns: account it now, with no duration.
        account(tgid, tid, nr, 0, 0);
        return 0;
    }
    let arg0 = if nr == global(&NR_FUTEX) {
        first_arg(&ctx)
    } else if nr == global(&NR_MMAP) {
        exec_file_mmap(&ctx)
    } else {
        0
    };
    let start = SyscallStart { ts: now, nr, tid, arg0 };
    let mut slot = syscall_slot::owned(tid);
    if slot.is_null() && syscall_slot::claim(tid) {
        slot = syscall_slot::owned(tid);
    }
    if !slot.is_null() {
        // SAFETY: the thread's own slot; only it writes there.
        unsafe { *slot = start };
        return 0;
    }
    match SYSCALL_START.get_ptr_mut(&tid) {
        // SAFETY: map value pointer; only this thread writes its entry.
        Some(p) => unsafe { *p = start },
        None => {
            if SYSCALL_START.insert(&tid, &start, 0).is_err() {
                count_drop(counters::SYSCALL_START_FULL);
            }
        }
    }
    0
}

/// The first syscall argument from `struct pt_regs` (futex only).
#[inline(always)]
fn first_arg(ctx: &BtfTracePointContext) -> u64 {
    let regs: u64 = ctx.arg(0);
    unsafe { bpf_probe_read_kernel((regs + global(&PT_REGS_ARG0_OFFSET)) as *const u64) }.unwrap_or(0)
}

/// `MMAP_EXEC_FILE` when the `mmap` entered maps a file (fd >= 0) with
/// `PROT_EXEC` (the dynamic loader bringing in a library), else 0.
#[inline(never)]
fn exec_file_mmap(ctx: &BtfTracePointContext) -> u64 {
    let regs: u64 = ctx.arg(0);
    let read = |off: u64| unsafe { bpf_probe_read_kernel((regs + off) as *const u64) }.unwrap_or(0);
    let prot = read(global(&PT_REGS_ARG2_OFFSET));
    let fd = read(global(&PT_REGS_ARG4_OFFSET)) as i64;
    if prot & PROT_EXEC != 0 && fd >= 0 {
        MMAP_EXEC_FILE
    } else {
        0
    }
}

/// `sys_exit(struct pt_regs *regs, long ret)`
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit(ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target((pid_tgid >> 32) as u32) {
        return 0;
    }
    let tid = pid_tgid as u32;
    let now = unsafe { bpf_ktime_get_ns() };
    if window_closed(now) {
        // After the window: a call still in flight stays so, and is
        // accounted as in flight at the end.
        return 0;
    }
    let ret: i64 = ctx.arg(1);
    let (state, start_ns, nr, arg0) = take_start(tid);
    let (start_ns, nr, arg0) = match state {
        START_FOUND => (start_ns, nr, arg0),
        START_CONSUMED => {
            // The thread entered syscalls before, in this window: this
            // exit's sys_enter was not seen (a seccomp filter refused the
            // call before the tracepoint, as in every container, or the
            // kernel skipped the program). Timing it from the window start,
            // as if in flight at attach, is what gave calls of seconds: it
            // is counted with no time instead.
            count_drop(counters::SYSCALL_ENTER_UNSEEN);
            match exit_nr(&ctx, ret) {
                Some(nr) => (now, nr, 0),
                None => return 0,
            }
        }
        _ => match in_flight_at_attach(&ctx, pid_tgid, ret) {
            // In flight at attach time: timed from the window start, once
            // per thread (the entry left behind marks it seen).
            Some(nr) => {
                mark_seen(tid);
                (window_start_ns(), nr, 0)
            }
            None => return 0,
        },
    };
    // Never before the window: a call's time cannot exceed the window it
    // was seen in.
    let start_ns = if start_ns < window_start_ns() { window_start_ns() } else { start_ns };
    let tgid = (pid_tgid >> 32) as u32;
    let errno = if (-4095..0).contains(&ret) { (-ret) as u32 } else { 0 };
    if errno == 0 && arg0 == MMAP_EXEC_FILE && nr == global(&NR_MMAP) {
        emit_proc_event(KIND_MAPPED, tgid, tid);
    }
    let ns = now.saturating_sub(start_ns);
    account(tgid, tid, nr, ns, errno);
    let slow = global(&SLOW_SYSCALL_NS);
    if slow != 0 && ns >= slow {
        record_slow(&ctx, tgid, tid, nr, ns);
    }
    0
}

/// A syscall slower than the threshold: aggregated by user and Python stack.
#[inline(never)]
fn record_slow(ctx: &BtfTracePointContext, tgid: u32, tid: u32, nr: u32, ns: u64) {
    let key = SlowKey {
        pid: tgid,
        tid,
        nr,
        user_stack: user_stack_id(ctx),
        py_stack: python::capture(tgid, tid, python::SCRATCH_SYSCALL),
    };
    crate::timeline::syscall(&key, ns);
    match SLOW_SYSCALLS.get_ptr_mut(&key) {
        Some(p) => unsafe {
            (*p).count += 1;
            (*p).total_ns += ns;
        },
        None => {
            if SLOW_SYSCALLS.insert(&key, &SlowStats { count: 1, total_ns: ns }, 0).is_err() {
                count_drop(counters::PY_STACKS_LOST);
            }
        }
    }
}

/// `take_start` states: no entry for the thread (never seen entering a
/// syscall in this window), an entry already consumed (the thread's last
/// sys_enter was paired; this exit has none), a start found.
const START_NONE: u8 = 0;
const START_CONSUMED: u8 = 1;
const START_FOUND: u8 = 2;

/// The (state, start, nr, arg0) of `tid`'s syscall in flight, consumed,
/// from its slot if it owns one, else from `SYSCALL_START`. A tuple, not
/// an `Option` (see `syscall_in_flight`).
#[inline(always)]
fn take_start(tid: u32) -> (u8, u64, u32, u64) {
    let slot = syscall_slot::owned(tid);
    let p = if !slot.is_null() {
        slot
    } else {
        match SYSCALL_START.get_ptr_mut(&tid) {
            Some(p) => p,
            None => return (START_NONE, 0, 0, 0),
        }
    };
    // SAFETY: map value pointer, owned by this thread.
    unsafe {
        if (*p).ts == 0 {
            return (START_CONSUMED, 0, 0, 0);
        }
        let v = (START_FOUND, (*p).ts, (*p).nr, (*p).arg0);
        (*p).ts = 0;
        v
    }
}

/// Leaves a consumed entry for `tid`: a later exit without its enter is
/// then a missed sys_enter, never another call in flight at attach.
#[inline(never)]
fn mark_seen(tid: u32) {
    let seen = SyscallStart { ts: 0, nr: 0, tid, arg0: 0 };
    // BPF_NOEXIST: an entry the thread wrote meanwhile stays.
    let _ = SYSCALL_START.insert(&tid, &seen, 1);
}

/// Offset of `start_time` (CLOCK_MONOTONIC ns at fork) in `struct task_struct`.
#[unsafe(no_mangle)]
static TASK_START_TIME_OFFSET: u64 = 0;

/// Whether the current thread was started before the window opened (a
/// thread born after cannot have had a call in flight at attach). True
/// when it cannot be told (offset unknown, read failed).
#[inline(never)]
fn started_before_window() -> bool {
    let off = global(&TASK_START_TIME_OFFSET);
    if off == 0 {
        return true;
    }
    let task = unsafe { bpf_get_current_task() };
    match unsafe { bpf_probe_read_kernel((task + off) as *const u64) } {
        Ok(start) => start <= window_start_ns(),
        Err(_) => true,
    }
}

/// A sys_exit without a recorded sys_enter: the call was in flight when we
/// attached to an explicit target, so it is timed from the window start.
/// Not for launched or followed processes (born inside the window: their
/// only such exits are a fork child's return and the launch hand-over), nor
/// for a new thread's or child's return from clone.
#[inline(always)]
fn in_flight_at_attach(ctx: &BtfTracePointContext, pid_tgid: u64, ret: i64) -> Option<u32> {
    let tgid = (pid_tgid >> 32) as u32;
    let flags = unsafe { *TARGETS.get(&tgid)? };
    if flags != target_flags::EXPLICIT {
        return None;
    }
    if !started_before_window() {
        return None;
    }
    exit_nr(ctx, ret)
}

/// The number of the syscall returning (`orig_ax`), none for a new
/// thread's or child's return from the clone family (no call of its own).
#[inline(never)]
fn exit_nr(ctx: &BtfTracePointContext, ret: i64) -> Option<u32> {
    let regs: u64 = ctx.arg(0);
    let nr = unsafe { bpf_probe_read_kernel((regs + global(&PT_REGS_NR_OFFSET)) as *const i64) }.ok()?;
    if nr < 0 {
        return None;
    }
    let nr = nr as u32;
    let clone_family = nr == global(&NR_CLONE)
        || nr == global(&NR_CLONE3)
        || nr == global(&NR_FORK)
        || nr == global(&NR_VFORK);
    if clone_family && ret == 0 {
        return None;
    }
    Some(nr)
}

#[inline(always)]
fn account(tgid: u32, tid: u32, nr: u32, ns: u64, errno: u32) {
    if !account_pending(tgid, tid, nr, ns, errno != 0) {
        let Some(stats) = stats_entry(tgid, tid, nr) else { return };
        // SAFETY: map value pointer; only this thread writes this key.
        unsafe { (*stats).record(ns, errno != 0) };
    }
    if errno != 0 {
        let ek = ErrnoKey { pid: tgid, tid, nr, errno };
        match SYSCALL_ERRNO.get_ptr_mut(&ek) {
            Some(p) => unsafe { *p += 1 },
            None => {
                if SYSCALL_ERRNO.insert(&ek, &1u64, 0).is_err() {
                    count_drop(counters::SYSCALL_ERRNO_FULL);
                }
            }
        }
    }
}

/// The `SYSCALL_STATS` entry of (tgid, tid, nr), created empty if absent.
#[inline(always)]
fn stats_entry(tgid: u32, tid: u32, nr: u32) -> Option<*mut SyscallStats> {
    let key = SyscallKey { pid: tgid, tid, nr, _pad: 0 };
    if let Some(p) = SYSCALL_STATS.get_ptr_mut(&key) {
        return Some(p);
    }
    let zero = ZERO_STATS.get(0)?;
    // BPF_NOEXIST: another CPU cannot race us (key is per-thread).
    if SYSCALL_STATS.insert(&key, zero, 1).is_err() {
        count_drop(counters::SYSCALL_STATS_FULL);
        return None;
    }
    SYSCALL_STATS.get_ptr_mut(&key)
}

/// Adds the call to this CPU's pending calls; false when they are not in
/// use (the caller accounts it in `SYSCALL_STATS`).
#[inline(always)]
fn account_pending(tgid: u32, tid: u32, nr: u32, ns: u64, error: bool) -> bool {
    if global(&SYSCALL_PENDING_ON) == 0 {
        return false;
    }
    let Some(p) = SYSCALL_PENDING.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's value; the programs that touch it (sys_enter,
    // sys_exit, sched_switch, sched_process_exit) never run nested on one CPU.
    let p = unsafe { &mut *p };
    if p.tid != tid || p.pid != tgid {
        // Another thread's calls, left by a switch the scheduler program
        // did not see.
        flush(p);
        p.pid = tgid;
        p.tid = tid;
    }
    let Some(row) = p.rows.get_mut(nr as usize & (PENDING_ROWS - 1)) else { return false };
    if row.stats.count != 0 && row.nr != nr {
        flush_row(tgid, tid, row);
    }
    row.nr = nr;
    row.stats.record(ns, error);
    true
}

/// Moves this CPU's pending calls into `SYSCALL_STATS` if they are
/// thread `tid`'s (it is leaving the CPU, or exiting).
#[inline(never)]
pub fn flush_pending_of(tid: u32) {
    if global(&SYSCALL_PENDING_ON) == 0 || tid == 0 {
        return;
    }
    let Some(p) = SYSCALL_PENDING.get_ptr_mut(0) else { return };
    // SAFETY: as in `account_pending`.
    let p = unsafe { &mut *p };
    if p.tid == tid {
        flush(p);
    }
}

/// Moves every row of `p` into `SYSCALL_STATS` and empties it.
#[inline(never)]
fn flush(p: &mut SyscallPending) {
    if p.tid != 0 {
        let (pid, tid) = (p.pid, p.tid);
        for row in p.rows.iter_mut() {
            if row.stats.count != 0 {
                flush_row(pid, tid, row);
            }
        }
    }
    p.tid = 0;
}

/// Adds `row` to its `SYSCALL_STATS` entry and empties it (counted as
/// lost when the map is full).
#[inline(never)]
fn flush_row(pid: u32, tid: u32, row: &mut PendingRow) {
    if let Some(dst) = stats_entry(pid, tid, row.nr) {
        // SAFETY: map value pointer; only this thread's calls go there.
        unsafe { (*dst).merge(&row.stats) };
    }
    row.stats.clear();
}
