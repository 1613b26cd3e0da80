//! Python attribution, collector side: finds CPython in each target
//! (`python::Interpreter`), hands the kernel its layout, the tid -> thread
//! state map (refreshed as threads appear) and its GIL range, and resolves
//! the Python stacks the kernel captured.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use aya::{
    maps::HashMap as BpfHashMap,
    Ebpf,
};
use tracer_common::python::{GilRange, PyLayout, PyStack, FRAME_OWNED_BY_CSTACK};

use crate::{
    probe::{self, ProbeError},
    procfs,
    python::{Interpreter, PythonError},
    recording::Frame,
};

/// How long a process that may still be starting CPython (just exec'd,
/// libpython not mapped yet, interpreter not initialized) is retried.
const STARTUP_RETRY: Duration = Duration::from_secs(10);
/// Processes that do not look like Python at all are retried this long
/// (the dynamic loader maps libpython right after exec).
const NON_PYTHON_RETRY: Duration = Duration::from_secs(1);

struct Pending {
    since: Instant,
    last_error: Option<String>,
}

/// The Python processes being traced.
#[derive(Default)]
pub struct PythonTargets {
    interpreters: HashMap<u32, Interpreter>,
    /// Processes already examined (Python or not).
    examined: HashMap<u32, ()>,
    /// Processes to examine again: CPython may still be starting.
    pending: HashMap<u32, Pending>,
    /// One-line notices for the recording (unsupported versions, ...).
    pub notes: Vec<String>,
    /// tid -> tstate currently in the kernel map, per pid.
    published: HashMap<u32, Vec<u32>>,
    /// Stacks resolved while their process was alive, by id.
    resolved: HashMap<u64, Vec<Frame>>,
}

impl PythonTargets {
    /// Looks for CPython in `pid` (once per process; again after exec).
    pub fn examine(&mut self, ebpf: &mut Ebpf, pid: u32, force: bool) -> Result<(), ProbeError> {
        if force {
            self.examined.remove(&pid);
            self.pending.remove(&pid);
        }
        if self.examined.contains_key(&pid) {
            return Ok(());
        }
        self.examined.insert(pid, ());
        self.try_attach(ebpf, pid)
    }

    fn try_attach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let retry = |this: &mut Self, err: Option<String>| {
            let p = this.pending.entry(pid).or_insert(Pending { since: Instant::now(), last_error: None });
            p.last_error = err;
        };
        match Interpreter::attach(pid) {
            Ok(Some(interp)) => {
                self.pending.remove(&pid);
                self.publish(ebpf, pid, interp)?;
            }
            Ok(None) => retry(self, None),
            Err(PythonError::Unsupported { version }) => {
                self.pending.remove(&pid);
                self.notes.push(format!("pid {pid}: CPython {version} is not supported (3.8 to 3.13 are); traced natively"));
            }
            Err(e) => retry(self, Some(e.to_string())),
        }
        Ok(())
    }

    /// Examines again the processes whose CPython may still be starting.
    fn retry_pending(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        let pids: Vec<u32> = self.pending.keys().copied().collect();
        for pid in pids {
            let Some(p) = self.pending.get(&pid) else { continue };
            let limit = if looks_like_python(pid) { STARTUP_RETRY } else { NON_PYTHON_RETRY };
            if !procfs::is_alive(pid) {
                // Gone before it could be read (short-lived children): nothing to say.
                self.pending.remove(&pid);
                continue;
            }
            if p.since.elapsed() > limit {
                if let Some(p) = self.pending.remove(&pid) {
                    if let Some(e) = p.last_error {
                        self.notes.push(format!("pid {pid}: {e}; traced natively"));
                    }
                }
                continue;
            }
            self.try_attach(ebpf, pid)?;
        }
        Ok(())
    }

    fn publish(&mut self, ebpf: &mut Ebpf, pid: u32, interp: Interpreter) -> Result<(), ProbeError> {
        let layout = interp.layout();
        let mut map: BpfHashMap<_, u32, PyLayout> = probe::hash_map(ebpf, "PY_LAYOUT")?;
        map.insert(pid, layout, 0).map_err(|e| ProbeError::map("PY_LAYOUT", e))?;
        if let Some((start, end)) = interp.gil_range() {
            let mut gil: BpfHashMap<_, u32, GilRange> = probe::hash_map(ebpf, "GIL_RANGE")?;
            gil.insert(pid, GilRange { start, end }, 0).map_err(|e| ProbeError::map("GIL_RANGE", e))?;
        } else {
            self.notes.push(format!("pid {pid}: GIL state not located; GIL waits are counted as lock time"));
        }
        self.interpreters.insert(pid, interp);
        self.refresh(ebpf, pid)
    }

    /// Notes for processes still pending (and alive) at the end of the window.
    pub fn finish_notes(&mut self) {
        for (pid, p) in self.pending.drain() {
            if !procfs::is_alive(pid) {
                continue;
            }
            if let Some(e) = p.last_error {
                self.notes.push(format!("pid {pid}: {e}; traced natively"));
            }
        }
    }

    /// Re-reads the thread list of `pid` and updates the kernel's tid -> tstate map.
    pub fn refresh(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let Some(interp) = self.interpreters.get(&pid) else { return Ok(()) };
        let Ok(states) = interp.thread_states() else { return Ok(()) };
        let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(ebpf, "PY_TSTATE")?;
        let old = self.published.remove(&pid).unwrap_or_default();
        let new: Vec<u32> = states.iter().map(|(tid, _)| *tid).collect();
        for tid in old.iter().filter(|t| !new.contains(t)) {
            let _ = map.remove(tid);
        }
        for (tid, tstate) in states {
            let _ = map.insert(tid, tstate, 0);
        }
        self.published.insert(pid, new);
        Ok(())
    }

    /// Refreshes every Python target (new threads appear here) and retries
    /// the ones still starting.
    pub fn refresh_all(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        self.retry_pending(ebpf)?;
        let pids: Vec<u32> = self.interpreters.keys().copied().collect();
        for pid in pids {
            self.refresh(ebpf, pid)?;
        }
        Ok(())
    }

    /// A process exited: its threads leave the kernel map; the interpreter
    /// (and its cache of resolved code objects) stays for late stacks.
    pub fn exited(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        self.resolve_new(ebpf)?;
        if let Some(tids) = self.published.remove(&pid) {
            let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(ebpf, "PY_TSTATE")?;
            for tid in tids {
                let _ = map.remove(&tid);
            }
        }
        Ok(())
    }

    /// Resolves the stacks captured since the last call, while their
    /// processes are alive (code objects are read from their memory).
    pub fn resolve_new(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        if self.interpreters.is_empty() {
            return Ok(());
        }
        let map: BpfHashMap<_, u64, PyStack> = probe::hash_map(ebpf, "PY_STACKS")?;
        let fresh: Vec<u64> = map.keys().filter_map(Result::ok).filter(|k| !self.resolved.contains_key(k)).collect();
        for id in fresh {
            if let Ok(stack) = map.get(&id, 0) {
                let frames = self.resolve(&stack);
                self.resolved.insert(id, frames);
            }
        }
        Ok(())
    }

    fn resolve(&mut self, stack: &PyStack) -> Vec<Frame> {
        let Some(interp) = self.interpreters.get_mut(&stack.pid) else { return Vec::new() };
        let n = (stack.len as usize).min(stack.frames.len());
        let old_lasti = interp.layout().version <= 310;
        stack.frames[..n]
            .iter()
            .filter(|f| f._pad < FRAME_OWNED_BY_CSTACK && f.code != 0)
            .map(|f| {
                // <= 3.10: the field is the int f_lasti (sign-extended for -1).
                let instr = if old_lasti { f.instr as u32 as i32 as i64 as u64 } else { f.instr };
                interp.resolve_frame(f.code, instr, f.checksum)
            })
            .collect()
    }

    pub fn versions(&self) -> BTreeMap<u32, String> {
        self.interpreters
            .iter()
            .map(|(pid, i)| {
                let (a, b, c) = i.version();
                (*pid, format!("{a}.{b}.{c}"))
            })
            .collect()
    }

    /// Reads all captured stacks out of the kernel.
    pub fn load_stacks(ebpf: &mut Ebpf) -> Result<HashMap<u64, PyStack>, ProbeError> {
        let map: BpfHashMap<_, u64, PyStack> = probe::hash_map(ebpf, "PY_STACKS")?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

    /// Leaf-first Python frames of stack `id`.
    pub fn frames(&mut self, id: u64, stacks: &HashMap<u64, PyStack>) -> Vec<Frame> {
        if let Some(f) = self.resolved.get(&id) {
            return f.clone();
        }
        let frames = stacks.get(&id).map(|s| self.resolve(s)).unwrap_or_default();
        self.resolved.insert(id, frames.clone());
        frames
    }
}

/// The executable is named like Python, or a libpython is mapped.
fn looks_like_python(pid: u32) -> bool {
    let exe = procfs::exe(pid).unwrap_or_default();
    let base = exe.rsplit('/').next().unwrap_or("");
    base.starts_with("python")
        || std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libpython"))
}

/// Merges one stack: kernel frames, then the native frames below the Python
/// leaf (e.g. libc's `read` under `FileIO.readinto`) up to the first frame of
/// the interpreter itself, then the Python frames. Without Python frames the
/// native stack is kept whole.
pub fn merge(kernel: Vec<Frame>, native: Vec<Frame>, python: Vec<Frame>) -> Vec<Frame> {
    let mut out = kernel;
    if python.is_empty() {
        out.extend(native);
        return out;
    }
    out.extend(native.into_iter().take_while(|f| !is_interpreter_frame(f)));
    out.extend(python);
    out
}

fn is_interpreter_frame(f: &Frame) -> bool {
    let in_python_binary = f
        .module
        .as_deref()
        .is_some_and(|m| m.starts_with("libpython") || m.starts_with("python"));
    in_python_binary
        || f.function.starts_with("_PyEval")
        || f.function.starts_with("PyEval")
        || f.function.starts_with("_PyObject_")
        || f.function.starts_with("PyObject_")
        || f.function.starts_with("_Py")
        || f.function.starts_with("cfunction_")
        || f.function.starts_with("method_vectorcall")
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::FrameKind;

    fn f(name: &str, kind: FrameKind, module: Option<&str>) -> Frame {
        Frame { function: name.into(), file: None, line: None, kind, module: module.map(Into::into) }
    }

    #[test]
    fn merges_native_leaf_then_python() {
        let k = vec![f("vfs_read", FrameKind::Kernel, None)];
        let n = vec![
            f("__libc_read", FrameKind::Native, Some("libc.so.6")),
            f("_Py_read", FrameKind::Native, Some("libpython3.11.so.1.0")),
            f("_PyEval_EvalFrameDefault", FrameKind::Native, Some("libpython3.11.so.1.0")),
        ];
        let p = vec![f("FileIO.readinto", FrameKind::Python, None), f("<module>", FrameKind::Python, None)];
        let m = merge(k, n, p);
        let names: Vec<&str> = m.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["vfs_read", "__libc_read", "FileIO.readinto", "<module>"]);
    }

    #[test]
    fn keeps_native_without_python() {
        let n = vec![f("main", FrameKind::Native, Some("a.out"))];
        assert_eq!(merge(vec![], n.clone(), vec![]), n);
    }
}
