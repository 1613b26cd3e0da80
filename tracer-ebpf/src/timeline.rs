//! `record --timeline` (a helper, no programs of its own, like `python.rs`):
//! the families call these when an interval ends, a sample is taken or a
//! slow syscall returns. Each checks the load-time global first, so with
//! the timeline off (the default) the cost is one load and a branch.
//! Records that do not fit the ring buffer are counted in `TIMELINE_LOST`.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use tracer_common::{
    python::SlowKey,
    cpu_samples::SampleKey,
    sched::{ThreadState, NO_STACK},
    timeline::{TimelineEvent, KIND_SAMPLE, KIND_STATE, KIND_SYSCALL, RING_BYTES},
};

use crate::global;

/// Set by userspace at load time when `--timeline` is given.
#[unsafe(no_mangle)]
static TIMELINE_ENABLED: u32 = 0;

#[map]
pub static TIMELINE_EVENTS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

/// Records that did not fit in `TIMELINE_EVENTS`.
#[map]
pub static TIMELINE_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn enabled() -> bool {
    global(&TIMELINE_ENABLED) != 0
}

#[inline(never)]
fn emit(ev: &TimelineEvent) {
    match TIMELINE_EVENTS.reserve::<TimelineEvent>(0) {
        Some(mut entry) => {
            entry.write(*ev);
            entry.submit(0);
        }
        None => {
            if let Some(p) = TIMELINE_LOST.get_ptr_mut(0) {
                unsafe { *p += 1 };
            }
        }
    }
}

/// The thread's current state (since `t.since_ns`) ends at `now`.
#[inline(always)]
pub fn state_ended(t: &ThreadState, now: u64) {
    interval(t, t.state, t.since_ns, now);
}

/// The thread was in `state` from `begin` to `end` (its reason and stacks
/// are those of `t`): a part of an interval that the kernel's sums split,
/// so that the timeline splits it the same way.
#[inline(always)]
pub fn interval(t: &ThreadState, state: u32, begin: u64, end: u64) {
    if !enabled() || end <= begin {
        return;
    }
    emit(&TimelineEvent {
        kind: KIND_STATE,
        pid: t.pid,
        tid: t.tid,
        state,
        reason: t.reason,
        user_stack: t.user_stack,
        kernel_stack: t.kernel_stack,
        _pad: 0,
        begin_ns: begin,
        end_ns: end,
        py_stack: t.py_stack,
    });
}

/// A CPU sample was taken.
#[inline(always)]
pub fn sample(key: &SampleKey) {
    if !enabled() {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    emit(&TimelineEvent {
        kind: KIND_SAMPLE,
        pid: key.pid,
        tid: key.tid,
        state: 0,
        reason: 0,
        user_stack: key.user_stack,
        kernel_stack: key.kernel_stack,
        _pad: 0,
        begin_ns: now,
        end_ns: now,
        py_stack: key.py_stack,
    });
}

/// A slow syscall of `ns` returned now.
#[inline(always)]
pub fn syscall(key: &SlowKey, ns: u64) {
    if !enabled() {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    emit(&TimelineEvent {
        kind: KIND_SYSCALL,
        pid: key.pid,
        tid: key.tid,
        state: key.nr,
        reason: 0,
        user_stack: key.user_stack,
        kernel_stack: NO_STACK,
        _pad: 0,
        begin_ns: now.saturating_sub(ns),
        end_ns: now,
        py_stack: key.py_stack,
    });
}

/// A thread started or exited (`kind`: `KIND_THREAD_START`, `KIND_THREAD_EXIT`) at `now`.
#[inline(always)]
pub fn lifecycle(kind: u32, pid: u32, tid: u32, now: u64) {
    if !enabled() {
        return;
    }
    emit(&TimelineEvent {
        kind,
        pid,
        tid,
        state: 0,
        reason: 0,
        user_stack: NO_STACK,
        kernel_stack: NO_STACK,
        _pad: 0,
        begin_ns: now,
        end_ns: now,
        py_stack: 0,
    });
}
