//! CPython stacks walked in the kernel: per-process layouts and per-thread
//! thread-state addresses come from userspace; the kernel records, per
//! frame, the code object pointer, the raw instruction value and a checksum
//! (`co_firstlineno`), and userspace resolves names and lines.

/// Frames walked per stack (deeper stacks are truncated and counted).
pub const PY_MAX_DEPTH: usize = 64;
/// "Absent" in a `PyLayout` field.
pub const ABSENT: u32 = u32::MAX;

/// Offsets of the fields the walker reads, for one interpreter version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// major * 100 + minor (e.g. 311).
    pub version: u32,
    /// tstate -> top frame (<= 3.10, 3.13) or -> cframe (3.11, 3.12).
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
    /// The frame owner byte (3.11+; 0 before). Owners >= 3 are C-stack shims.
    pub _pad: u32,
}

/// Frame owner values from this one up are C-stack shim frames.
pub const FRAME_OWNED_BY_CSTACK: u32 = 3;

/// A captured stack, leaf first. Value of `PY_STACKS`, keyed by its hash.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    /// The process the stack was taken in (stacks are per process).
    pub pid: u32,
    pub len: u32,
    /// 1 when the walk stopped at `PY_MAX_DEPTH` with frames left.
    pub truncated: u32,
    pub _pad: u32,
    pub frames: [PyFrameRec; PY_MAX_DEPTH],
}

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
    unsafe impl aya::Pod for super::SlowKey {}
    unsafe impl aya::Pod for super::SlowStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<PyLayout>(), 32);
        assert_eq!(core::mem::size_of::<PyFrameRec>(), 24);
        assert_eq!(core::mem::size_of::<PyStack>(), 16 + 24 * PY_MAX_DEPTH);
        assert_eq!(core::mem::size_of::<SlowKey>(), 24);
    }
}
