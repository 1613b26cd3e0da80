//! `_Py_DebugOffsets`: since 3.13, `_PyRuntime` starts with a structure in
//! which the interpreter publishes the offsets of its own runtime,
//! interpreter, thread, frame, code and unicode structures (for
//! out-of-process debuggers and profilers). The structure itself grows
//! between minor versions (3.14 and 3.15 inserted fields in the middle), so
//! where each member sits depends on the revision: [`Revision`] knows the
//! three published so far, and a later version (a 3.16 alpha) is read with
//! the newest one and accepted only when every member passes the sanity
//! checks of [`DebugOffsets::parse`].
//!
//! The positions below were read from the headers of each release
//! (`Include/internal/pycore_runtime.h` in 3.13,
//! `Include/internal/pycore_debug_offsets.h` in 3.14 and 3.15) by compiling
//! `offsetof(_Py_DebugOffsets, ...)`; `testdata/debug_offsets_3.*.hex` are
//! blobs captured from live interpreters with
//! `scripts/capture-debug-offsets.py`.

use super::{
    layout::{GilLocation, InstrKind, Offsets},
    linetable::LineFormat,
    proc::le_u64,
};

pub const COOKIE: &[u8; 8] = b"xdebugpy";
const VERSION: u64 = 8;
const FREE_THREADED: u64 = 16;

/// Bytes read from the start of `_PyRuntime`: every revision's structure fits.
pub const READ_LEN: usize = 1024;

/// Where the members we use sit inside one revision of `_Py_DebugOffsets`.
#[derive(Clone, Copy, Debug)]
pub struct Revision {
    /// The first minor version with this layout.
    pub minor: u32,
    /// `sizeof(_Py_DebugOffsets)`.
    len: u64,
    runtime_size: u64,
    runtime_interpreters_head: u64,
    interp_size: u64,
    interp_next: u64,
    interp_threads_head: u64,
    interp_ceval_gil: u64,
    tstate_size: u64,
    tstate_next: u64,
    tstate_interp: u64,
    tstate_current_frame: u64,
    tstate_thread_id: u64,
    tstate_native_thread_id: u64,
    frame_size: u64,
    frame_previous: u64,
    frame_executable: u64,
    frame_instr_ptr: u64,
    frame_owner: u64,
    code_size: u64,
    code_filename: u64,
    code_name: u64,
    code_qualname: u64,
    code_linetable: u64,
    code_firstlineno: u64,
    code_adaptive: u64,
    pyobject_size: u64,
    pyobject_ob_type: u64,
    unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`, published since 3.15.
    unicode_compact_size: Option<u64>,
}

/// 3.13.
const REV_313: Revision = Revision {
    minor: 13,
    len: 584,
    runtime_size: 24,
    runtime_interpreters_head: 40,
    interp_size: 48,
    interp_next: 64,
    interp_threads_head: 72,
    interp_ceval_gil: 112,
    tstate_size: 152,
    tstate_next: 168,
    tstate_interp: 176,
    tstate_current_frame: 184,
    tstate_thread_id: 192,
    tstate_native_thread_id: 200,
    frame_size: 224,
    frame_previous: 232,
    frame_executable: 240,
    frame_instr_ptr: 248,
    frame_owner: 264,
    code_size: 272,
    code_filename: 280,
    code_name: 288,
    code_qualname: 296,
    code_linetable: 304,
    code_firstlineno: 312,
    code_adaptive: 344,
    pyobject_size: 352,
    pyobject_ob_type: 360,
    unicode_ascii_size: 560,
    unicode_compact_size: None,
};

/// 3.14: `threads_main`, `code_object_generation`, `tlbc_*` and the set,
/// generator, list-node and debugger-support groups were added.
const REV_314: Revision = Revision {
    minor: 14,
    len: 760,
    runtime_size: 24,
    runtime_interpreters_head: 40,
    interp_size: 48,
    interp_next: 64,
    interp_threads_head: 72,
    interp_ceval_gil: 120,
    tstate_size: 176,
    tstate_next: 192,
    tstate_interp: 200,
    tstate_current_frame: 208,
    tstate_thread_id: 216,
    tstate_native_thread_id: 224,
    frame_size: 248,
    frame_previous: 256,
    frame_executable: 264,
    frame_instr_ptr: 272,
    frame_owner: 288,
    code_size: 312,
    code_filename: 320,
    code_name: 328,
    code_qualname: 336,
    code_linetable: 344,
    code_firstlineno: 352,
    code_adaptive: 384,
    pyobject_size: 400,
    pyobject_ob_type: 408,
    unicode_ascii_size: 640,
    unicode_compact_size: None,
};

/// 3.15: the thread state group gained `base_frame`, `last_profiled_*`,
/// `holds_gil`, ...; `err_stackitem`, type and heap-type members were added.
const REV_315: Revision = Revision {
    minor: 15,
    len: 888,
    tstate_thread_id: 240,
    tstate_native_thread_id: 248,
    frame_size: 312,
    frame_previous: 320,
    frame_executable: 328,
    frame_instr_ptr: 336,
    frame_owner: 352,
    code_size: 376,
    code_filename: 384,
    code_name: 392,
    code_qualname: 400,
    code_linetable: 408,
    code_firstlineno: 416,
    code_adaptive: 448,
    pyobject_size: 464,
    pyobject_ob_type: 472,
    unicode_ascii_size: 736,
    unicode_compact_size: Some(744),
    ..REV_314
};

/// The revisions, oldest first.
const REVISIONS: [Revision; 3] = [REV_313, REV_314, REV_315];

impl Revision {
    /// The layout of `_Py_DebugOffsets` in CPython 3.`minor` (the newest
    /// known for later versions); `None` before 3.13.
    pub fn for_minor(minor: u32) -> Option<Revision> {
        REVISIONS.iter().rev().find(|r| r.minor <= minor).copied()
    }
}

/// What is wrong with a `_Py_DebugOffsets` blob.
#[derive(Debug, PartialEq, Eq)]
pub enum DebugOffsetsError {
    /// `_PyRuntime` does not start with the cookie.
    NoCookie,
    /// Fewer bytes than the structure needs.
    Short { len: usize, need: u64 },
    /// A free-threaded build (`Py_GIL_DISABLED`).
    FreeThreaded,
    /// `version` is not the interpreter's major.minor.
    Version { published: u64 },
    /// A member is out of range for its structure: the revision guessed
    /// does not describe this blob.
    Implausible(String),
}

impl std::fmt::Display for DebugOffsetsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DebugOffsetsError::NoCookie => write!(f, "_PyRuntime does not start with the _Py_DebugOffsets cookie"),
            DebugOffsetsError::Short { len, need } => write!(f, "_Py_DebugOffsets: {len} bytes read, {need} needed"),
            DebugOffsetsError::FreeThreaded => write!(f, "_Py_DebugOffsets.free_threaded is set"),
            DebugOffsetsError::Version { published } => write!(f, "_Py_DebugOffsets.version is {published:#x}"),
            DebugOffsetsError::Implausible(m) => write!(f, "_Py_DebugOffsets: {m}"),
        }
    }
}

/// (member, position in `_Py_DebugOffsets`, bytes it needs).
type Member = (&'static str, u64, u64);
/// (structure, position of its size, its members).
type Group<'a> = (&'static str, u64, &'a [Member]);

/// Checks a structure as a process published it: its size is plausible
/// (16 bytes to `max_size`) and each `(member, offset, width)` lies inside
/// it, at or past `first` (16 where the structure starts with a `PyObject`
/// header). The error names what is wrong.
pub(crate) fn check_struct(strukt: &str, size: u64, max_size: u64, first: u64, members: &[(&str, u64, u64)]) -> Result<(), String> {
    if !(16..max_size).contains(&size) {
        return Err(format!("sizeof({strukt}) is {size}"));
    }
    for (member, off, width) in members {
        if *off < first || off.checked_add(*width).is_none_or(|end| end > size) {
            return Err(format!("{strukt}.{member} at {off} is outside its {size} bytes"));
        }
    }
    Ok(())
}

/// The values a process published, for the members we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX` of the build.
    pub version_hex: u64,
    runtime_interpreters_head: u64,
    interp_next: u64,
    interp_threads_head: u64,
    interp_ceval_gil: u64,
    tstate_next: u64,
    tstate_interp: u64,
    tstate_current_frame: u64,
    tstate_thread_id: u64,
    tstate_native_thread_id: u64,
    frame_previous: u64,
    frame_executable: u64,
    frame_instr_ptr: u64,
    frame_owner: u64,
    code_filename: u64,
    code_name: u64,
    code_qualname: u64,
    code_linetable: u64,
    code_firstlineno: u64,
    code_adaptive: u64,
    unicode_ascii_size: u64,
    unicode_compact_size: Option<u64>,
}

impl DebugOffsets {
    /// Reads `blob` (the start of `_PyRuntime`) with revision `rev`, for an
    /// interpreter that says it is 3.`minor`. Every member is checked
    /// against its structure's published size, and the fixed `PyObject`
    /// header (16 bytes, `ob_type` at 8) must be where `rev` puts it: a
    /// structure that moved is refused, never misread.
    pub fn parse(blob: &[u8], rev: &Revision, minor: u32) -> Result<DebugOffsets, DebugOffsetsError> {
        if blob.len() < 24 || &blob[..8] != COOKIE {
            return Err(DebugOffsetsError::NoCookie);
        }
        // The flag is first: a free-threaded build is refused as such, even
        // where the rest would not parse.
        if le_u64(blob, FREE_THREADED) != 0 {
            return Err(DebugOffsetsError::FreeThreaded);
        }
        let version_hex = le_u64(blob, VERSION);
        if (version_hex >> 24, (version_hex >> 16) & 0xff) != (3, u64::from(minor)) {
            return Err(DebugOffsetsError::Version { published: version_hex });
        }
        if (blob.len() as u64) < rev.len {
            return Err(DebugOffsetsError::Short { len: blob.len(), need: rev.len });
        }
        let at = |pos: u64| le_u64(blob, pos);
        let (pyobject_size, ob_type) = (at(rev.pyobject_size), at(rev.pyobject_ob_type));
        if (pyobject_size, ob_type) != (16, 8) {
            return Err(DebugOffsetsError::Implausible(format!(
                "PyObject is {pyobject_size} bytes with ob_type at {ob_type} (expected 16 and 8)"
            )));
        }
        let groups: [Group; 5] = [
            ("_PyRuntimeState", rev.runtime_size, &[("interpreters.head", rev.runtime_interpreters_head, 16)]),
            (
                "PyInterpreterState",
                rev.interp_size,
                &[("next", rev.interp_next, 8), ("threads.head", rev.interp_threads_head, 8), ("ceval.gil", rev.interp_ceval_gil, 8)],
            ),
            (
                "PyThreadState",
                rev.tstate_size,
                &[
                    ("next", rev.tstate_next, 8),
                    ("interp", rev.tstate_interp, 8),
                    ("current_frame", rev.tstate_current_frame, 8),
                    ("thread_id", rev.tstate_thread_id, 8),
                    ("native_thread_id", rev.tstate_native_thread_id, 8),
                ],
            ),
            (
                "_PyInterpreterFrame",
                rev.frame_size,
                &[
                    ("previous", rev.frame_previous, 8),
                    ("f_executable", rev.frame_executable, 8),
                    ("instr_ptr", rev.frame_instr_ptr, 8),
                    ("owner", rev.frame_owner, 1),
                ],
            ),
            (
                "PyCodeObject",
                rev.code_size,
                &[
                    ("co_filename", rev.code_filename, 8),
                    ("co_name", rev.code_name, 8),
                    ("co_qualname", rev.code_qualname, 8),
                    ("co_linetable", rev.code_linetable, 8),
                    ("co_firstlineno", rev.code_firstlineno, 4),
                    ("co_code_adaptive", rev.code_adaptive, 1),
                ],
            ),
        ];
        for (strukt, size_pos, members) in groups {
            let members: Vec<(&str, u64, u64)> = members.iter().map(|(m, pos, width)| (*m, at(*pos), *width)).collect();
            check_struct(strukt, at(size_pos), 1 << 20, 0, &members).map_err(DebugOffsetsError::Implausible)?;
        }
        let ascii = at(rev.unicode_ascii_size);
        let compact = rev.unicode_compact_size.map(at);
        if !(24..=64).contains(&ascii) || compact.is_some_and(|c| c <= ascii || c > ascii + 64) {
            return Err(DebugOffsetsError::Implausible(format!(
                "sizeof(PyASCIIObject) is {ascii}, sizeof(PyCompactUnicodeObject) {compact:?}"
            )));
        }
        Ok(DebugOffsets {
            version_hex,
            runtime_interpreters_head: at(rev.runtime_interpreters_head),
            interp_next: at(rev.interp_next),
            interp_threads_head: at(rev.interp_threads_head),
            interp_ceval_gil: at(rev.interp_ceval_gil),
            tstate_next: at(rev.tstate_next),
            tstate_interp: at(rev.tstate_interp),
            tstate_current_frame: at(rev.tstate_current_frame),
            tstate_thread_id: at(rev.tstate_thread_id),
            tstate_native_thread_id: at(rev.tstate_native_thread_id),
            frame_previous: at(rev.frame_previous),
            frame_executable: at(rev.frame_executable),
            frame_instr_ptr: at(rev.frame_instr_ptr),
            frame_owner: at(rev.frame_owner),
            code_filename: at(rev.code_filename),
            code_name: at(rev.code_name),
            code_qualname: at(rev.code_qualname),
            code_linetable: at(rev.code_linetable),
            code_firstlineno: at(rev.code_firstlineno),
            code_adaptive: at(rev.code_adaptive),
            unicode_ascii_size: ascii,
            unicode_compact_size: compact,
        })
    }

    /// The full layout: what was published, and for what is not (the line
    /// table format, `_PyRuntime.interpreters.main`, which follows
    /// `interpreters.head`) what every version since 3.13 has.
    pub fn offsets(&self, minor: u32) -> Offsets {
        Offsets {
            minor,
            runtime_interpreters_head: self.runtime_interpreters_head,
            interp_next: self.interp_next,
            interp_threads_head: self.interp_threads_head,
            tstate_next: self.tstate_next,
            tstate_interp: self.tstate_interp,
            tstate_frame: self.tstate_current_frame,
            cframe_current_frame: None,
            tstate_thread_id: self.tstate_thread_id,
            tstate_native_thread_id: Some(self.tstate_native_thread_id),
            frame_code: self.frame_executable,
            frame_back: self.frame_previous,
            frame_instr: self.frame_instr_ptr,
            instr_kind: InstrKind::Pointer,
            frame_owner: Some(self.frame_owner),
            code_firstlineno: self.code_firstlineno,
            code_filename: self.code_filename,
            code_name: self.code_name,
            code_qualname: Some(self.code_qualname),
            code_linetable: self.code_linetable,
            line_format: LineFormat::Locations,
            code_adaptive: Some(self.code_adaptive),
            unicode_ascii_data: self.unicode_ascii_size,
            // PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject.
            unicode_compact_data: self.unicode_compact_size.unwrap_or(self.unicode_ascii_size + 16),
            gil: GilLocation::Interpreter {
                runtime_main: self.runtime_interpreters_head + 8,
                ceval_gil: self.interp_ceval_gil,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob from `testdata/debug_offsets_3.X.hex` (a comment line, then hex).
    fn blob(minor: u32) -> Vec<u8> {
        let text = match minor {
            13 => include_str!("testdata/debug_offsets_3.13.hex"),
            14 => include_str!("testdata/debug_offsets_3.14.hex"),
            15 => include_str!("testdata/debug_offsets_3.15.hex"),
            _ => unreachable!(),
        };
        let hex: String = text.lines().filter(|l| !l.starts_with('#')).collect();
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn captured_blobs_give_the_built_in_tables() {
        for minor in [13, 14, 15] {
            let rev = Revision::for_minor(minor).unwrap();
            assert_eq!(rev.minor, minor);
            let d = DebugOffsets::parse(&blob(minor), &rev, minor).unwrap();
            assert_eq!(d.version_hex >> 16, 0x0300 | u64::from(minor), "3.{minor}");
            assert_eq!(Some(d.offsets(minor)), Offsets::for_minor(minor), "3.{minor}");
        }
    }

    #[test]
    fn revisions_by_version() {
        assert!(Revision::for_minor(12).is_none());
        assert_eq!(Revision::for_minor(14).map(|r| r.minor), Some(14));
        let later = Revision::for_minor(16).unwrap();
        assert_eq!(later.minor, 15);
    }

    /// A 3.16 alpha that kept 3.15's structure is read with it.
    #[test]
    fn a_later_version_with_the_same_structure_parses() {
        let mut b = blob(15);
        b[8..16].copy_from_slice(&0x0310_00a1u64.to_le_bytes());
        let rev = Revision::for_minor(16).unwrap();
        let d = DebugOffsets::parse(&b, &rev, 16).unwrap();
        let mut want = Offsets::for_minor(15).unwrap();
        want.minor = 16;
        assert_eq!(d.offsets(16), want);
    }

    /// A later version whose structure moved (a member inserted early on)
    /// is refused, not misread.
    #[test]
    fn a_moved_structure_is_refused() {
        let mut b = blob(15);
        b[8..16].copy_from_slice(&0x0310_00a1u64.to_le_bytes());
        b.splice(56..56, 0u64.to_le_bytes());
        let rev = Revision::for_minor(16).unwrap();
        let e = DebugOffsets::parse(&b, &rev, 16).unwrap_err();
        assert!(matches!(e, DebugOffsetsError::Implausible(_)), "{e}");
        // 3.14's blob read as 3.15's.
        let e = DebugOffsets::parse(&blob(14), &REV_315, 14).unwrap_err();
        assert!(matches!(e, DebugOffsetsError::Implausible(_)), "{e}");
    }

    #[test]
    fn free_threaded_wrong_version_and_garbage() {
        let rev = Revision::for_minor(14).unwrap();
        let mut b = blob(14);
        b[16] = 1;
        assert_eq!(DebugOffsets::parse(&b, &rev, 14), Err(DebugOffsetsError::FreeThreaded));
        assert_eq!(
            DebugOffsets::parse(&blob(14), &rev, 15),
            Err(DebugOffsetsError::Version { published: 0x030e_0af0 })
        );
        assert_eq!(DebugOffsets::parse(&[0u8; 1024], &rev, 14), Err(DebugOffsetsError::NoCookie));
        assert_eq!(DebugOffsets::parse(&blob(14)[..400], &rev, 14), Err(DebugOffsetsError::Short { len: 400, need: 760 }));
        let mut b = blob(14);
        // co_filename far outside PyCodeObject.
        b[320..328].copy_from_slice(&4096u64.to_le_bytes());
        assert!(matches!(DebugOffsets::parse(&b, &rev, 14), Err(DebugOffsetsError::Implausible(m)) if m.contains("co_filename")));
    }
}
