//! Python frames of the captured stacks: the interpreters found in the
//! targets (put here by the Python collector) and the code objects resolved
//! from their memory, cached by stack id.

use std::{
    any::Any,
    collections::{BTreeMap, HashMap, HashSet},
};

use aya::{maps::HashMap as BpfHashMap, Ebpf};
use tracer_common::python::{PyCodeKey, PyCodeRaw, PyStack, FRAME_OWNED_BY_CSTACK, STACK_LOOPED};

use crate::{
    engine::{stacks::PythonFrames, Topic},
    os::probe::{self, ProbeError},
    families::python::{Interpreter, UNKNOWN_FUNCTION},
    recording::Frame,
};

#[derive(Default)]
pub struct PyFrames {
    interpreters: HashMap<u32, Interpreter>,
    /// Stacks resolved while their process was alive, by id, with their
    /// process (forgotten with it).
    resolved: HashMap<u64, (u32, Vec<Frame>)>,
    /// Of those, the ones with an `[unknown]` frame: resolved again when a
    /// kernel copy of a code object arrives for their process (it can come
    /// after the stack was first resolved) and at the end.
    incomplete: HashSet<u64>,
    /// What is kept of the interpreters of processes that exited, once
    /// their stacks are resolved ([`retire`](Self::retire)).
    retired: HashMap<u32, Retired>,
    /// Per process, the stacks whose frame chain looped (the kernel's walk
    /// found the loop and stopped there).
    looped: BTreeMap<u32, u64>,
}

/// An exited process's interpreter as the recording still shows it.
struct Retired {
    version: (u32, u32, u32),
    problems: Vec<(Topic, String)>,
}

impl PyFrames {
    /// Drops the interpreters of these processes (see `Symbolizer::forget`).
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.interpreters.retain(|pid, _| !pids.contains(pid));
        self.retired.retain(|pid, _| !pids.contains(pid));
        self.looped.retain(|pid, _| !pids.contains(pid));
        self.resolved.retain(|_, (pid, _)| !pids.contains(pid));
        let resolved = &self.resolved;
        self.incomplete.retain(|id| resolved.contains_key(id));
    }

    /// Drops the interpreter of `pid`, which is gone, keeping its version
    /// and problems: its code objects (the biggest part of a target's cost
    /// to the agent, ~100 KB for a small script) serve nothing once every
    /// stack it captured is resolved, which the caller makes sure of (a
    /// snapshot that began after its end). Without this, a process's
    /// interpreter stays until it is forgotten: two windows under churn.
    pub fn retire(&mut self, pid: u32) {
        if let Some(i) = self.interpreters.remove(&pid) {
            self.retired.insert(pid, Retired { version: i.version(), problems: i.resolution_problems() });
        }
    }

    pub fn add(&mut self, pid: u32, interp: Interpreter) {
        self.interpreters.insert(pid, interp);
    }

    pub fn get(&self, pid: u32) -> Option<&Interpreter> {
        self.interpreters.get(&pid)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.interpreters.keys().copied().collect()
    }

    /// Moves the kernel's copies of code objects (`PY_CODES`) to their
    /// interpreters: they resolve frames after the process is gone. The
    /// entries are removed from the kernel map once taken, so that it does
    /// not fill up in a long recording. Returns the processes with a code
    /// object that was unresolved until this copy.
    pub fn take_copies(&mut self, ebpf: &mut Ebpf) -> Result<HashSet<u32>, ProbeError> {
        let mut map: BpfHashMap<_, PyCodeKey, PyCodeRaw> = probe::hash_map(ebpf, tracer_common::maps::PY_CODES)?;
        let keys: Vec<PyCodeKey> = map.keys().filter_map(Result::ok).collect();
        let mut renewed = HashSet::new();
        for key in keys {
            if let (Ok(raw), Some(interp)) = (map.get(&key, 0), self.interpreters.get_mut(&key.pid)) {
                if interp.add_captured(key.code, key.checksum, &raw) {
                    renewed.insert(key.pid);
                }
            }
            let _ = map.remove(&key);
        }
        Ok(renewed)
    }

    /// Per process, what could not be resolved fully (see
    /// `Interpreter::resolution_problems`).
    pub fn problems(&self) -> BTreeMap<u32, Vec<(Topic, String)>> {
        let mut out: BTreeMap<u32, Vec<(Topic, String)>> = self
            .interpreters
            .iter()
            .map(|(pid, i)| (*pid, i.resolution_problems()))
            .chain(self.retired.iter().map(|(pid, r)| (*pid, r.problems.clone())))
            .collect();
        for (pid, n) in &self.looped {
            out.entry(*pid).or_default().push((Topic::General, format!(
                "its Python frame chain loops (a corrupted or hostile interpreter): {n} stack(s) end where the walk found the loop"
            )));
        }
        out.retain(|_, p| !p.is_empty());
        out
    }

    /// Resolves the stacks captured since the last call, from the kernel's
    /// copies of their code objects or, for code objects not copied, from
    /// the memory of the (live) processes.
    ///
    /// The kernel stores a new stack, then copies its code objects: the
    /// stack ids are listed before the copies are taken, so that every
    /// listed stack whose program has finished has its copies here. (A
    /// module's top-level code object is freed right after it runs: read
    /// live a moment later, its frames would be `[unknown]`.) Stacks still
    /// incomplete are resolved again when a copy for their process comes.
    pub fn resolve_new(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        if self.interpreters.is_empty() {
            return Ok(());
        }
        let fresh: Vec<u64> = {
            let map: BpfHashMap<_, u64, PyStack> = probe::hash_map(ebpf, tracer_common::maps::PY_STACKS)?;
            map.keys().filter_map(Result::ok).filter(|k| !self.resolved.contains_key(k)).collect()
        };
        let renewed = self.take_copies(ebpf)?;
        let again: Vec<u64> = self
            .incomplete
            .iter()
            .filter(|id| self.resolved.get(id).is_some_and(|(pid, _)| renewed.contains(pid)))
            .copied()
            .collect();
        let map: BpfHashMap<_, u64, PyStack> = probe::hash_map(ebpf, tracer_common::maps::PY_STACKS)?;
        for id in fresh.into_iter().chain(again) {
            if let Ok(stack) = map.get(&id, 0) {
                self.resolve_into_cache(id, &stack);
            }
        }
        Ok(())
    }

    /// Resolves stack `id` and caches its frames, noting whether any is
    /// `[unknown]`.
    fn resolve_into_cache(&mut self, id: u64, stack: &PyStack) -> Vec<Frame> {
        let frames = self.resolve(stack);
        if frames.iter().any(|f| f.function == UNKNOWN_FUNCTION) {
            self.incomplete.insert(id);
        } else {
            self.incomplete.remove(&id);
        }
        self.resolved.insert(id, (stack.pid, frames.clone()));
        frames
    }

    fn resolve(&mut self, stack: &PyStack) -> Vec<Frame> {
        if stack.truncated == STACK_LOOPED {
            *self.looped.entry(stack.pid).or_default() += 1;
        }
        let Some(interp) = self.interpreters.get_mut(&stack.pid) else { return Vec::new() };
        let n = (stack.len as usize).min(stack.frames.len());
        let old_lasti = interp.layout().version <= 310;
        stack.frames[..n]
            .iter()
            .filter(|f| f.owner < FRAME_OWNED_BY_CSTACK && f.code != 0)
            .map(|f| {
                // <= 3.10: the field is the int f_lasti (sign-extended for -1).
                let instr = if old_lasti { f.instr as u32 as i32 as i64 as u64 } else { f.instr };
                interp.resolve_frame(f.code, instr, f.checksum)
            })
            .collect()
    }

    /// `pid -> "3.12.1"` for every interpreter found.
    pub fn versions(&self) -> BTreeMap<u32, String> {
        let live = self.interpreters.iter().map(|(pid, i)| (*pid, i.version()));
        let gone = self.retired.iter().map(|(pid, r)| (*pid, r.version));
        live.chain(gone).map(|(pid, (a, b, c))| (pid, format!("{a}.{b}.{c}"))).collect()
    }

    /// Leaf-first Python frames of stack `id`; one resolved with an
    /// `[unknown]` frame is resolved again (a copy may have come since).
    /// Most were resolved as they came ([`resolve_new`](Self::resolve_new)):
    /// the others are looked up in the kernel's map one by one.
    pub fn frames(&mut self, id: u64, ebpf: &Ebpf) -> Vec<Frame> {
        if let Some((_, f)) = self.resolved.get(&id) {
            if !self.incomplete.contains(&id) {
                return f.clone();
            }
        }
        let stack = ebpf
            .map(tracer_common::maps::PY_STACKS)
            .and_then(|m| BpfHashMap::<_, u64, PyStack>::try_from(m).ok())
            .and_then(|m| m.get(&id, 0).ok());
        match stack {
            Some(stack) => self.resolve_into_cache(id, &stack),
            None => self.resolved.get(&id).map(|(_, f)| f.clone()).unwrap_or_default(),
        }
    }
}

impl PythonFrames for PyFrames {
    fn take_copies(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        PyFrames::take_copies(self, ebpf).map(drop)
    }

    fn frames(&mut self, id: u64, ebpf: &Ebpf) -> Vec<Frame> {
        PyFrames::frames(self, id, ebpf)
    }

    fn problems(&self) -> BTreeMap<u32, Vec<(Topic, String)>> {
        PyFrames::problems(self)
    }

    fn forget(&mut self, pids: &HashSet<u32>) {
        PyFrames::forget(self, pids)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
