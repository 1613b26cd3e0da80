//! Wall-time accounting in the kernel: a per-thread state machine (running,
//! runnable, off CPU for a reason) driven by sched_switch and
//! sched_wakeup/wakeup_new, off-CPU time aggregated by (thread, reason,
//! stacks) and run-queue latency histograms. (CPU samples: `cpu_samples.rs`.)

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, generated::bpf_get_stack},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
    EbpfContext,
};
use tracer_common::{
    counters,
    sched::*,
    syscalls::hist_bucket,
};

use crate::{
    count_drop, global, is_target, python, syscall_in_flight, kernel_stack_id, user_stack_id, window_closed, window_start_ns, NO_SYSCALL,
};

#[map]
pub static THREADS: HashMap<u32, ThreadState> = HashMap::with_max_entries(32768, 0);

/// Earlier lives of reused thread ids: a new thread whose id still has an
/// entry in `THREADS` moves that entry here (closed, `STATE_DEAD`), keyed
/// by (tid, first_ns), and starts a row of its own. Drained by userspace
/// with the dead entries of `THREADS`.
#[map]
pub static REUSED_THREADS: HashMap<ReusedKey, ThreadState> = HashMap::with_max_entries(4096, 0);

#[map]
pub static OFFCPU_STACKS: HashMap<OffCpuKey, u64> = HashMap::with_max_entries(32768, 0);

/// GIL waits by (waiter, holder): see `GilHolderKey`. LRU: the oldest
/// pairs go first when a long session fills it.
#[map]
pub static GIL_HOLDERS: LruHashMap<GilHolderKey, GilHolderTime> = LruHashMap::with_max_entries(8192, 0);

#[map]
pub static RUNQ_HIST: HashMap<RunqKey, u64> = HashMap::with_max_entries(8192, 0);

/// Off-CPU reason of a syscall number (`REASON_*`), filled by userspace.
#[map]
pub static REASON_OF_NR: Array<u32> = Array::with_max_entries(REASON_TABLE_SIZE, 0);

/// Capture stacks at switch-out (off-CPU stacks).
#[unsafe(no_mangle)]
static OFFCPU_STACKS_ENABLED: u32 = 1;
/// A thread's off-CPU stacks are captured at most this often; a switch-out
/// in the same syscall sooner than that reuses the thread's last stacks
/// (a context-switch-heavy loop blocks at the same place every time).
#[unsafe(no_mangle)]
static OFFCPU_STACK_INTERVAL_NS: u64 = 1_000_000;
/// Offsets of `pid` and `tgid` in `struct task_struct`, from BTF.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u64 = 0;
/// Offset of `se.sum_exec_runtime` in `struct task_struct`, from BTF
/// (0: unknown, the repair of missed switch-ins is off).
#[unsafe(no_mangle)]
static TASK_EXEC_OFFSET: u64 = 0;

/// `TASK_RUNNING` as `prev_state`: the thread was preempted.
const TASK_RUNNING: u64 = 0;
const TASK_DEAD: u64 = 0x80;
/// `__TASK_STOPPED | __TASK_TRACED`: a stop (SIGSTOP, a debugger), not a wait on memory.
const TASK_STOPPED_OR_TRACED: u64 = 0x4 | 0x8;

/// Kernel text ranges [start, end) that mark a wait outside any syscall as
/// a memory wait (`memory_reason_of_stack`), from `/proc/kallsyms` at load
/// time (all 0: symbols hidden, such waits stay `other`): the page-fault
/// entry (two functions: the entry stub and its handler) and memory.high
/// throttling on the way back to user mode.
#[unsafe(no_mangle)]
static MEM_FAULT_START: u64 = 0;
#[unsafe(no_mangle)]
static MEM_FAULT_END: u64 = 0;
#[unsafe(no_mangle)]
static MEM_FAULT2_START: u64 = 0;
#[unsafe(no_mangle)]
static MEM_FAULT2_END: u64 = 0;
#[unsafe(no_mangle)]
static MEM_THROTTLE_START: u64 = 0;
#[unsafe(no_mangle)]
static MEM_THROTTLE_END: u64 = 0;

/// Kernel frames read to find a page fault under a wait: a fault waiting
/// for a page-in is ~15 frames deep under `__schedule` (filesystem and
/// block layers included); 48 leaves room.
const KSTACK_SCAN: usize = 48;

/// Per CPU: the kernel stack `memory_reason_of_stack` reads (too big for the BPF stack).
#[map]
static KSTACK_SCRATCH: PerCpuArray<[u64; KSTACK_SCAN]> = PerCpuArray::with_max_entries(1, 0);

/// (tgid, tid) of a task pointer.
#[inline(always)]
fn task_ids(task: u64) -> Option<(u32, u32)> {
    let tid: i32 = unsafe { bpf_probe_read_kernel((task + global(&TASK_PID_OFFSET)) as *const i32) }.ok()?;
    let tgid: i32 = unsafe { bpf_probe_read_kernel((task + global(&TASK_TGID_OFFSET)) as *const i32) }.ok()?;
    Some((tgid as u32, tid as u32))
}

/// The kernel's CPU-time counter of a task (`EXEC_UNKNOWN` if unreadable).
#[inline(always)]
fn task_exec_ns(task: u64) -> u64 {
    let off = global(&TASK_EXEC_OFFSET);
    if off == 0 {
        return EXEC_UNKNOWN;
    }
    unsafe { bpf_probe_read_kernel((task + off) as *const u64) }.unwrap_or(EXEC_UNKNOWN)
}

/// The thread's state entry, created in `state` since `since` when missing
/// (`task`: its task_struct, for the CPU-time counter; 0 when unknown).
#[inline(always)]
fn thread(tgid: u32, tid: u32, state: u32, since: u64, task: u64) -> Option<*mut ThreadState> {
    if let Some(p) = THREADS.get_ptr_mut(&tid) {
        return Some(p);
    }
    let p = new_thread(tgid, tid, state, since, task);
    (!p.is_null()).then_some(p)
}

/// Inserts a thread's state entry. A function of its own: the entry built
/// on its stack stays out of the frames of `sched_switch` & co, which are
/// live under the off-CPU stack walk (the verifier's 512-byte limit holds
/// for the whole call chain).
/// Null when the map is full (counted).
#[inline(never)]
fn new_thread(tgid: u32, tid: u32, state: u32, since: u64, task: u64) -> *mut ThreadState {
    // Read only for a new entry: an existing one has its value from its last switch-out.
    let exec = if task == 0 { EXEC_UNKNOWN } else { task_exec_ns(task) };
    let fresh = ThreadState::new(tgid, tid, state, since, exec);
    if THREADS.insert(&tid, &fresh, 0).is_err() {
        count_drop(counters::THREADS_FULL);
        return core::ptr::null_mut();
    }
    THREADS.get_ptr_mut(&tid).unwrap_or(core::ptr::null_mut())
}

/// Counts `ns` more in the thread's current state: its sums
/// (`ThreadState::charge`, shared with userspace), and the off-CPU stacks
/// or the run-queue histogram.
#[inline(always)]
fn charge(t: &mut ThreadState, ns: u64) {
    match t.charge(ns) {
        Charge::OffCpu => {
            add_off_cpu_stacks(&t.offcpu_key(), ns);
            if t.reason == REASON_GIL {
                add_gil_holder(t, ns);
            }
        }
        Charge::Runqueue => add_runqueue_hist(t.pid, ns),
        Charge::OnCpu | Charge::Nowhere => {}
    }
}

#[inline(always)]
fn add_off_cpu_stacks(key: &OffCpuKey, ns: u64) {
    match OFFCPU_STACKS.get_ptr_mut(key) {
        Some(p) => unsafe { *p += ns },
        None => {
            if OFFCPU_STACKS.insert(key, &ns, 0).is_err() {
                count_drop(counters::STACKS_LOST);
            }
        }
    }
}

/// Counts `ns` of a GIL wait to the holder it waited for. A wait that
/// began with the waiter itself as the GIL's last holder (it had just
/// dropped the GIL on a switch request, and the thread that asked had not
/// taken it yet: a wait as long as that thread's run-queue delay, under
/// load a sixth of the waits) or with no holder known is given the last
/// holder now, when it is charged: the thread that held the GIL meanwhile
/// (a release leaves `last_holder` as it was). Still unknown, it is left
/// to the off-CPU stacks alone: no map work for it.
#[inline(always)]
fn add_gil_holder(t: &mut ThreadState, ns: u64) {
    if t.gil.tid == 0 || t.gil.tid == t.tid {
        t.gil = gil_holder(t.pid);
        if t.gil.tid == 0 || t.gil.tid == t.tid {
            return;
        }
    }
    let key = GilHolderKey { pid: t.pid, tid: t.tid, holder: t.gil };
    let wait = (t.state == STATE_OFF_CPU) as u64;
    match GIL_HOLDERS.get_ptr_mut(&key) {
        Some(p) => unsafe {
            (*p).ns += ns;
            (*p).waits += wait;
        },
        None => {
            let _ = GIL_HOLDERS.insert(&key, &GilHolderTime { ns, waits: wait }, 0);
        }
    }
}

/// Who holds the GIL of `tgid` now, and what it is doing: blocked (its
/// own off-CPU stacks and syscall) or running. A function of its own, off
/// the chain under the stack walks.
#[inline(never)]
fn gil_holder(tgid: u32) -> GilHolder {
    let tid = python::gil_holder_tid(tgid);
    let mut h = GilHolder { tid, state: STATE_UNKNOWN, nr: NO_SYSCALL, user_stack: NO_STACK, py_stack: 0 };
    if tid == 0 {
        return h;
    }
    if let Some(s) = unsafe { THREADS.get(&tid) } {
        h.state = s.state;
        // The Python stack it last left the CPU with: where it blocks now,
        // or, running, where it last waited (for a Python thread in GIL
        // contention, its GIL wait at the line it runs). Walking a running
        // holder's frames here too put a second stack walk under
        // sched_switch: past the verifier's 1M instructions with
        // --debug-ebpf.
        h.py_stack = s.py_stack;
        if s.state == STATE_OFF_CPU {
            h.user_stack = s.user_stack;
            if s.in_syscall != 0 {
                h.nr = syscall_in_flight(tid).0;
            }
        }
    }
    h
}

#[inline(always)]
fn add_runqueue_hist(pid: u32, ns: u64) {
    let key = RunqKey { pid, bucket: hist_bucket(ns) as u32 };
    match RUNQ_HIST.get_ptr_mut(&key) {
        Some(p) => unsafe { *p += 1 },
        None => {
            let _ = RUNQ_HIST.insert(&key, &1u64, 0);
        }
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)`
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let prev_tid = pid_tgid as u32;
    let now = unsafe { bpf_ktime_get_ns() };
    if window_closed(now) {
        return 0;
    }
    // The syscalls it returned from on this CPU, summed since it came on,
    // go to the shared table before it may run elsewhere.
    crate::syscalls::flush_pending_of(prev_tid);
    let prev_tgid = (pid_tgid >> 32) as u32;
    if prev_tid != 0 && (is_target(prev_tgid) || exiting_known(&ctx, prev_tgid, prev_tid)) {
        let prev: u64 = ctx.arg(1);
        switch_out(&ctx, prev_tgid, prev_tid, now, task_exec_ns(prev));
    }
    let next: u64 = ctx.arg(2);
    if let Some((tgid, tid)) = task_ids(next) {
        if tid != 0 && is_target(tgid) {
            switch_in(tgid, tid, now, next);
        }
    }
    0
}

/// The last switch-out of a thread we follow whose process already left
/// the target set: userspace drops a process once /proc shows it gone
/// (its leader a zombie, no live thread), while its last thread may still
/// be tearing down the memory (`exit_mmap`, preempted: runnable). Without
/// its exit, that thread stayed runnable to the end of the window (a
/// DataLoader worker that lived 0.7 s had a thread of 6.9 s, "CPU
/// starvation at folios_put_refs").
#[inline(always)]
fn exiting_known(ctx: &BtfTracePointContext, tgid: u32, tid: u32) -> bool {
    let prev_state: u64 = ctx.arg(3);
    prev_state & TASK_DEAD != 0 && unsafe { THREADS.get(&tid) }.is_some_and(|t| t.pid == tgid && t.state != STATE_DEAD)
}

#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, tgid: u32, tid: u32, now: u64, exec: u64) {
    let Some(t) = thread(tgid, tid, STATE_RUNNING, window_start_ns(), 0) else { return };
    let t = unsafe { &mut *t };
    let elapsed = now.saturating_sub(t.since_ns);
    match t.state {
        STATE_RUNNING => {
            crate::timeline::state_ended(t, now);
            t.on_cpu_ns += elapsed
        }
        // Switched out while we thought it waited: its switch-in was never
        // reported (the kernel skips the tracepoint in some contexts). The
        // kernel's CPU-time counter says how long it actually ran; the
        // timeline shows the wait first, then the run, as the sums count them.
        STATE_RUNNABLE | STATE_OFF_CPU => {
            let rest = t.take_missed_run(elapsed, exec);
            let ran_from = t.since_ns + rest;
            crate::timeline::interval(t, t.state, t.since_ns, ran_from);
            crate::timeline::interval(t, STATE_RUNNING, ran_from, now);
            charge(t, rest);
        }
        _ => crate::timeline::state_ended(t, now),
    }
    t.exec_ns = exec;
    if let Ok(comm) = bpf_get_current_comm() {
        t.comm = comm;
    }
    let prev_state: u64 = ctx.arg(3);
    let (nr, uaddr) = syscall_in_flight(tid);
    t.in_syscall = (nr != NO_SYSCALL) as u32;
    t.since_ns = now;
    if prev_state & TASK_DEAD != 0 {
        crate::timeline::lifecycle(tracer_common::timeline::KIND_THREAD_EXIT, tgid, tid, now);
        t.state = STATE_DEAD;
        t.end_ns = now;
    } else if prev_state == TASK_RUNNING {
        t.state = STATE_RUNNABLE;
        t.reason = REASON_OTHER;
    } else {
        t.state = STATE_OFF_CPU;
        t.reason = if t.mem_op != MEM_OP_NONE {
            // In reclaim or compaction: a memory wait, in a syscall or not.
            reason_of_mem_op(t.mem_op)
        } else if nr == NO_SYSCALL {
            // Blocked in the kernel outside any syscall: a page fault
            // (or memory.high throttling), unless the stack says otherwise.
            if prev_state & TASK_STOPPED_OR_TRACED == 0 { memory_reason_of_stack(ctx.as_ptr()) } else { REASON_OTHER }
        } else {
            let r = REASON_OF_NR.get(nr).copied().unwrap_or(REASON_OTHER);
            if r == REASON_LOCK && python::is_gil_address(tgid, uaddr) { REASON_GIL } else { r }
        };
        if t.reason == REASON_GIL {
            t.gil = gil_holder(tgid);
        } else {
            t.gil = GilHolder::default();
        }
        let fresh = now.saturating_sub(t.stack_ns) >= global(&OFFCPU_STACK_INTERVAL_NS) || nr != t.stack_nr;
        if global(&OFFCPU_STACKS_ENABLED) != 0 && fresh {
            t.user_stack = user_stack_id(ctx);
            t.kernel_stack = kernel_stack_id(ctx);
            t.py_stack = python::capture(tgid, tid, python::SCRATCH_SCHED);
            t.stack_ns = now;
            t.stack_nr = nr;
        }
    }
}

#[inline(always)]
fn switch_in(tgid: u32, tid: u32, now: u64, task: u64) {
    let Some(t) = thread(tgid, tid, STATE_RUNNABLE, now, task) else { return };
    let t = unsafe { &mut *t };
    crate::timeline::state_ended(t, now);
    // Runnable: run-queue time (GIL time for a thread woken to take the
    // GIL, `charge_of`). Off CPU: woken without a wakeup we saw, the wait
    // counts as off-CPU. Running: a switch-out we missed (around attach),
    // counted on CPU to keep the parts adding up.
    charge(t, now.saturating_sub(t.since_ns));
    t.state = STATE_RUNNING;
    t.since_ns = now;
}

#[inline(always)]
fn wakeup(ctx: &BtfTracePointContext, new: bool) {
    let task: u64 = ctx.arg(0);
    let Some((tgid, tid)) = task_ids(task) else { return };
    if !is_target(tgid) {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if window_closed(now) {
        return;
    }
    let Some(t) = thread(tgid, tid, STATE_RUNNABLE, now, task) else { return };
    let t = unsafe { &mut *t };
    if new {
        crate::timeline::lifecycle(tracer_common::timeline::KIND_THREAD_START, tgid, tid, now);
    }
    if new && t.first_ns != now {
        // A new thread whose id has an entry: the id was reused, that entry
        // belongs to a thread that exited. Close it (a thread whose exit we
        // never saw ends at its last event), keep it for userspace, start over.
        if t.state != STATE_DEAD {
            t.state = STATE_DEAD;
            t.end_ns = t.since_ns;
        }
        let key = ReusedKey { tid, _pad: 0, first_ns: t.first_ns };
        if REUSED_THREADS.insert(&key, &*t, 0).is_err() {
            count_drop(counters::THREADS_FULL);
        }
        *t = ThreadState::new(tgid, tid, STATE_RUNNABLE, now, task_exec_ns(task));
        return;
    }
    if t.state == STATE_OFF_CPU {
        crate::timeline::state_ended(t, now);
        charge(t, now.saturating_sub(t.since_ns));
        t.state = STATE_RUNNABLE;
        t.since_ns = now;
    }
}

/// The reason of a wait that began outside any syscall and any memory
/// operation, from the kernel stack of the thread switching out: a frame
/// in the page-fault entry makes it a page-fault wait, one in memory.high
/// throttling a throttling wait; anything else (a thread still in a syscall
/// that began before the window, a freezer) stays `other`. A function of its
/// own: its frame stays off the chain under the off-CPU stack walk.
#[inline(never)]
fn memory_reason_of_stack(ctx: *mut core::ffi::c_void) -> u32 {
    let fault = (global(&MEM_FAULT_START), global(&MEM_FAULT_END));
    let fault2 = (global(&MEM_FAULT2_START), global(&MEM_FAULT2_END));
    let throttle = (global(&MEM_THROTTLE_START), global(&MEM_THROTTLE_END));
    if fault.1 == 0 && fault2.1 == 0 && throttle.1 == 0 {
        return REASON_OTHER;
    }
    let Some(buf) = KSTACK_SCRATCH.get_ptr_mut(0) else { return REASON_OTHER };
    // SAFETY: the helper writes at most the size given into the per-CPU slot.
    let n = unsafe { bpf_get_stack(ctx, buf as *mut core::ffi::c_void, (KSTACK_SCAN * 8) as u32, 0) };
    if n <= 0 {
        return REASON_OTHER;
    }
    let frames = n as usize / 8;
    // SAFETY: this CPU's slot, read after the helper filled it.
    let buf = unsafe { &*buf };
    for (i, ip) in buf.iter().enumerate() {
        if i >= frames {
            break;
        }
        let ip = *ip;
        if (ip >= fault.0 && ip < fault.1) || (ip >= fault2.0 && ip < fault2.1) {
            return REASON_MEM_FAULT;
        }
        if ip >= throttle.0 && ip < throttle.1 {
            return REASON_MEM_THROTTLE;
        }
    }
    REASON_OTHER
}

/// A target thread enters memory operation `op` (reclaim, compaction): the
/// waits that begin inside are memory waits. An operation inside another
/// keeps the outer one's cause.
#[inline(always)]
fn mem_op_begin(op: u32) {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(t) = THREADS.get_ptr_mut(&tid) {
        // SAFETY: the thread's own entry; only it changes `mem_op`.
        let t = unsafe { &mut *t };
        if t.mem_op == MEM_OP_NONE {
            t.mem_op = op;
        }
    }
}

#[inline(always)]
fn mem_op_end(op: u32) {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(t) = THREADS.get_ptr_mut(&tid) {
        // SAFETY: as in `mem_op_begin`.
        let t = unsafe { &mut *t };
        if t.mem_op == op {
            t.mem_op = MEM_OP_NONE;
        }
    }
}

/// Direct reclaim by an allocating thread (the machine short of memory).
#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_begin")]
pub fn sched_mem_reclaim_begin(_ctx: BtfTracePointContext) -> i32 {
    mem_op_begin(MEM_OP_RECLAIM);
    0
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn sched_mem_reclaim_end(_ctx: BtfTracePointContext) -> i32 {
    mem_op_end(MEM_OP_RECLAIM);
    0
}

/// Reclaim in a memory cgroup over its limit (or `memory.high`), by the
/// thread charging the page.
#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_begin")]
pub fn sched_memcg_reclaim_begin(_ctx: BtfTracePointContext) -> i32 {
    mem_op_begin(MEM_OP_RECLAIM);
    0
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn sched_memcg_reclaim_end(_ctx: BtfTracePointContext) -> i32 {
    mem_op_end(MEM_OP_RECLAIM);
    0
}

/// Compaction of a zone (kcompactd's is not a target's).
#[btf_tracepoint(function = "mm_compaction_begin")]
pub fn sched_mem_compaction_begin(_ctx: BtfTracePointContext) -> i32 {
    mem_op_begin(MEM_OP_COMPACTION);
    0
}

#[btf_tracepoint(function = "mm_compaction_end")]
pub fn sched_mem_compaction_end(_ctx: BtfTracePointContext) -> i32 {
    mem_op_end(MEM_OP_COMPACTION);
    0
}

/// `sched_wakeup(struct task_struct *p)`
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    wakeup(&ctx, false);
    0
}

/// `sched_wakeup_new(struct task_struct *p)`: a new thread or process.
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    wakeup(&ctx, true);
    0
}
