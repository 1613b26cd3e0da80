//! The kernel's per-thread syscall slots (`tracer-ebpf/src/syscall_slot.rs`):
//! a thread that owns a slot in `SYSCALL_SLOTS` keeps its syscall in flight
//! there instead of in `SYSCALL_START`. `SYSCALL_SLOT_OWNER` lists the owned
//! slots (slot -> tid), so that no walk of the whole array is needed.

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    Ebpf,
};
use tracer_common::syscalls::SyscallStart;

use crate::{os::probe::ProbeError, os::procfs};

const SLOTS: &str = tracer_common::maps::SYSCALL_SLOTS;
const OWNER: &str = tracer_common::maps::SYSCALL_SLOT_OWNER;

/// The owned slots, as (slot, owner tid).
fn owned(ebpf: &mut Ebpf) -> Result<Vec<(u32, u32)>, ProbeError> {
    let owner: BpfHashMap<_, u32, u32> = crate::os::probe::hash_map(ebpf, OWNER)?;
    Ok(owner.iter().filter_map(Result::ok).collect())
}

fn slots(ebpf: &mut Ebpf) -> Result<Array<&mut MapData, SyscallStart>, ProbeError> {
    let map = ebpf.map_mut(SLOTS).ok_or(ProbeError::MissingMap(SLOTS))?;
    Array::try_from(map).map_err(|e| ProbeError::map(SLOTS, e))
}

/// The entries of the owned slots (a call in flight where `ts != 0`).
pub fn entries(ebpf: &mut Ebpf) -> Result<Vec<SyscallStart>, ProbeError> {
    let owned = owned(ebpf)?;
    let slots = slots(ebpf)?;
    Ok(owned
        .into_iter()
        .filter_map(|(slot, tid)| slots.get(&slot, 0).ok().filter(|s| s.tid == tid))
        .collect())
}

/// Frees the slots of threads that exited: the slot is zeroed first and its
/// owner entry removed second, so that a thread claiming it meanwhile
/// cannot have its claim zeroed (its `BPF_NOEXIST` insert fails until then,
/// and it uses `SYSCALL_START`).
pub fn retire_dead(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    let dead: Vec<(u32, u32)> = owned(ebpf)?.into_iter().filter(|&(_, tid)| procfs::tgid_of(tid).is_none()).collect();
    if dead.is_empty() {
        return Ok(());
    }
    {
        let mut slots = slots(ebpf)?;
        for &(slot, _) in &dead {
            let _ = slots.set(slot, SyscallStart::default(), 0);
        }
    }
    let mut owner: BpfHashMap<_, u32, u32> = crate::os::probe::hash_map(ebpf, OWNER)?;
    for (slot, _) in dead {
        let _ = owner.remove(&slot);
    }
    Ok(())
}
