//! CPython stack walk in the kernel. Userspace provides, per process, the
//! struct layout of its interpreter (`PY_LAYOUT`) and, per thread, the
//! address of its `PyThreadState` (`PY_TSTATE`, refreshed as threads
//! appear), which stays valid while the thread does not hold the GIL. A
//! thread userspace has not listed yet (one just started) is found here on
//! its first event, by walking the interpreter's thread list for the state
//! whose `thread_id` (its `pthread_t`) is the thread's own (`find_tstate`).
//! The walk records (code object, instruction, checksum) per frame; names
//! and lines are resolved in userspace, from the process's memory or, once
//! it has exited, from the copy of each code object taken here the first
//! time a new stack holds it (`PY_CODES`).
//!
//! A helper module, not a probe family: it has no programs, the families
//! call `capture`, and it imports from the crate root only.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use aya_log_ebpf::warn;
use tracer_common::{
    counters,
    python::{
        GilRange, PyCodeKey, PyCodeRaw, CODE_BYTES, PyFrameRec, PyLayout, PyStack, PyTstateMiss, ABSENT,
        CODE_TAG_MASK, FRAME_OWNED_BY_CSTACK, PY_MAX_DEPTH, PY_MAX_THREAD_WALK, PY_TSTATE_EAGER_WALKS, PY_TSTATE_RETRY_NS, STACK_LOOPED,
        STACK_TRUNCATED,
    },
};

use crate::{count_drop, debug_enabled, debug_log_allowed, global};

#[map]
pub static PY_LAYOUT: HashMap<u32, PyLayout> = HashMap::with_max_entries(4096, 0);

#[map]
pub static PY_TSTATE: HashMap<u32, u64> = HashMap::with_max_entries(32768, 0);

#[map]
pub static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(8192, 0);

/// Threads whose state `find_tstate` looked for in vain, and when.
#[map]
pub static PY_TSTATE_MISS: HashMap<u32, PyTstateMiss> = HashMap::with_max_entries(32768, 0);

/// Code objects copied when a new stack first held them: what resolves
/// their frames once the process has exited. Userspace moves the entries
/// out as it reads them.
#[map]
pub static PY_CODES: HashMap<PyCodeKey, PyCodeRaw> = HashMap::with_max_entries(4096, 0);

/// Scratch for a code object's copy (too big for the BPF stack), one per
/// calling context like `PY_SCRATCH`.
#[map]
static PY_CODE_SCRATCH: PerCpuArray<PyCodeRaw> = PerCpuArray::with_max_entries(5, 0);

/// Offset of the FS base in `struct task_struct` (`thread.fsbase`, x86_64),
/// set at load time from the kernel's BTF; `u64::MAX` where unknown (other
/// architectures): new threads then wait for userspace's thread list.
#[unsafe(no_mangle)]
static PY_TASK_FSBASE_OFFSET: u64 = u64::MAX;

#[map]
pub static GIL_RANGE: HashMap<u32, GilRange> = HashMap::with_max_entries(4096, 0);

/// Scratch for building a stack (too big for the BPF stack), one per
/// calling context: a CPU sample can interrupt a (preemptible) sys_exit
/// program on the same CPU, so they must not share a buffer.
#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(5, 0);

pub const SCRATCH_SCHED: u32 = 0;
pub const SCRATCH_SAMPLE: u32 = 1;
pub const SCRATCH_SYSCALL: u32 = 2;
pub const SCRATCH_UPROBE: u32 = 3;
/// The `rss_stat` tracepoint (memory.rs): a page fault of a thread may
/// come while a preemptible program of another thread holds a slot.
pub const SCRATCH_MEMORY: u32 = 4;

/// The highest frame owner CPython defines (3.11+: thread 0, generator 1,
/// frame object 2, C stack 3, interpreter 4 since 3.14). A higher one means
/// a layout we do not know (or a misread frame).
const MAX_KNOWN_OWNER: u32 = 4;

/// The thread of a `PyThreadState` (the reverse of `PY_TSTATE`, written
/// with it here and by userspace): the GIL's `last_holder` is a thread
/// state, and its thread is what a GIL wait is charged to. LRU: a state
/// freed and reused for another thread is overwritten with that thread.
#[map]
pub static PY_TSTATE_TID: LruHashMap<u64, u32> = LruHashMap::with_max_entries(32768, 0);

/// `_gil_runtime_state.last_holder` (after `unsigned long interval`):
/// the same in 3.8 .. 3.15 GIL builds.
const GIL_LAST_HOLDER: u64 = 8;

/// The thread holding the GIL of process `pid` (its `last_holder`, read
/// when a thread begins to wait for it), 0 when unknown.
#[inline(always)]
pub fn gil_holder_tid(pid: u32) -> u32 {
    let Some(r) = (unsafe { GIL_RANGE.get(&pid) }) else { return 0 };
    let tstate = read_u64(r.start + GIL_LAST_HOLDER);
    if tstate == 0 {
        return 0;
    }
    unsafe { PY_TSTATE_TID.get(&tstate) }.copied().unwrap_or(0)
}

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
    let tstate = match unsafe { PY_TSTATE.get(&tid) } {
        Some(t) => *t,
        None => find_tstate(tid, &layout),
    };
    if tstate == 0 {
        return 0;
    }
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
    // Brent's cycle detection: `mark` is the frame at step 0, 1, 2, 4, 8,
    // ...; meeting it again means the chain loops (a loop of up to ~30
    // frames is found within the depth limit), one compare per frame.
    let mut mark: u64 = 0;
    let mut looped = false;
    for i in 0..PY_MAX_DEPTH {
        if frame == 0 {
            break;
        }
        if frame == mark {
            looped = true;
            break;
        }
        if i & i.wrapping_sub(1) == 0 {
            mark = frame;
        }
        // 3.14+: a `_PyStackRef`, tagged in its low bits (objects are 8-byte
        // aligned, so the mask changes nothing for older versions).
        let code = read_u64(frame + layout.frame_code as u64) & !CODE_TAG_MASK;
        let instr = read_u64(frame + layout.frame_instr as u64);
        let checksum = read_u64(code + layout.code_firstlineno as u64) as u32;
        let owner = match owner_off {
            Some(o) => read_u64(frame + o) as u32 & 0xff,
            None => 0,
        };
        scratch.frames[i] = PyFrameRec { code, instr, checksum, owner };
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
    scratch.truncated = if looped {
        STACK_LOOPED
    } else if frame != 0 {
        count_drop(counters::PY_STACKS_TRUNCATED);
        STACK_TRUNCATED
    } else {
        0
    };
    if hash == 0 {
        hash = 1;
    }
    // BPF_NOEXIST: an existing entry with this hash is the same stack.
    match PY_STACKS.insert(&hash, &*scratch, 1) {
        Ok(()) => {
            remember_codes(pid, scratch, &layout, scratch_slot);
            hash
        }
        Err(-17) => hash, // EEXIST
        Err(_) => {
            count_drop(counters::PY_STACKS_LOST);
            0
        }
    }
}

/// The state of the current thread `tid`, found in its interpreter's
/// thread list (the last state whose `thread_id` is the thread's
/// `pthread_t`: a state CPython has created for a thread not yet started
/// still holds its creator's) and remembered in `PY_TSTATE`; 0 when it is
/// not there (yet). A miss is remembered too: after a thread's first
/// `PY_TSTATE_EAGER_WALKS` misses, the list is walked again only when its
/// head changed or `PY_TSTATE_RETRY_NS` later (see `PyTstateMiss`).
#[inline(never)]
fn find_tstate(tid: u32, layout: &PyLayout) -> u64 {
    let fs_off = global(&PY_TASK_FSBASE_OFFSET);
    if fs_off == u64::MAX || layout.threads_head == 0 || bpf_get_current_pid_tgid() as u32 != tid {
        return 0;
    }
    let head = read_u64(layout.threads_head);
    if head == 0 {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let mut misses: u64 = 0;
    if let Some(m) = unsafe { PY_TSTATE_MISS.get(&tid) } {
        misses = m.misses();
        if misses >= PY_TSTATE_EAGER_WALKS && m.head == head && now.wrapping_sub(m.ts_ns()) < PY_TSTATE_RETRY_NS {
            return 0;
        }
    }
    let task = unsafe { bpf_get_current_task() };
    let fsbase = unsafe { bpf_probe_read_kernel((task + fs_off) as *const u64) }.unwrap_or(0);
    if fsbase == 0 {
        return 0;
    }
    let mut walk = WalkCtx {
        fsbase,
        ts: head,
        found: 0,
        id_off: layout.tstate_thread_id,
        next_off: layout.tstate_next,
    };
    let callback = walk_step as *const () as *mut core::ffi::c_void;
    // SAFETY: the helper calls `walk_step(i, &mut walk)` until it returns 1.
    unsafe { aya_ebpf::helpers::generated::bpf_loop(PY_MAX_THREAD_WALK, callback, (&mut walk as *mut WalkCtx).cast(), 0) };
    let found = walk.found;
    if found == 0 {
        let _ = PY_TSTATE_MISS.insert(&tid, &PyTstateMiss::new(head, now, misses + 1), 0);
        return 0;
    }
    if PY_TSTATE.insert(&tid, &found, 0).is_err() {
        count_drop(counters::PY_STACKS_LOST);
    }
    let _ = PY_TSTATE_TID.insert(&found, &tid, 0);
    let _ = PY_TSTATE_MISS.remove(&tid);
    found
}

/// `find_tstate`'s walk, on its stack.
#[repr(C)]
struct WalkCtx {
    fsbase: u64,
    /// The thread state to look at next (0: the end of the list).
    ts: u64,
    /// The last one whose `thread_id` is `fsbase`.
    found: u64,
    id_off: u32,
    next_off: u32,
}

/// `bpf_loop` callback: one thread state of `find_tstate`'s walk (a loop
/// the verifier checks once, not once per possible thread).
extern "C" fn walk_step(_i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `find_tstate` passes its `WalkCtx`.
    let w = unsafe { &mut *(ctx as *mut WalkCtx) };
    if w.ts == 0 {
        return 1;
    }
    if read_u64(w.ts + w.id_off as u64) == w.fsbase {
        w.found = w.ts;
    }
    w.ts = read_u64(w.ts + w.next_off as u64);
    0
}

/// Forgets thread `tid` (it exited: its id may be reused).
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let _ = PY_TSTATE.remove(&tid);
    let _ = PY_TSTATE_MISS.remove(&tid);
}

/// What `remember_frame` needs, on the stack of `remember_codes`.
#[repr(C)]
struct CodesCtx {
    pid: u32,
    slot: u32,
    code_name: u32,
    code_filename: u32,
    code_linetable: u32,
    _pad: u32,
}

/// Copies the code objects of a stack seen for the first time that are not
/// copied yet (`PY_CODES`), one frame per `bpf_loop` iteration: the
/// verifier checks the loop body once rather than once per possible frame
/// (unrolled, the three programs that walk stacks took ~0.4 s to load).
#[inline(never)]
fn remember_codes(pid: u32, stack: &PyStack, layout: &PyLayout, slot: u32) {
    // SAFETY: a plain read of map memory.
    let len = unsafe { core::ptr::read_volatile(&stack.len) }.min(PY_MAX_DEPTH as u32);
    let mut ctx = CodesCtx {
        pid,
        slot,
        code_name: layout.code_name,
        code_filename: layout.code_filename,
        code_linetable: layout.code_linetable,
        _pad: 0,
    };
    let callback = remember_frame as *const () as *mut core::ffi::c_void;
    // SAFETY: the helper calls `remember_frame(i, &mut ctx)` for i < len.
    unsafe { aya_ebpf::helpers::generated::bpf_loop(len, callback, (&mut ctx as *mut CodesCtx).cast(), 0) };
}

/// `bpf_loop` callback: copies the code object of frame `i` of the stack in
/// `PY_SCRATCH[ctx.slot]` (the one just stored), unless already copied.
extern "C" fn remember_frame(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `remember_codes` passes its `CodesCtx`.
    let c = unsafe { &*(ctx as *const CodesCtx) };
    let Some(stack) = PY_SCRATCH.get_ptr(c.slot) else { return 1 };
    let Some(f) = (unsafe { &*stack }).frames.get(i as usize) else { return 1 };
    if f.owner >= FRAME_OWNED_BY_CSTACK || f.code == 0 {
        return 0;
    }
    let (code, checksum) = (f.code, f.checksum);
    let key = PyCodeKey { pid: c.pid, checksum, code };
    if unsafe { PY_CODES.get(&key) }.is_some() {
        return 0;
    }
    let Some(raw) = PY_CODE_SCRATCH.get_ptr_mut(c.slot) else { return 1 };
    // SAFETY: per-CPU slot of this calling context.
    let raw = unsafe { &mut *raw };
    raw.addrs[0] = code;
    raw.lens[0] = read_part(&mut raw.code, code, CODE_BYTES as u64);
    let name = read_u64(code + c.code_name as u64);
    raw.addrs[1] = name;
    raw.lens[1] = read_part(&mut raw.name, name, str_size(name));
    let filename = read_u64(code + c.code_filename as u64);
    raw.addrs[2] = filename;
    raw.lens[2] = read_part(&mut raw.filename, filename, str_size(filename));
    let table = read_u64(code + c.code_linetable as u64);
    raw.addrs[3] = table;
    raw.lens[3] = read_part(&mut raw.linetable, table, bytes_size(table));
    // BPF_NOEXIST; EEXIST: another CPU copied it meanwhile.
    if let Err(e) = PY_CODES.insert(&key, raw, 1) {
        if e != -17 {
            count_drop(counters::PY_CODES_FULL);
        }
    }
    0
}

/// Fills `buf` with up to `want` bytes from user address `addr` (no more
/// than the buffer holds); where that fails (the object ends near the end
/// of a mapping), with what is left of `addr`'s page. Returns the bytes
/// read, 0 when none could be.
#[inline(always)]
fn read_part<const N: usize>(buf: &mut [u8; N], addr: u64, want: u64) -> u32 {
    if addr == 0 {
        return 0;
    }
    let mut size = if want < N as u64 { want as u32 } else { N as u32 };
    let read = |buf: &mut [u8; N], size: u32| unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(buf.as_mut_ptr().cast(), size, addr as *const core::ffi::c_void)
    };
    if read(buf, size) == 0 {
        return size;
    }
    let in_page = (4096 - (addr & 4095)) as u32;
    if in_page < size {
        size = in_page;
        if read(buf, size) == 0 {
            return size;
        }
    }
    0
}

/// Bytes a `str` object at `addr` may take: the largest header (a compact
/// non-ASCII one) plus 4 bytes per character, from its `length`.
#[inline(always)]
fn str_size(addr: u64) -> u64 {
    72 + read_u64(addr + 16).saturating_mul(4)
}

/// Bytes of a `bytes` object at `addr`: its header and `ob_size` bytes.
#[inline(always)]
fn bytes_size(addr: u64) -> u64 {
    32 + read_u64(addr + 16)
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
        let owner = (f.owner & 0xff) as u64;
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

/// Per thread: `[signature, stack id]` of its last stack captured by
/// [`capture_reusing`] (LRU: threads that exit age out).
#[map]
static PY_LAST: aya_ebpf::maps::LruHashMap<u32, [u64; 2]> = aya_ebpf::maps::LruHashMap::with_max_entries(32768, 0);

/// [`capture`], reusing the thread's last stack when its frames have not
/// changed: the walk reads only each frame's address, code and
/// instruction (3 reads per frame instead of 5, no copy into the scratch
/// stack, no `PY_STACKS` update) and compares their hash with the one
/// remembered for the thread. The whole chain is compared, not only the
/// top frame: a function called at the same data-stack depth from two
/// different callers has the same frame address and instruction, so the
/// top frame alone would attribute the second call to the first caller.
/// For the probes that fire at a high rate on few call sites (CUDA calls).
#[inline(never)]
pub fn capture_reusing(pid: u32, tid: u32, scratch_slot: u32) -> u64 {
    // `capture` is reached from one verifier state only (its walk is what
    // costs to verify): the cache is looked up in a function of its own.
    let cached = last_stack(pid, tid);
    if cached != 0 {
        return cached;
    }
    let stack = capture(pid, tid, scratch_slot);
    if stack != 0 {
        if let Some(p) = PY_LAST.get_ptr_mut(&tid) {
            // SAFETY: the thread's own entry; `last_stack` just set its signature.
            unsafe {
                if (*p)[1] == 0 {
                    (*p)[1] = stack;
                }
            }
        }
    }
    stack
}

/// The thread's last stack when its frames are unchanged, else 0, with
/// the new signature remembered (its stack set by [`capture_reusing`]).
#[inline(never)]
fn last_stack(pid: u32, tid: u32) -> u64 {
    let Some(tstate) = (unsafe { PY_TSTATE.get(&tid) }).copied() else { return 0 };
    if tstate == 0 {
        return 0;
    }
    let sig = chain_signature(pid, tstate);
    if sig == 0 {
        return 0;
    }
    match PY_LAST.get_ptr_mut(&tid) {
        // SAFETY: the thread's own entry.
        Some(p) => unsafe {
            if (*p)[0] == sig && (*p)[1] != 0 {
                return (*p)[1];
            }
            (*p)[0] = sig;
            (*p)[1] = 0;
        },
        None => {
            let _ = PY_LAST.insert(&tid, &[sig, 0], 0);
        }
    }
    0
}

/// A hash of the addresses, codes and instructions of the frames of the
/// thread whose state is `tstate` (0 when its layout is unknown).
#[inline(never)]
fn chain_signature(pid: u32, tstate: u64) -> u64 {
    let Some(layout) = (unsafe { PY_LAYOUT.get(&pid) }) else { return 0 };
    let layout = *layout;
    let mut frame = read_u64(tstate + layout.tstate_frame as u64);
    if layout.cframe_current_frame != ABSENT && frame != 0 {
        frame = read_u64(frame + layout.cframe_current_frame as u64);
    }
    let (code, instr, back) = (layout.frame_code as u64, layout.frame_instr as u64, layout.frame_back as u64);
    // One read per frame where the three fields lie within 64 bytes, 8-byte
    // aligned with each other (3.11+: 32 or 64 bytes), else three.
    let lo = code.min(instr).min(back);
    let span = code.max(instr).max(back) + 8 - lo;
    let aligned = (code - lo) % 8 == 0 && (instr - lo) % 8 == 0 && (back - lo) % 8 == 0;
    let mut ctx = SigCtx {
        frame,
        sig: (0xcbf2_9ce4_8422_2325 ^ pid as u64).wrapping_mul(0x0000_0100_0000_01b3),
        code,
        instr,
        back,
        lo,
        span: if aligned && span <= SIG_BLOCK { span } else { 0 },
    };
    // A `bpf_loop` (its callback verified once): an unrolled walk here
    // made loading the CUDA programs seconds slower.
    let callback = sig_frame as *const () as *mut core::ffi::c_void;
    // SAFETY: the helper calls `sig_frame(i, &mut ctx)` for i < PY_MAX_DEPTH.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(PY_MAX_DEPTH as u32, callback, (&mut ctx as *mut SigCtx).cast(), 0)
    };
    ctx.sig | 1
}

/// The walk of [`capture_reusing`]: the frame it is at, the hash so far,
/// the frame's field offsets.
#[repr(C)]
struct SigCtx {
    frame: u64,
    sig: u64,
    code: u64,
    instr: u64,
    back: u64,
    /// The three fields in one read of `span` bytes from `frame + lo`
    /// (`span` 0: three reads).
    lo: u64,
    span: u64,
}

/// The largest block a frame's fields are read in at once (bytes).
const SIG_BLOCK: u64 = 64;

/// `bpf_loop` callback: hashes one frame's address, code and instruction
/// into `ctx.sig` and moves to its caller; stops at the bottom.
extern "C" fn sig_frame(_i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `capture_reusing` passes its `SigCtx`.
    let c = unsafe { &mut *(ctx as *mut SigCtx) };
    if c.frame == 0 {
        return 1;
    }
    let (code, instr, back) = if c.span != 0 && c.span <= SIG_BLOCK {
        let mut block = [0u64; (SIG_BLOCK / 8) as usize];
        // SAFETY: at most `SIG_BLOCK` bytes into the block.
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                block.as_mut_ptr().cast(),
                c.span as u32,
                (c.frame + c.lo) as *const core::ffi::c_void,
            )
        };
        let at = |off: u64| block[(((off - c.lo) / 8) & (SIG_BLOCK / 8 - 1)) as usize];
        (at(c.code), at(c.instr), at(c.back))
    } else {
        (read_u64(c.frame + c.code), read_u64(c.frame + c.instr), read_u64(c.frame + c.back))
    };
    c.sig = (c.sig ^ c.frame).wrapping_mul(0x0000_0100_0000_01b3);
    c.sig = (c.sig ^ code).wrapping_mul(0x0000_0100_0000_01b3);
    c.sig = (c.sig ^ instr).wrapping_mul(0x0000_0100_0000_01b3);
    c.frame = back;
    0
}
