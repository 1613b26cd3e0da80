//! The kernel's syscall count rows (`tracer-ebpf/src/syscall_row.rs`): a
//! (pid, tid, nr) that owns row `syscall_row_index(tid, nr)` of
//! `SYSCALL_ROWS` keeps its counts there instead of in `SYSCALL_STATS`
//! (never in both). `SYSCALL_ROW_OWNER` lists the owned rows (row -> key).

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    Ebpf,
};
use tracer_common::syscalls::{syscall_row_index, SyscallKey, SyscallRow, SyscallStats};

use crate::probe::ProbeError;

const ROWS: &str = "SYSCALL_ROWS";
const OWNER: &str = "SYSCALL_ROW_OWNER";

fn owner(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, u32, SyscallKey>, ProbeError> {
    crate::probe::hash_map(ebpf, OWNER)
}

fn rows(ebpf: &mut Ebpf) -> Result<Array<&mut MapData, SyscallRow>, ProbeError> {
    let map = ebpf.map_mut(ROWS).ok_or(ProbeError::MissingMap(ROWS))?;
    Array::try_from(map).map_err(|e| ProbeError::map(ROWS, e))
}

/// The counts of every owned row, by key.
pub fn entries(ebpf: &mut Ebpf) -> Result<Vec<(SyscallKey, SyscallStats)>, ProbeError> {
    let owned: Vec<(u32, SyscallKey)> = owner(ebpf)?.iter().filter_map(Result::ok).collect();
    let rows = rows(ebpf)?;
    Ok(owned
        .into_iter()
        .filter_map(|(idx, key)| rows.get(&idx, 0).ok().filter(|r| r.key == key).map(|r| (key, r.stats)))
        .collect())
}

/// Frees the rows of `keys` (those that own one): the row is zeroed first
/// and its owner entry removed second, so that a claim made meanwhile
/// cannot be zeroed and a claimed row starts from zero counts.
pub fn free(ebpf: &mut Ebpf, keys: &[SyscallKey]) -> Result<(), ProbeError> {
    if keys.is_empty() {
        return Ok(());
    }
    let owned: Vec<u32> = {
        let owner = owner(ebpf)?;
        keys.iter()
            .map(|k| syscall_row_index(k.tid, k.nr))
            .filter(|idx| owner.get(idx, 0).is_ok_and(|o| keys.contains(&o)))
            .collect()
    };
    if owned.is_empty() {
        return Ok(());
    }
    {
        let mut rows = rows(ebpf)?;
        for &idx in &owned {
            let _ = rows.set(idx, SyscallRow::default(), 0);
        }
    }
    let mut owner = owner(ebpf)?;
    for idx in owned {
        let _ = owner.remove(&idx);
    }
    Ok(())
}
