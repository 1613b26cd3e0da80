//! `--max-overhead PCT`: the CUDA launch probes in time slices, sized so
//! that what they add stays within the budget, and the launch counts
//! estimated from the slices (docs/overhead.md, "An overhead budget").
//!
//! Launches are the highest-rate CUDA calls (thousands per second in a
//! PyTorch step), and each probe hit is a trap that costs microseconds:
//! more than the launch itself. With a budget, every launch function
//! (runtime and driver) is probed by a thread of its own, not by the
//! collector: it attaches their links, opens the kernel's slice
//! (`CUDA_SLICE`: only launches inside it count, per thread in
//! `CUDA_SLICE_HITS`), and measures what the probes cost per launch: the
//! hits of our launch programs in the slice (their run statistics: a
//! runtime launch whose driver launch is probed too is two hits) times the
//! trap's calibrated cost, plus our programs' measured run time, over the
//! launches counted. A thread's share is its launches x that cost over
//! the slice's length. While the largest share is within the budget the
//! probes stay on and every launch counts. Past it, the probes are taken
//! off and put back in slices: on for `duty x 1 s` (2 ms to 100 ms), then
//! off for the rest of the period, `duty = budget / share`, re-sized after
//! every slice.
//!
//! A driver launch function that a process reaches only through its
//! runtime (the driver gate's rule, `driver_gate.rs`: [`HOT_NESTED`]
//! nested calls, none direct) is left out of the slices, but for one
//! slice every [`RECHECK_EVERY_NS`]: each runtime launch then traps once.
//! So is a launch function no slice has seen launch (`CUDA_SLICE_API_HITS`):
//! of the dozen forms a runtime and a driver export, a program uses one or
//! two, and each breakpoint costs at every attachment and release. One
//! that comes into use is seen at the next re-check; its launches before
//! it go uncounted.
//!
//! A slice's probes are released together (`release_all`, see
//! [`Worker::close`]), and
//! the time off is sized by the time they were really in, release
//! included.
//!
//! The estimate, per thread: during the slices it ran slower (the traps
//! are in its time), so its untraced time per launch is `g0 = t1 - cost`
//! (`t1`: the counting time since its first slice over its launches
//! counted), and the launches it made while not counted are that time over
//! `g0`. A thread that stops launching for good is taken as idle from then
//! until it exits.

use std::{
    collections::HashMap,
    fs::File,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray};

use super::{HOT_NESTED, RECHECK_EVERY_NS};
use crate::{os::clock, os::{bpf_stats as stats, trap_timing::{self as calibrate, TrapClass}}, os::probe::ProbeError, os::procfs, recording::cuda::LaunchSampling, os::uprobe_multi};

/// The period a slice's on-time is a share of. Each attachment and release
/// costs the target too, beyond the traps (page copies, TLB flushes, its
/// mmap lock): with a 250 ms period the stand-in's loop ran 9-64% slower
/// in CPU time per iteration (5 runs), with 1 s 6-40% (10 runs), where the
/// same loop recorded with `--no-cuda` read -23% to +32%.
const PERIOD_NS: u64 = 1_000_000_000;
/// The shortest and longest slice.
const MIN_ON_NS: u64 = 2_000_000;
const MAX_ON_NS: u64 = 100_000_000;
/// The smallest share of the time the launches are probed.
const MIN_DUTY: f64 = 0.001;
/// While the probes stay on: how often the share is measured.
const CHECK_NS: u64 = 10_000_000;
/// A thread's untraced time per launch is at least this part of its
/// traced time per launch.
const MIN_EFFECTIVE: f64 = 0.05;
/// The trap's cost when the calibration could not measure it (ns).
const FALLBACK_UPROBE_NS: f64 = 5_000.0;
/// Thread ids kept (the ended first, then the oldest, dropped past it).
const MAX_THREADS: usize = 65_536;
/// Samples of the trap's cost taken when slicing starts, each the fastest
/// of this many rounds of this many calls (~5 ms of the tracer's time at
/// 25 us a trap).
const TRAP_SAMPLES: usize = 8;
const TRAP_ROUNDS: usize = 3;
const TRAP_CALLS: u32 = 60;
/// Slices between sweeps of the threads that exited.
const SWEEP_EVERY: u32 = 20;

/// One group of launch functions to probe in slices: a loaded program,
/// the file (kept open: attached through `/proc/self/fd/N`), the functions'
/// offsets and cookies, in every process or in one.
pub struct SliceTarget {
    pub prog: OwnedFd,
    pub file: Arc<File>,
    pub offsets: Vec<u64>,
    pub cookies: Vec<u64>,
    pub pid: Option<u32>,
    /// A driver launch function in one process: its `CUDA_DRV_ROUTE` key
    /// (`pid << 32 | api id`), to leave it out where the process reaches
    /// it only through its runtime.
    pub route: Option<u64>,
    /// For the notes: the functions and the file.
    pub what: String,
}

impl SliceTarget {
    /// Each function's launch API id (its cookie) and the class of its
    /// first instruction (read from the file; stepped where unreadable).
    fn trap_classes(&self) -> Vec<(u32, TrapClass)> {
        use std::os::unix::fs::FileExt;
        self.offsets
            .iter()
            .zip(&self.cookies)
            .filter_map(|(offset, cookie)| {
                let mut code = [0u8; 4];
                let class = match self.file.read_at(&mut code, *offset) {
                    Ok(n) => calibrate::trap_class(&code[..n]),
                    Err(_) => TrapClass::Stepped,
                };
                Some((u32::try_from(*cookie).ok()?, class))
            })
            .collect()
    }

    fn attach(&self) -> Result<OwnedFd, String> {
        self.attach_these(&self.offsets, &self.cookies)
    }

    /// Attaches only the functions whose cookie (launch API id) `keep`
    /// holds; None when that is none of them.
    fn attach_only(&self, keep: impl Fn(u64) -> bool) -> Option<Result<OwnedFd, String>> {
        let (offsets, cookies): (Vec<u64>, Vec<u64>) =
            self.offsets.iter().zip(&self.cookies).filter(|(_, c)| keep(**c)).map(|(o, c)| (*o, *c)).unzip();
        if offsets.len() == self.offsets.len() {
            return Some(self.attach());
        }
        (!offsets.is_empty()).then(|| self.attach_these(&offsets, &cookies))
    }

    fn attach_these(&self, offsets: &[u64], cookies: &[u64]) -> Result<OwnedFd, String> {
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        let r = match self.pid {
            Some(pid) => uprobe_multi::attach_pid(self.prog.as_fd(), &path, offsets, cookies, false, pid),
            None => uprobe_multi::attach(self.prog.as_fd(), &path, offsets, cookies, false),
        };
        r.map_err(|e| format!("probing {} in a slice failed: {e}", self.what))
    }
}

/// Our programs' work over some slices.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Runs {
    /// Probe hits (launch API hits in the slices), and their traps' cost
    /// (each hit priced by its function's [`TrapClass`]).
    hits: u64,
    trap_ns: f64,
    run_ns: u64,
    launches: u64,
}

impl Runs {
    /// The traps' cost and our programs' run time per launch.
    fn per_launch(&self) -> Option<(f64, f64)> {
        (self.launches > 0).then(|| (self.trap_ns / self.launches as f64, self.run_ns as f64 / self.launches as f64))
    }
}

/// One thread, since the first slice (or check) in which it launched.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ThreadAcc {
    /// Launches counted.
    n: u64,
    /// Counting time since its first.
    on: u64,
    /// What the probes cost it in that time: the traps of its launches
    /// (each slice's launches of it times that slice's trap cost per
    /// launch: its driver launch probed too, or not; emulated or stepped),
    /// and our programs' run time for them (ns).
    trap_ns: f64,
    program_ns: f64,
    /// Start of the first slice (or check) it launched in; its last
    /// launch seen; when it was found gone.
    first: u64,
    last: u64,
    end: Option<u64>,
}

#[derive(Default)]
struct Inner {
    targets: Vec<SliceTarget>,
    /// Attached now (an on phase).
    links: Vec<OwnedFd>,
    /// The slice open since then (ns).
    open_since: Option<u64>,
    /// Counting time of the closed slices, and their number.
    on_ns: u64,
    slices: u64,
    /// Off phases so far (the counts are estimates once there is one).
    off_phases: u64,
    threads: HashMap<u32, ThreadAcc>,
    /// The kernel's count per thread at the last read.
    seen: HashMap<u32, u64>,
    /// Our launch programs' runs and run time in the slices, and the
    /// launches counted there.
    runs: Runs,
    /// The trap's cost per [`TrapClass`]: the mean of the samples (the
    /// startup calibration's, then [`TRAP_SAMPLES`] when slicing starts),
    /// each taken on our own binary with the probe attached anew (its cost
    /// was seen to differ from one attachment to the next, 19-28 us here,
    /// while a target's slices, each attached anew, average them).
    trap_ns: [f64; 3],
    trap_samples: [u64; 3],
    /// The class of each launch API's first instruction (the costlier
    /// where two libraries differ), and its hits (`CUDA_SLICE_API_HITS`)
    /// already taken into the accounts.
    api_class: HashMap<u32, TrapClass>,
    api_taken: HashMap<u32, u64>,
    duty: f64,
    /// The largest share of a thread's time the probes took while on.
    share: f64,
    /// Why a slice could not be probed (first few).
    errors: Vec<String>,
    /// Set by [`LaunchSlicer::finish`]: no slice opens again.
    done: bool,
    /// Launch probe hits outside the slices (attaching, releasing), and
    /// what they cost the threads (each at the mean trap of its time).
    stray_hits: u64,
    stray_ns: f64,
}

impl Inner {
    /// The probes' cost per launch counted: the traps of the launch APIs
    /// hit per launch (a runtime launch whose driver launch is probed too
    /// is two), each at its class's calibrated cost, plus our programs'
    /// measured run time.
    fn cost_per_launch(&self) -> f64 {
        let (trap, program) = self.runs.per_launch().unwrap_or((self.trap_ns[TrapClass::Stepped.index()], 1000.0));
        trap + program
    }

    /// The mean trap cost of the hits so far (the stepped class's before
    /// any).
    fn mean_trap_ns(&self) -> f64 {
        if self.runs.hits > 0 {
            self.runs.trap_ns / self.runs.hits as f64
        } else {
            self.trap_ns[TrapClass::Stepped.index()]
        }
    }

    /// The trap cost of one hit of launch API `api`.
    fn trap_of(&self, api: u32) -> f64 {
        self.trap_ns[self.api_class.get(&api).copied().unwrap_or(TrapClass::Stepped).index()]
    }

    /// What the probes cost a thread so far (ns).
    fn probes_ns(&self, a: &ThreadAcc) -> f64 {
        a.trap_ns + a.program_ns
    }

    /// Thread `tid`'s untraced time per launch (None before it was
    /// counted): its counting time less what the probes cost it, per launch.
    fn g0(&self, tid: u32) -> Option<f64> {
        let a = self.threads.get(&tid).filter(|a| a.n > 0 && a.on > 0)?;
        let t1 = a.on as f64 / a.n as f64;
        Some(((a.on as f64 - self.probes_ns(a)) / a.n as f64).clamp(t1 * MIN_EFFECTIVE, t1))
    }

    /// Takes one more sample of the trap's cost for `class`.
    fn trap_sample(&mut self, class: TrapClass, ns: f64) {
        let i = class.index();
        self.trap_samples[i] += 1;
        self.trap_ns[i] += (ns - self.trap_ns[i]) / self.trap_samples[i] as f64;
    }

    /// The largest share of a live thread's time the probes take while on.
    fn max_share(&self) -> f64 {
        self.threads
            .values()
            .filter(|a| a.end.is_none() && a.n > 0 && a.on > 0)
            .map(|a| (self.probes_ns(a) / a.on as f64).min(1.0))
            .fold(0.0, f64::max)
    }

    /// Takes the launches counted over `[start, now)` (a slice, or part of
    /// one), each with `trap_ns` of traps and `program_ns` of our
    /// programs, into the threads' accounts.
    fn account(&mut self, fresh: &HashMap<u32, u64>, start: u64, now: u64, (trap_ns, program_ns): (f64, f64)) {
        let length = now.saturating_sub(start);
        for tid in fresh.keys() {
            self.threads.entry(*tid).or_insert(ThreadAcc { first: start, ..Default::default() });
        }
        for (tid, a) in self.threads.iter_mut().filter(|(_, a)| a.end.is_none()) {
            a.on += length;
            if let Some(n) = fresh.get(tid) {
                a.n += n;
                a.trap_ns += *n as f64 * trap_ns;
                a.program_ns += *n as f64 * program_ns;
                a.last = now;
            }
        }
        for (tid, n) in fresh {
            *self.seen.entry(*tid).or_default() += n;
        }
        if self.threads.len() > MAX_THREADS {
            let mut old: Vec<(bool, u64, u32)> = self.threads.iter().map(|(t, a)| (a.end.is_none(), a.first, *t)).collect();
            old.sort_unstable();
            for (_, _, t) in old.into_iter().take(self.threads.len() - MAX_THREADS) {
                self.threads.remove(&t);
            }
        }
    }
}

/// The slicing thread and what it learned.
pub struct LaunchSlicer {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    budget_pct: f64,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn map_from(fds: &uprobe_multi::MapFds, name: &'static str) -> Result<Map, ProbeError> {
    let fd = fds.get(name).ok_or(ProbeError::MissingMap(name))?;
    let owned = fd.try_clone_to_owned().map_err(|e| ProbeError::Io("duplicating a map descriptor", e))?;
    let data = MapData::from_fd(owned).map_err(|e| ProbeError::map(name, e))?;
    Map::from_map_data(data).map_err(|e| ProbeError::map(name, e))
}

impl LaunchSlicer {
    /// Starts the slicing thread. `uprobe_ns`: the calibrated trap cost
    /// (0: not measured); `launch_progs`: the launch programs, whose run
    /// statistics count the hits and give our own part of their cost.
    pub fn start(
        budget_pct: f64,
        uprobe_ns: f64,
        launch_progs: Vec<OwnedFd>,
        fds: &uprobe_multi::MapFds,
    ) -> Result<Self, ProbeError> {
        let mut slice: Array<MapData, u64> =
            Array::try_from(map_from(fds, tracer_common::maps::CUDA_SLICE)?).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE, e))?;
        let hits: BpfHashMap<MapData, u32, u64> =
            BpfHashMap::try_from(map_from(fds, tracer_common::maps::CUDA_SLICE_HITS)?).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE_HITS, e))?;
        let route: BpfHashMap<MapData, u64, [u64; 2]> =
            BpfHashMap::try_from(map_from(fds, tracer_common::maps::CUDA_DRV_ROUTE)?).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_DRV_ROUTE, e))?;
        let api_hits: PerCpuArray<MapData, u64> = PerCpuArray::try_from(map_from(fds, tracer_common::maps::CUDA_SLICE_API_HITS)?)
            .map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE_API_HITS, e))?;
        // Sampled from now on: nothing counts until a slice opens.
        slice.set(1, 1, 0).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE, e))?;
        slice.set(0, 1, 0).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE, e))?;
        let uprobe_ns = if uprobe_ns > 0.0 { uprobe_ns } else { FALLBACK_UPROBE_NS };
        // The startup calibration's (a stepped function) stands for every
        // class until they are measured.
        let inner = Arc::new(Mutex::new(Inner { trap_ns: [uprobe_ns; 3], trap_samples: [1; 3], duty: 1.0, ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            inner: inner.clone(),
            stop: stop.clone(),
            slice,
            hits,
            route,
            api_hits,
            budget: budget_pct / 100.0,
            launch_progs,
            rechecked: 0,
            attach_started: 0,
            open_stray: 0,
        };
        let thread = std::thread::Builder::new()
            .name("cuda-slicer".into())
            .spawn(move || worker.run())
            .map_err(|e| ProbeError::Io("starting the CUDA launch slicer", e))?;
        Ok(LaunchSlicer { inner, stop, thread: Some(thread), budget_pct })
    }

    /// Takes a group of launch functions to probe in slices (probed at
    /// once when a slice is open).
    pub fn add(&self, t: SliceTarget) -> Result<(), String> {
        let classes = t.trap_classes();
        let mut s = lock(&self.inner);
        for (api, class) in classes {
            let c = s.api_class.entry(api).or_insert(class);
            *c = (*c).max(class);
        }
        if s.open_since.is_some() && !s.done {
            let link = t.attach()?;
            s.links.push(link);
        }
        s.targets.push(t);
        Ok(())
    }

    /// Stops slicing: closes the slice, stops the thread, and returns the
    /// links still attached (to release with the others).
    pub fn finish(&mut self) -> Vec<OwnedFd> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut s = lock(&self.inner);
        s.done = true;
        std::mem::take(&mut s.links)
    }

    /// The estimated launches of thread `tid` for `counted` of its
    /// launches seen in the slices (of one kernel and site), at `now`.
    pub fn estimate(&self, tid: u32, counted: u64, now: u64) -> f64 {
        let s = lock(&self.inner);
        counted as f64 * scale_of(&s, tid, now)
    }

    /// What the report says of the sampling, `sampled` launches seen.
    pub fn summary(&self, now: u64, sampled: u64) -> LaunchSampling {
        let s = lock(&self.inner);
        let first = s.threads.values().map(|a| a.first).min();
        LaunchSampling {
            budget_percent: self.budget_pct,
            probed_ns: s.on_ns + s.open_since.map_or(0, |o| now.saturating_sub(o)),
            span_ns: first.map_or(0, |f| now.saturating_sub(f)),
            slices: s.slices,
            duty: s.duty,
            probe_share: s.share,
            per_launch_ns: s.cost_per_launch(),
            trap_ns: s.mean_trap_ns(),
            sampled_launches: sampled,
            stray_hits: s.stray_hits,
            estimated: estimating(&s),
            errors: s.errors.clone(),
        }
    }

    /// Whether the counts so far are estimates (some of the time not counted).
    pub fn estimating(&self) -> bool {
        estimating(&lock(&self.inner))
    }
}

fn estimating(s: &Inner) -> bool {
    s.off_phases > 0
}

impl Drop for LaunchSlicer {
    fn drop(&mut self) {
        drop(self.finish());
    }
}

/// A thread's launches seen, `n`, stand for `n + (its span - its counting
/// time) / g0`: those of the time not counted at its untraced rate. Its
/// span ends at its last launch seen when it was found gone (or stopped
/// launching before the last slices). The factor, applied to each of its
/// kernels and sites.
fn scale_of(s: &Inner, tid: u32, now: u64) -> f64 {
    if !estimating(s) {
        return 1.0;
    }
    let (Some(g0), Some(a)) = (s.g0(tid), s.threads.get(&tid)) else { return 1.0 };
    let end = a.end.unwrap_or(now).min(now);
    let span = end.saturating_sub(a.first);
    // Out of its counted time, the part its stray traps took (shared by
    // the threads in proportion to their launches seen) made no launches.
    let seen: u64 = s.threads.values().map(|t| t.n).sum();
    let stray = if seen > 0 { s.stray_ns * a.n as f64 / seen as f64 } else { 0.0 };
    let uncounted = (span.saturating_sub(a.on) as f64 - stray).max(0.0);
    1.0 + uncounted / (g0 * a.n as f64)
}

struct Worker {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    slice: Array<MapData, u64>,
    hits: BpfHashMap<MapData, u32, u64>,
    route: BpfHashMap<MapData, u64, [u64; 2]>,
    /// Per launch API id, its hits in slices (`CUDA_SLICE_API_HITS`).
    api_hits: PerCpuArray<MapData, u64>,
    budget: f64,
    launch_progs: Vec<OwnedFd>,
    /// When the driver launches left out were last put in a slice.
    rechecked: u64,
    /// When the last slice's probes started to go in, and our launch
    /// programs' hits while they did (before it opened).
    attach_started: u64,
    open_stray: u64,
}

impl Worker {
    fn run(mut self) {
        // The trap's cost over several attachments, before any slice (our
        // own calls then do not count as the targets').
        for _ in 0..TRAP_SAMPLES {
            for class in TrapClass::ALL {
                if let Some(ns) = self.measure_trap(class) {
                    lock(&self.inner).trap_sample(class, ns);
                }
            }
        }
        // Probes on all the time while within the budget; else slices.
        let mut sliced: Option<(u64, u64)> = None;
        let mut since_sweep = 0u32;
        while !self.stopped() {
            let was_sliced = sliced.is_some();
            let mut checked = self.open();
            let opened = checked.0;
            match sliced {
                Some((on, _)) => {
                    self.sleep(on);
                }
                None => loop {
                    if self.sleep(CHECK_NS) {
                        break;
                    }
                    // Measured in the part since the last check.
                    let share = self.take(checked, false);
                    checked = (clock::monotonic_ns(), self.runs());
                    if share > self.budget {
                        break;
                    }
                },
            }
            let (closed, stray) = self.close(checked);
            // From before the attachment to after the release.
            let held = clock::monotonic_ns().saturating_sub(self.attach_started);
            if self.stopped() {
                break;
            }
            let share = lock(&self.inner).max_share();
            let duty = if share <= 0.0 { 1.0 } else { (self.budget / share).clamp(MIN_DUTY, 1.0) };
            sliced = (duty < 1.0).then(|| {
                let on = ((duty * PERIOD_NS as f64) as u64).clamp(MIN_ON_NS, MAX_ON_NS);
                (on, ((on as f64 / duty) as u64).saturating_sub(on))
            });
            {
                let mut s = lock(&self.inner);
                s.duty = duty;
                s.share = share;
            }
            if let Some((_, off)) = sliced {
                // A period whose probes, stray hits included, cost the
                // budget: `share x slice + stray x trap` over it, the time
                // they were going in and out counted as part of it.
                let off = if was_sliced {
                    let cost = share * closed.saturating_sub(opened) as f64 + stray as f64 * lock(&self.inner).mean_trap_ns();
                    ((cost / self.budget) as u64).saturating_sub(held).max(off)
                } else {
                    off
                };
                lock(&self.inner).off_phases += 1;
                since_sweep += 1;
                if since_sweep >= SWEEP_EVERY {
                    since_sweep = 0;
                    self.sweep();
                }
                if self.sleep(off) {
                    break;
                }
            }
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `ns` or until stopped (true then).
    fn sleep(&self, ns: u64) -> bool {
        let end = clock::monotonic_ns().saturating_add(ns);
        loop {
            if self.stopped() {
                return true;
            }
            let now = clock::monotonic_ns();
            if now >= end {
                return false;
            }
            std::thread::sleep(Duration::from_nanos((end - now).min(5_000_000)));
        }
    }

    /// One sample of the trap's cost for `class`: our launch program
    /// attached anew to our own function of that class, in this process
    /// only (not a target: the program returns at once), timed against
    /// the same calls unprobed.
    fn measure_trap(&self, class: TrapClass) -> Option<f64> {
        let (path, offset) = calibrate::class_location(class).ok()?;
        let prog = self.launch_progs.first()?;
        let plain = calibrate::fastest((0..TRAP_ROUNDS).map(|_| calibrate::time_class(class, TRAP_CALLS * 10)).collect());
        let link = uprobe_multi::attach_pid(prog.as_fd(), std::path::Path::new(&path), &[offset], &[0], false, std::process::id()).ok()?;
        let probed = calibrate::fastest((0..TRAP_ROUNDS).map(|_| calibrate::time_class(class, TRAP_CALLS)).collect());
        drop(link);
        Some((probed - plain).max(0.0))
    }

    /// Launch API `api`'s hits in slices so far (all CPUs).
    fn api_hits_of(&self, api: u32) -> u64 {
        self.api_hits.get(&api, 0).map_or(0, |v| v.iter().sum())
    }

    /// The launch API hits since the last call, and their traps' cost.
    fn take_api_hits(&self, s: &mut Inner) -> (u64, f64) {
        let mut hits = 0;
        let mut trap_ns = 0.0;
        let apis: Vec<u32> = s.api_class.keys().copied().collect();
        for api in apis {
            let now = self.api_hits_of(api);
            let taken = s.api_taken.entry(api).or_default();
            let fresh = now.saturating_sub(*taken);
            *taken = now;
            hits += fresh;
            trap_ns += fresh as f64 * s.trap_of(api);
        }
        (hits, trap_ns)
    }

    /// Our launch programs' runs and run time so far.
    fn runs(&self) -> (u64, u64) {
        self.launch_progs
            .iter()
            .filter_map(|p| stats::of_fd(p.as_fd()))
            .fold((0, 0), |(n, t), r| (n + r.runs, t + r.run_ns))
    }

    /// Whether a target is a driver launch function its process reaches
    /// only through its runtime (left out of the slices but for a
    /// re-check).
    fn nested_only(&self, t: &SliceTarget) -> bool {
        let Some(key) = t.route else { return false };
        let [nested, direct] = self.route.get(&key, 0).unwrap_or([0, 0]);
        direct == 0 && nested >= HOT_NESTED
    }

    /// Attaches the groups and opens the slice; returns when it opened,
    /// and our programs' runs then.
    fn open(&mut self) -> (u64, (u64, u64)) {
        let now = clock::monotonic_ns();
        let recheck = now.saturating_sub(self.rechecked) >= RECHECK_EVERY_NS;
        self.attach_started = now;
        let runs_before = self.runs().0;
        let mut s = lock(&self.inner);
        // Groups of one process that exited go.
        s.targets.retain(|t| t.pid.is_none_or(procfs::exists));
        let mut links = Vec::with_capacity(s.targets.len());
        let mut errors = Vec::new();
        let mut left_out = false;
        for t in &s.targets {
            if !recheck && self.nested_only(t) {
                left_out = true;
                continue;
            }
            let attached = if recheck {
                Some(t.attach())
            } else {
                t.attach_only(|api| u32::try_from(api).is_ok_and(|a| self.api_hits_of(a) > 0))
            };
            match attached {
                Some(Ok(l)) => links.push(l),
                Some(Err(e)) => errors.push(e),
                None => left_out = true,
            }
        }
        if recheck || !left_out {
            self.rechecked = now;
        }
        for e in errors {
            if s.errors.len() < 4 && !s.errors.contains(&e) {
                s.errors.push(e);
            }
        }
        s.links = links;
        let now = clock::monotonic_ns();
        let _ = self.slice.set(1, u64::MAX, 0);
        let _ = self.slice.set(0, now, 0);
        s.open_since = Some(now);
        drop(s);
        let runs = self.runs();
        // Those hits were before the slice opened (a race with the
        // opening only moves a hit or two).
        self.open_stray = runs.0.saturating_sub(runs_before);
        (now, runs)
    }

    /// The kernel's per-thread launches now, less those already taken.
    fn new_hits(&self, seen: &HashMap<u32, u64>) -> HashMap<u32, u64> {
        self.hits
            .iter()
            .filter_map(Result::ok)
            .map(|(tid, n)| (tid, n.saturating_sub(seen.get(&tid).copied().unwrap_or(0))))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Takes the launches and our programs' runs since `since` (a slice's
    /// opening or its last check) into the accounts; returns the largest
    /// share of a thread's time the probes took then. `closing`: the slice
    /// closed, it counts as one.
    fn take(&self, (since, (_, run_ns0)): (u64, (u64, u64)), closing: bool) -> f64 {
        let now = clock::monotonic_ns();
        let (_, run_ns) = self.runs();
        let mut s = lock(&self.inner);
        let fresh = self.new_hits(&s.seen);
        let launches: u64 = fresh.values().sum();
        // This part's own traps per launch (a driver launch probed too, or
        // not; each API at its class's cost) and its programs' run time.
        let (hits, trap_ns) = self.take_api_hits(&mut s);
        let part = Runs { hits, trap_ns, run_ns: run_ns.saturating_sub(run_ns0), launches };
        let per_launch = part
            .per_launch()
            .or_else(|| s.runs.per_launch())
            .unwrap_or((s.trap_ns[TrapClass::Stepped.index()], 1000.0));
        let cost = per_launch.0 + per_launch.1;
        if launches > 0 {
            s.runs.hits += part.hits;
            s.runs.trap_ns += part.trap_ns;
            s.runs.run_ns += part.run_ns;
            s.runs.launches += launches;
        }
        s.account(&fresh, since, now, per_launch);
        s.on_ns += now.saturating_sub(since);
        s.slices += u64::from(closing);
        let length = now.saturating_sub(since);
        if length == 0 {
            return 0.0;
        }
        fresh.values().map(|n| (*n as f64 * cost / length as f64).min(1.0)).fold(0.0, f64::max)
    }

    /// Closes the slice (the part since `since` is taken), then releases
    /// the probes. Releasing a link takes out its breakpoints, then waits
    /// for the kernel (30-100 ms each on this VM, Linux 6.18): one link
    /// after the other, the last one's breakpoints stayed in ~0.6 s after
    /// a 20 ms slice, trapping uncounted. So they are released together.
    ///
    /// Returns when the slice closed, and the hits outside it (while its
    /// probes went in and came out: paid, not counted).
    fn close(&mut self, since: (u64, (u64, u64))) -> (u64, u64) {
        let closed = clock::monotonic_ns();
        let _ = self.slice.set(1, closed, 0);
        let at_close = self.runs().0;
        self.take(since, true);
        let links = {
            let mut s = lock(&self.inner);
            s.open_since = None;
            std::mem::take(&mut s.links)
        };
        // Released together (their waits overlap), quietly: a slice's few.
        crate::engine::release::release_all(links, "CUDA launch slice probes", true);
        let stray = self.runs().0.saturating_sub(at_close) + self.open_stray;
        let mut s = lock(&self.inner);
        s.stray_hits += stray;
        s.stray_ns += stray as f64 * s.mean_trap_ns();
        drop(s);
        (closed, stray)
    }

    /// Ends the accounts of threads that exited, at their last launch, and
    /// forgets their kernel entries (between slices: nothing counts then).
    fn sweep(&mut self) {
        let gone: Vec<u32> = self.hits.keys().filter_map(Result::ok).filter(|t| !procfs::exists(*t)).collect();
        let mut s = lock(&self.inner);
        for t in gone {
            let _ = self.hits.remove(&t);
            s.seen.remove(&t);
            if let Some(a) = s.threads.get_mut(&t) {
                let last = a.last;
                a.end.get_or_insert(last);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::cuda::api;

    /// A thread: untraced 10 us per launch; 2 hits per launch at 8 us of
    /// trap and 2 us of program each: 30 us per launch counted; 100 ms
    /// counted.
    fn inner() -> Inner {
        let acc = ThreadAcc {
            n: 3333,
            on: 100_000_000,
            trap_ns: 6666.0 * 8000.0,
            program_ns: 3333.0 * 4000.0,
            first: 0,
            last: 0,
            end: None,
        };
        Inner {
            on_ns: acc.on,
            off_phases: 1,
            slices: 1,
            threads: [(7, acc)].into_iter().collect(),
            runs: Runs { hits: 6666, trap_ns: 6666.0 * 8000.0, run_ns: 3333 * 4000, launches: 3333 },
            trap_ns: [8000.0; 3],
            ..Default::default()
        }
    }

    #[test]
    fn untraced_rate_extrapolates_the_time_not_counted() {
        let s = inner();
        assert!((s.cost_per_launch() - 20_000.0).abs() < 100.0);
        assert!((s.g0(7).expect("g0") - 10_000.0).abs() < 100.0);
        assert!((s.max_share() - 2.0 / 3.0).abs() < 0.01);
        // 1 s in all: 3333 seen + 900 ms not counted at 10 us.
        let e = 3333.0 * scale_of(&s, 7, 1_000_000_000);
        assert!((e - 93_333.0).abs() < 300.0, "{e}");
    }

    /// Stray traps (probes going in and out) took 100 ms of the 900 ms
    /// not counted: 800 ms at 10 us.
    #[test]
    fn time_in_stray_traps_makes_no_launches() {
        let mut s = inner();
        s.stray_ns = 100_000_000.0;
        let e = 3333.0 * scale_of(&s, 7, 1_000_000_000);
        assert!((e - 83_333.0).abs() < 300.0, "{e}");
    }

    #[test]
    fn exact_while_never_off_and_unknown_threads_keep_their_count() {
        let mut s = inner();
        s.off_phases = 0;
        assert_eq!(scale_of(&s, 7, 1_000_000_000), 1.0);
        s.off_phases = 1;
        assert_eq!(scale_of(&s, 8, 1_000_000_000), 1.0);
    }

    #[test]
    fn untraced_time_is_never_below_a_floor() {
        let mut s = inner();
        s.threads.get_mut(&7).expect("thread").trap_ns = 1e12;
        let t1 = 100_000_000.0 / 3333.0;
        assert!((s.g0(7).expect("g0") - t1 * MIN_EFFECTIVE).abs() < 1e-6);
    }

    #[test]
    fn a_thread_gone_is_extrapolated_to_its_last_launch_only() {
        let mut s = inner();
        s.threads.get_mut(&7).expect("thread").end = Some(500_000_000);
        let e = 3333.0 * scale_of(&s, 7, 1_000_000_000);
        // 400 ms not counted before its last launch, at 10 us.
        assert!((e - (3333.0 + 40_000.0)).abs() < 300.0, "{e}");
    }

    #[test]
    fn accounting_starts_at_a_threads_first_launch() {
        let mut s = Inner::default();
        s.account(&HashMap::new(), 0, 10, (1.0, 1.0));
        s.account(&[(5, 3)].into_iter().collect(), 10, 30, (2.0, 5.0));
        s.account(&HashMap::new(), 30, 40, (4.0, 4.0));
        let a = s.threads[&5];
        assert_eq!((a.n, a.on, a.first, a.last, a.trap_ns, a.program_ns), (3, 30, 10, 30, 6.0, 15.0));
    }

    #[test]
    fn the_trap_cost_is_the_mean_of_its_samples() {
        let mut s = Inner { trap_ns: [20.0; 3], trap_samples: [1; 3], ..Default::default() };
        s.trap_sample(TrapClass::Stepped, 26.0);
        s.trap_sample(TrapClass::Stepped, 26.0);
        assert!((s.trap_ns[TrapClass::Stepped.index()] - 24.0).abs() < 1e-9);
        assert_eq!(s.trap_ns[TrapClass::Branch.index()], 20.0);
    }

    /// Each API's hits at its own class's cost: an emulated runtime
    /// launch (1 us) and a stepped driver launch under it (30 us) cost 31
    /// us a launch, not twice either.
    #[test]
    fn hits_are_priced_by_their_functions_class() {
        let mut s = Inner { trap_ns: [1000.0, 2000.0, 30_000.0], ..Default::default() };
        s.api_class.insert(api::LAUNCH, TrapClass::Branch);
        s.api_class.insert(api::CU_LAUNCH, TrapClass::Stepped);
        assert_eq!(s.trap_of(api::LAUNCH) + s.trap_of(api::CU_LAUNCH), 31_000.0);
        // Unknown: priced as stepped.
        assert_eq!(s.trap_of(api::LAUNCH_EX_C), 30_000.0);
        s.runs = Runs { hits: 200, trap_ns: 100.0 * 31_000.0, run_ns: 100 * 500, launches: 100 };
        assert!((s.cost_per_launch() - 31_500.0).abs() < 1e-6);
        assert!((s.mean_trap_ns() - 15_500.0).abs() < 1e-6);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_target_reads_the_class_of_each_function_from_its_file() {
        let dir = std::env::temp_dir().join(format!("infertrace-slicer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("lib.bin");
        // jmp at 0, push %rbp at 8, mov at 16.
        let mut bytes = vec![0u8; 24];
        bytes[0] = 0xe9;
        bytes[8] = 0x55;
        bytes[16..19].copy_from_slice(&[0x48, 0x89, 0xe5]);
        std::fs::write(&path, &bytes).expect("write");
        let file = Arc::new(File::open(&path).expect("open"));
        let prog: OwnedFd = File::open(&path).expect("open").into();
        let t = SliceTarget {
            prog,
            file,
            offsets: vec![0, 8, 16, 400],
            cookies: vec![u64::from(api::LAUNCH), u64::from(api::LAUNCH_PTSZ), u64::from(api::CU_LAUNCH), u64::from(api::CU_LAUNCH_EX)],
            pid: None,
            route: None,
            what: "test".into(),
        };
        let got = t.trap_classes();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            got,
            vec![
                (api::LAUNCH, TrapClass::Branch),
                (api::LAUNCH_PTSZ, TrapClass::Push),
                (api::CU_LAUNCH, TrapClass::Stepped),
                (api::CU_LAUNCH_EX, TrapClass::Stepped),
            ]
        );
    }
}
