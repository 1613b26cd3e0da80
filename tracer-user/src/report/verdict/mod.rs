//! The bottleneck verdict: per process, and per thread that matters, the
//! share of wall time in each bottleneck [`Class`], the dominant class
//! named with the user-code Python line most responsible ([`sites`]), one
//! line of advice, and the CUDA findings that go with it.
//!
//! A pure function of a [`Recording`] ([`verdict`]), rendered at the top
//! of the text report ([`text::render_text`]) and as `verdict` in the JSON
//! report; the rules and thresholds are in docs/verdict.md.

pub mod class;
pub mod gil;
pub mod memory;
pub mod parked;
pub mod pipeline;
pub mod pools;
pub mod text;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

pub use class::Class;
pub use crate::recording::attribution::{Charged, SiteRef};
pub use text::{render_text, render_text_above};

use crate::recording::{
    attribution as sites, cuda::CallClass, Frame, FrameKind, OffCpuReason, Recording, StackKind, StackRecord, ThreadTimes,
};

/// Two classes whose shares differ by less than this many percentage
/// points are too close to call.
pub const CLOSE_CALL_POINTS: f64 = 5.0;
/// A thread matters when it lived at least this share of the window.
pub const THREAD_MIN_WALL_SHARE: f64 = 0.10;
/// The text shows processes with at least this share of the largest one's thread time.
pub const PROCESS_MIN_SHARE: f64 = 0.01;
/// At most this many threads per process, busiest (on CPU, GIL, run queue) first.
pub const MAX_THREADS: usize = 8;
/// Sites kept per class.
pub const TOP_SITES: usize = 3;
/// CUDA findings linked to a GPU class.
pub const MAX_FINDINGS: usize = 3;

/// The verdict of a whole recording.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// One per traced process with scheduler data, most thread time first.
    pub processes: Vec<ProcessVerdict>,
    /// Worker processes of one traced parent with one command line (two
    /// or more): one row each, their verdict as one process (pid: the
    /// lowest); the text report shows these rows instead of their members
    /// (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<ProcessVerdict>,
    /// What the verdict could not see (no sampling, no scheduler data...).
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProcessVerdict {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Thread-time: the wall time of its threads, summed (the 100% of the shares).
    pub wall_ns: u64,
    /// Every class with time, largest first.
    pub classes: Vec<ClassShare>,
    /// The dominant class; None when no thread time was recorded.
    pub bottleneck: Option<Bottleneck>,
    /// The threads that matter (docs/verdict.md), busiest first.
    pub threads: Vec<ThreadVerdict>,
    /// Parked native threads left out of `wall_ns` and the shares
    /// (docs/verdict.md#parked-native-threads); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<parked::Parked>,
    /// Helper threads left out of `wall_ns` and the shares: Python or
    /// native threads that run no user code and are mostly idle (queue
    /// feeders, library helpers; docs/verdict.md#the-threads-that-matter);
    /// absent when none (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helpers: Option<parked::Parked>,
    /// In `verdict.groups` only: the processes of this row, worker
    /// processes of one parent with one command line (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// In `verdict.groups` only: their parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    /// Its memory classes (`oom_killed`, `near_memory_limit`,
    /// `memory_growth`; docs/verdict.md#memory; additive), empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<memory::MemoryVerdict>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ThreadVerdict {
    /// 0: the process's exited threads, summed.
    pub tid: u32,
    pub comm: String,
    pub wall_ns: u64,
    pub classes: Vec<ClassShare>,
    pub bottleneck: Option<Bottleneck>,
    /// Set on a native worker pool thread (docs/verdict.md#native-worker-pools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<pools::PoolThread>,
}

/// Time in one class.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClassShare {
    pub class: Class,
    pub time_ns: u64,
    /// Of the process's (or thread's) wall time, 0 to 1.
    pub share: f64,
    /// The lines this time is charged to, largest first (at most [`TOP_SITES`]).
    pub sites: Vec<SiteShare>,
    /// On-CPU time per native library (`native_compute`, `native_pool`), largest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libraries: Vec<LibraryShare>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SiteShare {
    pub site: SiteRef,
    /// The innermost Python frame beneath the user line (stdlib, packages), when different.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beneath: Option<SiteRef>,
    pub time_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LibraryShare {
    pub library: String,
    pub time_ns: u64,
}

/// The class named as the bottleneck.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bottleneck {
    pub class: Class,
    pub share: f64,
    /// Classes within [`CLOSE_CALL_POINTS`] of it: non-empty means "too close to call".
    pub too_close_with: Vec<Class>,
    /// The line most responsible.
    pub site: Option<SiteShare>,
    pub advice: String,
    /// CUDA findings of the process that go with a GPU class (`gpu_sync`, `copy_work`, `collective`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<FindingRef>,
    /// For `input_pipeline`: who the thread waits for and what they are
    /// bound by (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<pipeline::Producers>,
    /// For `gil` (the bottleneck or too close to it): who held the GIL
    /// during the waits, most first (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gil_holders: Vec<gil::GilHolderShare>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FindingRef {
    pub kind: String,
    pub severity: String,
    /// `function (file:line)`.
    pub site: String,
    pub advice: String,
}

/// Time of one thread (or one process) per class, and where it is charged.
#[derive(Default)]
struct Acc {
    time: BTreeMap<Class, u64>,
    sites: BTreeMap<Class, HashMap<Charged, u64>>,
    libs: HashMap<String, u64>,
    /// `libs` of native worker pool threads (pools.rs).
    pool_libs: HashMap<String, u64>,
    /// The part of each wait class spent in consumer waits (pipeline.rs),
    /// by line: moved to `input_pipeline` when the process has busy producers.
    consumer: BTreeMap<Class, HashMap<Charged, u64>>,
}

impl Acc {
    fn add(&mut self, class: Class, ns: u64, at: Option<&Charged>) {
        if ns == 0 {
            return;
        }
        let t = self.time.entry(class).or_default();
        *t = t.saturating_add(ns);
        if let Some(c) = at {
            let s = self.sites.entry(class).or_default().entry(c.clone()).or_default();
            *s = s.saturating_add(ns);
        }
    }

    fn merge(&mut self, other: &Acc) {
        for (c, t) in &other.time {
            let e = self.time.entry(*c).or_default();
            *e = e.saturating_add(*t);
        }
        for (c, sites) in &other.sites {
            let m = self.sites.entry(*c).or_default();
            for (k, v) in sites {
                let e = m.entry(k.clone()).or_default();
                *e = e.saturating_add(*v);
            }
        }
        for (l, t) in &other.libs {
            let e = self.libs.entry(l.clone()).or_default();
            *e = e.saturating_add(*t);
        }
        for (l, t) in &other.pool_libs {
            let e = self.pool_libs.entry(l.clone()).or_default();
            *e = e.saturating_add(*t);
        }
        for (c, sites) in &other.consumer {
            let m = self.consumer.entry(*c).or_default();
            for (k, v) in sites {
                let e = m.entry(k.clone()).or_default();
                *e = e.saturating_add(*v);
            }
        }
    }

    /// Moves the consumer waits to [`Class::InputPipeline`], at their lines.
    fn move_consumer_waits(&mut self) {
        for (class, sites) in std::mem::take(&mut self.consumer) {
            for (charged, ns) in sites {
                if let Some(t) = self.time.get_mut(&class) {
                    *t = t.saturating_sub(ns);
                }
                if let Some(m) = self.sites.get_mut(&class) {
                    if let Some(s) = m.get_mut(&charged) {
                        *s = s.saturating_sub(ns);
                        if *s == 0 {
                            m.remove(&charged);
                        }
                    }
                }
                self.add(Class::InputPipeline, ns, Some(&charged));
            }
        }
    }

    fn shares(&self, wall_ns: u64) -> Vec<ClassShare> {
        let mut v: Vec<ClassShare> = self
            .time
            .iter()
            .filter(|(_, t)| **t > 0)
            .map(|(class, t)| {
                let mut sites: Vec<SiteShare> = self
                    .sites
                    .get(class)
                    .map(|m| m.iter().map(|(c, ns)| SiteShare { site: c.site.clone(), beneath: c.beneath.clone(), time_ns: *ns }).collect())
                    .unwrap_or_default();
                sites.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then_with(|| a.site.cmp(&b.site)));
                sites.truncate(TOP_SITES);
                let mut libraries: Vec<LibraryShare> = match class {
                    Class::NativeCompute => self.libs.iter().map(|(l, t)| LibraryShare { library: l.clone(), time_ns: *t }).collect(),
                    Class::NativePool => self.pool_libs.iter().map(|(l, t)| LibraryShare { library: l.clone(), time_ns: *t }).collect(),
                    _ => Vec::new(),
                };
                libraries.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then_with(|| a.library.cmp(&b.library)));
                ClassShare { class: *class, time_ns: *t, share: ratio(*t, wall_ns), sites, libraries }
            })
            .collect();
        v.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(a.class.cmp(&b.class)));
        v
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).min(1.0)
    }
}

/// `part * num / den` without overflow (0 when `den` is 0).
fn scale(part: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return 0;
    }
    u64::try_from(u128::from(part) * u128::from(num) / u128::from(den)).unwrap_or(u64::MAX)
}

/// Lines of a process that issue CUDA synchronizes or copies (from the
/// CUDA call table), keyed by (file basename, line).
#[derive(Default)]
struct CudaSites {
    sync: BTreeSet<(String, u32)>,
    copy: BTreeSet<(String, u32)>,
    /// Lines whose syncs (or polling) spent at least half their time
    /// waiting for NCCL collectives, and the lines of NCCL calls.
    collective: BTreeSet<(String, u32)>,
}

fn base(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn frame_key(f: &Frame) -> Option<(String, u32)> {
    Some((base(f.file.as_deref()?).to_owned(), f.line?))
}

fn cuda_sites(rec: &Recording) -> HashMap<u32, CudaSites> {
    let mut m: HashMap<u32, CudaSites> = HashMap::new();
    for c in rec.cuda.iter().flat_map(|c| c.calls.iter()) {
        let (Some(file), Some(line)) = (c.site.file.as_deref(), c.site.line) else { continue };
        let key = (base(file).to_owned(), line);
        let e = m.entry(c.pid).or_default();
        // A line whose queries found the work not done polls the GPU.
        let polls = c.not_ready.unwrap_or(0) > 0;
        // A sync's time, or a polling line's waits.
        let waited = c.poll_ns.unwrap_or(c.total_ns);
        let on_collectives = c.collective_waits.unwrap_or(0) > 0 && c.collective_wait_ns.unwrap_or(0).saturating_mul(2) >= waited;
        match c.class() {
            CallClass::Collective => {
                e.collective.insert(key);
            }
            _ if on_collectives => {
                e.collective.insert(key);
            }
            _ if polls => {
                e.sync.insert(key);
            }
            CallClass::Sync => {
                e.sync.insert(key);
            }
            CallClass::Copy => {
                e.copy.insert(key);
            }
            _ => {}
        }
    }
    m
}

/// The GPU class of a stack, if it is inside a CUDA sync or copy: by its
/// native frames (`cudaStreamSynchronize`, `cuMemcpy...`), else by its
/// Python leaf being a line that issues such calls.
fn gpu_class(frames: &[Frame], cuda: Option<&CudaSites>, on_cpu: bool) -> Option<Class> {
    let copy = if on_cpu { Class::CopyWork } else { Class::GpuSync };
    let key = cuda.and(frames.iter().find(|f| f.kind == FrameKind::Python).and_then(frame_key));
    // A sync at a line whose syncs mostly waited for collectives.
    let on_collectives = matches!((cuda, &key), (Some(c), Some(k)) if c.collective.contains(k));
    for f in frames.iter().filter(|f| f.kind == FrameKind::Native) {
        match CallClass::of_symbol(&f.function) {
            CallClass::Collective => return Some(Class::Collective),
            CallClass::Sync if on_collectives => return Some(Class::Collective),
            CallClass::Sync => return Some(Class::GpuSync),
            CallClass::Copy => return Some(copy),
            _ => {}
        }
    }
    let cuda = cuda?;
    let key = key?;
    if on_collectives {
        Some(Class::Collective)
    } else if cuda.copy.contains(&key) {
        Some(copy)
    } else if cuda.sync.contains(&key) {
        Some(Class::GpuSync)
    } else {
        None
    }
}

/// Whether a native module is the interpreter (libpython, the python executable).
fn is_interpreter(module: &str) -> bool {
    module.starts_with("libpython") || module.starts_with("python")
}

/// The compute class of a CPU sample, and the native library it ran in.
fn compute_class(frames: &[Frame]) -> (Class, Option<String>) {
    match frames.iter().find(|f| f.kind != FrameKind::Kernel) {
        Some(f) if f.kind == FrameKind::Python => (Class::PythonCompute, None),
        Some(f) => match f.module.as_deref() {
            Some(m) if is_interpreter(m) => (Class::PythonCompute, None),
            Some(m) => (Class::NativeCompute, Some(m.to_owned())),
            None => (Class::NativeCompute, Some(crate::recording::UNKNOWN.to_owned())),
        },
        None => (Class::NativeCompute, Some("[kernel]".to_owned())),
    }
}

fn reason_class(r: OffCpuReason) -> Class {
    match r {
        OffCpuReason::Io => Class::Io,
        OffCpuReason::Lock => Class::WaitingOnThreads,
        OffCpuReason::Poll => Class::Polling,
        OffCpuReason::Sleep => Class::Sleeping,
        OffCpuReason::Other => Class::OtherWait,
        OffCpuReason::Gil => Class::Gil,
        OffCpuReason::Memory => Class::MemoryStall,
    }
}

/// Spreads `total` ns over `stacks` in proportion to their weight, each
/// part to the class `class_of` gives it; what no stack carries (no stack,
/// or rounding) goes to `fallback`.
fn spread<'a>(
    acc: &mut Acc,
    total: u64,
    stacks: &[&'a StackRecord],
    weight: impl Fn(&StackRecord) -> u64,
    mut class_of: impl FnMut(&'a StackRecord, &mut Acc, u64) -> Class,
    fallback: Class,
) {
    let w_total = stacks.iter().fold(0u64, |a, s| a.saturating_add(weight(s)));
    let mut given = 0u64;
    for s in stacks {
        let ns = scale(total, weight(s), w_total);
        if ns == 0 {
            continue;
        }
        let class = class_of(s, acc, ns);
        acc.add(class, ns, sites::charge(&s.frames).as_ref());
        given = given.saturating_add(ns);
    }
    acc.add(fallback, total.saturating_sub(given), None);
}

/// One thread's time per class.
fn thread_acc(t: &ThreadTimes, stacks: &[&StackRecord], cuda: Option<&CudaSites>) -> Acc {
    let mut acc = Acc::default();
    let of = |kind: StackKind, reason: Option<OffCpuReason>| -> Vec<&StackRecord> {
        stacks.iter().copied().filter(|s| s.kind == kind && (reason.is_none() || s.reason == reason)).collect()
    };
    let cpu = of(StackKind::Cpu, None);
    let has_python = stacks.iter().any(|s| s.frames.iter().any(|f| f.kind == FrameKind::Python));
    let default_compute = if has_python { Class::PythonCompute } else { Class::NativeCompute };
    // On CPU: split by the samples.
    spread(
        &mut acc,
        t.on_cpu_ns,
        &cpu,
        |s| s.samples,
        |s, acc, ns| {
            if let Some(g) = gpu_class(&s.frames, cuda, true) {
                return g;
            }
            let (class, lib) = compute_class(&s.frames);
            if let Some(lib) = lib {
                let e = acc.libs.entry(lib).or_default();
                *e = e.saturating_add(ns);
            }
            class
        },
        default_compute,
    );
    // Off CPU, by reason; a CUDA sync or copy inside becomes GPU synchronisation.
    let o = &t.off_cpu;
    for (reason, ns) in [
        (OffCpuReason::Io, o.io_ns),
        (OffCpuReason::Lock, o.lock_ns),
        (OffCpuReason::Poll, o.poll_ns),
        (OffCpuReason::Sleep, o.sleep_ns),
        (OffCpuReason::Other, o.other_ns),
        (OffCpuReason::Memory, o.memory_ns),
    ] {
        let class = reason_class(reason);
        spread(
            &mut acc,
            ns,
            &of(StackKind::OffCpu, Some(reason)),
            |s| s.weight_ns,
            |s, acc, ns| {
                if let Some(g) = gpu_class(&s.frames, cuda, false) {
                    return g;
                }
                if pipeline::is_consumer_wait(reason, &s.frames) {
                    if let Some(c) = sites::charge(&s.frames) {
                        let e = acc.consumer.entry(class).or_default().entry(c).or_default();
                        *e = e.saturating_add(ns);
                    }
                }
                class
            },
            class,
        );
    }
    spread(&mut acc, o.gil_ns, &of(StackKind::Gil, None), |s| s.weight_ns, |_, _, _| Class::Gil, Class::Gil);
    // Run-queue delay has no stack of its own: charged where the thread runs.
    spread(&mut acc, t.runqueue_ns, &cpu, |s| s.samples, |_, _, _| Class::CpuStarvation, Class::CpuStarvation);
    acc
}

/// What the bottleneck of a process (or of its thread `tid`) is chosen with.
struct Scope<'a> {
    rec: &'a Recording,
    pid: u32,
    tid: Option<u32>,
    cuda: Option<&'a CudaSites>,
    /// Go with `input_pipeline`.
    producers: Option<&'a pipeline::Producers>,
}

/// The dominant class of `classes` (sorted largest first), its line, its
/// advice (for its cause: the producers of an input pipeline, the GIL's
/// holder; each class's when too close to call) and the findings that go
/// with it.
fn pick_bottleneck(classes: &[ClassShare], sc: &Scope) -> Option<Bottleneck> {
    let rec = sc.rec;
    let top = classes.first()?;
    let too_close_with: Vec<Class> = classes[1..]
        .iter()
        .filter(|c| (top.share - c.share) * 100.0 < CLOSE_CALL_POINTS)
        .map(|c| c.class)
        .collect();
    let site = top.sites.first().cloned();
    let mut findings = Vec::new();
    if matches!(top.class, Class::GpuSync | Class::CopyWork | Class::Collective) {
        let line = site.as_ref().and_then(|s| s.site.line);
        let mut fs: Vec<_> = rec.cuda.iter().flat_map(|c| c.findings.iter()).filter(|f| f.pid == sc.pid).collect();
        // Those at the bottleneck's line first, then by time.
        fs.sort_by_key(|f| (line.is_none() || f.site.line != line, std::cmp::Reverse(f.time_ns)));
        findings = fs
            .into_iter()
            .take(MAX_FINDINGS)
            .map(|f| FindingRef { kind: f.kind.clone(), severity: f.severity.clone(), site: f.site.display(), advice: crate::report::findings::cuda_advice(f).to_owned() })
            .collect();
    }
    let producers = sc.producers.filter(|_| top.class == Class::InputPipeline).cloned();
    let gil_named = top.class == Class::Gil || too_close_with.contains(&Class::Gil);
    let gil_holders = if gil_named { gil::holders(rec, sc.pid, sc.tid, sc.cuda) } else { Vec::new() };
    findings.extend(gil::findings(&gil_holders));
    let advice_of = |c: Class| -> String {
        match c {
            Class::InputPipeline => producers.as_ref().map(pipeline::Producers::advice),
            Class::Gil => gil_holders.first().map(gil::GilHolderShare::advice),
            _ => None,
        }
        .unwrap_or_else(|| c.advice().to_owned())
    };
    let advice = if too_close_with.is_empty() {
        advice_of(top.class)
    } else {
        std::iter::once(top.class).chain(too_close_with.iter().copied()).map(|c| format!("{}: {}", c.label(), advice_of(c))).collect::<Vec<_>>().join(" | ")
    };
    Some(Bottleneck { class: top.class, share: top.share, too_close_with, site, advice, findings, producers, gil_holders })
}

/// One process's time per class and per user line (all classes), the
/// figures `diff` compares.
#[derive(Clone, Debug, Default)]
pub struct ProcessTimes {
    /// Thread-time (the threads' wall time, summed).
    pub wall_ns: u64,
    pub classes: BTreeMap<Class, u64>,
    /// [`SiteRef::key`] (`file.py:12`) -> the site and its time: on CPU,
    /// and blocked there (every class but `cpu_starvation`).
    pub sites: BTreeMap<String, (SiteRef, u64)>,
}

/// Each thread's stacks (CPU and off-CPU), and per process its threads
/// with their time per class: what [`verdict`] and [`process_times`] start from.
type StacksOf<'a> = HashMap<(u32, u32), Vec<&'a StackRecord>>;
type ByPid<'a> = BTreeMap<u32, Vec<(&'a ThreadTimes, Acc)>>;

fn threads_by_pid(rec: &Recording) -> (StacksOf<'_>, ByPid<'_>) {
    let cuda = cuda_sites(rec);
    let mut stacks_of: StacksOf = HashMap::new();
    for s in rec.stacks.iter().filter(|s| s.kind != StackKind::Syscall) {
        stacks_of.entry((s.pid, s.tid)).or_default().push(s);
    }
    let mut by_pid: ByPid = BTreeMap::new();
    for t in &rec.threads {
        let stacks = stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
        by_pid.entry(t.pid).or_default().push((t, thread_acc(t, stacks, cuda.get(&t.pid))));
    }
    (stacks_of, by_pid)
}

/// One process's threads after the verdict's passes (parked and helper
/// threads out, pools marked, consumer waits moved to the input
/// pipeline when it has busy producers), and what the passes found.
struct Prepared<'a> {
    threads: Vec<(&'a ThreadTimes, Acc)>,
    parked: parked::Parked,
    helpers: parked::Parked,
    pool_of: HashMap<u32, pools::PoolThread>,
    producers: Option<pipeline::Producers>,
}

fn prepare(rec: &Recording) -> (StacksOf<'_>, BTreeMap<u32, Prepared<'_>>) {
    let (stacks_of, by_pid) = threads_by_pid(rec);
    let mut out: BTreeMap<u32, Prepared> = BTreeMap::new();
    for (pid, mut threads) in by_pid {
        let parked = parked::drop_parked(&mut threads, &stacks_of);
        let pool_of = pools::apply(&mut threads, &stacks_of, rec.sample_hz);
        let helpers = parked::drop_helpers(&mut threads, &stacks_of);
        out.insert(pid, Prepared { threads, parked, helpers, pool_of, producers: None });
    }
    let ppid_of = parents(rec);
    let cmd_of: HashMap<u32, &[String]> = rec.targets.iter().map(|t| (t.pid, t.cmdline.as_slice())).collect();
    let mut found = Vec::new();
    for (pid, p) in &out {
        let waited: u64 = p.threads.iter().flat_map(|(_, a)| a.consumer.values()).flat_map(HashMap::values).fold(0u64, |a, b| a.saturating_add(*b));
        if waited == 0 {
            continue;
        }
        // Its children, by command line.
        let mut children: BTreeMap<&[String], Vec<(u32, pipeline::Working)>> = BTreeMap::new();
        for (c, q) in out.iter().filter(|(c, _)| ppid_of.get(*c) == Some(pid)) {
            children.entry(cmd_of.get(c).copied().unwrap_or_default()).or_default().push((*c, pipeline::Working { threads: &q.threads, pool: &q.pool_of }));
        }
        let children: Vec<Vec<(u32, pipeline::Working)>> = children.into_values().collect();
        let own = pipeline::Working { threads: &p.threads, pool: &p.pool_of };
        if let Some(prod) = pipeline::producers(&own, &children, &stacks_of, waited) {
            found.push((*pid, prod));
        }
    }
    for (pid, prod) in found {
        if let Some(p) = out.get_mut(&pid) {
            for (_, a) in &mut p.threads {
                a.move_consumer_waits();
            }
            p.producers = Some(prod);
        }
    }
    (stacks_of, out)
}

/// Parent pid of each traced process in its job, where known: its parent,
/// or for a process forked by a `multiprocessing` fork server (the
/// `forkserver` start method, 3.14's default on Linux) the process that
/// started the fork server: a pool's workers are the loop's, not the
/// server's.
fn parents(rec: &Recording) -> HashMap<u32, u32> {
    let direct: HashMap<u32, u32> = rec.targets.iter().filter_map(|t| Some((t.pid, t.ppid?))).collect();
    // A server's children run its command line too: the server is the one
    // whose parent does not.
    let cmd: HashMap<u32, &[String]> = rec.targets.iter().map(|t| (t.pid, t.cmdline.as_slice())).collect();
    let servers: std::collections::HashSet<u32> = rec
        .targets
        .iter()
        .filter(|t| is_fork_server(&t.cmdline) && !t.ppid.and_then(|p| cmd.get(&p)).is_some_and(|c| is_fork_server(c)))
        .map(|t| t.pid)
        .collect();
    // The server itself is no one's worker (it forks them, idle).
    direct
        .iter()
        .filter(|(pid, _)| !servers.contains(pid))
        .map(|(pid, ppid)| match (servers.contains(ppid), direct.get(ppid)) {
            (true, Some(up)) => (*pid, *up),
            _ => (*pid, *ppid),
        })
        .collect()
}

/// Whether a command line is a `multiprocessing` fork server's
/// (`python -c 'from multiprocessing.forkserver import main; main(...)'`).
fn is_fork_server(cmdline: &[String]) -> bool {
    cmdline.iter().any(|a| a.contains("from multiprocessing.forkserver import main"))
}

/// [`ProcessTimes`] of every process with scheduler data, by pid: the
/// same accounting as [`verdict`].
pub fn process_times(rec: &Recording) -> BTreeMap<u32, ProcessTimes> {
    let (_, prepared) = prepare(rec);
    let mut out: BTreeMap<u32, ProcessTimes> = BTreeMap::new();
    for (t, acc) in prepared.values().flat_map(|p| p.threads.iter()) {
        let p = out.entry(t.pid).or_default();
        p.wall_ns = p.wall_ns.saturating_add(t.wall_ns);
        for (c, ns) in &acc.time {
            let e = p.classes.entry(*c).or_default();
            *e = e.saturating_add(*ns);
        }
        // Run-queue delay is spread over the lines by CPU samples (a proxy):
        // it stays in its class, out of the lines' own time.
        for (charged, ns) in acc.sites.iter().filter(|(c, _)| **c != Class::CpuStarvation).flat_map(|(_, m)| m) {
            let e = p.sites.entry(charged.site.key()).or_insert_with(|| (charged.site.clone(), 0));
            e.1 = e.1.saturating_add(*ns);
        }
    }
    out
}

impl parked::Parked {
    fn add(&mut self, other: &parked::Parked) {
        self.threads += other.threads;
        self.wall_ns = self.wall_ns.saturating_add(other.wall_ns);
        self.tids.extend_from_slice(&other.tids);
    }
}

/// The verdict of one process, or of a group of worker processes (`members`, pid order).
fn process_verdict(rec: &Recording, members: &[(u32, &Prepared)], min_wall: u64, cuda: &HashMap<u32, CudaSites>) -> ProcessVerdict {
    let pid = members.first().map(|(p, _)| *p).unwrap_or(0);
    let target = rec.targets.iter().find(|t| t.pid == pid);
    let mut acc = Acc::default();
    let mut wall_ns = 0u64;
    let (mut parked, mut helpers) = (parked::Parked::default(), parked::Parked::default());
    let threads: Vec<&(&ThreadTimes, Acc)> = members.iter().flat_map(|(_, p)| p.threads.iter()).collect();
    for (_, p) in members {
        parked.add(&p.parked);
        helpers.add(&p.helpers);
    }
    for (t, a) in &threads {
        acc.merge(a);
        wall_ns = wall_ns.saturating_add(t.wall_ns);
    }
    // A group's producers: those of its members, when one member has them.
    let producers = members.iter().find_map(|(_, p)| p.producers.as_ref());
    let classes = acc.shares(wall_ns);
    let bottleneck = pick_bottleneck(&classes, &Scope { rec, pid, tid: None, cuda: cuda.get(&pid), producers });
    let busy = |t: &ThreadTimes| t.on_cpu_ns.saturating_add(t.off_cpu.gil_ns).saturating_add(t.runqueue_ns);
    let mut kept: Vec<&(&ThreadTimes, Acc)> = threads.into_iter().filter(|(t, _)| t.wall_ns >= min_wall && t.wall_ns > 0).collect();
    kept.sort_by(|a, b| busy(b.0).cmp(&busy(a.0)).then(a.0.tid.cmp(&b.0.tid)));
    kept.truncate(MAX_THREADS);
    let threads = kept
        .into_iter()
        .map(|(t, a)| {
            let classes = a.shares(t.wall_ns);
            let member = members.iter().find(|(p, _)| *p == t.pid).map(|(_, p)| *p);
            ThreadVerdict {
                tid: t.tid,
                comm: t.comm.clone(),
                wall_ns: t.wall_ns,
                bottleneck: pick_bottleneck(
                    &classes,
                    &Scope { rec, pid: t.pid, tid: (t.tid != 0).then_some(t.tid), cuda: cuda.get(&t.pid), producers: member.and_then(|m| m.producers.as_ref()) },
                ),
                classes,
                pool: member.and_then(|m| m.pool_of.get(&t.tid).cloned()),
            }
        })
        .collect();
    let memory = if members.len() == 1 {
        rec.memory.as_ref().and_then(|m| m.processes.iter().find(|p| p.pid == pid)).map(memory::memory_verdicts).unwrap_or_default()
    } else {
        Vec::new()
    };
    ProcessVerdict {
        pid,
        comm: target.map(|t| t.comm.clone()).unwrap_or_default(),
        cmdline: target.map(|t| t.cmdline.clone()).unwrap_or_default(),
        wall_ns,
        classes,
        bottleneck,
        threads,
        parked: (parked.threads > 0).then_some(parked),
        helpers: (helpers.threads > 0).then_some(helpers),
        pids: if members.len() > 1 { members.iter().map(|(p, _)| *p).collect() } else { Vec::new() },
        ppid: None,
        memory,
    }
}

/// Worker processes: traced processes of one traced parent (in the job:
/// [`parents`]) with one command line, two or more, by (parent, command
/// line), pid order.
fn worker_groups(rec: &Recording, traced: &BTreeSet<u32>) -> Vec<(u32, Vec<u32>)> {
    let parent = parents(rec);
    let mut groups: BTreeMap<(u32, &[String]), BTreeSet<u32>> = BTreeMap::new();
    for t in rec.targets.iter().filter(|t| traced.contains(&t.pid)) {
        if let Some(ppid) = parent.get(&t.pid).copied().filter(|p| traced.contains(p)) {
            groups.entry((ppid, t.cmdline.as_slice())).or_default().insert(t.pid);
        }
    }
    groups.into_iter().filter(|(_, pids)| pids.len() >= 2).map(|((ppid, _), pids)| (ppid, pids.into_iter().collect())).collect()
}

/// The verdict of `rec` (docs/verdict.md).
pub fn verdict(rec: &Recording) -> Verdict {
    let mut notes = Vec::new();
    if rec.threads.is_empty() {
        notes.push("no scheduler data (recorded with --no-sched): no wall-time verdict".to_owned());
    } else if rec.sample_hz == 0 {
        notes.push("CPU sampling was off (-F 0): on-CPU time is not split between Python and native code, and has no line".to_owned());
    }
    let (_, prepared) = prepare(rec);
    let cuda = cuda_sites(rec);
    let min_wall = (rec.duration_ns as f64 * THREAD_MIN_WALL_SHARE) as u64;
    let mut processes: Vec<ProcessVerdict> = prepared.iter().map(|(pid, p)| process_verdict(rec, &[(*pid, p)], min_wall, &cuda)).collect();
    // The process with the most thread time first (the service, not the shell that started it).
    processes.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then(a.pid.cmp(&b.pid)));
    let traced: BTreeSet<u32> = prepared.keys().copied().collect();
    let groups = worker_groups(rec, &traced)
        .into_iter()
        .map(|(ppid, pids)| {
            let members: Vec<(u32, &Prepared)> = pids.iter().filter_map(|p| prepared.get(p).map(|q| (*p, q))).collect();
            let mut g = process_verdict(rec, &members, min_wall, &cuda);
            g.ppid = Some(ppid);
            g
        })
        .collect();
    Verdict { processes, groups, notes }
}

#[cfg(test)]
mod tests;
