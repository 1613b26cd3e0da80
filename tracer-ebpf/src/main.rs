//! infertrace kernel programs. One module per probe family; the maps that
//! several families share live here.
#![no_std]
#![no_main]

mod cuda;
mod process;
mod python;
mod sched;
mod syscalls;

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};

/// Processes (tgid) being traced, with `tracer_common::target_flags`.
/// Userspace inserts the explicit targets; `process` adds forked children.
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// `[0]`: `bpf_ktime_get_ns()` when the window opened, written by userspace
/// right before attaching. Read on rare paths only.
#[map]
pub static WINDOW: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn window_start_ns() -> u64 {
    WINDOW.get(0).copied().unwrap_or(0)
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

#[inline(always)]
pub fn count_drop(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
