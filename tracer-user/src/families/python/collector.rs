//! Python attribution, collector side: finds CPython in each target
//! (`python::Interpreter`), hands the kernel its layout, the tid -> thread
//! state map (refreshed every 25 ms, as threads appear) and its GIL range,
//! and resolves the captured Python stacks while their processes are alive
//! (into `resolve::PyFrames`, registered with the stack resolver shared with every family that records stacks).
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

use super::resolve::PyFrames;
use crate::{
    engine::{Topic, Collector, Cx, Handle, FamilyTable, GlobalSpec, GlobalValue, LoadInputs, TargetEvent},
    os::probe::{self, ProbeError},
    os::procfs,
    families::python::{Interpreter, PythonError, STILL_TRACED},
    recording::{Origin, Recording},
};

/// No programs of its own (the layout goes through the `PY_LAYOUT` map);
/// one global: where a task's FS base is, by which the kernel recognises a
/// new thread's `PyThreadState` (its `thread_id` is the thread's
/// `pthread_t`, the FS base on x86_64).
pub static TABLE: FamilyTable = FamilyTable {
    family: "python",
    programs: &[],
    globals: &[GlobalSpec { name: "PY_TASK_FSBASE_OFFSET", value: |i| Ok(GlobalValue::U64(task_fsbase_offset(i))) }],
};

/// `offsetof(struct task_struct, thread.fsbase)`, `u64::MAX` when unknown
/// (not x86_64, or no such member in the kernel's BTF).
fn task_fsbase_offset(i: &LoadInputs<'_>) -> u64 {
    if !cfg!(target_arch = "x86_64") {
        return u64::MAX;
    }
    let o = &i.btf.offsets;
    match (o.member_offset("task_struct", "thread"), o.member_offset("thread_struct", "fsbase")) {
        (Ok(a), Ok(b)) => u64::from(a) + u64::from(b),
        _ => u64::MAX,
    }
}

/// How long a process that may still be starting CPython (just exec'd,
/// libpython not mapped yet, interpreter not initialized) is retried.
const STARTUP_RETRY: Duration = Duration::from_secs(10);
/// Processes that do not look like Python at all are retried this long
/// (the dynamic loader maps libpython right after exec).
const NON_PYTHON_RETRY: Duration = Duration::from_secs(1);
/// How often the thread maps are refreshed (a backstop: the kernel finds a
/// new thread's state on its first event) and starting interpreters retried.
const REFRESH: Duration = Duration::from_millis(25);
/// How often a process that may be starting CPython is retried in its
/// first `EAGER_FOR`: its interpreter is up milliseconds after exec, and
/// until its layout is published its samples carry no Python frames.
const EAGER_RETRY: Duration = Duration::from_millis(4);
const EAGER_FOR: Duration = Duration::from_millis(250);
/// How long a starting interpreter may take to write its version string
/// (<= 3.10) before it is attached with the version its file name gives.
/// Written within milliseconds of exec on an idle machine; 3 s so that a
/// start-up slowed by a loaded machine still gets its exact version (the
/// wait ends as soon as the string is there).
const VERSION_WAIT: Duration = Duration::from_secs(3);
/// How often new stacks are resolved while their processes are alive.
const RESOLVE: Duration = Duration::from_millis(300);

struct Pending {
    since: Instant,
    last_try: Instant,
    last_error: Option<PythonError>,
    /// Named like Python or maps a libpython (else tried at the slow pace:
    /// looking for an interpreter reads ELF files).
    python_like: bool,
}

impl Pending {
    /// In its first `EAGER_FOR`, when it may be starting CPython.
    fn eager(&self, now: Instant) -> bool {
        self.python_like && now.duration_since(self.since) < EAGER_FOR
    }

    fn due(&self, now: Instant) -> bool {
        let every = if self.eager(now) { EAGER_RETRY } else { REFRESH };
        now.duration_since(self.last_try) + EAGER_RETRY / 2 >= every
    }
}

/// The Python processes being traced.
pub struct PythonCollector {
    /// Processes already examined (Python or not).
    examined: HashMap<u32, ()>,
    /// Processes to examine again: CPython may still be starting.
    pending: HashMap<u32, Pending>,
    /// tid -> tstate currently in the kernel map, per pid.
    published: HashMap<u32, Vec<u32>>,
    last_refresh: Instant,
    last_resolve: Instant,
    /// Processes gone (no thread left) since the last snapshot began.
    gone: Vec<u32>,
    /// Processes gone before the last snapshot began: every event of
    /// theirs was drained and every stack resolved by it, so their
    /// interpreters are retired at the next poll.
    to_retire: Vec<u32>,
}

impl Default for PythonCollector {
    fn default() -> Self {
        PythonCollector {
            examined: HashMap::new(),
            pending: HashMap::new(),
            published: HashMap::new(),
            last_refresh: Instant::now(),
            last_resolve: Instant::now(),
            gone: Vec::new(),
            to_retire: Vec::new(),
        }
    }
}

impl PythonCollector {
    /// Looks for CPython in `pid` (once per process; again after exec).
    fn examine(&mut self, cx: &mut Cx<'_>, pid: u32, force: bool) -> Result<(), ProbeError> {
        // A pid used again (or exec'd) is a new interpreter: not retired.
        self.gone.retain(|p| *p != pid);
        self.to_retire.retain(|p| *p != pid);
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

    fn try_attach(&mut self, cx: &mut Cx<'_>, pid: u32) -> Result<(), ProbeError> {
        let retry = |this: &mut Self, err: Option<PythonError>| {
            let now = Instant::now();
            let p = this.pending.entry(pid).or_insert(Pending { since: now, last_try: now, last_error: None, python_like: false });
            p.last_try = now;
            p.last_error = err;
            p.python_like = looks_like_python(pid);
        };
        match Interpreter::attach(pid) {
            // <= 3.10 write their version string during start-up, after the
            // thread state we validate exists: wait a little for it rather
            // than report the file name's major.minor.
            Ok(Some(interp))
                if !interp.version_is_exact()
                    && self.pending.get(&pid).is_none_or(|p| p.since.elapsed() < VERSION_WAIT) =>
            {
                retry(self, None)
            }
            Ok(Some(interp)) => {
                self.pending.remove(&pid);
                self.publish(cx, pid, interp)?;
            }
            Ok(None) => retry(self, None),
            // As above: an old interpreter read before it wrote its version.
            Err(e)
                if e.version_pending() && self.pending.get(&pid).is_none_or(|p| p.since.elapsed() < VERSION_WAIT) =>
            {
                retry(self, Some(e))
            }
            Err(e @ PythonError::Unsupported { .. }) => {
                self.pending.remove(&pid);
                cx.sink.note(format!("pid {pid}: {e}; still traced: {STILL_TRACED}"));
            }
            Err(e) => retry(self, Some(e)),
        }
        Ok(())
    }

    /// Examines again the processes whose CPython may still be starting.
    fn retry_pending(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        let now = Instant::now();
        let pids: Vec<u32> = self.pending.iter().filter(|(_, p)| p.due(now)).map(|(pid, _)| *pid).collect();
        for pid in pids {
            let Some(p) = self.pending.get(&pid) else { continue };
            let limit = if p.python_like { STARTUP_RETRY } else { NON_PYTHON_RETRY };
            if !procfs::is_alive(pid) {
                // Gone before it could be read (short-lived children):
                // nothing to say, unless its structures were misread (a
                // layout error is no start-up race: it would stay).
                match self.pending.remove(&pid).and_then(|p| p.last_error) {
                    Some(e @ PythonError::Layout { .. }) => cx.sink.note(format!("pid {pid}: {e}; traced natively")),
                    Some(e @ PythonError::Unsupported { .. }) => cx.sink.note(format!("pid {pid}: {e}; still traced: {STILL_TRACED}")),
                    _ => {}
                }
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

    fn publish(&mut self, cx: &mut Cx<'_>, pid: u32, interp: Interpreter) -> Result<(), ProbeError> {
        let layout = interp.layout();
        if let Some(note) = interp.layout_note() {
            cx.sink.note(format!("pid {pid}: {note}"));
        }
        let mut map: BpfHashMap<_, u32, PyLayout> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::PY_LAYOUT)?;
        map.insert(pid, layout, 0).map_err(|e| ProbeError::map(tracer_common::maps::PY_LAYOUT, e))?;
        if let Some((start, end)) = interp.gil_range() {
            let mut gil: BpfHashMap<_, u32, GilRange> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::GIL_RANGE)?;
            gil.insert(pid, GilRange { start, end }, 0).map_err(|e| ProbeError::map(tracer_common::maps::GIL_RANGE, e))?;
        } else {
            cx.sink.note(format!("pid {pid}: GIL state not located; GIL waits are counted as lock time"));
        }
        if let Some(py) = frames(cx) {
            py.add(pid, interp);
        }
        self.refresh(cx, pid)
    }

    /// Re-reads the thread list of `pid` and updates the kernel's tid -> tstate map.
    fn refresh(&mut self, cx: &mut Cx<'_>, pid: u32) -> Result<(), ProbeError> {
        let Some(interp) = frames(cx).and_then(|py| py.get(pid)) else { return Ok(()) };
        let states = interp.thread_states();
        // A thread list (or frame chain) that loops or runs on: one note
        // each, the threads read before it are traced.
        for note in interp.take_walk_notes() {
            cx.sink.note(note);
        }
        let Ok(states) = states else { return Ok(()) };
        let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::PY_TSTATE)?;
        let old = self.published.remove(&pid).unwrap_or_default();
        let new: Vec<u32> = states.iter().map(|(tid, _)| *tid).collect();
        for tid in old.iter().filter(|t| !new.contains(t)) {
            let _ = map.remove(tid);
        }
        for (tid, tstate) in &states {
            let _ = map.insert(tid, tstate, 0);
        }
        // The reverse, for the GIL's holder (a thread state) in GIL waits.
        let mut rev: BpfHashMap<_, u64, u32> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::PY_TSTATE_TID)?;
        for (tid, tstate) in states {
            let _ = rev.insert(tstate, tid, 0);
        }
        self.published.insert(pid, new);
        Ok(())
    }

    /// A process's main thread exited: its threads leave the kernel map,
    /// and its stacks are resolved. When no thread of it is left, its
    /// interpreter (with its cache of code objects) is retired after the
    /// next snapshot (see `to_retire`); a process whose other threads go on
    /// keeps it.
    fn exited(&mut self, cx: &mut Cx<'_>, pid: u32) -> Result<(), ProbeError> {
        if let Some(py) = cx.stacks.python_mut::<PyFrames>() {
            py.resolve_new(&mut cx.kernel.ebpf)?;
            if !crate::os::procfs::is_alive(pid) {
                self.gone.push(pid);
            }
        }
        if let Some(tids) = self.published.remove(&pid) {
            let mut map: BpfHashMap<_, u32, u64> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::PY_TSTATE)?;
            for tid in tids {
                let _ = map.remove(&tid);
            }
        }
        Ok(())
    }
}

/// Removes what the kernel maps keep per process of these (gone)
/// processes: their layout and GIL range (4096 entries each: the 4097th
/// Python process of a long agent could not be published) and their
/// captured stacks (resolved already, and forgotten with the process).
fn forget_kernel_entries(cx: &mut Cx<'_>, pids: &std::collections::HashSet<u32>) {
    if let Ok(mut map) = probe::hash_map::<u32, PyLayout>(&mut cx.kernel.ebpf, tracer_common::maps::PY_LAYOUT) {
        for pid in pids {
            let _ = map.remove(pid);
        }
    }
    if let Ok(mut map) = probe::hash_map::<u32, GilRange>(&mut cx.kernel.ebpf, tracer_common::maps::GIL_RANGE) {
        for pid in pids {
            let _ = map.remove(pid);
        }
    }
    if let Ok(mut map) = probe::hash_map::<u64, tracer_common::python::PyStack>(&mut cx.kernel.ebpf, tracer_common::maps::PY_STACKS) {
        let gone: Vec<u64> = map.iter().filter_map(Result::ok).filter(|(_, s)| pids.contains(&s.pid)).map(|(id, _)| id).collect();
        for id in gone {
            let _ = map.remove(&id);
        }
    }
}

/// The Python frame resolver registered at attach.
fn frames<'c>(cx: &'c mut Cx<'_>) -> Option<&'c mut PyFrames> {
    cx.stacks.python_mut::<PyFrames>()
}

impl Collector for PythonCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Stacks]
    }

    fn name(&self) -> &'static str {
        "python"
    }

    fn forget(&mut self, cx: &mut Cx<'_>, pids: &std::collections::HashSet<u32>) {
        self.gone.retain(|pid| !pids.contains(pid));
        self.to_retire.retain(|pid| !pids.contains(pid));
        self.examined.retain(|pid, _| !pids.contains(pid));
        self.pending.retain(|pid, _| !pids.contains(pid));
        self.published.retain(|pid, _| !pids.contains(pid));
        forget_kernel_entries(cx, pids);
    }

    /// Registers the Python frame resolver with the stack resolver every
    /// family uses.
    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        cx.stacks.set_python(Box::new(PyFrames::default()));
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        match ev {
            // A launched command is examined at its exec.
            TargetEvent::Appeared { origin: Origin::Launched, .. } => Ok(()),
            TargetEvent::Appeared { pid, .. } | TargetEvent::Forked { pid, .. } => self.examine(cx, *pid, false),
            TargetEvent::Execed { pid, .. } => self.examine(cx, *pid, true),
            TargetEvent::Exited { pid } => self.exited(cx, *pid),
            TargetEvent::Mapped { .. } => Ok(()),
        }
    }

    /// `EAGER_RETRY` while an interpreter may be starting, `REFRESH`
    /// otherwise (the loop wakes 40 times a second for Python, not 250).
    fn poll_every(&self) -> Duration {
        let now = Instant::now();
        if self.pending.values().any(|p| p.eager(now)) {
            EAGER_RETRY
        } else {
            REFRESH
        }
    }

    /// Retries starting interpreters (each at its own pace, see
    /// `Pending::due`); every `REFRESH`, re-reads the thread lists into the
    /// kernel map (new threads are found by the kernel itself on their
    /// first event; this keeps the map right where it cannot, e.g. more
    /// threads than it walks).
    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        if !self.to_retire.is_empty() {
            if let Some(py) = frames(cx) {
                for pid in self.to_retire.drain(..) {
                    py.retire(pid);
                }
            }
        }
        self.retry_pending(cx)?;
        // The engine runs a poll up to a quarter period early (its polls
        // share wake-ups): the same slack here.
        if self.last_refresh.elapsed() + REFRESH / 4 >= REFRESH {
            self.last_refresh = Instant::now();
            for pid in frames(cx).map(|py| py.pids()).unwrap_or_default() {
                self.refresh(cx, pid)?;
            }
        }
        if self.last_resolve.elapsed() >= RESOLVE {
            self.last_resolve = Instant::now();
            if let Some(py) = cx.stacks.python_mut::<PyFrames>() {
            py.resolve_new(&mut cx.kernel.ebpf)?;
        }
        }
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, _rec: &mut Recording) -> Result<(), ProbeError> {
        self.to_retire.append(&mut self.gone);
        if let Some(py) = cx.stacks.python_mut::<PyFrames>() {
            py.resolve_new(&mut cx.kernel.ebpf)?;
        }
        if cx.window.end.is_some() {
            // Processes still pending at the end of the window: alive, or
            // gone with their structures misread (as in `retry_pending`).
            for (pid, p) in self.pending.drain() {
                match p.last_error {
                    Some(e) if procfs::is_alive(pid) || matches!(e, PythonError::Layout { .. }) => {
                        cx.sink.note(format!("pid {pid}: {e}; traced natively"))
                    }
                    _ => {}
                }
            }
        }
        for (pid, version) in frames(cx).map(|py| py.versions()).unwrap_or_default() {
            cx.sink.detail(format!("pid {pid}: CPython {version}, Python stacks attributed"));
        }
        // A stack cut at the depth limit is kept (its leaf frames are
        // there): reported, not counted as lost.
        let full = probe::counter(&mut cx.kernel.ebpf, counters::PY_CODES_FULL)?;
        if full > 0 {
            let text = format!(
                "{full} Python code objects could not be copied in the kernel (python_code_copies_map_full): their frames resolve only while their process lives"
            );
            cx.sink.state_note_on(Topic::Detail, "python_code_copies_map_full", text);
        }
        let n = probe::counter(&mut cx.kernel.ebpf, counters::PY_STACKS_TRUNCATED)?;
        if n > 0 {
            let text = format!("{n} Python stacks were deeper than {PY_MAX_DEPTH} frames and were cut at their root end");
            cx.sink.state_note_on(Topic::Detail, "python_stacks_truncated", text);
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
