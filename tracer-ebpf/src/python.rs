//! CPython stack walk in the kernel. Userspace provides, per process, the
//! struct layout of its interpreter (`PY_LAYOUT`) and, per thread, the
//! address of its `PyThreadState` (`PY_TSTATE`, refreshed as threads
//! appear), which stays valid while the thread does not hold the GIL. The
//! walk records (code object, instruction, checksum) per frame; names and
//! lines are resolved in userspace.

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use tracer_common::{
    counters,
    python::{GilRange, PyFrameRec, PyLayout, PyStack, ABSENT, PY_MAX_DEPTH},
};

use crate::count_drop;

#[map]
pub static PY_LAYOUT: HashMap<u32, PyLayout> = HashMap::with_max_entries(4096, 0);

#[map]
pub static PY_TSTATE: HashMap<u32, u64> = HashMap::with_max_entries(32768, 0);

#[map]
pub static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(8192, 0);

#[map]
pub static GIL_RANGE: HashMap<u32, GilRange> = HashMap::with_max_entries(4096, 0);

/// Scratch for building a stack (too big for the BPF stack).
#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Frame owner values >= this are C-stack shim frames (no Python function).
const FRAME_OWNED_BY_CSTACK: u8 = 3;

#[inline(always)]
fn read<T>(addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Whether `addr` lies in the GIL state of process `pid`.
#[inline(always)]
pub fn is_gil_address(pid: u32, addr: u64) -> bool {
    match unsafe { GIL_RANGE.get(&pid) } {
        Some(r) => addr >= r.start && addr < r.end,
        None => false,
    }
}

/// Walks the Python stack of thread `tid` of `pid`; returns its id in
/// `PY_STACKS` (a hash of the frames), or 0 when the thread runs no Python.
#[inline(always)]
pub fn capture(pid: u32, tid: u32) -> u64 {
    let Some(layout) = (unsafe { PY_LAYOUT.get(&pid) }) else { return 0 };
    let layout = *layout;
    let Some(tstate) = (unsafe { PY_TSTATE.get(&tid) }).copied() else { return 0 };
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else { return 0 };
    let scratch = unsafe { &mut *scratch };
    let mut frame: u64 = read(tstate + layout.tstate_frame as u64).unwrap_or(0);
    if layout.cframe_current_frame != ABSENT {
        frame = read(frame + layout.cframe_current_frame as u64).unwrap_or(0);
    }
    // FNV-1a over (code, instr) pairs.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut len: usize = 0;
    for _ in 0..PY_MAX_DEPTH {
        if frame == 0 {
            break;
        }
        let back: u64 = read(frame + layout.frame_back as u64).unwrap_or(0);
        if layout.frame_owner != ABSENT {
            let owner: u8 = read(frame + layout.frame_owner as u64).unwrap_or(FRAME_OWNED_BY_CSTACK);
            if owner >= FRAME_OWNED_BY_CSTACK {
                frame = back;
                continue;
            }
        }
        let code: u64 = read(frame + layout.frame_code as u64).unwrap_or(0);
        let instr: u64 = if layout.version <= 310 {
            read::<i32>(frame + layout.frame_instr as u64).unwrap_or(-1) as i64 as u64
        } else {
            read::<u64>(frame + layout.frame_instr as u64).unwrap_or(0)
        };
        let checksum: u32 = read(code + layout.code_firstlineno as u64).unwrap_or(0);
        if let Some(slot) = scratch.frames.get_mut(len) {
            *slot = PyFrameRec { code, instr, checksum, _pad: 0 };
            len += 1;
        }
        hash = (hash ^ code).wrapping_mul(0x0000_0100_0000_01b3);
        hash = (hash ^ instr).wrapping_mul(0x0000_0100_0000_01b3);
        frame = back;
    }
    if len == 0 {
        return 0;
    }
    scratch.len = len as u32;
    scratch.truncated = (frame != 0) as u32;
    if frame != 0 {
        count_drop(counters::PY_STACKS_TRUNCATED);
    }
    if hash == 0 {
        hash = 1;
    }
    // BPF_NOEXIST: an existing entry with this hash is the same stack.
    match PY_STACKS.insert(&hash, scratch, 1) {
        Ok(()) => hash,
        Err(e) if e == -17 => hash, // EEXIST
        Err(_) => {
            count_drop(counters::PY_STACKS_LOST);
            0
        }
    }
}
