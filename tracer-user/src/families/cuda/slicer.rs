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

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};

use super::{HOT_NESTED, RECHECK_EVERY_NS};
use crate::{os::clock, os::{bpf_stats as stats, trap_timing as calibrate}, os::probe::ProbeError, os::procfs, recording::cuda::LaunchSampling, os::uprobe_multi};

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
    fn attach(&self) -> Result<OwnedFd, String> {
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        let r = match self.pid {
            Some(pid) => uprobe_multi::attach_pid(self.prog.as_fd(), &path, &self.offsets, &self.cookies, false, pid),
            None => uprobe_multi::attach(self.prog.as_fd(), &path, &self.offsets, &self.cookies, false),
        };
        r.map_err(|e| format!("probing {} in a slice failed: {e}", self.what))
    }
}

/// Our programs' work over some slices.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Runs {
    runs: u64,
    run_ns: u64,
    launches: u64,
}

impl Runs {
    /// Program runs (probe hits) and run time per launch.
    fn per_launch(&self) -> Option<(f64, f64)> {
        (self.launches > 0).then(|| (self.runs as f64 / self.launches as f64, self.run_ns as f64 / self.launches as f64))
    }
}

/// One thread, since the first slice (or check) in which it launched.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ThreadAcc {
    /// Launches counted.
    n: u64,
    /// Counting time since its first.
    on: u64,
    /// What the probes cost it in that time: the hits of its launches
    /// (each slice's launches of it times that slice's hits per launch:
    /// its driver launch probed too, or not), and our programs' run time
    /// for them (ns).
    hits: f64,
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
    /// The trap's cost: the mean of the samples (the startup calibration's,
    /// then [`TRAP_SAMPLES`] when slicing starts), each taken on our own
    /// binary with the probe attached anew (its cost was seen to differ
    /// from one attachment to the next, 19-28 us here, while a target's
    /// slices, each attached anew, average them).
    uprobe_ns: f64,
    trap_samples: u64,
    duty: f64,
    /// The largest share of a thread's time the probes took while on.
    share: f64,
    /// Why a slice could not be probed (first few).
    errors: Vec<String>,
    /// Set by [`LaunchSlicer::finish`]: no slice opens again.
    done: bool,
}

impl Inner {
    /// The probes' cost per launch counted: our launch programs' runs
    /// per launch (a runtime launch whose driver launch is probed too is
    /// two) times the trap's calibrated cost, plus their measured run time.
    fn cost_per_launch(&self) -> f64 {
        let (hits, program) = self.runs.per_launch().unwrap_or((1.0, 1000.0));
        hits * self.uprobe_ns + program
    }

    /// What the probes cost a thread so far (ns).
    fn probes_ns(&self, a: &ThreadAcc) -> f64 {
        a.hits * self.uprobe_ns + a.program_ns
    }

    /// Thread `tid`'s untraced time per launch (None before it was
    /// counted): its counting time less what the probes cost it, per launch.
    fn g0(&self, tid: u32) -> Option<f64> {
        let a = self.threads.get(&tid).filter(|a| a.n > 0 && a.on > 0)?;
        let t1 = a.on as f64 / a.n as f64;
        Some(((a.on as f64 - self.probes_ns(a)) / a.n as f64).clamp(t1 * MIN_EFFECTIVE, t1))
    }

    /// Takes one more sample of the trap's cost.
    fn trap_sample(&mut self, ns: f64) {
        self.trap_samples += 1;
        self.uprobe_ns += (ns - self.uprobe_ns) / self.trap_samples as f64;
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
    /// one), each with `hits` probe hits and `program_ns` of our programs,
    /// into the threads' accounts.
    fn account(&mut self, fresh: &HashMap<u32, u64>, start: u64, now: u64, (hits, program_ns): (f64, f64)) {
        let length = now.saturating_sub(start);
        for tid in fresh.keys() {
            self.threads.entry(*tid).or_insert(ThreadAcc { first: start, ..Default::default() });
        }
        for (tid, a) in self.threads.iter_mut().filter(|(_, a)| a.end.is_none()) {
            a.on += length;
            if let Some(n) = fresh.get(tid) {
                a.n += n;
                a.hits += *n as f64 * hits;
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
        // Sampled from now on: nothing counts until a slice opens.
        slice.set(1, 1, 0).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE, e))?;
        slice.set(0, 1, 0).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_SLICE, e))?;
        let uprobe_ns = if uprobe_ns > 0.0 { uprobe_ns } else { FALLBACK_UPROBE_NS };
        let inner = Arc::new(Mutex::new(Inner { uprobe_ns, trap_samples: 1, duty: 1.0, ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            inner: inner.clone(),
            stop: stop.clone(),
            slice,
            hits,
            route,
            budget: budget_pct / 100.0,
            launch_progs,
            rechecked: 0,
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
        let mut s = lock(&self.inner);
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
            trap_ns: s.uprobe_ns,
            sampled_launches: sampled,
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
    let uncounted = span.saturating_sub(a.on) as f64;
    1.0 + uncounted / (g0 * a.n as f64)
}

struct Worker {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    slice: Array<MapData, u64>,
    hits: BpfHashMap<MapData, u32, u64>,
    route: BpfHashMap<MapData, u64, [u64; 2]>,
    budget: f64,
    launch_progs: Vec<OwnedFd>,
    /// When the driver launches left out were last put in a slice.
    rechecked: u64,
}

impl Worker {
    fn run(mut self) {
        // The trap's cost over several attachments, before any slice (our
        // own calls then do not count as the targets').
        for _ in 0..TRAP_SAMPLES {
            if let Some(ns) = self.measure_trap() {
                lock(&self.inner).trap_sample(ns);
            }
        }
        // Probes on all the time while within the budget; else slices.
        let mut sliced: Option<(u64, u64)> = None;
        let mut since_sweep = 0u32;
        while !self.stopped() {
            let mut checked = self.open();
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
            self.close(checked);
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

    /// One sample of the trap's cost: our launch program attached anew to
    /// our own calibration function, in this process only (not a target:
    /// the program returns at once), timed against the same calls
    /// unprobed.
    fn measure_trap(&self) -> Option<f64> {
        let (path, offset) = calibrate::target_location().ok()?;
        let prog = self.launch_progs.first()?;
        let plain = calibrate::fastest((0..TRAP_ROUNDS).map(|_| calibrate::time_target(TRAP_CALLS * 10)).collect());
        let link = uprobe_multi::attach_pid(prog.as_fd(), std::path::Path::new(&path), &[offset], &[0], false, std::process::id()).ok()?;
        let probed = calibrate::fastest((0..TRAP_ROUNDS).map(|_| calibrate::time_target(TRAP_CALLS)).collect());
        drop(link);
        Some((probed - plain).max(0.0))
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
            match t.attach() {
                Ok(l) => links.push(l),
                Err(e) => errors.push(e),
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
        (now, self.runs())
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
    fn take(&self, (since, (runs0, run_ns0)): (u64, (u64, u64)), closing: bool) -> f64 {
        let now = clock::monotonic_ns();
        let (runs, run_ns) = self.runs();
        let mut s = lock(&self.inner);
        let fresh = self.new_hits(&s.seen);
        let launches: u64 = fresh.values().sum();
        // This part's own hits per launch (a driver launch probed too, or
        // not) and its programs' run time.
        let part = Runs { runs: runs.saturating_sub(runs0), run_ns: run_ns.saturating_sub(run_ns0), launches };
        let per_launch = part.per_launch().or_else(|| s.runs.per_launch()).unwrap_or((1.0, 1000.0));
        let cost = per_launch.0 * s.uprobe_ns + per_launch.1;
        if launches > 0 {
            s.runs.runs += part.runs;
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
    /// the probes.
    fn close(&mut self, since: (u64, (u64, u64))) {
        let _ = self.slice.set(1, clock::monotonic_ns(), 0);
        self.take(since, true);
        let links = {
            let mut s = lock(&self.inner);
            s.open_since = None;
            std::mem::take(&mut s.links)
        };
        // Closing waits for the kernel; the breakpoints go first.
        drop(links);
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

    /// A thread: untraced 10 us per launch; 2 hits per launch at 8 us of
    /// trap and 2 us of program each: 30 us per launch counted; 100 ms
    /// counted.
    fn inner() -> Inner {
        let acc = ThreadAcc { n: 3333, on: 100_000_000, hits: 6666.0, program_ns: 3333.0 * 4000.0, first: 0, last: 0, end: None };
        Inner {
            on_ns: acc.on,
            off_phases: 1,
            slices: 1,
            threads: [(7, acc)].into_iter().collect(),
            runs: Runs { runs: 6666, run_ns: 3333 * 4000, launches: 3333 },
            uprobe_ns: 8000.0,
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
        s.threads.get_mut(&7).expect("thread").hits = 1e12;
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
        assert_eq!((a.n, a.on, a.first, a.last, a.hits, a.program_ns), (3, 30, 10, 30, 6.0, 15.0));
    }

    #[test]
    fn the_trap_cost_is_the_mean_of_its_samples() {
        let mut s = Inner { uprobe_ns: 20.0, trap_samples: 1, ..Default::default() };
        s.trap_sample(26.0);
        s.trap_sample(26.0);
        assert!((s.uprobe_ns - 24.0).abs() < 1e-9);
    }
}
