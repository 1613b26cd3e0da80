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
use aya_log_ebpf::warn;
use tracer_common::{
    counters,
    python::{GilRange, PyFrameRec, PyLayout, PyStack, ABSENT, PY_MAX_DEPTH},
};

use crate::{count_drop, debug_enabled, debug_log_allowed};

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

/// The highest frame owner CPython defines (3.11+: thread 0, generator 1,
/// frame object 2, C stack 3, interpreter 4 since 3.14). A higher one means
/// a layout we do not know (or a misread frame).
const MAX_KNOWN_OWNER: u32 = 4;

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
        if debug_enabled() {
            debug_empty_walk(pid, tid, tstate + layout.tstate_frame as u64);
        }
        return 0;
    }
    if debug_enabled() {
        debug_odd_frames(pid, tid, scratch, len);
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

/// `DEBUG_EBPF` only: a walk that found no frame because the thread state
/// itself (its top-frame field at `addr`) could not be read. A stale
/// `PY_TSTATE` entry or a wrong layout; a thread that simply runs no Python
/// reads fine (a null frame) and is not reported.
#[inline(never)]
fn debug_empty_walk(pid: u32, tid: u32, addr: u64) {
    let mut v: u64 = 0;
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            (&mut v as *mut u64).cast(),
            8,
            addr as *const core::ffi::c_void,
        )
    };
    if rc == 0 || !debug_log_allowed() {
        return;
    }
    warn!(&(), "python stack: pid {} tid {}: thread state unreadable at {:x} (error {})", pid, tid, addr, rc);
}

/// `DEBUG_EBPF` only: reports a walk that ended at an unreadable frame
/// (its code pointer read as 0: the frame could not be read, so neither
/// could its link, and the walk stopped there), and one that met frames
/// whose owner CPython does not define (a layout we do not know, or
/// misread frames).
///
/// The scan's body is arithmetic without comparisons (LLVM turns those
/// into branches, as BPF has no conditional set): one path per frame for
/// the verifier. With a branch per outcome and frame, loading the programs
/// with `DEBUG_EBPF` on took seconds.
#[inline(never)]
fn debug_odd_frames(pid: u32, tid: u32, stack: &PyStack, len: u32) {
    let last = stack.frames.get(len.wrapping_sub(1) as usize).map_or(1, |f| f.code);
    // Non-zero once a frame's owner is above MAX_KNOWN_OWNER (4): owner + 3
    // reaches 8 exactly from 5 on.
    let mut unknown: u64 = 0;
    // Bit n: some frame has owner n (mod 64).
    let mut owners: u64 = 0;
    // Bit i: frame i is part of this walk (the scratch holds older ones
    // beyond `len`).
    let live: u64 = if len >= 64 { u64::MAX } else { (1u64 << len) - 1 };
    for (i, f) in stack.frames.iter().enumerate() {
        let owner = (f._pad & 0xff) as u64;
        let on = (live >> i) & 1;
        unknown |= on * ((owner + (7 - MAX_KNOWN_OWNER as u64)) >> 3);
        owners |= on << (owner & 63);
    }
    if last == 0 && debug_log_allowed() {
        warn!(&(), "python stack: pid {} tid {}: frame {} of {} unreadable, stack cut there", pid, tid, len - 1, len);
    }
    if unknown != 0 && debug_log_allowed() {
        warn!(
            &(),
            "python stack: pid {} tid {}: a frame owner CPython does not define among {} frames (owners seen, bit n = owner n: {:x})",
            pid,
            tid,
            len,
            owners
        );
    }
}
