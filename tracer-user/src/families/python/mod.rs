//! CPython attribution, userspace side: find the interpreter of a running
//! process that knows nothing about us, work out its version and structure
//! layout, list its threads, read Python stacks from its memory and resolve
//! the frames the kernel walker captured (code object pointer + instruction)
//! into (qualified function, file, line).
//!
//! Supported: CPython 3.8 to 3.15 (x86_64, release builds with the GIL; a
//! later version through the layout it publishes), the interpreter
//! either in the executable (static builds such as Debian's
//! `/usr/bin/python3.11`, only `.dynsym` needed) or in a mapped
//! `libpython3.X.so` (pyenv builds). Other versions give
//! [`PythonError::Unsupported`], as do free-threaded builds.
//!
//! How the pieces are found:
//! - the binary: the process's executable or a mapped `libpython*`, the one
//!   that defines `_PyRuntime`, read through `/proc/PID/map_files` or the
//!   process's root (`/proc/PID/root`, symlinks confined to it);
//! - the version: `Py_Version` (3.11+), else the string `Py_GetVersion`
//!   leaves in its static buffer (in `.data`/`.bss`), else the file name;
//! - the layout: the per-version table of [`layout`], cross-checked at
//!   attach time against the process itself (see `validate_*`), first
//!   against the `_Py_DebugOffsets` 3.13+ publish ([`debug_offsets`]); a
//!   version newer than the tables is read with what it publishes;
//! - thread ids: `tstate->native_thread_id` (3.11+); before, `thread_id` is a
//!   `pthread_t`, i.e. the address of glibc's (or musl's) `struct pthread`,
//!   whose `tid` field is found by looking, at every 4-byte offset of the
//!   threads' `struct pthread`s, for the one that holds a distinct live
//!   thread id of the process for every thread (glibc's 0x2d0 preferred);
//!   both are ids in the process's own PID namespace (a container's,
//!   `unshare -p`), translated to ours through `NSpid` (`procfs::ThreadIdMap`).
//!
//! The code: [`Interpreter::attach`] and the version detection are in
//! `attach`, the checks of the layout against the live process in
//! `validate`, the thread list in `threads`, the stack walk and
//! [`Interpreter::dump`] in `frames`, code objects and
//! [`Interpreter::resolve_frame`] in `code`; `elf`, `proc`, `layout` and
//! `linetable` read ELF files, process memory, per-version structure
//! layouts and line tables. `dump`'s output is rendered by
//! `crate::report::dump`.

pub mod asyncio;
pub mod pause;
mod attach;
mod captured;
pub mod collector;
pub mod resolve;
mod code;
mod debug_offsets;
mod elf;
mod frames;
mod layout;
mod linetable;
mod proc;
mod threads;
mod validate;
mod walk;

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, HashMap, HashSet},
    io,
    path::PathBuf,
};

pub use code::UNKNOWN_FUNCTION;
pub use layout::{PyLayout, ABSENT};

use code::{CodeInfo, Unresolved};
use layout::Offsets;
use proc::Mem;
#[cfg(test)]
use threads::GLIBC_PTHREAD_TID;

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// The process maps a binary that looked like CPython but is not.
    #[error("process {pid} does not run CPython")]
    NotPython { pid: u32 },
    /// A CPython outside 3.8 .. 3.15 whose layout could not be read from
    /// the process, or an unsupported build (free-threaded) of any version.
    #[error("CPython {version}{detail} is not supported (supported: {SUPPORTED})")]
    Unsupported {
        version: String,
        detail: String,
        /// False when the version came from the file name only: a starting
        /// interpreter that has not written its version string yet.
        exact: bool,
    },
    /// `_PyRuntime` is there but no interpreter is (still starting, or
    /// shutting down): try again later.
    #[error("CPython {version} in process {pid} has no interpreter yet (starting up or exiting)")]
    NotInitialized { pid: u32, version: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a usable ELF file: {message}")]
    Elf { path: String, message: String },
    #[error("reading {len} bytes at {addr:#x} in process {pid}: {source}")]
    Memory {
        pid: u32,
        addr: u64,
        len: usize,
        #[source]
        source: io::Error,
    },
    /// The process's structures do not look like the layout of its version.
    #[error("CPython {version} in process {pid}: unexpected memory layout: {message}")]
    Layout { pid: u32, version: String, message: String },
}

/// The supported versions and builds, as messages say them.
pub const SUPPORTED: &str = "3.8 to 3.15, GIL builds";

/// What a process whose interpreter is not supported is still traced for.
pub const STILL_TRACED: &str = "syscalls, wall time, off-CPU and native stacks";

impl PythonError {
    fn unsupported(version: String, detail: &str) -> PythonError {
        PythonError::Unsupported { version, detail: detail.to_owned(), exact: true }
    }

    /// An unsupported interpreter whose version is only known from its
    /// file name (it has not written its version string yet): worth
    /// reading again in a moment.
    pub fn version_pending(&self) -> bool {
        matches!(self, PythonError::Unsupported { exact: false, .. })
    }

    fn free_threaded(version: String) -> PythonError {
        PythonError::unsupported(version, " (free-threaded build, Py_GIL_DISABLED)")
    }

    fn io(context: impl std::fmt::Display, source: io::Error) -> PythonError {
        PythonError::Io { context: context.to_string(), source }
    }

    /// The kernel refused to let us read the process's memory or files
    /// (EPERM, EACCES).
    pub fn permission_denied(&self) -> bool {
        match self {
            PythonError::Io { source, .. } | PythonError::Memory { source, .. } => {
                source.kind() == io::ErrorKind::PermissionDenied
            }
            _ => false,
        }
    }

    /// What to do about it, in a few words. Root is suggested only where a
    /// permission was refused to a process without CAP_SYS_PTRACE.
    pub fn hint(&self) -> &'static str {
        const CAP_SYS_PTRACE: u32 = 19;
        match self {
            _ if self.permission_denied() => {
                if crate::os::procfs::own_effective_caps().is_some_and(|c| c & (1 << CAP_SYS_PTRACE) != 0) {
                    "refused even with CAP_SYS_PTRACE: check kernel.yama.ptrace_scope and the security modules"
                } else {
                    "run as root: reading another user's process needs CAP_SYS_PTRACE"
                }
            }
            PythonError::NotPython { .. } => "CPython 3.8 to 3.15 is supported",
            PythonError::Unsupported { .. } => "the process is still traced without Python frames",
            PythonError::NotInitialized { .. } => "retry once the interpreter has started",
            PythonError::Io { .. } | PythonError::Memory { .. } => "retry; the process may have exited",
            PythonError::Elf { .. } => "the interpreter's file could not be read as CPython's",
            PythonError::Layout { .. } => "this build's structures differ from upstream CPython's for its version",
        }
    }
}

pub use crate::recording::ThreadDump;

/// One traced CPython process.
pub struct Interpreter {
    pid: u32,
    mem: Mem,
    version: (u32, u32, u32),
    version_text: String,
    /// False when the version came from the file name only (see `attach`).
    version_exact: bool,
    binary: PathBuf,
    offsets: Offsets,
    /// Address of `_PyRuntime` in the process.
    runtime: u64,
    /// Set when the layout came from the process itself (a version newer
    /// than the tables): says so.
    layout_note: Option<String>,
    /// Address of `PyCode_Type` in the process, when exported.
    code_type: Option<u64>,
    /// Before 3.11: offset of `tid` in `struct pthread`, once found.
    pthread_tid: Cell<Option<u64>>,
    /// The process's own thread ids (what CPython stores) -> ours.
    thread_ids: RefCell<crate::os::procfs::ThreadIdMap>,
    /// [start, end) of the GIL state, when located and plausible.
    gil: Option<(u64, u64)>,
    /// (code address, co_firstlineno) -> code object; `None` = unreadable.
    codes: HashMap<(u64, u32), Option<CodeInfo>>,
    /// Code objects whose kernel copy could not be decoded.
    bad_copies: HashSet<(u64, u32)>,
    /// Code objects resolved from a kernel copy that cut a part.
    partial_codes: HashSet<(u64, u32)>,
    /// Code objects left unresolved, with why; a copy that arrives later
    /// takes its code object out (see `add_captured`). At most
    /// `MAX_CACHED_CODES`; past that, counted in `unresolved_more`.
    unresolved: HashMap<(u64, u32), Unresolved>,
    /// Unresolved code objects past the bound of `unresolved`, by cause.
    unresolved_more: BTreeMap<Unresolved, u64>,
    /// The deadline of the whole operation (a `dump`) every walk over the
    /// process's memory also stops at (`walk`).
    walk_deadline: Cell<Option<std::time::Instant>>,
    /// Walks that tripped a bound: (what was walked, note), one per what;
    /// the notes not taken yet are flagged false.
    walk_notes: RefCell<Vec<(String, String, bool)>>,
    /// The last thread-list walk tripped a bound: its thread states without
    /// a live thread are the hostile structure's, not shown.
    tstates_cut: Cell<bool>,
}

impl std::fmt::Debug for Interpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interpreter")
            .field("pid", &self.pid)
            .field("version", &self.version_text)
            .field("binary", &self.binary)
            .field("runtime", &format_args!("{:#x}", self.runtime))
            .finish_non_exhaustive()
    }
}

impl Interpreter {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// (major, minor, micro).
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// The version as the interpreter reports it (e.g. `3.13.0`, `3.12.0rc1`).
    pub fn version_string(&self) -> &str {
        &self.version_text
    }

    /// False when only the file name told the version (major.minor): the
    /// interpreter had not written its version string yet.
    pub fn version_is_exact(&self) -> bool {
        self.version_exact
    }

    /// The file holding the interpreter, as the process sees its path.
    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    /// Address of `_PyRuntime` in the process.
    pub fn runtime_address(&self) -> u64 {
        self.runtime
    }

    /// A note for the report when the layout was read from the process's
    /// `_Py_DebugOffsets` because its version is newer than the tables.
    pub fn layout_note(&self) -> Option<&str> {
        self.layout_note.as_deref()
    }

    /// The kernel's view of this interpreter, with the address of its
    /// (first) interpreter's thread-list head when it can be read now.
    pub fn layout(&self) -> PyLayout {
        let o = &self.offsets;
        let mut l = o.py_layout();
        l.threads_head = match self.mem.u64(self.runtime + o.runtime_interpreters_head) {
            Ok(interp) if interp != 0 => interp + o.interp_threads_head,
            _ => 0,
        };
        l
    }

    /// [start, end) of the interpreter's GIL state (`struct
    /// _gil_runtime_state`: its mutex and condition variables), in which a
    /// futex wait is a GIL wait. `None` when it could not be located.
    pub fn gil_range(&self) -> Option<(u64, u64)> {
        self.gil
    }

    /// Sets (or clears) the deadline of the whole operation: every walk
    /// over the process's memory stops there, with a note.
    pub fn set_deadline(&self, deadline: Option<std::time::Instant>) {
        self.walk_deadline.set(deadline);
    }

    /// The notes of walks that tripped a bound since the last call (each
    /// structure once per interpreter), e.g. "thread list of pid 12: cycle
    /// at 0x5612a0, stopped after 3 nodes".
    pub fn take_walk_notes(&self) -> Vec<String> {
        let mut notes = self.walk_notes.borrow_mut();
        notes.iter_mut().filter(|n| !n.2).map(|n| {
            n.2 = true;
            n.1.clone()
        }).collect()
    }

    /// A walk over the process's memory of at most `max` nodes (`walk`).
    fn walk(&self, max: usize) -> walk::Walk {
        walk::Walk::new(max, walk::WALK_TIME, self.walk_deadline.get())
    }

    /// Keeps the note of a walk of `what` that tripped a bound (once per
    /// `what`, at most `MAX_WALK_NOTES`).
    fn tripped(&self, what: impl std::fmt::Display, stopped: walk::Stopped) {
        self.walk_note(what.to_string(), |w| stopped.describe(w));
    }

    fn walk_note(&self, what: String, text: impl FnOnce(&str) -> String) {
        const MAX_WALK_NOTES: usize = 64;
        let mut notes = self.walk_notes.borrow_mut();
        if notes.len() < MAX_WALK_NOTES && !notes.iter().any(|n| n.0 == what) {
            let text = text(&what);
            notes.push((what, text, false));
        }
    }

    fn layout_err(&self, message: impl Into<String>) -> PythonError {
        PythonError::Layout { pid: self.pid, version: self.version_text.clone(), message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_not_python() {
        assert!(Interpreter::attach(std::process::id()).unwrap().is_none());
    }

    #[test]
    fn missing_process_is_an_io_error() {
        let err = Interpreter::attach(u32::MAX - 7).unwrap_err();
        assert!(matches!(err, PythonError::Io { .. }), "{err}");
    }

    #[test]
    fn unsupported_message_is_one_line() {
        let e = PythonError::unsupported("2.7.18".into(), "");
        assert_eq!(e.to_string(), "CPython 2.7.18 is not supported (supported: 3.8 to 3.15, GIL builds)");
        let e = PythonError::free_threaded("3.14.0".into());
        assert_eq!(
            e.to_string(),
            "CPython 3.14.0 (free-threaded build, Py_GIL_DISABLED) is not supported (supported: 3.8 to 3.15, GIL builds)"
        );
    }

    #[test]
    fn root_is_suggested_only_for_a_refused_permission() {
        let layout = PythonError::Layout { pid: 1, version: "3.12.1".into(), message: "x".into() };
        let memory = |errno| PythonError::Memory { pid: 1, addr: 8, len: 8, source: io::Error::from_raw_os_error(errno) };
        let io = PythonError::io("/proc/1/maps", io::Error::from_raw_os_error(libc::EACCES));
        for e in [&layout, &memory(libc::ESRCH), &PythonError::unsupported("3.7.16".into(), "")] {
            assert!(!e.permission_denied() && !e.hint().contains("root"), "{e}: {}", e.hint());
        }
        let ptrace = crate::os::procfs::own_effective_caps().is_some_and(|c| c & (1 << 19) != 0);
        for e in [&memory(libc::EPERM), &io] {
            assert!(e.permission_denied(), "{e}");
            assert_eq!(e.hint().contains("run as root"), !ptrace, "{e}: {}", e.hint());
        }
    }
}

/// Checks against live interpreters that are our own children (no root, no
/// eBPF): a corrupted layout must be caught by validation, never yield a
/// wrong stack. Every interpreter the e2e tests expect is required under
/// CI=true (`infertrace_e2e::skip`).
#[cfg(test)]
mod live_tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    fn pythons() -> Vec<PathBuf> {
        let (found, missing) = infertrace_e2e::expected_pythons();
        if !missing.is_empty() {
            infertrace_e2e::skip("python::live_tests (some interpreters)", &missing.join(", "));
        }
        found.into_iter().map(|p| p.exe).collect()
    }

    struct Sleeper(Child);
    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn start(python: &std::path::Path) -> Sleeper {
        start_in(python, &[])
    }

    /// [`start`] under the command `wrapper` (`unshare -p -f`), if any.
    fn start_in(python: &std::path::Path, wrapper: &[&str]) -> Sleeper {
        use std::io::BufRead;
        let mut argv: Vec<&std::ffi::OsStr> = wrapper.iter().map(|a| std::ffi::OsStr::new(*a)).collect();
        argv.push(python.as_os_str());
        let mut c = Command::new(argv[0])
            .args(&argv[1..])
            .args(["-c", "import threading, time\nt = threading.Thread(target=time.sleep, args=(60,), daemon=True)\nt.start()\nprint('ready', flush=True)\ntime.sleep(60)"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Sleeper(c)
    }

    /// In a PID namespace of its own (`unshare -p -f`, root needed) the
    /// interpreter stores that namespace's thread ids: translated, they are
    /// the process's threads as we know them, each once (and before 3.11
    /// glibc's `struct pthread` tid offset is still the one found).
    #[test]
    fn namespaced_thread_ids_are_translated() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || infertrace_e2e::which("unshare").is_none() {
            infertrace_e2e::skip("python::live_tests::namespaced_thread_ids_are_translated", "root and unshare (util-linux)");
            return;
        }
        for py in pythons() {
            let s = start_in(&py, &["unshare", "-p", "-f", "--kill-child"]);
            // The interpreter: unshare's child, pid 1 in its namespace.
            let pid = crate::os::procfs::thread_ids(s.0.id())
                .iter()
                .find_map(|t| {
                    let children = std::fs::read_to_string(format!("/proc/{}/task/{t}/children", s.0.id())).ok()?;
                    children.split_whitespace().next()?.parse::<u32>().ok()
                })
                .expect("unshare's child");
            assert_eq!(crate::os::procfs::nspid(pid, pid).and_then(|v| v.last().copied()), Some(1), "{}", py.display());
            let i = Interpreter::attach(pid).unwrap().unwrap();
            let states = i.thread_states().unwrap();
            let tids: Vec<u32> = states.iter().map(|t| t.0).collect();
            let unique: HashSet<u32> = tids.iter().copied().collect();
            assert_eq!(unique.len(), tids.len(), "{}: {tids:?}", py.display());
            assert_eq!(unique, crate::os::procfs::thread_ids(pid).into_iter().collect::<HashSet<_>>(), "{}", py.display());
            if i.offsets.tstate_native_thread_id.is_none() {
                assert_eq!(i.pthread_tid.get(), Some(GLIBC_PTHREAD_TID), "{}", py.display());
            }
        }
    }

    /// What the kernel copies of a code object (see `remember_frame` in
    /// tracer-ebpf's python.rs), read here from the live process.
    fn kernel_like_copy(i: &Interpreter, code: u64) -> tracer_common::python::PyCodeRaw {
        use tracer_common::python::PyCodeRaw;
        // SAFETY: PyCodeRaw is plain old data; all zeroes is a valid value.
        let mut raw: PyCodeRaw = unsafe { std::mem::zeroed() };
        let o = &i.offsets;
        let part = |addr: u64, want: u64, buf: &mut [u8]| -> (u64, u32) {
            let got = i.mem.bytes_lossy(addr, want.min(buf.len() as u64) as usize);
            buf[..got.len()].copy_from_slice(&got);
            (addr, got.len() as u32)
        };
        let str_size = |a: u64| 72 + i.mem.u64(a + 16).unwrap() * 4;
        let name = i.mem.u64(code + o.code_qualname.unwrap_or(o.code_name)).unwrap();
        let file = i.mem.u64(code + o.code_filename).unwrap();
        let table = i.mem.u64(code + o.code_linetable).unwrap();
        (raw.addrs[0], raw.lens[0]) = part(code, raw.code.len() as u64, &mut raw.code);
        (raw.addrs[1], raw.lens[1]) = part(name, str_size(name), &mut raw.name);
        (raw.addrs[2], raw.lens[2]) = part(file, str_size(file), &mut raw.filename);
        (raw.addrs[3], raw.lens[3]) = part(table, 32 + i.mem.u64(table + 16).unwrap(), &mut raw.linetable);
        raw
    }

    /// A kernel copy of a code object resolves its frames once the process
    /// is gone, also after a first try left them `[unknown]` (the copy can
    /// be taken after the stack was first resolved), and it wins over an
    /// earlier read of the address (freed and reused since, as a module's
    /// top-level code is once it has run).
    #[test]
    fn kernel_copies_resolve_late_and_win_over_earlier_reads() {
        for py in pythons() {
            let what = py.display().to_string();
            let s = start(&py);
            let mut i = Interpreter::attach(s.0.id()).unwrap().unwrap();
            // The innermost Python frame of the first thread that has one.
            let (code, instr) = i
                .walk_tstates()
                .unwrap()
                .iter()
                .find_map(|t| {
                    let mut frame = i.top_frame(t.addr).ok()?;
                    while frame != 0 {
                        let f = i.read_frame(frame).ok()?;
                        if !f.skip {
                            return Some((f.code, f.instr));
                        }
                        frame = f.back;
                    }
                    None
                })
                .unwrap_or_else(|| panic!("{what}: no Python frame"));
            let checksum = i.mem.u32(code + i.offsets.code_firstlineno).unwrap();
            let raw = kernel_like_copy(&i, code);
            let live = i.resolve_frame(code, instr, checksum);
            assert_ne!(live.function, UNKNOWN_FUNCTION, "{what}");

            // A copy that says otherwise than the earlier read wins.
            let mut other = raw;
            other.name[i.offsets.unicode_ascii_data as usize] = b'Z';
            i.add_captured(code, checksum, &other);
            let f = i.resolve_frame(code, instr, checksum);
            assert!(
                f.function.starts_with('Z') && f.function[1..] == live.function[1..] && f.file == live.file,
                "{what}: {f:?} after a copy, {live:?} before"
            );

            // The process gone, a new reader: [unknown] until the copy comes.
            let mut fresh = Interpreter::attach(s.0.id()).unwrap().unwrap();
            drop(s);
            let gone = fresh.resolve_frame(code, instr, checksum);
            assert_eq!(gone.function, UNKNOWN_FUNCTION, "{what}");
            assert_eq!(fresh.resolution_problems().len(), 1, "{what}");
            assert!(fresh.add_captured(code, checksum, &raw), "{what}: the copy resolves an unresolved object");
            let late = fresh.resolve_frame(code, instr, checksum);
            assert_eq!((&late.function, &late.file, late.line), (&live.function, &live.file, live.line), "{what}");
            assert!(fresh.resolution_problems().is_empty(), "{what}: {:?}", fresh.resolution_problems());
        }
    }

    /// 3.13+ (3.14 and 3.15 from Debian's root included): the layout the
    /// live interpreter publishes in its `_Py_DebugOffsets` is the table's.
    #[test]
    fn published_layouts_match_the_tables() {
        let mut checked = Vec::new();
        for py in pythons() {
            let s = start(&py);
            let i = Interpreter::attach(s.0.id()).unwrap().unwrap();
            let minor = i.offsets.minor;
            if minor < 13 {
                continue;
            }
            let published = attach::published_offsets(&i.mem, i.runtime, minor)
                .unwrap_or_else(|_| panic!("{}: no usable _Py_DebugOffsets", py.display()));
            let table = Offsets::for_minor(minor).unwrap();
            assert_eq!(table.differences(&published), Vec::<String>::new(), "{}", py.display());
            assert!(i.layout_note().is_none(), "{}", py.display());
            checked.push(i.version_string().to_owned());
        }
        // Every version that publishes one was checked: under CI=true
        // pythons() has failed already when one is missing (the chroot's
        // 3.14 and 3.15 included); elsewhere a missing one was said.
        let last = if infertrace_e2e::ci() { 15 } else { 13 };
        for minor in 13..=last {
            let v = format!("3.{minor}.");
            assert!(checked.iter().any(|c| c.starts_with(&v)), "no {v}x among {checked:?}");
        }
        eprintln!("published layouts match the tables: {checked:?}");
    }

    #[test]
    fn wrong_layouts_are_rejected() {
        for py in pythons() {
            let s = start(&py);
            let pid = s.0.id();
            let good = Interpreter::attach(pid).unwrap().unwrap();
            let tids: HashSet<u32> = good.thread_states().unwrap().iter().map(|t| t.0).collect();
            assert_eq!(tids, crate::os::procfs::thread_ids(pid).into_iter().collect::<HashSet<_>>(), "{}", py.display());
            if good.offsets.tstate_native_thread_id.is_none() {
                assert_eq!(good.pthread_tid.get(), Some(GLIBC_PTHREAD_TID), "{}", py.display());
            }
            let o = good.offsets;
            let mutations: Vec<(&str, Offsets)> = vec![
                ("co_firstlineno", Offsets { code_firstlineno: o.code_firstlineno + 4, ..o }),
                ("co_filename", Offsets { code_filename: o.code_filename + 8, ..o }),
                ("threads head", Offsets { interp_threads_head: o.interp_threads_head + 8, ..o }),
                ("tstate interp", Offsets { tstate_interp: o.tstate_interp + 8, ..o }),
                (
                    "thread id",
                    Offsets {
                        tstate_native_thread_id: o.tstate_native_thread_id.map(|x| x + 8),
                        tstate_thread_id: o.tstate_thread_id + 8,
                        ..o
                    },
                ),
                ("frame code", Offsets { frame_code: o.frame_code + 8, ..o }),
                ("top frame", Offsets { tstate_frame: o.tstate_frame + 8, ..o }),
            ];
            for (what, bad) in mutations {
                let mut i = Interpreter::attach(pid).unwrap().unwrap();
                i.offsets = bad;
                i.pthread_tid.set(None);
                let r = (|| {
                    if i.offsets.minor >= 13 {
                        i.validate_debug_offsets()?;
                    }
                    i.validate_code_type()?;
                    i.validate_threads()?;
                    i.validate_frames()
                })();
                assert!(
                    matches!(r, Err(PythonError::Layout { .. }) | Err(PythonError::Memory { .. })),
                    "{}: wrong {what} not detected: {r:?}",
                    py.display()
                );
            }
        }
    }
}
