//! Following targets: children forked by a target become targets (in the
//! kernel, so no early syscall is missed), and fork/exec of targets is
//! reported to userspace through a small ring buffer (rare events only),
//! as is every executable file mapping a target makes (`mmap` with
//! `PROT_EXEC` and a file: the dynamic loader bringing in a library), so
//! that userspace can probe a library dlopen'd while the process runs
//! before it is called, without re-scanning the targets' maps.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{LruHashMap, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{
    counters,
    proc_events::{ProcEvent, KIND_EXEC, KIND_EXIT, KIND_FORK, KIND_MAPPED},
    target_flags,
};

use crate::{bump_targets_gen, count_drop, is_target, TARGETS};

#[map]
pub static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Field offsets in the `task/task_newtask` tracepoint record, read by
/// userspace from tracefs before load (formats differ between kernels).
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: u32 = 32;

/// Field offsets in the `syscalls/sys_enter_mmap` and `sys_exit_mmap`
/// records (read from tracefs before load).
#[unsafe(no_mangle)]
static MMAP_PROT_OFFSET: u32 = 32;
#[unsafe(no_mangle)]
static MMAP_FD_OFFSET: u32 = 48;
#[unsafe(no_mangle)]
static MMAP_RET_OFFSET: u32 = 16;

const CLONE_THREAD: u64 = 0x0001_0000;
const PROT_EXEC: u64 = 0x4;

/// Threads of targets inside an `mmap` of a file with `PROT_EXEC` (tid ->
/// 1), from sys_enter to sys_exit. A thread is in one mmap at a time; LRU,
/// so a thread killed inside the call cannot fill it.
#[map]
static MMAP_EXEC_PENDING: LruHashMap<u32, u8> = LruHashMap::with_max_entries(4096, 0);

fn emit(kind: u32, pid: u32, ppid: u32) {
    let Some(mut entry) = PROC_EVENTS.reserve::<ProcEvent>(0) else {
        count_drop(counters::PROC_EVENTS_RINGBUF_FULL);
        return;
    };
    let ev = ProcEvent {
        kind,
        pid,
        ppid,
        _pad: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    entry.write(ev);
    entry.submit(0);
}

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
    emit(KIND_FORK, child, parent);
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_target(tgid) {
        emit(KIND_EXEC, tgid, 0);
    }
    0
}

/// `sched_process_exit(struct task_struct *p, ...)`: reported for the main
/// thread only; userspace confirms the whole group is gone through /proc.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == pid_tgid as u32 && is_target(tgid) {
        emit(KIND_EXIT, tgid, 0);
    }
    0
}

/// `mmap(addr, len, prot, flags, fd, off)` entered by a target: remember
/// the thread when it maps a file (fd >= 0) executable.
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target((pid_tgid >> 32) as u32) {
        return 0;
    }
    let (prot_off, fd_off) =
        unsafe { (core::ptr::read_volatile(&MMAP_PROT_OFFSET), core::ptr::read_volatile(&MMAP_FD_OFFSET)) };
    let Ok(prot) = (unsafe { ctx.read_at::<u64>(prot_off as usize) }) else { return 0 };
    let Ok(fd) = (unsafe { ctx.read_at::<u64>(fd_off as usize) }) else { return 0 };
    if prot & PROT_EXEC == 0 || (fd as i64) < 0 {
        return 0;
    }
    let _ = MMAP_EXEC_PENDING.insert(&(pid_tgid as u32), &1, 0);
    0
}

/// The `mmap` returned: a successful executable file mapping is reported
/// (the mapping is in /proc/PID/maps now).
#[tracepoint(category = "syscalls", name = "sys_exit_mmap")]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: presence test only.
    if unsafe { MMAP_EXEC_PENDING.get(&tid).is_none() } {
        return 0;
    }
    let _ = MMAP_EXEC_PENDING.remove(&tid);
    let ret_off = unsafe { core::ptr::read_volatile(&MMAP_RET_OFFSET) };
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(ret_off as usize) }) else { return 0 };
    // Errors are -4095..-1.
    if (-4095..0).contains(&ret) {
        return 0;
    }
    emit(KIND_MAPPED, (pid_tgid >> 32) as u32, tid);
    0
}
