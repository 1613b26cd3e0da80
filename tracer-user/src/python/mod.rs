//! CPython attribution, userspace side: find the interpreter of a running
//! process that knows nothing about us, work out its version and structure
//! layout, list its threads, read Python stacks from its memory and resolve
//! the frames the kernel walker captured (code object pointer + instruction)
//! into (qualified function, file, line).
//!
//! Supported: CPython 3.8 to 3.13 (x86_64, release builds), the interpreter
//! either in the executable (static builds such as Debian's
//! `/usr/bin/python3.11`, only `.dynsym` needed) or in a mapped
//! `libpython3.X.so` (pyenv builds). Other versions give
//! [`PythonError::Unsupported`].
//!
//! How the pieces are found:
//! - the binary: the process's executable or a mapped `libpython*`, the one
//!   that defines `_PyRuntime`, read through `/proc/PID/map_files` or the
//!   process's root (`/proc/PID/root`, symlinks confined to it);
//! - the version: `Py_Version` (3.11+), else the string `Py_GetVersion`
//!   leaves in its static buffer (in `.data`/`.bss`), else the file name;
//! - the layout: the per-version table of [`layout`], cross-checked at
//!   attach time against the process itself (see `validate_*`);
//! - thread ids: `tstate->native_thread_id` (3.11+); before, `thread_id` is a
//!   `pthread_t`, i.e. the address of glibc's (or musl's) `struct pthread`,
//!   whose `tid` field is found by looking, at every 4-byte offset of the
//!   threads' `struct pthread`s, for the one that holds a distinct live
//!   thread id of the process for every thread (glibc's 0x2d0 preferred).

mod elf;
mod layout;
mod linetable;
mod proc;

use std::{
    cell::Cell,
    collections::{HashMap, HashSet},
    fs, io,
    os::unix::fs::MetadataExt,
    path::PathBuf,
};

pub use layout::{PyLayout, ABSENT};

use crate::recording::{Frame, FrameKind};
use layout::{GilLocation, InstrKind, Offsets};
use proc::{le_u32, le_u64, Mem};

/// Function name of a frame whose code object could not be read (or no
/// longer matches what the kernel saw).
pub const UNKNOWN_FUNCTION: &str = "[unknown]";

/// Most frames walked per thread (the default recursion limit is 1000).
const MAX_DEPTH: usize = 4096;
/// Most thread states walked per interpreter, and interpreters per process.
const MAX_THREADS: usize = 65_536;
const MAX_INTERPRETERS: usize = 1024;
/// Longest string / byte table read from the process.
const MAX_STRING: u64 = 1 << 16;
const MAX_TABLE: u64 = 1 << 20;
/// Code objects cached before the cache is reset.
const MAX_CACHED_CODES: usize = 1 << 16;
/// glibc's `offsetof(struct pthread, tid)` on x86_64 (0x2d0), preferred when
/// several offsets fit.
const GLIBC_PTHREAD_TID: u64 = 0x2d0;
/// Bytes of `struct pthread` searched for the `tid` field.
const PTHREAD_SCAN: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// The process maps a binary that looked like CPython but is not.
    #[error("process {pid} does not run CPython")]
    NotPython { pid: u32 },
    /// A CPython outside 3.8 .. 3.13 (or an unsupported build of one).
    #[error("CPython {version} is not supported (supported: 3.8 to 3.13)")]
    Unsupported { version: String },
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

impl PythonError {
    fn io(context: impl std::fmt::Display, source: io::Error) -> PythonError {
        PythonError::Io { context: context.to_string(), source }
    }
}

/// The current Python stack of one thread.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadDump {
    /// Kernel thread id (0 when it could not be determined, before 3.11).
    pub tid: u32,
    pub thread_name: Option<String>,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

/// A code object as read from the process.
#[derive(Debug)]
struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    name: String,
    filename: String,
    firstlineno: i32,
    table: Vec<u8>,
    /// Address of the first code unit (3.11+: `code + co_code_adaptive`).
    code_start: u64,
    /// Line per instruction value already asked for.
    lines: HashMap<u64, Option<u32>>,
}

/// One thread state found in the interpreter list.
#[derive(Clone, Copy, Debug)]
struct TState {
    addr: u64,
    /// `native_thread_id` (3.11+) or the `pthread_t` `thread_id`.
    thread_id: u64,
}

/// One traced CPython process.
pub struct Interpreter {
    pid: u32,
    mem: Mem,
    version: (u32, u32, u32),
    version_text: String,
    binary: PathBuf,
    offsets: Offsets,
    /// Address of `_PyRuntime` in the process.
    runtime: u64,
    /// Address of `PyCode_Type` in the process, when exported.
    code_type: Option<u64>,
    /// Before 3.11: offset of `tid` in `struct pthread`, once found.
    pthread_tid: Cell<Option<u64>>,
    /// [start, end) of the GIL state, when located and plausible.
    gil: Option<(u64, u64)>,
    /// (code address, co_firstlineno) -> code object; `None` = unreadable.
    codes: HashMap<(u64, u32), Option<CodeInfo>>,
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

/// A mapped file that may hold the interpreter.
struct Candidate<'a> {
    mappings: Vec<&'a proc::MapEntry>,
    is_libpython: bool,
}

impl Interpreter {
    /// Finds CPython in process `pid` (its executable or a mapped
    /// `libpython*.so`), detects its version, locates `_PyRuntime` and
    /// validates the layout against the live process. `Ok(None)` when the
    /// process runs no CPython.
    pub fn attach(pid: u32) -> Result<Option<Interpreter>, PythonError> {
        let maps = proc::read_maps(pid)?;
        let exe_inode = fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| m.ino());

        // Group file mappings by (inode, path), in address order.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut seen: HashMap<(u64, &str), usize> = HashMap::new();
        for m in maps.iter().filter(|m| m.is_file()) {
            let base = m.basename().unwrap_or("");
            let is_libpython = base.starts_with("libpython");
            if !is_libpython && Some(m.inode) != exe_inode {
                continue;
            }
            let key = (m.inode, m.clean_path().unwrap_or(""));
            match seen.get(&key) {
                Some(&i) => candidates[i].mappings.push(m),
                None => {
                    seen.insert(key, candidates.len());
                    candidates.push(Candidate { mappings: vec![m], is_libpython });
                }
            }
        }
        // libpython first: the executable of a shared build only imports.
        candidates.sort_by_key(|c| !c.is_libpython);

        let mem = Mem { pid };
        let mut old_python: Option<(elf::ElfInfo, Vec<&proc::MapEntry>, String)> = None;
        let mut last_err = None;
        for cand in &candidates {
            let first = cand.mappings[0];
            let (file, path) = match proc::open_mapped(pid, first) {
                Ok(x) => x,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let info = match elf::inspect(file, &path) {
                Ok(i) => i,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let name = first.basename().unwrap_or("").to_string();
            if info.symbol("_PyRuntime").is_some() {
                return Self::attach_to(pid, mem, &info, &cand.mappings, path, &name).map(Some);
            }
            if info.symbol("Py_GetVersion").is_some() && old_python.is_none() {
                old_python = Some((info, cand.mappings.clone(), name));
            }
        }
        if let Some((info, mappings, name)) = old_python {
            // CPython without _PyRuntime: 3.6 or older.
            let version = info
                .load_bias(&mappings)
                .and_then(|bias| detect_version(&mem, &info, bias, &name))
                .map_or_else(|| format!("{name} (no _PyRuntime: older than 3.7)"), |v| v.3);
            return Err(PythonError::Unsupported { version });
        }
        match last_err {
            // A libpython we could not read is an error; an unreadable
            // executable that is not named like Python is just not Python.
            Some(e) if candidates.iter().any(|c| c.is_libpython) => Err(e),
            _ => Ok(None),
        }
    }

    fn attach_to(
        pid: u32,
        mem: Mem,
        info: &elf::ElfInfo,
        mappings: &[&proc::MapEntry],
        binary: PathBuf,
        name: &str,
    ) -> Result<Interpreter, PythonError> {
        let bias = info.load_bias(mappings).ok_or_else(|| PythonError::Elf {
            path: binary.display().to_string(),
            message: "no mapping matches a loadable segment (cannot compute the load bias)".into(),
        })?;
        let (major, minor, micro, version_text) =
            detect_version(&mem, info, bias, name).ok_or_else(|| PythonError::Layout {
                pid,
                version: "?".into(),
                message: format!("cannot determine the CPython version of {}", binary.display()),
            })?;
        let offsets = match (major, Offsets::for_minor(minor)) {
            (3, Some(o)) => o,
            _ => return Err(PythonError::Unsupported { version: version_text }),
        };
        let mut interp = Interpreter {
            pid,
            mem,
            version: (major, minor, micro),
            version_text,
            binary,
            offsets,
            runtime: bias.wrapping_add(info.symbol("_PyRuntime").unwrap_or(0)),
            code_type: info.symbol("PyCode_Type").map(|a| bias.wrapping_add(a)),
            pthread_tid: Cell::new(None),
            gil: None,
            codes: HashMap::new(),
        };
        if minor == 13 {
            interp.validate_debug_offsets()?;
        }
        interp.validate_code_type()?;
        interp.validate_threads()?;
        interp.validate_frames()?;
        interp.gil = interp.locate_gil();
        Ok(interp)
    }

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

    /// The file holding the interpreter, as the process sees its path.
    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    /// Address of `_PyRuntime` in the process.
    pub fn runtime_address(&self) -> u64 {
        self.runtime
    }

    pub fn layout(&self) -> PyLayout {
        self.offsets.py_layout()
    }

    /// [start, end) of the interpreter's GIL state (`struct
    /// _gil_runtime_state`: its mutex and condition variables), in which a
    /// futex wait is a GIL wait. `None` when it could not be located.
    pub fn gil_range(&self) -> Option<(u64, u64)> {
        self.gil
    }

    fn locate_gil(&self) -> Option<(u64, u64)> {
        let start = match self.offsets.gil {
            GilLocation::Runtime(off) => self.runtime + off,
            GilLocation::Interpreter { runtime_main, ceval_gil } => {
                let main = self.mem.u64(self.runtime + runtime_main).ok()?;
                self.mem.u64(main.checked_add(ceval_gil)?).ok()?
            }
        };
        // Plausibility: a switch interval (default 5000 us) and a 0/1 lock.
        let interval = self.mem.u64(start + layout::GIL_INTERVAL).ok()?;
        let locked = self.mem.u32(start + layout::GIL_LOCKED).ok()?;
        (interval > 0 && interval < 1 << 40 && locked <= 1).then_some((start, start + layout::GIL_STATE_SIZE))
    }

    fn layout_err(&self, message: impl Into<String>) -> PythonError {
        PythonError::Layout { pid: self.pid, version: self.version_text.clone(), message: message.into() }
    }

    // ------------------------------------------------------------------
    // Validation against the live process

    /// 3.13 publishes its own offsets at the start of `_PyRuntime`: they
    /// must be ours.
    fn validate_debug_offsets(&self) -> Result<(), PythonError> {
        use layout::debug_offsets_313 as d;
        let buf = self.mem.bytes(self.runtime, d::LEN)?;
        if &buf[..8] != d::COOKIE {
            return Err(self.layout_err("_PyRuntime does not start with the _Py_DebugOffsets cookie"));
        }
        if le_u64(&buf, d::FREE_THREADED) != 0 {
            return Err(PythonError::Unsupported { version: format!("{} (free-threaded build)", self.version_text) });
        }
        let hex = le_u64(&buf, d::VERSION);
        if (hex >> 24, (hex >> 16) & 0xff) != (3, 13) {
            return Err(self.layout_err(format!("_Py_DebugOffsets.version is {hex:#x}")));
        }
        let ours = self.offsets.debug_fields_313();
        let mut diffs = Vec::new();
        for ((off, field), want) in d::FIELDS.iter().zip(ours) {
            let got = le_u64(&buf, *off);
            if got != want {
                diffs.push(format!("{field} is {got}, expected {want}"));
            }
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(self.layout_err(format!("_Py_DebugOffsets disagree: {}", diffs.join(", "))))
        }
    }

    /// `PyCode_Type.tp_members` lists the offsets of the code object fields
    /// we read (and 3.11+'s `tp_basicsize` is `co_code_adaptive`'s offset).
    fn validate_code_type(&self) -> Result<(), PythonError> {
        let Some(ty) = self.code_type else { return Ok(()) };
        let basicsize = self.mem.u64(ty + layout::TP_BASICSIZE)?;
        let members = self.mem.u64(ty + layout::TP_MEMBERS)?;
        let mut found: HashMap<String, u64> = HashMap::new();
        let mut at = members;
        for _ in 0..64 {
            let def = self.mem.bytes(at, layout::MEMBERDEF_SIZE as usize)?;
            let name_ptr = le_u64(&def, 0);
            if name_ptr == 0 {
                break;
            }
            let name = self.mem.c_string(name_ptr, 64)?;
            found.insert(name, le_u64(&def, layout::MEMBERDEF_OFFSET));
            at += layout::MEMBERDEF_SIZE;
        }
        let o = self.offsets;
        let table_name = if o.minor <= 9 { "co_lnotab" } else { "co_linetable" };
        let mut expect = vec![
            ("co_filename", o.code_filename),
            ("co_name", o.code_name),
            ("co_firstlineno", o.code_firstlineno),
            (table_name, o.code_linetable),
        ];
        if let Some(q) = o.code_qualname {
            expect.push(("co_qualname", q));
        }
        let mut diffs = Vec::new();
        for (field, want) in expect {
            match found.get(field) {
                Some(&got) if got == want => {}
                Some(&got) => diffs.push(format!("{field} at {got}, expected {want}")),
                None => diffs.push(format!("{field} missing from PyCode_Type.tp_members")),
            }
        }
        if let Some(adaptive) = o.code_adaptive {
            if basicsize != adaptive {
                diffs.push(format!("PyCode_Type.tp_basicsize (co_code_adaptive) is {basicsize}, expected {adaptive}"));
            }
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(self.layout_err(format!("code object: {}", diffs.join(", "))))
        }
    }

    /// The thread list: an interpreter, whose thread states point back to
    /// it, and whose thread ids are threads of the process.
    fn validate_threads(&self) -> Result<(), PythonError> {
        let head = self.mem.u64(self.runtime + self.offsets.runtime_interpreters_head)?;
        if head == 0 {
            return Err(PythonError::NotInitialized { pid: self.pid, version: self.version_text.clone() });
        }
        // The main thread state follows the interpreter within microseconds
        // at start-up; an interpreter that stays without one is misread.
        let mut first = 0;
        for _ in 0..20 {
            first = self.mem.u64(head + self.offsets.interp_threads_head)?;
            if first != 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if first == 0 {
            return Err(self.layout_err(format!("interpreter {head:#x} has no thread state")));
        }
        let back = self.mem.u64(first + self.offsets.tstate_interp)?;
        if back != head {
            return Err(
                self.layout_err(format!("thread state {first:#x} points to interpreter {back:#x}, not {head:#x}"))
            );
        }
        let tstates = self.walk_tstates()?;
        let tids = self.tids(&tstates);
        if !tids.iter().any(Option::is_some) {
            let what = if self.offsets.tstate_native_thread_id.is_some() {
                "native_thread_id"
            } else {
                "thread_id (pthread_t -> struct pthread tid)"
            };
            return Err(self.layout_err(format!("no thread state's {what} is a thread of the process")));
        }
        Ok(())
    }

    /// The top frame of a thread that has one points at a code object
    /// (frames run concurrently: three tries before giving up).
    fn validate_frames(&self) -> Result<(), PythonError> {
        let Some(code_type) = self.code_type else { return Ok(()) };
        let mut problem = None;
        for _ in 0..3 {
            match self.check_some_frame(code_type)? {
                None => return Ok(()),
                Some(p) => problem = Some(p),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Err(self.layout_err(problem.unwrap_or_default()))
    }

    /// `None` when a thread's first Python frame has a code object (or no
    /// thread has a frame), else what went wrong.
    fn check_some_frame(&self, code_type: u64) -> Result<Option<String>, PythonError> {
        let mut problem = None;
        for ts in self.walk_tstates()? {
            // 3.11/3.12: `tstate->cframe` is never null (it starts at
            // `&tstate->root_cframe`).
            if self.offsets.cframe_current_frame.is_some() && self.mem.u64(ts.addr + self.offsets.tstate_frame)? == 0 {
                return Ok(Some(format!("thread state {:#x} has a null cframe", ts.addr)));
            }
            let mut frame = self.top_frame(ts.addr)?;
            if frame == 0 {
                continue;
            }
            for _ in 0..MAX_DEPTH {
                if frame == 0 {
                    break;
                }
                let f = match self.read_frame(frame) {
                    Ok(f) => f,
                    Err(e) => {
                        problem = Some(format!("thread state {:#x}: frame unreadable: {e}", ts.addr));
                        break;
                    }
                };
                if !f.skip {
                    match self.mem.u64(f.code.wrapping_add(layout::OB_TYPE)) {
                        Ok(ty) if ty == code_type => return Ok(None),
                        Ok(ty) => {
                            problem = Some(format!(
                                "frame {frame:#x}: code field {:#x} is not a code object (type {ty:#x}, PyCode_Type {code_type:#x})",
                                f.code
                            ))
                        }
                        Err(e) => problem = Some(format!("frame {frame:#x}: code field unreadable: {e}")),
                    }
                    break;
                }
                frame = f.back;
            }
        }
        Ok(problem)
    }

    // ------------------------------------------------------------------
    // Threads

    fn walk_tstates(&self) -> Result<Vec<TState>, PythonError> {
        let o = &self.offsets;
        let tid_off = o.tstate_native_thread_id.unwrap_or(o.tstate_thread_id);
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut interp = self.mem.u64(self.runtime + o.runtime_interpreters_head)?;
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 {
                break;
            }
            let mut ts = self.mem.u64(interp + o.interp_threads_head)?;
            for _ in 0..MAX_THREADS {
                if ts == 0 || !seen.insert(ts) {
                    break;
                }
                let thread_id = self.mem.u64(ts + tid_off)?;
                out.push(TState { addr: ts, thread_id });
                ts = self.mem.u64(ts + o.tstate_next)?;
            }
            interp = self.mem.u64(interp + o.interp_next)?;
        }
        Ok(out)
    }

    /// Kernel thread id of each thread state (`None`: not a live thread).
    fn tids(&self, tstates: &[TState]) -> Vec<Option<u32>> {
        let tasks: HashSet<u32> = proc::task_ids(self.pid).into_iter().collect();
        if self.offsets.tstate_native_thread_id.is_some() {
            return tstates.iter().map(|t| u32::try_from(t.thread_id).ok().filter(|tid| tasks.contains(tid))).collect();
        }
        // pthread_t -> struct pthread -> tid. A struct pthread may end
        // before PTHREAD_SCAN bytes (musl): read what is mapped.
        let pthreads: Vec<Vec<u8>> = tstates
            .iter()
            .map(|t| if t.thread_id == 0 { Vec::new() } else { self.mem.bytes_lossy(t.thread_id, PTHREAD_SCAN) })
            .collect();
        let at = |off: u64| -> Vec<Option<u32>> {
            pthreads.iter().map(|b| Some(le_u32(b, off)).filter(|tid| tasks.contains(tid))).collect()
        };
        if let Some(off) = self.pthread_tid.get() {
            let r = at(off);
            if r.iter().any(Option::is_some) {
                return r;
            }
        }
        // Calibrate: the offset at which the most thread states find
        // distinct live tids (a thread that exited has tid 0 there, the
        // kernel clears it), glibc's when it is among the best.
        let score = |off: u64| -> usize { at(off).into_iter().flatten().collect::<HashSet<u32>>().len() };
        let scores: Vec<(u64, usize)> = (0..PTHREAD_SCAN as u64 - 4).step_by(4).map(|o| (o, score(o))).collect();
        let best = scores.iter().map(|s| s.1).max().unwrap_or(0);
        if best == 0 {
            return vec![None; tstates.len()];
        }
        let off = if score(GLIBC_PTHREAD_TID) == best {
            GLIBC_PTHREAD_TID
        } else {
            scores.iter().find(|s| s.1 == best).map_or(GLIBC_PTHREAD_TID, |s| s.0)
        };
        self.pthread_tid.set(Some(off));
        at(off)
    }

    /// Every thread state of every interpreter: (kernel tid, address of its
    /// `PyThreadState`). Thread states whose thread is gone (or, before
    /// 3.11, whose tid cannot be found) are left out. Does not need the GIL.
    pub fn thread_states(&self) -> Result<Vec<(u32, u64)>, PythonError> {
        let tstates = self.walk_tstates()?;
        let tids = self.tids(&tstates);
        Ok(tstates.iter().zip(tids).filter_map(|(t, tid)| Some((tid?, t.addr))).collect())
    }

    // ------------------------------------------------------------------
    // Frames

    fn top_frame(&self, tstate: u64) -> Result<u64, PythonError> {
        let o = &self.offsets;
        let p = self.mem.u64(tstate + o.tstate_frame)?;
        match o.cframe_current_frame {
            Some(off) if p != 0 => self.mem.u64(p + off),
            _ => Ok(p),
        }
    }

    fn read_frame(&self, frame: u64) -> Result<RawFrame, PythonError> {
        let o = &self.offsets;
        let len = [o.frame_code + 8, o.frame_back + 8, o.frame_instr + 8, o.frame_owner.map_or(0, |x| x + 1)]
            .into_iter()
            .max()
            .unwrap_or(0);
        let buf = self.mem.bytes(frame, len as usize)?;
        let instr = match o.instr_kind {
            InstrKind::Pointer => le_u64(&buf, o.frame_instr),
            _ => u64::from(le_u32(&buf, o.frame_instr)),
        };
        let skip = o.frame_owner.is_some_and(|off| buf[off as usize] >= layout::FRAME_OWNED_BY_CSTACK);
        Ok(RawFrame { code: le_u64(&buf, o.frame_code), back: le_u64(&buf, o.frame_back), instr, skip })
    }

    /// The Python stack of one thread state, leaf first. A frame that cannot
    /// be read ends the walk (the thread may be returning right now).
    fn stack(&mut self, tstate: u64) -> Vec<Frame> {
        let mut frames = Vec::new();
        let Ok(mut frame) = self.top_frame(tstate) else { return frames };
        let mut seen = HashSet::new();
        while frame != 0 && frames.len() < MAX_DEPTH && seen.insert(frame) {
            let Ok(f) = self.read_frame(frame) else { break };
            if !f.skip {
                let checksum = self.mem.u32(f.code + self.offsets.code_firstlineno).unwrap_or(0);
                frames.push(self.resolve_frame(f.code, f.instr, checksum));
            }
            frame = f.back;
        }
        frames
    }

    /// The current Python stack of every thread (leaf first), read from the
    /// process's memory without stopping it.
    pub fn dump(&mut self) -> Result<Vec<ThreadDump>, PythonError> {
        let tstates = self.walk_tstates()?;
        let tids = self.tids(&tstates);
        let mut out = Vec::with_capacity(tstates.len());
        for (ts, tid) in tstates.iter().zip(tids) {
            let frames = self.stack(ts.addr);
            let tid = tid.unwrap_or(0);
            let thread_name = (tid != 0).then(|| proc::thread_comm(self.pid, tid)).flatten();
            out.push(ThreadDump { tid, thread_name, frames });
        }
        Ok(out)
    }

    fn read_code(&self, code: u64) -> Result<CodeInfo, PythonError> {
        let o = &self.offsets;
        let buf = self.mem.bytes(code, o.code_read_len())?;
        if let Some(ty) = self.code_type {
            let got = le_u64(&buf, layout::OB_TYPE);
            if got != ty {
                return Err(self.layout_err(format!("{code:#x} is not a code object (type {got:#x})")));
            }
        }
        let name_ptr = le_u64(&buf, o.code_qualname.unwrap_or(o.code_name));
        let name = match self.read_str(name_ptr) {
            Ok(n) => n,
            // A qualname can be missing on odd code objects; the name will do.
            Err(_) if o.code_qualname.is_some() => self.read_str(le_u64(&buf, o.code_name))?,
            Err(e) => return Err(e),
        };
        Ok(CodeInfo {
            name,
            filename: self.read_str(le_u64(&buf, o.code_filename))?,
            firstlineno: le_u32(&buf, o.code_firstlineno) as i32,
            table: self.read_bytes(le_u64(&buf, o.code_linetable))?,
            code_start: code + o.code_adaptive.unwrap_or(0),
            lines: HashMap::new(),
        })
    }

    /// A `str` object (compact ASCII, compact, or legacy).
    fn read_str(&self, addr: u64) -> Result<String, PythonError> {
        let o = &self.offsets;
        let hdr = self.mem.bytes(addr, o.unicode_compact_data as usize + 8)?;
        let len = le_u64(&hdr, layout::UNICODE_LENGTH);
        let state = le_u32(&hdr, layout::UNICODE_STATE);
        let kind = u64::from((state >> 2) & 7);
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        if len > MAX_STRING || !matches!(kind, 1 | 2 | 4) {
            return Err(self.layout_err(format!("{addr:#x} is not a str (length {len}, kind {kind})")));
        }
        let data = match (compact, ascii) {
            (true, true) => addr + o.unicode_ascii_data,
            (true, false) => addr + o.unicode_compact_data,
            // Legacy string: `data.any` follows the compact header.
            (false, _) => le_u64(&hdr, o.unicode_compact_data),
        };
        let raw = self.mem.bytes(data, (len * kind) as usize)?;
        Ok(match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => char::decode_utf16(raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        })
    }

    /// A `bytes` object's contents.
    fn read_bytes(&self, addr: u64) -> Result<Vec<u8>, PythonError> {
        let len = self.mem.u64(addr + layout::OB_SIZE)?;
        if len > MAX_TABLE {
            return Err(self.layout_err(format!("{addr:#x}: bytes of length {len}")));
        }
        self.mem.bytes(addr + layout::BYTES_DATA, len as usize)
    }

    /// Resolves one frame captured by the kernel: the code object address,
    /// the raw value at `layout().frame_instr` (the int `f_lasti` up to
    /// 3.10, zero- or sign-extended; the instruction pointer from 3.11) and
    /// the `co_firstlineno` the kernel read (checksum). Code objects are
    /// cached by (address, checksum); when the code object now at that
    /// address has another `co_firstlineno` (freed, address reused), or
    /// cannot be read, the frame is `[unknown]` (kind Python, no file).
    pub fn resolve_frame(&mut self, code: u64, instr: u64, checksum: u32) -> Frame {
        let key = (code, checksum);
        if !self.codes.contains_key(&key) {
            if self.codes.len() >= MAX_CACHED_CODES {
                self.codes.clear();
            }
            let info = self.read_code(code).ok().filter(|c| c.firstlineno as u32 == checksum);
            self.codes.insert(key, info);
        }
        let kind = self.offsets.instr_kind;
        let format = self.offsets.line_format;
        let Some(Some(info)) = self.codes.get_mut(&key) else {
            return Frame {
                function: UNKNOWN_FUNCTION.to_string(),
                file: None,
                line: None,
                kind: FrameKind::Python,
                module: None,
            };
        };
        let line = match info.lines.get(&instr) {
            Some(&l) => l,
            None => {
                let addr = match kind {
                    InstrKind::LastiBytes => i64::from(instr as u32 as i32),
                    InstrKind::LastiUnits => i64::from(instr as u32 as i32) * 2,
                    InstrKind::Pointer => instr.wrapping_sub(info.code_start) as i64,
                };
                let l = linetable::line_for(format, &info.table, info.firstlineno, addr);
                if info.lines.len() < 4096 {
                    info.lines.insert(instr, l);
                }
                l
            }
        };
        Frame {
            function: info.name.clone(),
            file: Some(info.filename.clone()),
            line,
            kind: FrameKind::Python,
            module: None,
        }
    }
}

struct RawFrame {
    code: u64,
    back: u64,
    instr: u64,
    /// A C-stack shim (3.12+), not a Python function.
    skip: bool,
}

/// (major, minor, micro, text) of the interpreter in `info` (loaded at `bias`).
fn detect_version(mem: &Mem, info: &elf::ElfInfo, bias: u64, name: &str) -> Option<(u32, u32, u32, String)> {
    if let Some(addr) = info.symbol("Py_Version") {
        if let Ok(hex) = mem.u64(bias.wrapping_add(addr)) {
            let (major, minor, micro) =
                ((hex >> 24) as u32 & 0xff, (hex >> 16) as u32 & 0xff, (hex >> 8) as u32 & 0xff);
            let level = (hex >> 4) & 0xf;
            let serial = hex & 0xf;
            let suffix = match level {
                0xa => format!("a{serial}"),
                0xb => format!("b{serial}"),
                0xc => format!("rc{serial}"),
                _ => String::new(),
            };
            if major >= 2 {
                return Some((major, minor, micro, format!("{major}.{minor}.{micro}{suffix}")));
            }
        }
    }
    let from_name = elf::version_from_name(name);
    for &(addr, size) in &info.data_sections {
        let buf = mem.bytes_lossy(bias.wrapping_add(addr), size.min(64 << 20) as usize);
        if let Some(v) = elf::find_version_string(&buf) {
            if from_name.is_none_or(|(a, b)| (a, b) == (v.0, v.1)) {
                return Some(v);
            }
        }
    }
    from_name.map(|(a, b)| (a, b, 0, format!("{a}.{b}")))
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
        let e = PythonError::Unsupported { version: "2.7.18".into() };
        assert_eq!(e.to_string(), "CPython 2.7.18 is not supported (supported: 3.8 to 3.13)");
    }
}

/// Checks against live interpreters (skipped, with a note, when none is
/// installed; under CI=true the e2e tests require them).
#[cfg(test)]
mod live_tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// Some supported interpreters of this machine.
    fn pythons() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = ["3.8.18", "3.10.13", "3.12.1", "3.13.0"]
            .iter()
            .map(|x| PathBuf::from(format!("/root/.pyenv/versions/{x}/bin/python3")))
            .collect();
        v.push(PathBuf::from("/usr/bin/python3.11"));
        v.retain(|p| p.is_file());
        v
    }

    struct Sleeper(Child);
    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn start(python: &std::path::Path) -> Sleeper {
        use std::io::BufRead;
        let mut c = Command::new(python)
            .args(["-c", "import threading, time\nt = threading.Thread(target=time.sleep, args=(60,), daemon=True)\nt.start()\nprint('ready', flush=True)\ntime.sleep(60)"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Sleeper(c)
    }

    #[test]
    fn wrong_layouts_are_rejected() {
        let pythons = pythons();
        if pythons.is_empty() {
            eprintln!("SKIPPED wrong_layouts_are_rejected: no CPython installed");
            return;
        }
        for py in pythons {
            let s = start(&py);
            let pid = s.0.id();
            let good = Interpreter::attach(pid).unwrap().unwrap();
            let tids: HashSet<u32> = good.thread_states().unwrap().iter().map(|t| t.0).collect();
            assert_eq!(tids, proc::task_ids(pid).into_iter().collect::<HashSet<_>>(), "{}", py.display());
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
                    if i.offsets.minor == 13 {
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
