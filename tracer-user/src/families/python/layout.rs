//! Structure offsets of CPython 3.8 .. 3.15 on x86_64 (and other LP64
//! targets), read with `gdb -batch -ex 'ptype/o struct _ts' ...` from the
//! DWARF of pyenv builds (3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1, 3.13.0);
//! 3.14 and 3.15 from the `_Py_DebugOffsets` of Debian's 3.14.10 and 3.15.2
//! and the headers of those releases. These are the release-build
//! layouts; they do not change within a minor version. At attach time they
//! are cross-checked against the running process (`Interpreter::attach`):
//! 3.13+'s against the `_Py_DebugOffsets` the process publishes (which is
//! also the layout of a newer version than these tables know), the code
//! object offsets against `PyCode_Type.tp_members` / `tp_basicsize`, the
//! thread list against back pointers and live thread ids, and a live
//! frame's code object against `PyCode_Type`.

use super::linetable::LineFormat;

/// The offsets the kernel frame walker needs: the `#[repr(C)]` type shared
/// with the kernel programs.
pub use tracer_common::python::{PyLayout, ABSENT};

/// How the frame's instruction field is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstrKind {
    /// `int f_lasti`, in bytes (3.8, 3.9).
    LastiBytes,
    /// `int f_lasti`, in 2-byte code units (3.10).
    LastiUnits,
    /// `_Py_CODEUNIT *prev_instr` / `instr_ptr` (3.11+): byte offset =
    /// pointer - (code + co_code_adaptive).
    Pointer,
}

/// Everything the userspace reader uses. Offsets in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub minor: u32,
    // _PyRuntime
    pub runtime_interpreters_head: u64,
    // PyInterpreterState
    pub interp_next: u64,
    pub interp_threads_head: u64,
    // PyThreadState
    pub tstate_next: u64,
    pub tstate_interp: u64,
    pub tstate_frame: u64,
    pub cframe_current_frame: Option<u64>,
    pub tstate_thread_id: u64,
    pub tstate_native_thread_id: Option<u64>,
    // frame (PyFrameObject <= 3.10, _PyInterpreterFrame 3.11+)
    pub frame_code: u64,
    pub frame_back: u64,
    pub frame_instr: u64,
    pub instr_kind: InstrKind,
    pub frame_owner: Option<u64>,
    // PyCodeObject
    pub code_firstlineno: u64,
    pub code_filename: u64,
    pub code_name: u64,
    pub code_qualname: Option<u64>,
    pub code_linetable: u64,
    pub line_format: LineFormat,
    pub code_adaptive: Option<u64>,
    // PyUnicodeObject: data of compact ASCII / compact non-ASCII strings.
    pub unicode_ascii_data: u64,
    pub unicode_compact_data: u64,
    /// Where the GIL state (`struct _gil_runtime_state`) lives.
    pub gil: GilLocation,
}

/// Where `struct _gil_runtime_state` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GilLocation {
    /// Inside `_PyRuntime` (`_PyRuntime.ceval.gil`, <= 3.11), at this offset.
    Runtime(u64),
    /// Pointed to by the main interpreter's `ceval.gil` (3.12+): offsets of
    /// `_PyRuntime.interpreters.main` and of `interp->ceval.gil`.
    Interpreter { runtime_main: u64, ceval_gil: u64 },
}

/// `sizeof(struct _gil_runtime_state)`, 3.8 .. 3.15 (GIL builds).
pub const GIL_STATE_SIZE: u64 = 208;
/// `_gil_runtime_state.interval` (switch interval, microseconds) and `.locked`.
pub const GIL_INTERVAL: u64 = 0;
pub const GIL_LOCKED: u64 = 16;

// Fixed in every supported version (PyObject / PyVarObject / PyBytesObject
// headers, PyTypeObject up to tp_members, PyMemberDef).
pub const OB_TYPE: u64 = 8;
pub const OB_SIZE: u64 = 16;
pub const BYTES_DATA: u64 = 32;
pub const UNICODE_LENGTH: u64 = 16;
pub const UNICODE_STATE: u64 = 32;
pub const TP_BASICSIZE: u64 = 32;
pub const TP_MEMBERS: u64 = 240;
pub const MEMBERDEF_SIZE: u64 = 40;
pub const MEMBERDEF_OFFSET: u64 = 16;
/// Owners from this one up carry no Python function (the kernel's walk
/// skips the same frames).
pub use tracer_common::python::FRAME_OWNED_BY_CSTACK;
/// Tag bits of a frame's code field (3.14+), masked off everywhere.
pub use tracer_common::python::CODE_TAG_MASK;

impl Offsets {
    /// The table for CPython 3.`minor`, or `None` when unsupported.
    pub fn for_minor(minor: u32) -> Option<Offsets> {
        Some(match minor {
            8..=10 => Self::v38_310(minor),
            11 => Self::v311(),
            12 => Self::v312(),
            13 => Self::v313(),
            14 | 15 => Self::v314_315(minor),
            _ => return None,
        })
    }

    /// CPython 3.8 to 3.10.
    fn v38_310(minor: u32) -> Offsets {
        Offsets {
            minor,
            runtime_interpreters_head: 32,
            interp_next: 0,
            interp_threads_head: 8,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_frame: 24,
            cframe_current_frame: None,
            tstate_thread_id: 176,
            tstate_native_thread_id: None,
            frame_code: 32,
            frame_back: 24,
            frame_instr: if minor == 10 { 96 } else { 104 },
            instr_kind: if minor == 10 { InstrKind::LastiUnits } else { InstrKind::LastiBytes },
            frame_owner: None,
            code_firstlineno: 40,
            code_filename: 104,
            code_name: 112,
            code_qualname: None,
            code_linetable: 120,
            line_format: if minor == 10 { LineFormat::Linetable310 } else { LineFormat::Lnotab },
            code_adaptive: None,
            unicode_ascii_data: 48,
            unicode_compact_data: 72,
            gil: GilLocation::Runtime(if minor == 8 { 1152 } else { 352 }),
        }
    }

    /// CPython 3.11.
    fn v311() -> Offsets {
        Offsets {
            minor: 11,
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_frame: 56,
            cframe_current_frame: Some(8),
            tstate_thread_id: 152,
            tstate_native_thread_id: Some(160),
            frame_code: 32,
            frame_back: 48,
            frame_instr: 56,
            instr_kind: InstrKind::Pointer,
            frame_owner: Some(69),
            code_firstlineno: 72,
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_linetable: 136,
            line_format: LineFormat::Locations,
            code_adaptive: Some(184),
            unicode_ascii_data: 48,
            unicode_compact_data: 72,
            gil: GilLocation::Runtime(360),
        }
    }

    /// CPython 3.12.
    fn v312() -> Offsets {
        Offsets {
            minor: 12,
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_frame: 56,
            cframe_current_frame: Some(0),
            tstate_thread_id: 136,
            tstate_native_thread_id: Some(144),
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            instr_kind: InstrKind::Pointer,
            frame_owner: Some(70),
            code_firstlineno: 68,
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_linetable: 136,
            line_format: LineFormat::Locations,
            code_adaptive: Some(192),
            unicode_ascii_data: 40,
            unicode_compact_data: 56,
            gil: GilLocation::Interpreter { runtime_main: 48, ceval_gil: 384 },
        }
    }

    /// CPython 3.13.
    fn v313() -> Offsets {
        Offsets {
            minor: 13,
            runtime_interpreters_head: 632,
            // Not 0 on 3.13: `struct _is` starts with the ceval state.
            interp_next: 7264,
            interp_threads_head: 7344,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_frame: 72,
            cframe_current_frame: None,
            tstate_thread_id: 152,
            tstate_native_thread_id: Some(160),
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            instr_kind: InstrKind::Pointer,
            frame_owner: Some(70),
            code_firstlineno: 68,
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_linetable: 136,
            line_format: LineFormat::Locations,
            code_adaptive: Some(200),
            unicode_ascii_data: 40,
            unicode_compact_data: 56,
            gil: GilLocation::Interpreter { runtime_main: 640, ceval_gil: 16 },
        }
    }

    /// CPython 3.14 and 3.15: from their `_Py_DebugOffsets` (Debian's 3.14.10 and
    /// 3.15.2, `debug_offsets.rs`); `f_executable` is a `_PyStackRef`,
    /// whose low bits are tags (`CODE_TAG_MASK`).
    fn v314_315(minor: u32) -> Offsets {
        let (head, next, threads, tid) = if minor == 14 { (808, 7272, 7344, 152) } else { (936, 7264, 7336, 176) };
        Offsets {
            minor,
            runtime_interpreters_head: head,
            interp_next: next,
            interp_threads_head: threads,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_frame: 72,
            cframe_current_frame: None,
            tstate_thread_id: tid,
            tstate_native_thread_id: Some(tid + 8),
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            instr_kind: InstrKind::Pointer,
            frame_owner: Some(74),
            code_firstlineno: 68,
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_linetable: 136,
            line_format: LineFormat::Locations,
            code_adaptive: Some(208),
            unicode_ascii_data: 40,
            unicode_compact_data: 56,
            gil: GilLocation::Interpreter { runtime_main: head + 8, ceval_gil: 16 },
        }
    }

    /// The kernel's view.
    pub fn py_layout(&self) -> PyLayout {
        let u = |v: u64| u32::try_from(v).unwrap_or(ABSENT);
        PyLayout {
            version: 300 + self.minor,
            tstate_frame: u(self.tstate_frame),
            cframe_current_frame: self.cframe_current_frame.map_or(ABSENT, u),
            frame_code: u(self.frame_code),
            frame_back: u(self.frame_back),
            frame_instr: u(self.frame_instr),
            frame_owner: self.frame_owner.map_or(ABSENT, u),
            code_firstlineno: u(self.code_firstlineno),
            tstate_next: u(self.tstate_next),
            tstate_thread_id: u(self.tstate_thread_id),
            code_name: u(self.code_qualname.unwrap_or(self.code_name)),
            code_filename: u(self.code_filename),
            code_linetable: u(self.code_linetable),
            _pad: 0,
            // Known once the process is read (`Interpreter::layout`).
            threads_head: 0,
        }
    }

    /// Size of the code object prefix read in one go (up to and including
    /// every field used, plus the type pointer).
    pub fn code_read_len(&self) -> usize {
        let fields = [
            OB_TYPE + 8,
            self.code_firstlineno + 4,
            self.code_filename + 8,
            self.code_name + 8,
            self.code_qualname.map_or(0, |o| o + 8),
            self.code_linetable + 8,
        ];
        fields.into_iter().max().unwrap_or(0) as usize
    }
}

impl Offsets {
    /// The fields in which `other` differs from `self`, as
    /// "name: ours vs theirs".
    pub fn differences(&self, other: &Offsets) -> Vec<String> {
        let mut out = Vec::new();
        macro_rules! cmp {
            ($($f:ident),*) => {$(
                if self.$f != other.$f {
                    out.push(format!("{}: {:?} vs {:?}", stringify!($f), self.$f, other.$f));
                }
            )*};
        }
        cmp!(
            runtime_interpreters_head, interp_next, interp_threads_head, tstate_next, tstate_interp, tstate_frame,
            cframe_current_frame, tstate_thread_id, tstate_native_thread_id, frame_code, frame_back, frame_instr,
            instr_kind, frame_owner, code_firstlineno, code_filename, code_name, code_qualname, code_linetable,
            line_format, code_adaptive, unicode_ascii_data, unicode_compact_data, gil
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_range() {
        for m in 8..=15 {
            let o = Offsets::for_minor(m).unwrap();
            assert_eq!(o.py_layout().version, 300 + m);
        }
        for m in [0, 6, 7, 16] {
            assert!(Offsets::for_minor(m).is_none());
        }
    }

    #[test]
    fn kernel_layout_absent_fields() {
        let l = Offsets::for_minor(10).unwrap().py_layout();
        assert_eq!((l.cframe_current_frame, l.frame_owner), (ABSENT, ABSENT));
        assert_eq!((l.tstate_frame, l.frame_code, l.frame_back, l.frame_instr), (24, 32, 24, 96));
        let l = Offsets::for_minor(11).unwrap().py_layout();
        assert_eq!((l.tstate_frame, l.cframe_current_frame, l.frame_owner, l.code_firstlineno), (56, 8, 69, 72));
        let l = Offsets::for_minor(12).unwrap().py_layout();
        assert_eq!((l.tstate_frame, l.cframe_current_frame, l.frame_code, l.frame_back), (56, 0, 0, 8));
        let l = Offsets::for_minor(13).unwrap().py_layout();
        assert_eq!((l.tstate_frame, l.cframe_current_frame, l.frame_instr, l.frame_owner), (72, ABSENT, 56, 70));
    }
}
