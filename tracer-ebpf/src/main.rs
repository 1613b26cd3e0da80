//! infertrace kernel programs.
//!
//! Module layout (no cycles):
//! - probe families, one module each, named as the families of
//!   `tracer-user/src/families/`: `process`, `syscalls`, `sched`,
//!   `cpu_samples`, `cuda`, `exec_watch`, `overhead`, `asyncio`.
//!   A family imports from this crate root (and the helper module below)
//!   only, never from another family.
//! - `python`: the CPython stack walker, a helper the families call; it has
//!   no programs and imports from the crate root only.
//! - this file: the maps that more than one module uses, and the small
//!   helpers they share (target filter, drop counters, load-time globals,
//!   the kernel-side debug-log gate).
#![no_std]
#![no_main]
// Map keys and values are passed by reference on purpose: aya-ebpf's map
// methods take `impl Borrow<K>`, and passing a struct by value can copy it
// onto the 512-byte BPF stack.
#![allow(clippy::needless_borrows_for_generic_args)]

mod asyncio;
mod cpu_samples;
mod cuda;
mod exec_watch;
mod memory;
mod overhead;
mod process;
mod python;
mod sched;
mod syscall_slot;
mod syscalls;
mod timeline;

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::tracing::StackIdContext,
};
use tracer_common::{process::ProcEvent, syscalls::SyscallStart};

/// Processes (tgid) being traced, with `tracer_common::target_flags`.
/// Userspace inserts the explicit targets; `process` adds forked children.
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// `[0]`: `bpf_ktime_get_ns()` when the window opened, written by userspace
/// right before attaching. `[1]`: when it closed (0 while open), written
/// by userspace before it detaches anything: events after it belong to no
/// recording (the scheduler and syscall programs ignore them).
#[map]
pub static WINDOW: Array<u64> = Array::with_max_entries(2, 0);

#[inline(always)]
pub fn window_start_ns() -> u64 {
    WINDOW.get(0).copied().unwrap_or(0)
}

/// Whether the window had closed at `now` (an array read, inlined by the
/// verifier: cheap enough for every context switch).
#[inline(always)]
pub fn window_closed(now: u64) -> bool {
    let end = WINDOW.get(1).copied().unwrap_or(0);
    end != 0 && now > end
}

/// Drop counters, indexed by `tracer_common::counters::*`.
#[map]
pub static COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(tracer_common::counters::COUNT, 0);

/// Generation of `TARGETS`: bumped by whoever changes it, so that the
/// per-CPU verdict caches below notice.
#[map]
pub static TARGETS_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// The last target verdict per CPU. A syscall-heavy thread asks about the
/// same tgid over and over: this turns a hash lookup per syscall into an
/// inlined array read. One u64 (`tgid << 32 | gen << 1 | verdict`), read and
/// written with single 8-byte accesses: the syscall tracepoints are
/// preemptible here, and a multi-field entry could be torn.
#[map]
static TARGET_CACHE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    let gen = TARGETS_GEN.get(0).copied().unwrap_or(0) & 0x7fff_ffff;
    let tag = ((tgid as u64) << 32) | (gen << 1);
    let cache = TARGET_CACHE.get_ptr_mut(0);
    if let Some(c) = cache {
        // SAFETY: per-CPU slot, accessed as one aligned u64.
        let entry = unsafe { core::ptr::read_volatile(c) };
        if entry & !1 == tag {
            return entry & 1 != 0;
        }
    }
    // SAFETY: the value is only tested for presence.
    let verdict = unsafe { TARGETS.get(&tgid).is_some() };
    if let Some(c) = cache {
        unsafe { core::ptr::write_volatile(c, tag | verdict as u64) };
    }
    verdict
}

/// Invalidates every CPU's verdict cache after a change to `TARGETS`.
#[inline(always)]
pub fn bump_targets_gen() {
    if let Some(g) = TARGETS_GEN.get_ptr_mut(0) {
        // A lost concurrent increment still changes the value: good enough.
        unsafe { *g += 1 };
    }
}

/// Lifecycle records for the process follower (`tracer_common::process`):
/// fork/exec/exit from `process`, executable mappings from `syscalls`.
#[map]
pub static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Sends one `ProcEvent` (counted in `PROC_EVENTS_RINGBUF_FULL` when the
/// ring is full).
pub fn emit_proc_event(kind: u32, pid: u32, ppid: u32) {
    let Some(mut entry) = PROC_EVENTS.reserve::<ProcEvent>(0) else {
        count_drop(tracer_common::counters::PROC_EVENTS_RINGBUF_FULL);
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

#[inline(always)]
pub fn count_drop(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// Native stacks (user and kernel) of every family: off-CPU and CPU
/// samples (`sched`), slow syscalls (`syscalls`), CUDA calls (`cuda`).
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

/// `bpf_get_stackid` flag: the user stack rather than the kernel's.
pub const BPF_F_USER_STACK: u64 = 1 << 8;

/// The id of the current user stack in `STACKS`: `NO_STACK` (-1) when
/// there is none to take, `STACK_COLLIDED` when another stack holds its
/// bucket (counted: the event is kept, its native frames are not).
#[inline(always)]
pub fn user_stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    stack_id(ctx, BPF_F_USER_STACK)
}

/// The id of the current kernel stack in `STACKS`, as [`user_stack_id`].
#[inline(always)]
pub fn kernel_stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    stack_id(ctx, 0)
}

#[inline(always)]
fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    use tracer_common::sched::{NO_STACK, STACK_COLLIDED};
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        // EEXIST: the bucket of this stack's hash holds another stack (no
        // BPF_F_REUSE_STACKID: that would change the stacks of ids already
        // stored in the aggregates).
        Err(-17) => {
            count_drop(tracer_common::counters::STACKS_COLLIDED);
            STACK_COLLIDED
        }
        Err(_) => NO_STACK,
    }
}

/// The syscall in flight, per thread (only the thread itself writes its
/// entry), for the threads that own no slot in `syscall_slot` (the fast
/// path): written by `syscalls` (sys_enter / sys_exit), read by `sched`
/// (the off-CPU reason). Deliberately not a per-CPU slot: on this kernel
/// the syscall tracepoints run preemptible, so a per-CPU protocol between
/// sys_enter, sys_exit and sched_switch loses calls when a program is
/// preempted.
#[map]
pub static SYSCALL_START: HashMap<u32, SyscallStart> = HashMap::with_max_entries(65536, 0);

/// `syscall_in_flight`'s number when the thread is in no syscall.
pub const NO_SYSCALL: u32 = u32::MAX;

/// The (nr, first argument) of the syscall `tid` is inside, `(NO_SYSCALL,
/// 0)` if none (used by sched_switch for the off-CPU reason and GIL
/// detection). Not an `Option`: LLVM leaves a `None`'s payload undefined and
/// may spill that register, which the verifier rejects as uninitialised.
#[inline(always)]
pub fn syscall_in_flight(tid: u32) -> (u32, u64) {
    let slot = syscall_slot::owned(tid);
    if !slot.is_null() {
        // SAFETY: the thread's own slot (`syscall_slot`), read only.
        let s = unsafe { *slot };
        return if s.ts != 0 { (s.nr, s.arg0) } else { (NO_SYSCALL, 0) };
    }
    // SAFETY: read-only use of the value.
    match unsafe { SYSCALL_START.get(&tid) } {
        Some(s) if s.ts != 0 => (s.nr, s.arg0),
        _ => (NO_SYSCALL, 0),
    }
}

/// Reads a load-time global (a `#[no_mangle] static` the loader may patch).
#[inline(always)]
pub fn global<T: Copy>(v: &T) -> T {
    // SAFETY: globals live in .rodata, patched by the loader.
    unsafe { core::ptr::read_volatile(v) }
}

/// Kernel-side diagnostics (aya-log records in `AYA_LOGS`): 0 off (the
/// default), non-zero on. Set at load time by `record --debug-ebpf`. Every
/// log site is behind this gate: with it off, a Python stack capture and a
/// failed CUDA argument read pay one load and a branch, nothing else does,
/// and the verifier, seeing the frozen 0, drops the dead diagnostic code
/// (measured: the loaded programs grow by 0-20 instructions; with it on,
/// by up to 3000, and loading them all takes ~0.6 s instead of ~0.2 s).
#[unsafe(no_mangle)]
static DEBUG_EBPF: u32 = 0;

/// At most one diagnostic per CPU per this interval: a systematic fault (a
/// wrong interpreter layout, say) would otherwise log on every sample.
const DEBUG_LOG_INTERVAL_NS: u64 = 100_000_000;

/// When the last diagnostic was emitted on this CPU.
#[map]
static DEBUG_LOG_LAST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether kernel-side diagnostics are on (`DEBUG_EBPF`). With them off,
/// the default, this is one load and a branch; test the rare condition
/// first where that is cheaper still.
#[inline(always)]
pub fn debug_enabled() -> bool {
    global(&DEBUG_EBPF) != 0
}

/// Whether this CPU may log a diagnostic now (at most one per
/// `DEBUG_LOG_INTERVAL_NS`); call it under `debug_enabled()`, right before
/// the log line. Races between preemptible programs on one CPU only let an
/// extra line through.
#[inline(never)]
pub fn debug_log_allowed() -> bool {
    let Some(last) = DEBUG_LOG_LAST.get_ptr_mut(0) else { return false };
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: per-CPU slot, one aligned u64.
    unsafe {
        if *last != 0 && now.saturating_sub(*last) < DEBUG_LOG_INTERVAL_NS {
            return false;
        }
        *last = now;
    }
    true
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
