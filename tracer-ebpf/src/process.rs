//! Following targets: children forked by a target become targets (in the
//! kernel, so no early syscall is missed), and fork/exec of targets is
//! reported to userspace through a small ring buffer (`PROC_EVENTS`, in
//! the crate root: `syscalls` reports there the executable file mappings
//! of targets too). Rare events only.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{
    counters,
    process::{KIND_EXEC, KIND_EXIT, KIND_FORK},
    target_flags,
};

use crate::{bump_targets_gen, count_drop, emit_proc_event, is_target, python, window_closed, TARGETS};

/// Field offsets in the `task/task_newtask` tracepoint record, read by
/// userspace from tracefs before load (formats differ between kernels).
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: u32 = 32;

const CLONE_THREAD: u64 = 0x0001_0000;

/// Runs in the parent, in `copy_process`, once the child has its pid.
#[tracepoint(category = "task", name = "task_newtask")]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(parent) {
        return 0;
    }
    let (pid_off, flags_off) = unsafe {
        (
            core::ptr::read_volatile(&NEWTASK_PID_OFFSET),
            core::ptr::read_volatile(&NEWTASK_FLAGS_OFFSET),
        )
    };
    let Ok(flags) = (unsafe { ctx.read_at::<u64>(flags_off as usize) }) else { return 0 };
    if flags & CLONE_THREAD != 0 {
        return 0; // a new thread of a target is covered by its tgid
    }
    let Ok(child) = (unsafe { ctx.read_at::<i32>(pid_off as usize) }) else { return 0 };
    let child = child as u32;
    if TARGETS.insert(&child, &target_flags::FOLLOWED, 0).is_err() {
        count_drop(counters::TARGETS_FULL);
    }
    bump_targets_gen();
    emit_proc_event(KIND_FORK, child, parent);
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_target(tgid) {
        emit_proc_event(KIND_EXEC, tgid, 0);
    }
    0
}

/// `sched_process_exit(struct task_struct *p, ...)`, for every exiting
/// thread of a target: its Python thread state is forgotten (its id may
/// be reused); reported for the main thread only; userspace confirms the
/// whole group is gone through /proc.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // Its last syscalls go to the shared table before /proc forgets it
    // (not after the window: the final read sees them where they are).
    if !window_closed(unsafe { bpf_ktime_get_ns() }) {
        crate::syscalls::flush_pending_of(pid_tgid as u32);
    }
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    python::forget_thread(pid_tgid as u32);
    if tgid == pid_tgid as u32 {
        emit_proc_event(KIND_EXIT, tgid, 0);
    }
    0
}
