//! The userspace sampler of `record --async`: a thread of its own that
//! reads, from outside, the Python stack of every thread of each Python
//! target (the `dump` machinery, `crate::families::python::Interpreter`), finds the
//! threads that run an asyncio event loop (a `BaseEventLoop._run_once`
//! frame), and at each tick sends what those threads were doing (their
//! user line, whether in the selector, the syscall they are in from
//! `/proc/PID/task/TID/syscall`) and, where a task reader exists, every
//! loop's tasks. Processes without a loop are re-examined every
//! [`SCAN_EVERY`] ticks only; while no process has one, the thread wakes
//! only at those ticks (20 times a second at the default 200 Hz).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex,
    },
    thread,
    time::Duration,
};

use super::tasks::{self, LoopTasks, TaskSource};
use crate::{
    os::clock,
    families::python::Interpreter,
    recording::{
        attribution::{self as sites, Charged},
        Frame, FrameKind,
    },
};

/// A process without a known loop is read every this many ticks.
const SCAN_EVERY: u64 = 10;
/// A process that is not (yet) a usable interpreter is tried again after this.
const ATTACH_RETRY: Duration = Duration::from_millis(25);
/// A process that is not CPython is looked at every [`ATTACH_RETRY`] for
/// this long after it appeared (it may exec one), then every [`NOT_PYTHON_RETRY`].
const NOT_PYTHON_FAST: Duration = Duration::from_secs(2);
const NOT_PYTHON_RETRY: Duration = Duration::from_secs(1);

/// What one loop thread was doing at a tick.
#[derive(Clone, Debug)]
pub struct ThreadSample {
    pub tid: u32,
    pub thread_name: Option<String>,
    /// The user line (and the frame beneath) its stack is charged to.
    pub site: Option<Charged>,
    /// In the loop's selector (`selectors.py` `select`).
    pub in_selector: bool,
    /// The syscall it was inside (`None`: running on a CPU, or unknown).
    pub syscall: Option<u32>,
}

/// One tick of one process with at least one loop thread.
#[derive(Clone, Debug)]
pub struct Tick {
    pub ts_ns: u64,
    pub pid: u32,
    pub version: (u32, u32),
    pub threads: Vec<ThreadSample>,
    /// The loops' tasks, or why they cannot be read.
    pub tasks: Result<Vec<LoopTasks>, String>,
    /// Walks over the process's memory that tripped a bound (python/walk.rs),
    /// for the recording's notes.
    pub notes: Vec<String>,
}

/// Whether a leaf-first stack runs an asyncio event loop.
pub fn is_loop_stack(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        f.kind == FrameKind::Python
            && f.function.ends_with("_run_once")
            && f.file.as_deref().is_some_and(|p| p.ends_with("asyncio/base_events.py"))
    })
}

/// Whether the thread's Python leaf is the loop's selector call.
fn in_selector(frames: &[Frame]) -> bool {
    frames
        .iter()
        .find(|f| f.kind == FrameKind::Python)
        .is_some_and(|f| f.function.ends_with("select") && f.file.as_deref().is_some_and(|p| p.ends_with("/selectors.py")))
}

/// `/proc/PID/task/TID/syscall`: the syscall number the thread is blocked
/// in, `None` when running (or unreadable).
fn syscall_of(pid: u32, tid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let first = s.split_whitespace().next()?;
    first.parse::<i64>().ok().filter(|n| *n >= 0).map(|n| n as u32)
}

struct Proc {
    generation: u64,
    interp: Option<Interpreter>,
    source: Option<Result<Box<dyn TaskSource>, tasks::NoSource>>,
    /// When to try opening the task reader again (asyncio not imported yet).
    source_retry: u64,
    next_try: u64,
    has_loop: bool,
    /// When this process (this generation) was first seen.
    since: u64,
}

/// The sampling thread; dropped or [`finish`](Sampler::finish)ed, it stops.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    pids: Arc<Mutex<BTreeMap<u32, u64>>>,
    handle: Option<thread::JoinHandle<()>>,
    pub rx: mpsc::Receiver<Tick>,
    /// Why the sampling thread runs at an ordinary priority (it asks for
    /// the lowest real-time one), for the recording's notes.
    pub priority_note: Option<String>,
}

impl Sampler {
    pub fn start(hz: u32) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let pids = Arc::new(Mutex::new(BTreeMap::new()));
        let (tx, rx) = mpsc::channel();
        let (rt_tx, rt_rx) = mpsc::channel();
        let (s, p) = (stop.clone(), pids.clone());
        let handle = thread::Builder::new().name("infertrace-async".into()).spawn(move || {
            // Unbiased on saturated CPUs (see `realtime_self`): a sampler
            // that waits for a CPU catches the loops idle, not busy.
            let _ = rt_tx.send(crate::os::sched::realtime_self().err());
            run(hz, &s, &p, &tx)
        })?;
        let priority_note = rt_rx.recv().ok().flatten().map(|e| {
            format!("the asyncio sampler runs at an ordinary priority (SCHED_FIFO refused: {e}): on saturated CPUs it samples busy loop steps less often than idle ones")
        });
        Ok(Sampler { stop, pids, handle: Some(handle), rx, priority_note })
    }

    pub fn add(&self, pid: u32) {
        if let Ok(mut p) = self.pids.lock() {
            p.entry(pid).or_insert(0);
        }
    }

    /// The process exec'd: its interpreter is examined again.
    pub fn reset(&self, pid: u32) {
        if let Ok(mut p) = self.pids.lock() {
            *p.entry(pid).or_insert(0) += 1;
        }
    }

    pub fn remove(&self, pid: u32) {
        if let Ok(mut p) = self.pids.lock() {
            p.remove(&pid);
        }
    }

    pub fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.finish();
    }
}

fn run(hz: u32, stop: &AtomicBool, pids: &Mutex<BTreeMap<u32, u64>>, tx: &mpsc::Sender<Tick>) {
    let period = 1_000_000_000 / u64::from(hz.max(1));
    let mut procs: HashMap<u32, Proc> = HashMap::new();
    let mut n: u64 = 0;
    let mut next = clock::monotonic_ns();
    while !stop.load(Ordering::Relaxed) {
        let now = clock::monotonic_ns();
        let list: Vec<(u32, u64)> = pids.lock().map(|p| p.iter().map(|(a, b)| (*a, *b)).collect()).unwrap_or_default();
        procs.retain(|pid, p| list.contains(&(*pid, p.generation)));
        // No loop known: every process is read at each wake, and the
        // thread wakes SCAN_EVERY times less often (the same reads, a
        // tenth of the wake-ups of an idle sampler).
        let idle = !procs.values().any(|p| p.has_loop);
        for (pid, generation) in list {
            let p = procs.entry(pid).or_insert(Proc {
                generation,
                interp: None,
                source: None,
                source_retry: 0,
                next_try: 0,
                has_loop: false,
                since: now,
            });
            if p.interp.is_none() {
                if now < p.next_try {
                    continue;
                }
                match Interpreter::attach(pid) {
                    Ok(Some(i)) => p.interp = Some(i),
                    // Not CPython (yet: a launched command before its exec,
                    // a launcher script): looked at again, less often later.
                    Ok(None) => {
                        let after = if now < p.since + NOT_PYTHON_FAST.as_nanos() as u64 { ATTACH_RETRY } else { NOT_PYTHON_RETRY };
                        p.next_try = now + after.as_nanos() as u64;
                    }
                    Err(_) => p.next_try = now + ATTACH_RETRY.as_nanos() as u64,
                }
                continue;
            }
            if !idle && !p.has_loop && n % SCAN_EVERY != pid as u64 % SCAN_EVERY {
                continue;
            }
            if let Some(t) = sample(pid, p) {
                if tx.send(t).is_err() {
                    return;
                }
            }
        }
        n += 1;
        let idle = !procs.values().any(|p| p.has_loop);
        next += if idle { period * SCAN_EVERY } else { period };
        let now = clock::monotonic_ns();
        if next > now {
            thread::sleep(Duration::from_nanos(next - now));
        } else {
            next = now; // fell behind: no burst to catch up
        }
    }
}

fn sample(pid: u32, p: &mut Proc) -> Option<Tick> {
    let interp = p.interp.as_mut()?;
    let ts_ns = clock::monotonic_ns();
    let dump = interp.dump().ok()?;
    let v = interp.version();
    let version = (v.0, v.1);
    let threads: Vec<ThreadSample> = dump
        .into_iter()
        .filter(|t| t.tid != 0 && is_loop_stack(&t.frames))
        .map(|t| ThreadSample {
            tid: t.tid,
            thread_name: t.thread_name,
            site: sites::charge(&t.frames),
            in_selector: in_selector(&t.frames),
            syscall: syscall_of(pid, t.tid),
        })
        .collect();
    if threads.is_empty() {
        return None;
    }
    p.has_loop = true;
    if matches!(&p.source, Some(Err(e)) if e.retry && ts_ns >= p.source_retry) {
        p.source = None;
    }
    let interp = p.interp.as_mut()?;
    let source = p.source.get_or_insert_with(|| tasks::open_source(interp));
    let tasks = match source {
        Ok(s) => s.read(interp),
        Err(e) => {
            if e.retry && p.source_retry <= ts_ns {
                p.source_retry = ts_ns + 1_000_000_000;
            }
            Err(e.why.clone())
        }
    };
    let notes = p.interp.as_ref().map(|i| i.take_walk_notes()).unwrap_or_default();
    Some(Tick { ts_ns, pid, version, threads, tasks, notes })
}
