//! Attaching to a running CPython: finding the interpreter among a
//! process's mappings (its executable or a mapped `libpython*`, the one
//! that defines `_PyRuntime`), detecting its version (`Py_Version`, the
//! `Py_GetVersion` string, or the file name), picking the layout of that
//! version, validating it against the process, and locating the GIL.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    path::PathBuf,
};

use super::{
    debug_offsets::{self, DebugOffsets, DebugOffsetsError, Revision},
    elf,
    layout::{self, GilLocation, Offsets},
    proc::{self, Mem},
    Interpreter, PythonError,
};
use crate::os::procfs::MapsLine;

/// A mapped file that may hold the interpreter.
struct Candidate<'a> {
    mappings: Vec<&'a MapsLine>,
    is_libpython: bool,
}

impl Interpreter {
    /// Finds CPython in process `pid` (its executable or a mapped
    /// `libpython*.so`), detects its version, locates `_PyRuntime` and
    /// validates the layout against the live process. `Ok(None)` when the
    /// process runs no CPython.
    pub fn attach(pid: u32) -> Result<Option<Interpreter>, PythonError> {
        let maps = proc::read_maps(pid)?;
        let exe_inode = crate::os::procfs::exe_inode(pid);

        // Group file mappings by (inode, path), in address order.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut seen: HashMap<(u64, &str), usize> = HashMap::new();
        for m in maps.iter().filter(|m| m.is_file()) {
            let base = m.basename();
            let is_libpython = base.starts_with("libpython");
            if !is_libpython && Some(m.inode) != exe_inode {
                continue;
            }
            let key = (m.inode, m.path());
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

        // process_vm_readv through a live thread when the main one has exited.
        let mem = Mem { pid: crate::os::procfs::stand_in_thread(pid).unwrap_or(pid) };
        let mut old_python: Option<(elf::ElfInfo, Vec<&MapsLine>, String)> = None;
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
            let name = first.basename().to_string();
            if info.symbol("_PyRuntime").is_some() {
                return Self::attach_to(pid, mem, &info, &cand.mappings, path, &name).map(Some);
            }
            if info.symbol("Py_GetVersion").is_some() && old_python.is_none() {
                old_python = Some((info, cand.mappings.clone(), name));
            }
        }
        if let Some((info, mappings, name)) = old_python {
            // CPython without _PyRuntime: 3.6 or older.
            let (version, exact) = info
                .load_bias(&mappings)
                .and_then(|bias| detect_version(&mem, &info, bias, &name))
                .map_or_else(|| (format!("{name} (no _PyRuntime: older than 3.7)"), true), |v| (v.text, v.exact));
            return Err(PythonError::Unsupported { version, detail: String::new(), exact });
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
        mappings: &[&MapsLine],
        binary: PathBuf,
        name: &str,
    ) -> Result<Interpreter, PythonError> {
        let bias = info.load_bias(mappings).ok_or_else(|| PythonError::Elf {
            path: binary.display().to_string(),
            message: "no mapping matches a loadable segment (cannot compute the load bias)".into(),
        })?;
        let Version { major, minor, micro, text: version_text, exact: version_exact } =
            detect_version(&mem, info, bias, name).ok_or_else(|| PythonError::Layout {
                pid,
                version: "?".into(),
                message: format!("cannot determine the CPython version of {}", binary.display()),
            })?;
        let runtime = bias.wrapping_add(info.symbol("_PyRuntime").unwrap_or(0));
        let table = if major == 3 { Offsets::for_minor(minor) } else { None };
        // 3.13+ publish their layout: a version newer than our tables is
        // read with it; for the others it is checked below.
        let (offsets, layout_note) = match (table, major == 3 && minor >= 13) {
            (Some(t), _) => (t, None),
            (None, true) => match published_offsets(&mem, runtime, minor) {
                Ok(o) => (
                    o,
                    Some(format!(
                        "CPython {version_text} is newer than the layouts built in (3.8 to 3.15): its layout was read from its own _Py_DebugOffsets and checked against the process"
                    )),
                ),
                Err(PublishedError::FreeThreaded) => return Err(PythonError::free_threaded(version_text)),
                Err(PublishedError::Read(e)) => return Err(e),
                Err(PublishedError::Bad(e)) => return Err(PythonError::unsupported(version_text, &format!(" (its {e})"))),
            },
            (None, false) => return Err(PythonError::unsupported(version_text, "")),
        };
        let mut interp = Interpreter {
            pid,
            mem,
            version: (major, minor, micro),
            version_text,
            binary,
            offsets,
            runtime,
            version_exact,
            layout_note,
            code_type: info.symbol("PyCode_Type").map(|a| bias.wrapping_add(a)),
            pthread_tid: Cell::new(None),
            thread_ids: RefCell::new(crate::os::procfs::ThreadIdMap::new(pid)),
            gil: None,
            codes: HashMap::new(),
            bad_copies: Default::default(),
            partial_codes: Default::default(),
            unresolved: Default::default(),
            unresolved_more: Default::default(),
            walk_deadline: Cell::new(None),
            walk_notes: RefCell::new(Vec::new()),
            tstates_cut: Cell::new(false),
        };
        if minor >= 13 {
            interp.validate_debug_offsets()?;
        }
        interp.validate_code_type()?;
        interp.validate_threads()?;
        interp.validate_frames()?;
        interp.gil = interp.locate_gil();
        Ok(interp)
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
}

/// Why the layout a process publishes could not be used.
pub(super) enum PublishedError {
    /// A free-threaded build.
    FreeThreaded,
    /// The memory could not be read.
    Read(PythonError),
    /// No cookie, another version, or a structure we cannot read.
    Bad(DebugOffsetsError),
}

/// The layout CPython 3.`minor` (3.13+) publishes at `runtime`.
pub(super) fn published_offsets(mem: &Mem, runtime: u64, minor: u32) -> Result<Offsets, PublishedError> {
    let rev = Revision::for_minor(minor).ok_or(PublishedError::Bad(DebugOffsetsError::NoCookie))?;
    let blob = mem.bytes(runtime, debug_offsets::READ_LEN).map_err(PublishedError::Read)?;
    match DebugOffsets::parse(&blob, &rev, minor) {
        Ok(d) => Ok(d.offsets(minor)),
        Err(DebugOffsetsError::FreeThreaded) => Err(PublishedError::FreeThreaded),
        Err(e) => Err(PublishedError::Bad(e)),
    }
}

/// The version of an interpreter, and how it was learnt.
struct Version {
    major: u32,
    minor: u32,
    micro: u32,
    /// As the interpreter reports it (`3.10.13`), or `3.10` from a file name.
    text: String,
    /// False when only the file name told (major.minor): <= 3.10 write
    /// their version string during start-up, after their first thread
    /// state exists.
    exact: bool,
}

/// The version of the interpreter in `info` (loaded at `bias`).
fn detect_version(mem: &Mem, info: &elf::ElfInfo, bias: u64, name: &str) -> Option<Version> {
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
                let text = format!("{major}.{minor}.{micro}{suffix}");
                return Some(Version { major, minor, micro, text, exact: true });
            }
        }
    }
    let from_name = elf::version_from_name(name);
    for &(addr, size) in &info.data_sections {
        let buf = mem.bytes_lossy(bias.wrapping_add(addr), size.min(64 << 20) as usize);
        if let Some((major, minor, micro, text)) = elf::find_version_string(&buf) {
            if from_name.is_none_or(|(a, b)| (a, b) == (major, minor)) {
                return Some(Version { major, minor, micro, text, exact: true });
            }
        }
    }
    from_name.map(|(major, minor)| Version { major, minor, micro: 0, text: format!("{major}.{minor}"), exact: false })
}
