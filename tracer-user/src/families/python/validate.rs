//! Checks of the layout picked for a CPython version against the live
//! process, run at attach time: 3.13+'s own `_Py_DebugOffsets`, the code
//! object fields `PyCode_Type` publishes, the thread list (interpreter,
//! thread states pointing back to it, thread ids of the process) and the
//! top frames (a code object in their code field).

use std::collections::HashMap;

use super::{
    attach::{published_offsets, PublishedError},
    frames::MAX_VISITED,
    layout,
    proc::le_u64,
    Interpreter, PythonError,
};

impl Interpreter {
    /// 3.13+ publish their own offsets at the start of `_PyRuntime`: they
    /// must be ours.
    pub(super) fn validate_debug_offsets(&self) -> Result<(), PythonError> {
        let minor = self.offsets.minor;
        let published = match published_offsets(&self.mem, self.runtime, minor) {
            Ok(o) => o,
            Err(PublishedError::FreeThreaded) => return Err(PythonError::free_threaded(self.version_text.clone())),
            Err(PublishedError::Read(e)) => return Err(e),
            Err(PublishedError::Bad(e)) => return Err(self.layout_err(e.to_string())),
        };
        let diffs = self.offsets.differences(&published);
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(self.layout_err(format!("_Py_DebugOffsets disagree with the 3.{minor} table: {}", diffs.join(", "))))
        }
    }

    /// `PyCode_Type.tp_members` lists the offsets of the code object fields
    /// we read (and 3.11+'s `tp_basicsize` is `co_code_adaptive`'s offset).
    pub(super) fn validate_code_type(&self) -> Result<(), PythonError> {
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
    pub(super) fn validate_threads(&self) -> Result<(), PythonError> {
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
    pub(super) fn validate_frames(&self) -> Result<(), PythonError> {
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
            let mut walk = self.walk(MAX_VISITED);
            while frame != 0 && walk.visit(frame).is_ok() {
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
}
