//! Python attribution, collector side: finds CPython in each target
//! (`python::Interpreter`), hands the kernel its layout, the tid -> thread
//! state map (refreshed every 25 ms, as threads appear) and its GIL range,
//! and resolves the captured Python stacks while their processes are alive
//! (into `stacks::PyFrames`, shared with every family that records stacks).
//! It has no kernel programs of its own: the stack walk runs inside the
//! other families' programs.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use aya::maps::HashMap as BpfHashMap;
use tracer_common::{
    counters,
    python::{GilRange, PyLayout, PY_MAX_DEPTH},
};

use crate::{
    collect::{Collector, Context, FamilyTable, TargetEvent},
    probe::{self, ProbeError},
    procfs,
    python::{Interpreter, PythonError},
    recording::{Origin, Recording},
};

/// No programs, no globals: the layout goes through the `PY_LAYOUT` map.
pub static TABLE: FamilyTable = FamilyTable { family: "python", programs: &[], globals: &[] };

/// How long a process that may still be starting CPython (just exec'd,
/// libpython not mapped yet, interpreter not initialized) is retried.
const STARTUP_RETRY: Duration = Duration::from_secs(10);
/// Processes that do not look like Python at all are retried this long
/// (the dynamic loader maps libpython right after exec).
const NON_PYTHON_RETRY: Duration = Duration::from_secs(1);
/// How often the thread maps are refreshed and starting interpreters retried.
const REFRESH: Duration = Duration::from_millis(25);
/// How often new stacks are resolved while their processes are alive.
const RESOLVE: Duration = Duration::from_millis(300);

struct Pending {
    since: Instant,
    last_error: Option<String>,
}

/// The Python processes being traced.
pub struct PythonCollector {
    /// Processes already examined (Python or not).
    examined: HashMap<u32, ()>,
    /// Processes to examine again: CPython may still be starting.
    pending: HashMap<u32, Pending>,
    /// tid -> tstate currently in the kernel map, per pid.
    published: HashMap<u32, Vec<u32>>,
    last_resolve: Instant,
}

impl Default for PythonCollector {
    fn default() -> Self {
        PythonCollector { examined: HashMap::new(), pending: HashMap::new(), published: HashMap::new(), last_resolve: Instant::now() }
    }
}

impl PythonCollector {
    /// Looks for CPython in `pid` (once per process; again after exec).
    fn examine(&mut self, cx: &mut Context, pid: u32, force: bool) -> Result<(), ProbeError> {
        if force {
            self.examined.remove(&pid);
            self.pending.remove(&pid);
        }
        if self.examined.contains_key(&pid) {
            return Ok(());
        }
        self.examined.insert(pid, ());
        self.try_attach(cx, pid)
    }

    fn try_attach(&mut self, cx: &mut Context, pid: u32) -> Result<(), ProbeError> {
        let retry = |this: &mut Self, err: Option<String>| {
            let p = this.pending.entry(pid).or_insert(Pending { since: Instant::now(), last_error: None });
            p.last_error = err;
        };
        match Interpreter::attach(pid) {
            Ok(Some(interp)) => {
                self.pending.remove(&pid);
                self.publish(cx, pid, interp)?;
            }
            Ok(None) => retry(self, None),
            Err(PythonError::Unsupported { version }) => {
                self.pending.remove(&pid);
                cx.sink.note(format!("pid {pid}: CPython {version} is not supported (3.8 to 3.13 are); traced natively"));
            }
            Err(e) => retry(self, Some(e.to_string())),
        }
        Ok(())
    }

    /// Examines again the processes whose CPython may still be starting.
    fn retry_pending(&mut self, cx: &mut Context) -> Result<(), ProbeError> {
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
                if let Some(e) = self.pending.remove(&pid).and_then(|p| p.last_error) {
                    cx.sink.note(format!("pid {pid}: {e}; traced natively"));
                }
                continue;
            }
            self.try_attach(cx, pid)?;
        }
        Ok(())
    }

    fn publish(&mut self, cx: &mut Context, pid: u32, interp: Interpreter) -> Result<(), ProbeError> {
        let layout = interp.layout();
        let mut map: BpfHashMap<_, u32, PyLayout> = probe::hash_map(&mut cx.ebpf, "PY_LAYOUT")?;
        map.insert(pid, layout, 0).map_err(|e| ProbeError::map("PY_LAYOUT", e))?;
        if let Some((start, end)) = interp.gil_range() {
            let mut gil: BpfHashMap<_, u32, GilRange> = probe::hash_map(&mut cx.ebpf, "GIL_RANGE")?;
            gil.insert(pid, GilRange { start, end }, 0).map_err(|e| ProbeError::map("GIL_RANGE", e))?;
        } else {
            cx.sink.note(format!("pid {pid}: GIL state not located; GIL waits are counted as lock time"));
        }
        cx.stacks.python.add(pid, interp);
        self.refresh(cx, pid)
    }

    /// Re-reads the thread list of `pid` and updates the kernel's tid -> tstate map.
    fn refresh(&mut self, cx: &mut Context, pid: u32) -> Result<(), ProbeError> {
        let Some(interp) = cx.stacks.python.get(pid) else { return Ok(()) };
        let Ok(states) = interp.thread_states() else { return Ok(()) };
        let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(&mut cx.ebpf, "PY_TSTATE")?;
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

    /// A process exited: its threads leave the kernel map; the interpreter
    /// (and its cache of resolved code objects) stays for late stacks.
    fn exited(&mut self, cx: &mut Context, pid: u32) -> Result<(), ProbeError> {
        cx.stacks.python.resolve_new(&mut cx.ebpf)?;
        if let Some(tids) = self.published.remove(&pid) {
            let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(&mut cx.ebpf, "PY_TSTATE")?;
            for tid in tids {
                let _ = map.remove(&tid);
            }
        }
        Ok(())
    }
}

impl Collector for PythonCollector {
    fn name(&self) -> &'static str {
        "python"
    }

    fn attach(&mut self, _cx: &mut Context) -> Result<(), ProbeError> {
        Ok(())
    }

    fn target(&mut self, cx: &mut Context, ev: &TargetEvent) -> Result<(), ProbeError> {
        match ev {
            // A launched command is examined at its exec.
            TargetEvent::Appeared { origin: Origin::Launched, .. } => Ok(()),
            TargetEvent::Appeared { pid, .. } | TargetEvent::Forked { pid, .. } => self.examine(cx, *pid, false),
            TargetEvent::Execed { pid, .. } => self.examine(cx, *pid, true),
            TargetEvent::Exited { pid } => self.exited(cx, *pid),
            TargetEvent::Mapped { .. } => Ok(()),
        }
    }

    fn poll_every(&self) -> Duration {
        REFRESH
    }

    /// New threads get their thread state into the kernel map here: until
    /// then their samples carry native frames only.
    fn poll(&mut self, cx: &mut Context) -> Result<(), ProbeError> {
        self.retry_pending(cx)?;
        for pid in cx.stacks.python.pids() {
            self.refresh(cx, pid)?;
        }
        if self.last_resolve.elapsed() >= RESOLVE {
            self.last_resolve = Instant::now();
            cx.stacks.python.resolve_new(&mut cx.ebpf)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Context, _rec: &mut Recording) -> Result<(), ProbeError> {
        cx.stacks.python.resolve_new(&mut cx.ebpf)?;
        if cx.window_end.is_some() {
            // Processes still pending (and alive) at the end of the window.
            for (pid, p) in self.pending.drain() {
                if let (true, Some(e)) = (procfs::is_alive(pid), p.last_error) {
                    cx.sink.note(format!("pid {pid}: {e}; traced natively"));
                }
            }
        }
        for (pid, version) in cx.stacks.python.versions() {
            cx.sink.note(format!("pid {pid}: CPython {version}, Python stacks attributed"));
        }
        // A stack cut at the depth limit is kept (its leaf frames are
        // there): reported, not counted as lost.
        let n = probe::counter(&mut cx.ebpf, counters::PY_STACKS_TRUNCATED)?;
        if n > 0 {
            let text = format!("{n} Python stacks were deeper than {PY_MAX_DEPTH} frames and were cut at their root end");
            cx.sink.state_note("python_stacks_truncated", text);
        }
        Ok(())
    }
}

/// The executable is named like Python, or a libpython is mapped.
fn looks_like_python(pid: u32) -> bool {
    let exe = procfs::exe(pid).unwrap_or_default();
    let base = exe.rsplit('/').next().unwrap_or("");
    base.starts_with("python")
        || procfs::maps_text(pid).is_ok_and(|m| m.contains("libpython"))
}
