//! CPython stack walk in the kernel. Userspace provides, per process, the
//! struct layout of its interpreter (`PY_LAYOUT`) and, per thread, the
//! address of its `PyThreadState` (`PY_TSTATE`, refreshed as threads
//! appear), which stays valid while the thread does not hold the GIL. The
//! walk records (code object, instruction, checksum) per frame; names and
//! lines are resolved in userspace.
//!
//! A helper module, not a probe family: it has no programs, the families
//! call `capture`, and it imports from the crate root only.

use aya_ebpf::{
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

/// Scratch for building a stack (too big for the BPF stack), one per
/// calling context: a CPU sample can interrupt a (preemptible) sys_exit
/// program on the same CPU, so they must not share a buffer.
#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(4, 0);

pub const SCRATCH_SCHED: u32 = 0;
pub const SCRATCH_SAMPLE: u32 = 1;
pub const SCRATCH_SYSCALL: u32 = 2;
pub const SCRATCH_UPROBE: u32 = 3;

/// Whether `addr` lies in the GIL state of process `pid`.
#[inline(always)]
pub fn is_gil_address(pid: u32, addr: u64) -> bool {
    match unsafe { GIL_RANGE.get(&pid) } {
        Some(r) => addr >= r.start && addr < r.end,
        None => false,
    }
}

/// Reads a u64 (or less, zero-extended) of user memory; 0 when unreadable.
/// Branch-free on purpose: every branch inside the frame loop multiplies
/// the states the verifier explores.
#[inline(always)]
fn read_u64(addr: u64) -> u64 {
    let mut v: u64 = 0;
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            (&mut v as *mut u64).cast(),
            8,
            addr as *const core::ffi::c_void,
        )
    };
    v
}

/// Walks the Python stack of thread `tid` of `pid`; returns its id in
/// `PY_STACKS` (a hash of the frames), or 0 when the thread runs no Python.
///
/// Every frame is recorded as read: the raw 8 bytes at the instruction
/// field (userspace takes the low 32 bits for <= 3.10's int `f_lasti`) and
/// the owner byte (userspace drops C-stack shim frames, owner >= 3).
#[inline(never)]
pub fn capture(pid: u32, tid: u32, scratch_slot: u32) -> u64 {
    let Some(layout) = (unsafe { PY_LAYOUT.get(&pid) }) else { return 0 };
    let layout = *layout;
    let Some(tstate) = (unsafe { PY_TSTATE.get(&tid) }).copied() else { return 0 };
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(scratch_slot) else { return 0 };
    let scratch = unsafe { &mut *scratch };
    let mut frame = read_u64(tstate + layout.tstate_frame as u64);
    if layout.cframe_current_frame != ABSENT && frame != 0 {
        frame = read_u64(frame + layout.cframe_current_frame as u64);
    }
    let owner_off = if layout.frame_owner == ABSENT { None } else { Some(layout.frame_owner as u64) };
    // FNV-1a over the pid and the (code, instr) pairs.
    let mut hash: u64 = (0xcbf2_9ce4_8422_2325 ^ pid as u64).wrapping_mul(0x0000_0100_0000_01b3);
    let mut len: u32 = 0;
    for i in 0..PY_MAX_DEPTH {
        if frame == 0 {
            break;
        }
        let code = read_u64(frame + layout.frame_code as u64);
        let instr = read_u64(frame + layout.frame_instr as u64);
        let checksum = read_u64(code + layout.code_firstlineno as u64) as u32;
        let owner = match owner_off {
            Some(o) => read_u64(frame + o) as u32 & 0xff,
            None => 0,
        };
        scratch.frames[i] = PyFrameRec { code, instr, checksum, _pad: owner };
        hash = (hash ^ code).wrapping_mul(0x0000_0100_0000_01b3);
        hash = (hash ^ instr).wrapping_mul(0x0000_0100_0000_01b3);
        len += 1;
        frame = read_u64(frame + layout.frame_back as u64);
    }
    if len == 0 {
        return 0;
    }
    scratch.pid = pid;
    scratch.len = len;
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
        Err(-17) => hash, // EEXIST
        Err(_) => {
            count_drop(counters::PY_STACKS_LOST);
            0
        }
    }
}

