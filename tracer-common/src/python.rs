//! CPython stacks walked in the kernel: per-process layouts and per-thread
//! thread-state addresses come from userspace; the kernel records, per
//! frame, the code object pointer, the raw instruction value and a checksum
//! (`co_firstlineno`), and userspace resolves names and lines.

/// Frames walked per stack (deeper stacks are truncated and counted).
pub const PY_MAX_DEPTH: usize = 64;
/// `PyStack::truncated`: cut at `PY_MAX_DEPTH` frames with frames left.
pub const STACK_TRUNCATED: u32 = 1;
/// `PyStack::truncated`: the frame chain loops; the walk stopped where it
/// found the loop (the loop's frames may appear twice).
pub const STACK_LOOPED: u32 = 2;
/// "Absent" in a `PyLayout` field.
pub const ABSENT: u32 = u32::MAX;

/// Offsets of the fields the walker reads, for one interpreter version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// major * 100 + minor (e.g. 311).
    pub version: u32,
    /// tstate -> top frame (<= 3.10, 3.13+) or -> cframe (3.11, 3.12).
    pub tstate_frame: u32,
    /// cframe -> current_frame (3.11, 3.12), else `ABSENT`.
    pub cframe_current_frame: u32,
    pub frame_code: u32,
    pub frame_back: u32,
    /// f_lasti (i32, <= 3.10) or prev_instr / instr_ptr (pointer, 3.11+).
    pub frame_instr: u32,
    /// u8 frame owner (3.11+), else `ABSENT`; owners >= 3 are C-stack shims.
    pub frame_owner: u32,
    pub code_firstlineno: u32,
    /// tstate -> next thread state of the interpreter.
    pub tstate_next: u32,
    /// tstate -> `thread_id` (the `pthread_t` of its thread: on x86_64 the
    /// thread's FS base).
    pub tstate_thread_id: u32,
    /// code -> the name copied in the kernel: `co_qualname` (3.11+) or `co_name`.
    pub code_name: u32,
    pub code_filename: u32,
    /// code -> `co_linetable` (3.10+) or `co_lnotab`.
    pub code_linetable: u32,
    pub _pad: u32,
    /// Address of the main interpreter's thread-list head pointer
    /// (`&interp->threads.head`), 0 when unknown: the kernel finds a new
    /// thread's state there on its first event (see `PyTstateMiss`).
    pub threads_head: u64,
}

/// One captured frame, as read (the kernel does not branch on versions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameRec {
    pub code: u64,
    /// The 8 bytes at `frame_instr`: the low 32 bits are `f_lasti` on <= 3.10.
    pub instr: u64,
    /// `co_firstlineno` of `code` (detects a reused code address).
    pub checksum: u32,
    /// The frame owner byte (3.11+; 0 before), zero-extended. From
    /// `FRAME_OWNED_BY_CSTACK` up the frame carries no Python function.
    pub owner: u32,
}

/// Frame owner values from this one up carry no Python function: frames
/// owned by the C stack (3.12, 3.13 entry shims) or, from 3.14, by the
/// interpreter (3) or the C stack (4). Compared with `PyFrameRec::owner` in
/// the kernel and with the owner byte read from the process in userspace.
pub const FRAME_OWNED_BY_CSTACK: u32 = 3;
/// Low bits of a frame's code field that are tags, not address (3.14+'s
/// `_PyStackRef`, `Py_TAG_BITS` <= 3). Objects are at least 8-byte aligned,
/// so the mask changes nothing for the plain pointers of older versions.
pub const CODE_TAG_MASK: u64 = 7;

/// A captured stack, leaf first. Value of `PY_STACKS`, keyed by its hash.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    /// The process the stack was taken in (stacks are per process).
    pub pid: u32,
    pub len: u32,
    /// [`STACK_TRUNCATED`] when the walk stopped at `PY_MAX_DEPTH` with
    /// frames left, [`STACK_LOOPED`] when the frame chain came back to a
    /// frame it had passed (a corrupted or hostile interpreter), else 0.
    pub truncated: u32,
    pub _pad: u32,
    pub frames: [PyFrameRec; PY_MAX_DEPTH],
}

/// Bytes of a code object copied from its start (covers every field read).
pub const CODE_BYTES: usize = 160;
/// Bytes copied from the start of the name `str` (header included).
pub const NAME_BYTES: usize = 128;
/// Bytes copied from the start of the file name `str` (header included).
pub const FILENAME_BYTES: usize = 256;
/// Bytes copied from the start of the line table `bytes` (header included).
pub const LINETABLE_BYTES: usize = 2048;

/// Key of `PY_CODES`: a code object of a process, as a frame saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyCodeKey {
    pub pid: u32,
    /// `co_firstlineno` (as in `PyFrameRec::checksum`).
    pub checksum: u32,
    pub code: u64,
}

/// A code object copied in the kernel the first time a new stack holds it,
/// so that its frames resolve after the process is gone: the raw bytes of
/// the object and of the three objects it points to (name, file name, line
/// table), each from its start. `lens[i]` is how many bytes of part i were
/// read (0: unreadable, e.g. a page not resident); userspace decodes them
/// with the same layout it uses on live memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyCodeRaw {
    /// Addresses the parts were read from: code, name, file name, line table.
    pub addrs: [u64; 4],
    pub lens: [u32; 4],
    pub code: [u8; CODE_BYTES],
    pub name: [u8; NAME_BYTES],
    pub filename: [u8; FILENAME_BYTES],
    pub linetable: [u8; LINETABLE_BYTES],
}

/// Value of `PY_TSTATE_MISS`: a thread whose state the kernel looked for
/// and did not find, the list head it walked then, and how many walks
/// missed. The first `PY_TSTATE_EAGER_WALKS` misses of a thread do not
/// hold back the next walk: a new thread's first event (the first touch
/// of its stack, a page fault) can come before CPython binds its state to
/// it, and its first sleep, a moment later, must find it. After that the
/// list is walked again when its head changes (CPython puts new thread
/// states first) or `PY_TSTATE_RETRY_NS` later (a state is bound to its
/// thread after it is listed), so that threads that never run Python cost
/// one short walk per millisecond at most.
///
/// 16 bytes on purpose: the programs that walk stacks are at the BPF stack
/// limit (512 bytes over their call chain), so the miss count shares a
/// word with the time (its low 4 bits; nanoseconds lose nothing there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyTstateMiss {
    pub head: u64,
    /// `bpf_ktime_get_ns()` of the last miss, its low 4 bits replaced by
    /// the misses so far (at most 15).
    pub stamp: u64,
}

impl PyTstateMiss {
    const COUNT_BITS: u64 = 0xf;

    #[inline(always)]
    pub fn new(head: u64, ts_ns: u64, misses: u64) -> Self {
        let misses = if misses > Self::COUNT_BITS { Self::COUNT_BITS } else { misses };
        PyTstateMiss { head, stamp: (ts_ns & !Self::COUNT_BITS) | misses }
    }

    #[inline(always)]
    pub fn ts_ns(&self) -> u64 {
        self.stamp & !Self::COUNT_BITS
    }

    #[inline(always)]
    pub fn misses(&self) -> u64 {
        self.stamp & Self::COUNT_BITS
    }
}

/// See `PyTstateMiss`.
pub const PY_TSTATE_RETRY_NS: u64 = 1_000_000;
/// See `PyTstateMiss`.
pub const PY_TSTATE_EAGER_WALKS: u64 = 8;
/// Thread states the kernel walks per interpreter when looking for a thread's.
pub const PY_MAX_THREAD_WALK: u32 = 256;

/// Address range of a process's GIL state (`struct _gil_runtime_state`):
/// a futex wait inside it is a GIL wait.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GilRange {
    pub start: u64,
    pub end: u64,
}

/// Key of `SLOW_SYSCALLS`: a syscall slower than `--slow-syscall`, by Python stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlowKey {
    pub pid: u32,
    pub tid: u32,
    pub nr: u32,
    pub user_stack: i32,
    pub py_stack: u64,
}

/// Value of `SLOW_SYSCALLS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowStats {
    pub count: u64,
    pub total_ns: u64,
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::PyLayout {}
    unsafe impl aya::Pod for super::PyFrameRec {}
    unsafe impl aya::Pod for super::PyStack {}
    unsafe impl aya::Pod for super::GilRange {}
    unsafe impl aya::Pod for super::PyCodeKey {}
    unsafe impl aya::Pod for super::PyCodeRaw {}
    unsafe impl aya::Pod for super::PyTstateMiss {}
    unsafe impl aya::Pod for super::SlowKey {}
    unsafe impl aya::Pod for super::SlowStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<PyLayout>(), 64);
        assert_eq!(core::mem::size_of::<PyCodeKey>(), 16);
        assert_eq!(core::mem::size_of::<PyCodeRaw>(), 48 + CODE_BYTES + NAME_BYTES + FILENAME_BYTES + LINETABLE_BYTES);
        assert_eq!(core::mem::size_of::<PyTstateMiss>(), 16);
        assert_eq!(core::mem::size_of::<PyFrameRec>(), 24);
        assert_eq!(core::mem::size_of::<PyStack>(), 16 + 24 * PY_MAX_DEPTH);
        assert_eq!(core::mem::size_of::<SlowKey>(), 24);
    }
}
