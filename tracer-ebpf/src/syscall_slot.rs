//! The fast path of the per-thread syscall in flight: a slot per thread in
//! an array indexed by the thread id itself (`tid % SYSCALL_SLOT_COUNT`),
//! tagged with the owner's tid. Two array reads, inlined by the verifier,
//! instead of a hash lookup at every sys_enter and sys_exit (measured
//! here: a `SYSCALL_START` lookup cost ~50 ns per program run).
//!
//! A thread claims its slot once, at its first sys_enter with the slot
//! free: the claim is an atomic `BPF_NOEXIST` insert of (slot -> tid) in
//! `SYSCALL_SLOT_OWNER`, so two threads whose ids share a slot (possible
//! only where `pid_max` exceeds the slot count) never both own it; the
//! loser, and any thread whose claim fails, keeps using `SYSCALL_START`
//! (the hash map) as before. Only the owner writes its slot. Userspace
//! lists the owned slots through `SYSCALL_SLOT_OWNER` (the calls in flight
//! at the window's end) and frees those of exited threads (slot zeroed
//! first, owner entry removed second, so that a new claim cannot be
//! zeroed). A helper module: no programs; used by `syscalls` and, through
//! `syscall_in_flight` in the crate root, by `sched`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use tracer_common::syscalls::{SyscallStart, SYSCALL_SLOT_COUNT};

/// `BPF_NOEXIST`: insert only if the key is absent (atomic per bucket).
const BPF_NOEXIST: u64 = 1;

/// The slots: a `SyscallStart` with `tid` = the owner (0: free).
#[map]
pub static SYSCALL_SLOTS: Array<SyscallStart> = Array::with_max_entries(SYSCALL_SLOT_COUNT, 0);

/// Owned slots: slot index -> owner tid (at most this many threads own a
/// slot at once; a claim beyond fails and the thread uses `SYSCALL_START`).
#[map]
pub static SYSCALL_SLOT_OWNER: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

#[inline(always)]
fn index(tid: u32) -> u32 {
    tid & (SYSCALL_SLOT_COUNT - 1)
}

/// `tid`'s slot if it owns one, else null. A raw pointer, not an
/// `Option` (see `syscall_in_flight` in the crate root).
#[inline(always)]
pub fn owned(tid: u32) -> *mut SyscallStart {
    let Some(p) = SYSCALL_SLOTS.get_ptr_mut(index(tid)) else { return core::ptr::null_mut() };
    // SAFETY: array value pointer; the tag is one aligned u32.
    if unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*p).tid)) } == tid {
        p
    } else {
        core::ptr::null_mut()
    }
}

/// Claims `tid`'s slot if it is free; whether the thread owns it now.
#[inline(never)]
pub fn claim(tid: u32) -> bool {
    let idx = index(tid);
    let Some(p) = SYSCALL_SLOTS.get_ptr_mut(idx) else { return false };
    // SAFETY: as in `owned`.
    if unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*p).tid)) } != 0 {
        return false;
    }
    if SYSCALL_SLOT_OWNER.insert(&idx, &tid, BPF_NOEXIST).is_err() {
        return false;
    }
    // The owner now: no other writer. Empty (no call in flight) until the
    // caller writes its start.
    unsafe { *p = SyscallStart { ts: 0, nr: 0, tid, arg0: 0 } };
    true
}
