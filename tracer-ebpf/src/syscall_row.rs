//! The fast path of the per-thread syscall counts: row
//! `syscall_row_index(tid, nr)` of the `SYSCALL_ROWS` array, tagged with its
//! owner's `SyscallKey`. An inlined array read and a key compare instead of
//! a `SYSCALL_STATS` hash lookup at every sys_exit (measured here: that
//! lookup and its update cost ~75 ns per call).
//!
//! A key claims its row once, when the row is free and the key has no
//! entry in `SYSCALL_STATS` (so that a key's counts are in one place only):
//! the claim is an atomic `BPF_NOEXIST` insert of (row -> key) in
//! `SYSCALL_ROW_OWNER`, so two keys sharing a row never both own it; the
//! loser keeps using `SYSCALL_STATS` as before. Only the owning thread
//! writes its row. Userspace reads the owned rows through
//! `SYSCALL_ROW_OWNER` and frees those of exited threads (row zeroed
//! first, owner entry removed second: a claimed row is all zero but its
//! key). A helper module: no programs; used by `syscalls`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use tracer_common::syscalls::{syscall_row_index, SyscallKey, SyscallRow, SyscallStats, SYSCALL_ROW_COUNT};

/// `BPF_NOEXIST`: insert only if the key is absent (atomic per bucket).
const BPF_NOEXIST: u64 = 1;

#[map]
pub static SYSCALL_ROWS: Array<SyscallRow> = Array::with_max_entries(SYSCALL_ROW_COUNT, 0);

/// Owned rows: row index -> owner key.
#[map]
pub static SYSCALL_ROW_OWNER: HashMap<u32, SyscallKey> = HashMap::with_max_entries(SYSCALL_ROW_COUNT, 0);

/// The counts of `key` if it owns its row, else null (a raw pointer, not
/// an `Option`: see `syscall_in_flight` in the crate root).
#[inline(always)]
pub fn owned(key: &SyscallKey) -> *mut SyscallStats {
    let Some(r) = SYSCALL_ROWS.get_ptr_mut(syscall_row_index(key.tid, key.nr)) else { return core::ptr::null_mut() };
    // SAFETY: array value pointer; the tag is read field by field.
    unsafe {
        if (*r).key.tid == key.tid && (*r).key.nr == key.nr && (*r).key.pid == key.pid {
            core::ptr::addr_of_mut!((*r).stats)
        } else {
            core::ptr::null_mut()
        }
    }
}

/// Claims `key`'s row if it is free; whether `key` owns it now (its counts
/// all zero). The caller has checked that `SYSCALL_STATS` lacks `key`.
#[inline(never)]
pub fn claim(key: &SyscallKey) -> bool {
    let idx = syscall_row_index(key.tid, key.nr);
    let Some(r) = SYSCALL_ROWS.get_ptr_mut(idx) else { return false };
    // SAFETY: as in `owned`.
    if unsafe { (*r).key.tid } != 0 {
        return false;
    }
    if SYSCALL_ROW_OWNER.insert(&idx, key, BPF_NOEXIST).is_err() {
        return false;
    }
    // The owner now: no other writer; the counts were zeroed when the row
    // was freed (or never written).
    unsafe { (*r).key = *key };
    true
}
