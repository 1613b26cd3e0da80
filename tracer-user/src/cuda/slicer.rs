//! `--max-overhead PCT`: the CUDA launch probes in time slices, sized so
//! that what they add stays within the budget, and the launch counts
//! estimated from the slices (docs/overhead.md, "An overhead budget").
//!
//! Launches are the highest-rate CUDA calls (thousands per second in a
//! PyTorch step), and each probe hit is a trap that costs microseconds:
//! more than the launch itself. With a budget, every launch function
//! (runtime and driver) is probed by a thread of its own, not by the
//! collector: it attaches their links, opens the kernel's slice
//! (`CUDA_SLICE`: only launches inside it count), and measures, per thread
//! of the targets, the share of its time the hits took (hits in the slice
//! x the per-hit cost: the calibrated uprobe trap plus our program's
//! measured mean run time). While that share is within the budget the
//! probes stay on and every launch counts. Past it, the probes are taken
//! off and put back in slices: on for `duty x 1 s` (2 ms to 100 ms), then
//! off for the rest of the period, `duty = budget / share`, re-sized after
//! every slice.
//!
//! The estimate, per thread: its launches seen in the slices, times the
//! time it was traced over the untraced time the slices stood for. During
//! a slice the thread ran slower (the traps are in its time), so its
//! untraced-equivalent on-time is the slices' length minus its hits x the
//! per-hit cost: `count x (1 + (W - on) / (on - hits x cost))`, where `W`
//! runs from the first slice to the window's end. A thread that lived for
//! part of the window only is estimated as if it had lived through it (an
//! over-estimate; said in the docs).

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

use crate::{clock, overhead::stats, probe::ProbeError, procfs, recording::cuda::LaunchSampling, uprobe_multi};

/// The period a slice's on-time is a share of.
const PERIOD_NS: u64 = 1_000_000_000;
/// The shortest and longest slice.
const MIN_ON_NS: u64 = 2_000_000;
const MAX_ON_NS: u64 = 100_000_000;
/// The smallest share of the time the launches are probed.
const MIN_DUTY: f64 = 0.001;
/// While the probes stay on: how often the share is measured.
const CHECK_NS: u64 = 10_000_000;
/// A calibration slice while the probes are otherwise on.
const CAL_NS: u64 = 20_000_000;
/// Every this many counting slices, one calibration slice.
const CAL_EVERY: u64 = 3;
/// What the calibration slices (each hit twice) add to the probes' cost.
const CAL_WEIGHT: f64 = 1.0 + 1.0 / CAL_EVERY as f64;
/// Before any calibration slice, a guessed share past this part of the
/// budget is measured in the targets (the guess can be several times low).
const GUESS_MARGIN: f64 = 0.25;
/// A slice's untraced-equivalent time is at least this part of it.
const MIN_EFFECTIVE: f64 = 0.05;
/// The per-hit cost when the calibration could not measure it (ns).
const FALLBACK_UPROBE_NS: f64 = 5_000.0;
/// Thread ids kept (the oldest dropped past it).
const MAX_THREADS: usize = 65_536;

/// One group of launch functions to probe in slices: a loaded program,
/// the file (kept open: attached through `/proc/self/fd/N`), the functions'
/// offsets and cookies, in every process or in one.
pub struct SliceTarget {
    pub prog: OwnedFd,
    pub file: Arc<File>,
    pub offsets: Vec<u64>,
    pub cookies: Vec<u64>,
    pub pid: Option<u32>,
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

#[derive(Default)]
struct Inner {
    targets: Vec<SliceTarget>,
    /// Attached now (an on phase).
    links: Vec<OwnedFd>,
    /// The slice open since then (ns), and whether it calibrates.
    open_since: Option<(u64, bool)>,
    /// The first slice's start: what the estimates extrapolate from.
    first: Option<u64>,
    /// Length of the closed counting slices, and of the calibration ones.
    on_ns: u64,
    cal_ns: u64,
    slices: u64,
    cal_slices: u64,
    /// Time with the probes off (closed slices' gaps).
    off_phases: u64,
    /// Per thread seen launching: what the slices saw of it.
    threads: HashMap<u32, ThreadAcc>,
    /// The kernel's count per thread at the last read.
    seen: HashMap<u32, u64>,
    /// The calibrated cost of one hit (trap + our program), until the
    /// calibration slices measured it in the targets.
    guess_ns: f64,
    duty: f64,
    /// The largest share of a thread's time the probes took while on.
    share: f64,
    /// Why a slice could not be probed (first few).
    errors: Vec<String>,
    /// Set by [`LaunchSlicer::finish`]: no slice opens again.
    done: bool,
}

/// One thread in the slices since the first in which it launched (a
/// thread that starts launching late, or stops living, is not taken as
/// idle before or after).
#[derive(Clone, Copy, Debug, Default)]
struct ThreadAcc {
    /// Launches in counting slices, and in calibration slices (each
    /// counted twice there: probed twice).
    n1: u64,
    n2: u64,
    /// Counting and calibration time since its first.
    on: u64,
    cal: u64,
    /// Start of the first slice (or check) it launched in; when it was
    /// found gone.
    first: u64,
    end: Option<u64>,
}

/// What the slices say of one thread: its time per launch traced (`t1`)
/// and untraced (`g0`), and the probes' cost per launch.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Model {
    t1: f64,
    g0: f64,
    cost: f64,
}

impl Inner {
    /// The model of thread `tid` (None before it was seen in a counting slice).
    fn model(&self, tid: u32) -> Option<Model> {
        let a = self.threads.get(&tid)?;
        let n1 = a.n1 as f64;
        if n1 <= 0.0 || a.on == 0 {
            return None;
        }
        let t1 = a.on as f64 / n1;
        // Each launch counted twice in a calibration slice (probed twice).
        let n2 = a.n2 as f64 / 2.0;
        let measured = (n2 > 0.0 && a.cal > 0).then(|| a.cal as f64 / n2 - t1).filter(|c| *c > 0.0);
        let cost = measured.unwrap_or(self.guess_ns);
        let g0 = (t1 - cost).clamp(t1 * MIN_EFFECTIVE, t1);
        Some(Model { t1, g0, cost })
    }

    /// The largest share of a thread's time the probes take while on.
    fn max_share(&self) -> f64 {
        self.threads.keys().filter_map(|t| self.model(*t)).map(|m| (m.cost / m.t1).min(1.0)).fold(0.0, f64::max)
    }

    /// Takes what the kernel counted over `[start, now)` (a slice, or part
    /// of one) into the threads' accounts; returns the fresh launches.
    fn account(&mut self, fresh: &HashMap<u32, u64>, start: u64, now: u64, cal: bool) {
        let length = now.saturating_sub(start);
        for tid in fresh.keys() {
            self.threads.entry(*tid).or_insert(ThreadAcc { first: start, ..Default::default() });
        }
        for (tid, a) in self.threads.iter_mut().filter(|(_, a)| a.end.is_none()) {
            let n = fresh.get(tid).copied().unwrap_or(0);
            if cal {
                a.cal += length;
                a.n2 += n;
            } else {
                a.on += length;
                a.n1 += n;
            }
        }
        for (tid, n) in fresh {
            *self.seen.entry(*tid).or_default() += n;
        }
        if self.threads.len() > MAX_THREADS {
            // The ended first.
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
    /// (0: not measured); `launch_prog`: the launch program, whose run
    /// statistics give our own part of a hit.
    pub fn start(
        budget_pct: f64,
        uprobe_ns: f64,
        launch_prog: OwnedFd,
        fds: &uprobe_multi::MapFds,
    ) -> Result<Self, ProbeError> {
        let mut slice: Array<MapData, u64> =
            Array::try_from(map_from(fds, "CUDA_SLICE")?).map_err(|e| ProbeError::map("CUDA_SLICE", e))?;
        let hits: BpfHashMap<MapData, u32, u64> =
            BpfHashMap::try_from(map_from(fds, "CUDA_SLICE_HITS")?).map_err(|e| ProbeError::map("CUDA_SLICE_HITS", e))?;
        // Sampled from now on: nothing counts until a slice opens.
        slice.set(1, 1, 0).map_err(|e| ProbeError::map("CUDA_SLICE", e))?;
        slice.set(0, 1, 0).map_err(|e| ProbeError::map("CUDA_SLICE", e))?;
        let uprobe_ns = if uprobe_ns > 0.0 { uprobe_ns } else { FALLBACK_UPROBE_NS };
        let inner = Arc::new(Mutex::new(Inner { guess_ns: uprobe_ns, duty: 1.0, ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker { inner: inner.clone(), stop: stop.clone(), slice, hits, budget: budget_pct / 100.0, uprobe_ns, launch_prog };
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
        if let Some((_, cal)) = s.open_since.filter(|_| !s.done) {
            let times = if cal { 2 } else { 1 };
            for _ in 0..times {
                let link = t.attach()?;
                s.links.push(link);
            }
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
        let span = s.first.map_or(0, |f| now.saturating_sub(f));
        LaunchSampling {
            budget_percent: self.budget_pct,
            probed_ns: s.on_ns,
            calibration_ns: s.cal_ns,
            span_ns: span,
            slices: s.slices,
            calibration_slices: s.cal_slices,
            duty: s.duty,
            probe_share: s.share,
            per_hit_ns: s.threads.keys().filter_map(|t| s.model(*t)).map(|m| m.cost).fold(0.0, f64::max),
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

impl Drop for LaunchSlicer {
    fn drop(&mut self) {
        drop(self.finish());
    }
}

fn estimating(s: &Inner) -> bool {
    s.off_phases > 0 || s.cal_slices > 0
}

/// A thread's launches seen, `n`, stand for `n + (span - counting time)
/// / g0`: those of the time not counted at its untraced rate. The factor
/// (applied to each of its kernels and sites).
fn scale_of(s: &Inner, tid: u32, now: u64) -> f64 {
    if !estimating(s) {
        return 1.0;
    }
    let (Some(m), Some(a)) = (s.model(tid), s.threads.get(&tid)) else { return 1.0 };
    let span = a.end.unwrap_or(now).min(now).saturating_sub(a.first);
    let uncounted = span.saturating_sub(a.on) as f64;
    1.0 + uncounted / (m.g0 * a.n1 as f64)
}

struct Worker {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    slice: Array<MapData, u64>,
    hits: BpfHashMap<MapData, u32, u64>,
    budget: f64,
    uprobe_ns: f64,
    launch_prog: OwnedFd,
}

impl Worker {
    fn run(mut self) {
        // Probes on all the time while within the budget; else slices.
        let mut sliced: Option<(u64, u64)> = None;
        let mut next_cal = false;
        let mut since_sweep = 0u32;
        while !self.stopped() {
            let cal = next_cal;
            let mut checked = self.open(cal);
            match sliced {
                Some((on, _)) => {
                    self.sleep(on);
                }
                None if cal => {
                    self.sleep(CAL_NS);
                }
                None => loop {
                    if self.sleep(CHECK_NS) {
                        break;
                    }
                    // A share over the budget (measured, or guessed
                    // before any calibration) ends the phase.
                    let now = clock::monotonic_ns();
                    let share = self.share_since(checked, now);
                    checked = now;
                    if share > self.budget * if self.calibrated() { 1.0 } else { GUESS_MARGIN } {
                        break;
                    }
                },
            }
            self.close(checked, cal);
            if self.stopped() {
                break;
            }
            let (share, calibrated, slices) = {
                let s = lock(&self.inner);
                (s.max_share(), s.cal_slices > 0, s.slices)
            };
            if !calibrated {
                // Measure the cost in the targets before deciding.
                next_cal = true;
                continue;
            }
            let duty = if share <= 0.0 { 1.0 } else { (self.budget / (share * CAL_WEIGHT)).clamp(MIN_DUTY, 1.0) };
            sliced = (duty < 1.0).then(|| {
                let on = ((duty * PERIOD_NS as f64) as u64).clamp(MIN_ON_NS, MAX_ON_NS);
                (on, ((on as f64 / duty) as u64).saturating_sub(on))
            });
            next_cal = sliced.is_some() && !cal && slices % CAL_EVERY == 0;
            {
                let mut s = lock(&self.inner);
                s.duty = duty;
                s.share = share;
            }
            if let Some((_, off)) = sliced {
                lock(&self.inner).off_phases += 1;
                since_sweep += 1;
                if since_sweep >= 20 {
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

    fn calibrated(&self) -> bool {
        lock(&self.inner).cal_slices > 0
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

    /// Attaches every group (twice to calibrate) and opens the slice;
    /// returns when it opened.
    fn open(&mut self, cal: bool) -> u64 {
        let mut s = lock(&self.inner);
        // Groups of one process that exited go.
        s.targets.retain(|t| t.pid.is_none_or(procfs::exists));
        let mut links = Vec::with_capacity(s.targets.len() * 2);
        let mut errors = Vec::new();
        for t in &s.targets {
            for _ in 0..if cal { 2 } else { 1 } {
                match t.attach() {
                    Ok(l) => links.push(l),
                    Err(e) => errors.push(e),
                }
            }
        }
        for e in errors {
            if s.errors.len() < 4 && !s.errors.contains(&e) {
                s.errors.push(e);
            }
        }
        s.links = links;
        let now = clock::monotonic_ns();
        let _ = self.slice.set(2, u64::from(cal), 0);
        let _ = self.slice.set(1, u64::MAX, 0);
        let _ = self.slice.set(0, now, 0);
        s.open_since = Some((now, cal));
        s.first.get_or_insert(now);
        now
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

    /// The per-hit cost guessed from the calibration at startup: the trap
    /// plus our launch program's mean run time.
    fn guess_ns(&self) -> f64 {
        let prog = stats::of_fd(self.launch_prog.as_fd())
            .filter(|r| r.runs > 0)
            .map_or(0.0, |r| r.run_ns as f64 / r.runs as f64);
        self.uprobe_ns + prog
    }

    /// Accounts `[since, now)` of a counting phase left on, and returns
    /// the largest share of a thread's time the probes took in it: its
    /// launches x the cost per launch (measured by the calibration
    /// slices, else guessed).
    fn share_since(&self, since: u64, now: u64) -> f64 {
        let mut s = lock(&self.inner);
        let fresh = self.new_hits(&s.seen);
        s.account(&fresh, since, now, false);
        s.on_ns += now.saturating_sub(since);
        if now <= since {
            return 0.0;
        }
        fresh
            .iter()
            .map(|(tid, n)| {
                let cost = s.model(*tid).map_or(s.guess_ns, |m| m.cost);
                (*n as f64 * cost / (now - since) as f64).min(1.0)
            })
            .fold(0.0, f64::max)
    }

    /// Closes the slice, releases the probes, takes the slice's launches
    /// since `opened` (its start, or its last check).
    fn close(&mut self, opened: u64, cal: bool) {
        let now = clock::monotonic_ns();
        let _ = self.slice.set(1, now, 0);
        let links = {
            let mut s = lock(&self.inner);
            s.open_since = None;
            std::mem::take(&mut s.links)
        };
        // Closing waits for the kernel; the breakpoints go first.
        drop(links);
        let guess = self.guess_ns();
        let mut s = lock(&self.inner);
        let fresh = self.new_hits(&s.seen);
        let length = now.saturating_sub(opened);
        s.account(&fresh, opened, now, cal);
        if cal {
            s.cal_ns += length;
            s.cal_slices += 1;
        } else {
            s.on_ns += length;
            s.slices += 1;
        }
        s.guess_ns = guess;
    }

    /// Forgets the kernel's entries of threads that exited (between
    /// slices: nothing counts then).
    fn sweep(&mut self) {
        let gone: Vec<u32> = self.hits.keys().filter_map(Result::ok).filter(|t| !procfs::exists(*t)).collect();
        let now = clock::monotonic_ns();
        let mut s = lock(&self.inner);
        for t in gone {
            let _ = self.hits.remove(&t);
            s.seen.remove(&t);
            if let Some(a) = s.threads.get_mut(&t) {
                a.end.get_or_insert(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inner(on_ns: u64, cal_ns: u64, counted: u64, calibrating: u64, guess: f64) -> Inner {
        let acc = ThreadAcc { n1: counted, n2: calibrating, on: on_ns, cal: cal_ns, first: 0, end: None };
        Inner {
            on_ns,
            cal_ns,
            first: Some(0),
            off_phases: 1,
            slices: 1,
            cal_slices: u64::from(cal_ns > 0),
            threads: [(7, acc)].into_iter().collect(),
            guess_ns: guess,
            ..Default::default()
        }
    }

    #[test]
    fn the_calibration_slices_measure_the_cost_per_launch() {
        // Untraced 10 us per launch, 20 us of probes: 30 us traced, 50 us
        // probed twice. 100 ms counting (3333 launches), 100 ms calibrating
        // (2000 launches, each counted twice).
        let s = inner(100_000_000, 100_000_000, 3333, 4000, 5000.0);
        let m = s.model(7).expect("model");
        assert!((m.cost - 20_000.0).abs() < 100.0, "{m:?}");
        assert!((m.g0 - 10_000.0).abs() < 100.0, "{m:?}");
        assert!((s.max_share() - 2.0 / 3.0).abs() < 0.01);
        // 1 s in all: 3333 seen + 900 ms not counted (the calibration's
        // launches are not counted either) at 10 us = 93,333.
        let e = 3333.0 * scale_of(&s, 7, 1_000_000_000);
        assert!((e - 93_333.0).abs() < 200.0, "{e}");
    }

    #[test]
    fn without_calibration_the_guess_is_used_and_exact_counts_stay() {
        let s = inner(100_000_000, 0, 3333, 0, 20_000.0);
        assert!((s.model(7).expect("model").g0 - 10_000.0).abs() < 100.0);
        let mut exact = inner(1_000_000_000, 0, 10, 0, 5000.0);
        exact.off_phases = 0;
        exact.cal_slices = 0;
        assert_eq!(scale_of(&exact, 7, 1_000_000_000), 1.0);
        // A thread never seen in a counting slice keeps its count.
        assert_eq!(scale_of(&s, 8, 1_000_000_000), 1.0);
    }

    #[test]
    fn untraced_time_is_never_below_a_floor() {
        // A cost measured above the traced time (noise) leaves 5% of it.
        let s = inner(100_000_000, 100_000_000, 1000, 200, 5000.0);
        let m = s.model(7).expect("model");
        assert!((m.g0 - m.t1 * MIN_EFFECTIVE).abs() < 1e-6, "{m:?}");
    }
}
