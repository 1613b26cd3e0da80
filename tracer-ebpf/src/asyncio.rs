//! Event-loop selector calls (`record --async`, docs/python.md "asyncio"):
//! two classic tracepoint programs, attached by userspace to
//! `syscalls/sys_{enter,exit}_{epoll_wait,epoll_pwait,epoll_pwait2}` only
//! when `--async` is on, so that they cost nothing otherwise and fire only
//! for those syscalls. For a target thread each sends one
//! `tracer_common::asyncio::SelectorEvent` (timestamp, the thread's CPU
//! time and run-queue wait so far) to `ASYNC_EVENTS`; userspace makes the
//! loop's iterations of them. A full ring is counted in `ASYNC_LOST`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, tracepoint},
    maps::{PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use tracer_common::asyncio::{SelectorEvent, KIND_ENTER, KIND_EXIT};

use crate::{global, is_target};

/// Offset of `se.sum_exec_runtime` in `struct task_struct` (0: unknown).
#[unsafe(no_mangle)]
static TASK_SUM_EXEC_OFFSET: u64 = 0;
/// Offset of `sched_info.run_delay` in `struct task_struct` (0: unknown).
#[unsafe(no_mangle)]
static TASK_RUN_DELAY_OFFSET: u64 = 0;

#[map]
pub static ASYNC_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Records that did not fit in `ASYNC_EVENTS`.
#[map]
pub static ASYNC_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Offsets in the `syscalls/sys_{enter,exit}_*` records.
const NR_OFFSET: usize = 8;
const RET_OFFSET: usize = 16;

#[inline(always)]
fn task_u64(task: u64, off: u64) -> u64 {
    if off == 0 {
        return 0;
    }
    // SAFETY: a kernel read that may fail (then 0).
    unsafe { bpf_probe_read_kernel((task + off) as *const u64) }.unwrap_or(0)
}

#[inline(always)]
fn emit(ctx: &TracePointContext, kind: u32) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let pid = (id >> 32) as u32;
    if !is_target(pid) {
        return 0;
    }
    let nr = unsafe { ctx.read_at::<i32>(NR_OFFSET) }.unwrap_or(-1) as u32;
    let ret = if kind == KIND_EXIT { unsafe { ctx.read_at::<i64>(RET_OFFSET) }.unwrap_or(0) } else { 0 };
    let task = unsafe { bpf_get_current_task() };
    let ev = SelectorEvent {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cpu_ns: task_u64(task, global(&TASK_SUM_EXEC_OFFSET)),
        run_delay_ns: task_u64(task, global(&TASK_RUN_DELAY_OFFSET)),
        ret,
        pid,
        tid: id as u32,
        kind,
        nr,
    };
    match ASYNC_EVENTS.reserve::<SelectorEvent>(0) {
        Some(mut entry) => {
            entry.write(ev);
            entry.submit(0);
        }
        None => {
            if let Some(p) = ASYNC_LOST.get_ptr_mut(0) {
                // SAFETY: per-CPU slot.
                unsafe { *p += 1 };
            }
        }
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_epoll_wait")]
pub fn asyncio_selector_enter(ctx: TracePointContext) -> u32 {
    emit(&ctx, KIND_ENTER)
}

#[tracepoint(category = "syscalls", name = "sys_exit_epoll_wait")]
pub fn asyncio_selector_exit(ctx: TracePointContext) -> u32 {
    emit(&ctx, KIND_EXIT)
}
