//! The input pipeline ([`Class::InputPipeline`]): a working thread that
//! waits where a consumer takes data from the job's producers (a
//! multiprocessing queue or pipe, a `queue.Queue`, a DataLoader's
//! `next()`), while those producers, the process's child processes or its
//! other threads, are busy producing it.
//!
//! The rules (docs/verdict.md#input-pipeline), all deterministic:
//!
//! - A **consumer wait** is an off-CPU stack (lock, poll, I/O or other
//!   wait) with a Python frame in one of [`CONSUMER_FRAMES`].
//! - The **producers** of a process are its traced child processes (the
//!   DataLoader's or a `multiprocessing` job's workers), by command line,
//!   each on its busiest thread; else its other working threads that have
//!   no consumer wait and are no native pool. They count when busy (on
//!   CPU, in the run queue, waiting for the GIL, for I/O or for memory) at
//!   least [`PRODUCER_MIN_BUSY_SHARE`] of their thread time and alive at
//!   least a tenth of the time the consumers waited
//!   ([`PRODUCER_MIN_WALL_PER_WAIT`]: not `ldconfig` at import).
//! - With busy producers, the consumer waits of the process's threads move
//!   to `input_pipeline` (same lines); without, they stay in the class of
//!   their reason: a consumer fed by a producer that sleeps between items
//!   waits on a paced source, not on a pipeline it could widen.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{ratio, Acc, Class, SiteShare};
use crate::recording::{Frame, FrameKind, OffCpuReason, StackRecord, ThreadTimes};

/// Producers busy at least this share of their thread time feed a pipeline.
pub const PRODUCER_MIN_BUSY_SHARE: f64 = 0.5;
/// ... and on a CPU at least this share, or CPU-starved (in the run queue
/// at least [`STARVED_MIN_SHARE`]): a helper process blocked reading a
/// pipe all its life (multiprocessing's resource tracker) is "in I/O", not
/// producing. Run-queue delay alone does not count: it is the machine's
/// load, and on a busy machine the tracker's start-up (its imports, ~0.1 s
/// of CPU and as long again waiting for one) passed 5% of a 3 s life.
pub const PRODUCER_MIN_CPU_SHARE: f64 = 0.05;
/// Producers whose run-queue delay is at least this share of their
/// thread time are named CPU-starved.
pub const STARVED_MIN_SHARE: f64 = 0.15;
/// Producer ids named in the text (all of them in JSON).
const NAMED_MAX: usize = 4;

/// Python frames (file suffix, function names) where a consumer waits for
/// its producers. The function is the code object's name (`get`, or
/// `Queue.get` where CPython gives the qualified name).
pub const CONSUMER_FRAMES: &[(&str, &[&str])] = &[
    ("/multiprocessing/queues.py", &["get"]),
    ("/multiprocessing/connection.py", &["recv", "recv_bytes", "recv_bytes_into", "_recv", "_recv_bytes", "poll", "_poll", "wait"]),
    ("/queue.py", &["get"]),
    ("/torch/utils/data/dataloader.py", &["__next__", "_next_data", "_get_data", "_try_get_data"]),
    // `Pool.map`/`imap`/`apply_async(...).get()`: results of the pool's processes.
    ("/multiprocessing/pool.py", &["get", "wait", "next", "__next__"]),
    // `Executor.map`, `Future.result`, `as_completed`, `wait`: a process or thread pool's results.
    ("/concurrent/futures/_base.py", &["result", "_result_or_cancel", "as_completed", "wait", "result_iterator"]),
];

/// A DataLoader worker's loop: its process is named a DataLoader worker.
const DATALOADER_WORKER: &str = "/torch/utils/data/_utils/worker.py";

fn is_consumer_frame(f: &Frame) -> bool {
    if f.kind != FrameKind::Python {
        return false;
    }
    let Some(file) = f.file.as_deref() else { return false };
    // A user's own `queue.py` is not the standard library's.
    if crate::recording::attribution::is_user_file(file) {
        return false;
    }
    let function = f.function.rsplit('.').next().unwrap_or(&f.function);
    CONSUMER_FRAMES.iter().any(|(suffix, functions)| file.ends_with(suffix) && functions.contains(&function))
}

/// Whether an off-CPU stack of this reason waits for producers.
pub(super) fn is_consumer_wait(reason: OffCpuReason, frames: &[Frame]) -> bool {
    matches!(reason, OffCpuReason::Lock | OffCpuReason::Poll | OffCpuReason::Io | OffCpuReason::Other) && frames.iter().any(is_consumer_frame)
}

/// Who the waiting thread waits for, and what they are bound by
/// (`bottleneck.producers` in JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Producers {
    /// `dataloader_workers`, `processes` (child processes) or `threads`.
    pub kind: String,
    /// The producing child processes (all of them, in pid order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// The producing threads of the same process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tids: Vec<u32>,
    /// Busy (on CPU, run queue, GIL, I/O, memory) share of their thread time.
    pub busy_share: f64,
    /// What they are bound by: their largest busy class.
    pub bound_by: Class,
    /// Its share of their thread time.
    pub bound_share: f64,
    /// Their run-queue delay, of their thread time.
    pub starved_share: f64,
    /// Their line most responsible for `bound_by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteShare>,
}

impl Producers {
    /// `DataLoader workers 5753, 5754`, `threads 12, 13`.
    pub fn who(&self) -> String {
        let (what, ids) = match self.kind.as_str() {
            "dataloader_workers" => ("DataLoader worker", &self.pids),
            "processes" => ("child process", &self.pids),
            _ => ("thread", &self.tids),
        };
        let mut named: Vec<String> = ids.iter().take(NAMED_MAX).map(u32::to_string).collect();
        if ids.len() > NAMED_MAX {
            named.push(format!("and {} more", ids.len() - NAMED_MAX));
        }
        let plural = if ids.len() == 1 { "" } else { "s" };
        let what = if what == "DataLoader worker" { format!("DataLoader worker{plural}") } else { format!("{what}{plural}") };
        format!("{what} {}", named.join(", "))
    }

    /// `CPU-bound (and CPU-starved)`, `I/O-bound`...
    pub fn bound(&self) -> String {
        let how = match self.bound_by {
            Class::PythonCompute | Class::NativeCompute | Class::NativePool => "CPU-bound".to_owned(),
            Class::CpuStarvation => "CPU-starved".to_owned(),
            Class::Io => "I/O-bound".to_owned(),
            Class::Gil => "GIL-bound".to_owned(),
            Class::MemoryStall => "bound by memory waits".to_owned(),
            c => format!("bound by {}", c.label()),
        };
        if self.bound_by != Class::CpuStarvation && self.starved_share >= STARVED_MIN_SHARE {
            format!("{how} (and CPU-starved)")
        } else {
            how
        }
    }

    /// Advice for the cause: what the producers are bound by, in the words
    /// of what they are (DataLoader workers, a pool's processes, threads).
    pub fn advice(&self) -> String {
        let (head, workers, ahead, tail) = match self.kind.as_str() {
            "dataloader_workers" => (
                "the loop waits for its DataLoader workers",
                "num_workers",
                "let them run ahead (prefetch_factor, persistent_workers=True)",
                "; with a GPU, pin_memory=True and non_blocking copies overlap the transfer",
            ),
            "processes" => (
                "the loop waits for its worker processes",
                "the pool's processes (Pool(processes=N), max_workers=N)",
                "give each task more work (chunksize=) so less time goes to passing items",
                "",
            ),
            _ => (
                "the loop waits for its producer threads",
                "the producer threads",
                "let them run ahead (a bigger queue)",
                if matches!(self.bound_by, Class::PythonCompute | Class::Gil) {
                    "; threads share one GIL: Python work scales with processes, not threads"
                } else {
                    ""
                },
            ),
        };
        let cheaper = if self.kind == "dataloader_workers" {
            "make each item cheaper (move decoding and augmentation to native or vectorised code, precompute offline)"
        } else {
            "make each item cheaper (native or vectorised code, results precomputed offline)"
        };
        let cure = match self.bound_by {
            Class::PythonCompute | Class::NativeCompute | Class::NativePool | Class::Gil => {
                if self.starved_share >= STARVED_MIN_SHARE {
                    format!("they compute but wait for a CPU too: raise {workers} only as far as there are free cores, {cheaper}, or give the job more CPUs")
                } else {
                    format!("they compute: raise {workers} (there are CPUs to spare), {cheaper}, and {ahead}")
                }
            }
            Class::CpuStarvation => format!("they wait for a CPU: there are more busy processes than cores; lower {workers} or other load, or give the job more CPUs"),
            Class::Io => format!("they wait on storage or the network: read larger chunks, cache or pre-shard the data locally, and raise {workers} to overlap more reads"),
            Class::MemoryStall => "they wait on memory (page-ins, reclaim): keep the dataset's working set in memory or give the job more memory".to_owned(),
            _ => "look at the producers' own bottleneck".to_owned(),
        };
        format!("{head}, which are {}: {cure}{tail}", self.bound())
    }
}

/// Busy time of a thread: on CPU, run queue, GIL, I/O, memory.
fn busy_ns(t: &ThreadTimes) -> u64 {
    let o = &t.off_cpu;
    [t.on_cpu_ns, t.runqueue_ns, o.gil_ns, o.io_ns, o.memory_ns].iter().fold(0u64, |a, b| a.saturating_add(*b))
}

/// The threads of one process the verdict kept, with the ids of its native pool threads.
pub(super) struct Working<'a, 'b> {
    pub threads: &'b [(&'a ThreadTimes, Acc)],
    pub pool: &'b HashMap<u32, super::pools::PoolThread>,
}

/// The thread a process produces on: its busiest.
fn producing<'w>(w: &Working<'_, 'w>) -> Option<&'w (&'w ThreadTimes, Acc)> {
    let threads: &'w [(&ThreadTimes, Acc)] = w.threads;
    threads.iter().filter(|(t, _)| t.tid != 0).max_by_key(|(t, _)| (busy_ns(t), t.tid)).or_else(|| threads.first())
}

/// Thread time, busy time and run-queue delay of some threads.
#[derive(Default)]
struct Tally {
    acc: Acc,
    wall: u64,
    busy: u64,
    on_cpu: u64,
    starved: u64,
}

impl Tally {
    fn add(&mut self, t: &ThreadTimes, a: &Acc) {
        self.acc.merge(a);
        self.wall = self.wall.saturating_add(t.wall_ns);
        self.busy = self.busy.saturating_add(busy_ns(t));
        self.on_cpu = self.on_cpu.saturating_add(t.on_cpu_ns);
        self.starved = self.starved.saturating_add(t.runqueue_ns);
    }

    fn busy_enough(&self, waited: u64) -> bool {
        ratio(self.busy, self.wall) >= PRODUCER_MIN_BUSY_SHARE
            && (ratio(self.on_cpu, self.wall) >= PRODUCER_MIN_CPU_SHARE || ratio(self.starved, self.wall) >= STARVED_MIN_SHARE)
            && self.wall.saturating_mul(PRODUCER_MIN_WALL_PER_WAIT) >= waited
    }
}

/// Producers live at least 1/this of the time the consumers wait: a helper
/// that ran a moment at import (`ldconfig`) feeds no pipeline.
pub const PRODUCER_MIN_WALL_PER_WAIT: u64 = 10;

/// The producers of a process whose threads (`own`) wait `waited` ns in
/// consumer waits, when busy: its traced children (`children`, grouped by
/// command line, each group taken when busy), else its own busy threads
/// that are not consumers; None when none are busy enough.
pub(super) fn producers(
    own: &Working,
    children: &[Vec<(u32, Working)>],
    stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>,
    waited: u64,
) -> Option<Producers> {
    let consumer = |t: &ThreadTimes| {
        stacks_of.get(&(t.pid, t.tid)).is_some_and(|st| st.iter().any(|s| s.reason.is_some_and(|r| is_consumer_wait(r, &s.frames))))
    };
    let worker_stack = |t: &ThreadTimes| {
        stacks_of
            .get(&(t.pid, t.tid))
            .is_some_and(|st| st.iter().any(|s| s.frames.iter().any(|f| f.file.as_deref().is_some_and(|p| p.ends_with(DATALOADER_WORKER)))))
    };
    // Child processes, a command line at a time.
    let mut all = Tally::default();
    let mut pids = Vec::new();
    let mut worker = false;
    // A process produces on its busiest thread: its other threads (a
    // DataLoader worker's queue feeder, fd-passing listener) would dilute it.
    for group in children {
        let mut g = Tally::default();
        for (t, a) in group.iter().filter_map(|(_, w)| producing(w)) {
            g.add(t, a);
        }
        if !g.busy_enough(waited) {
            continue;
        }
        for (pid, w) in group {
            pids.push(*pid);
            if let Some((t, a)) = producing(w) {
                all.add(t, a);
            }
            worker |= w.threads.iter().any(|(t, _)| worker_stack(t));
        }
    }
    if !pids.is_empty() {
        pids.sort_unstable();
        let kind = if worker { "dataloader_workers" } else { "processes" };
        return Some(summarise(kind, pids, Vec::new(), &all));
    }
    // Threads of the same process.
    let mut all = Tally::default();
    let mut tids = Vec::new();
    for (t, a) in own.threads.iter().filter(|(t, _)| t.tid != 0 && !own.pool.contains_key(&t.tid) && !consumer(t)) {
        let mut one = Tally::default();
        one.add(t, a);
        if one.busy_enough(waited) {
            all.add(t, a);
            tids.push(t.tid);
        }
    }
    if tids.is_empty() {
        return None;
    }
    tids.sort_unstable();
    Some(summarise("threads", Vec::new(), tids, &all))
}

fn summarise(kind: &str, pids: Vec<u32>, tids: Vec<u32>, t: &Tally) -> Producers {
    let shares = t.acc.shares(t.wall);
    let busy_class = |c: Class| c.on_cpu() || matches!(c, Class::Gil | Class::Io | Class::MemoryStall);
    let top = shares.iter().find(|c| busy_class(c.class)).or_else(|| shares.iter().find(|c| c.class == Class::CpuStarvation));
    // Run-queue delay is charged to the lines the producers run at: the
    // compute line, when that is what they are bound by.
    Producers {
        kind: kind.to_owned(),
        pids,
        tids,
        busy_share: ratio(t.busy, t.wall),
        bound_by: top.map(|c| c.class).unwrap_or(Class::CpuStarvation),
        bound_share: top.map(|c| c.share).unwrap_or(0.0),
        starved_share: ratio(t.starved, t.wall),
        site: top.and_then(|c| c.sites.first().cloned()),
    }
}
