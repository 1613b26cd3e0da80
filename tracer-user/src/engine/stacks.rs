//! Turning the kernel's stack ids into frames: native and kernel stacks from
//! the `STACKS` map through the one [`Symbolizer`] of the recording, Python
//! stacks through the [`PythonFrames`] the Python family registers when it
//! attaches, merged leaf first. Shared by every probe family that records
//! stacks (it lives in the engine's `Context`; a collector that declares it
//! reaches it as `cx.stacks`, and `cx.frames()` resolves through it).

use std::{
    any::Any,
    collections::{BTreeMap, HashMap, HashSet},
};

use aya::{
    maps::{MapData, StackTraceMap},
    Ebpf,
};
use tracer_common::sched::STACK_COLLIDED;

/// The Python part of the resolver: the Python family's (registered with
/// [`Stacks::set_python`] when it attaches), so that every family resolves
/// Python frames without knowing the Python family.
pub trait PythonFrames: Any {
    /// Takes what the kernel copied since the last call (code objects).
    fn take_copies(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError>;
    /// Leaf-first Python frames of stack `id`, read out of the kernel's
    /// map when it was not resolved before (one lookup per new stack: the
    /// whole map, ~2 KiB a stack, was read at every snapshot: 25 MiB of the
    /// agent's peak under 350 Python processes a minute).
    fn frames(&mut self, id: u64, ebpf: &Ebpf) -> Vec<Frame>;
    /// Per process, what could not be resolved (for notes).
    fn problems(&self) -> BTreeMap<u32, Vec<(super::Topic, String)>>;
    /// Drops what is kept of these processes.
    fn forget(&mut self, pids: &HashSet<u32>);
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

use crate::{os::probe::ProbeError, recording::{Frame, FrameKind, STACK_LOST}, os::symbolize::Symbolizer};

/// The native stacks captured so far, read out of the kernel map.
struct Loaded {
    native: HashMap<u32, Vec<u64>>,
}

#[derive(Default)]
pub struct Stacks {
    pub symbolizer: Symbolizer,
    python: Option<Box<dyn PythonFrames>>,
    loaded: Option<Loaded>,
    /// The processes each user-stack id was resolved for: the id leaves
    /// `STACKS` once all of them are forgotten (see [`forget`](Self::forget)).
    owners: HashMap<u32, Vec<u32>>,
}

/// The leading kernel frames of a stack taken at sched_switch are our own
/// program and the tracepoint machinery: not the user's time.
fn is_tracing_frame(function: &str) -> bool {
    ["bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "trace_call_bpf"]
        .iter()
        .any(|p| function.starts_with(p))
}

impl Stacks {
    /// Forgets what was read from the kernel maps: the next
    /// [`frames`](Self::frames) reads them again (a new snapshot).
    pub fn invalidate(&mut self) {
        self.loaded = None;
    }

    /// Registers the Python part of the resolver (the Python family does, at attach).
    pub fn set_python(&mut self, python: Box<dyn PythonFrames>) {
        self.python = Some(python);
    }

    /// The registered Python part, as its own type.
    pub fn python_mut<T: PythonFrames>(&mut self) -> Option<&mut T> {
        self.python.as_mut().and_then(|p| p.as_any_mut().downcast_mut::<T>())
    }

    /// Per process, Python frames that could not be resolved (each with
    /// where its note belongs: a note, or a detail).
    pub fn python_problems(&self) -> BTreeMap<u32, Vec<(super::Topic, String)>> {
        self.python.as_ref().map(|p| p.problems()).unwrap_or_default()
    }

    /// Drops what is kept of these processes (the agent, once they are
    /// gone), and their user stacks from the kernel's `STACKS`: a stack map
    /// never frees a bucket by itself, so under process churn it fills
    /// (14,000 of 16,384 buckets after 5 minutes of the agent's soak) and
    /// every new stack then collides (`[stack lost]`). A user stack holds
    /// addresses of one process's mappings, so it is that process's, unless
    /// another process resolved the same id (the same code at the same
    /// addresses: a non-PIE binary): it stays until all of them are
    /// forgotten. Kernel stacks are everyone's and stay.
    pub fn forget(&mut self, ebpf: &mut Ebpf, pids: &HashSet<u32>) -> Result<(), ProbeError> {
        self.symbolizer.forget(pids);
        if let Some(p) = self.python.as_mut() {
            p.forget(pids);
        }
        let freed = free_owned(&mut self.owners, pids);
        if freed.is_empty() {
            return Ok(());
        }
        let map = ebpf.map_mut(tracer_common::maps::STACKS).ok_or(ProbeError::MissingMap(tracer_common::maps::STACKS))?;
        let mut map: StackTraceMap<&mut MapData> =
            StackTraceMap::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::STACKS, e))?;
        for id in &freed {
            // An id already gone (ENOENT) is no failure.
            let _ = map.remove(id);
        }
        Ok(())
    }

    fn load(&mut self, ebpf: &mut Ebpf) -> Result<Loaded, ProbeError> {
        let map = ebpf.map(tracer_common::maps::STACKS).ok_or(ProbeError::MissingMap(tracer_common::maps::STACKS))?;
        let map: StackTraceMap<&MapData> = StackTraceMap::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::STACKS, e))?;
        let native = map
            .iter()
            .filter_map(Result::ok)
            .map(|(id, st)| (id, st.frames().iter().map(|f| f.ip).filter(|ip| *ip != 0).collect()))
            .collect();
        Ok(Loaded { native })
    }

    /// Leaf-first frames: kernel, native below the Python leaf, Python.
    pub fn frames(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        user_stack: i32,
        kernel_stack: i32,
        py_stack: u64,
    ) -> Result<Vec<Frame>, ProbeError> {
        if self.loaded.is_none() {
            // Native stacks, then the code copies of the Python stacks
            // (those are looked up as they are resolved: one stored after
            // the copies were taken and resolved with an `[unknown]` frame
            // is resolved again at the next snapshot; most were resolved
            // as they came, see `PyFrames::resolve_new`).
            let loaded = self.load(ebpf)?;
            if let Some(p) = self.python.as_mut() {
                p.take_copies(ebpf)?;
            }
            self.loaded = Some(loaded);
        }
        let Some(loaded) = self.loaded.as_ref() else { return Ok(Vec::new()) };
        let ips = |id: i32| -> &[u64] {
            let ips = u32::try_from(id).ok().and_then(|id| loaded.native.get(&id));
            ips.map(Vec::as_slice).unwrap_or(&[])
        };
        let mut kernel = match kernel_stack {
            STACK_COLLIDED => vec![stack_lost(FrameKind::Kernel)],
            id => self.symbolizer.kernel_frames(ips(id)),
        };
        let ours = kernel.iter().take_while(|f| is_tracing_frame(&f.function)).count();
        kernel.drain(..ours);
        let native = match user_stack {
            STACK_COLLIDED => vec![stack_lost(FrameKind::Native)],
            id => {
                if let Ok(id) = u32::try_from(id) {
                    let owners = self.owners.entry(id).or_default();
                    if !owners.contains(&pid) {
                        owners.push(pid);
                    }
                }
                self.symbolizer.user_frames(pid, ips(id))
            }
        };
        let python = match self.python.as_mut() {
            Some(p) if py_stack != 0 => p.frames(py_stack, ebpf),
            _ => Vec::new(),
        };
        Ok(merge(kernel, native, python))
    }
}

/// Takes `pids` out of each id's owners; returns the ids left with none.
fn free_owned(owners: &mut HashMap<u32, Vec<u32>>, pids: &HashSet<u32>) -> Vec<u32> {
    let mut freed = Vec::new();
    owners.retain(|id, o| {
        o.retain(|p| !pids.contains(p));
        if o.is_empty() {
            freed.push(*id);
        }
        !o.is_empty()
    });
    freed
}

/// The frame that stands for a native stack the kernel could not store
/// (`STACK_COLLIDED`, counted in `native_stacks_collided`): the stack was
/// there, so it is not left out as if there had been none. Under Python
/// frames [`merge`] leaves it out: what it held below the Python leaf is
/// not known, and it is mostly the interpreter's own frames.
pub fn stack_lost(kind: FrameKind) -> Frame {
    Frame { function: STACK_LOST.to_owned(), file: None, line: None, kind, module: None }
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
    out.extend(native.into_iter().take_while(|f| !is_interpreter_frame(f) && f.function != STACK_LOST));
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
        // 3.14+ built by clang: the tail-calling interpreter's opcode handlers.
        || f.function.starts_with("_TAIL_CALL_")
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
    fn a_user_stack_is_freed_when_every_process_that_used_it_is_forgotten() {
        let mut owners: HashMap<u32, Vec<u32>> = HashMap::from([(1, vec![10]), (2, vec![10, 11]), (3, vec![12])]);
        let mut freed = free_owned(&mut owners, &HashSet::from([10]));
        freed.sort();
        assert_eq!(freed, [1]);
        assert_eq!(owners.get(&2), Some(&vec![11]));
        let mut freed = free_owned(&mut owners, &HashSet::from([11, 12]));
        freed.sort();
        assert_eq!(freed, [2, 3]);
        assert!(owners.is_empty());
    }

    #[test]
    fn a_lost_native_stack_shows_alone_and_not_under_python_frames() {
        let p = vec![f("<module>", FrameKind::Python, None)];
        let m = merge(vec![], vec![stack_lost(FrameKind::Native)], p.clone());
        assert_eq!(m, p);
        let m = merge(vec![], vec![stack_lost(FrameKind::Native)], vec![]);
        assert_eq!(m[0].function, STACK_LOST);
    }

    #[test]
    fn keeps_native_without_python() {
        let n = vec![f("main", FrameKind::Native, Some("a.out"))];
        assert_eq!(merge(vec![], n.clone(), vec![]), n);
    }
}
