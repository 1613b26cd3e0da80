//! infertrace kernel programs. One module per probe family; the maps that
//! several families share live here.
#![no_std]
#![no_main]

mod process;
mod syscalls;

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};

/// Processes (tgid) being traced, with `tracer_common::target_flags`.
/// Userspace inserts the explicit targets; `process` adds forked children.
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// Drop counters, indexed by `tracer_common::counters::*`.
#[map]
pub static COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(tracer_common::counters::COUNT, 0);

#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { TARGETS.get(&tgid).is_some() }
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
