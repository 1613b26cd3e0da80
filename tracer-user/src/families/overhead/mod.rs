//! The tracer's account of its own cost, in every recording
//! (`tracer_overhead`; docs/report-schema.md and docs/overhead.md).
//!
//! Two collectors share one state: [`OverheadStart`], first in the list,
//! turns the kernel's BPF run statistics on and calibrates the probe
//! mechanism ([`calibrate`]) before any other family attaches, then opens
//! the window (the calibration is not in it); and
//! [`OverheadReport`], last, whose snapshot reads the run statistics of our
//! programs ([`stats`]) and estimates, per target, the time the probes
//! added: its probe hits (exact, from the recording's own counts) times the
//! calibrated cost of the kernel's mechanism plus our programs' measured
//! mean run time. It also moves the kernel's `uretprobe` syscall (how a
//! uretprobe's return trap enters the kernel on x86_64 Linux 6.11+) out of
//! the targets' syscall tables: that time is the tracer's.

mod cache;
pub mod calibrate;


use std::{
    collections::{BTreeMap, HashMap},
    os::fd::OwnedFd,
    sync::{Arc, Mutex},
};

use crate::os::bpf_stats as stats;
use crate::{
    engine::{Part, Collector, Cx, Handle, FamilyTable, ProgramKind, ProgramSpec},
    os::probe::ProbeError,
    recording::{
        overhead::{Calibration, FamilyOverhead, ProgramRuns, TargetOverhead, TracerOverhead, TracerSelf, OVERHEAD_VERSION},
        Recording, Target,
    },
};

/// The calibration's empty programs (`tracer-ebpf/src/overhead.rs`).
pub static TABLE: FamilyTable = FamilyTable {
    family: "overhead",
    programs: &[
        ProgramSpec { name: "overhead_calib_up", kind: ProgramKind::UProbe },
        ProgramSpec { name: "overhead_calib_uret", kind: ProgramKind::UProbe },
        ProgramSpec { name: "overhead_calib_enter", kind: ProgramKind::BtfTracePoint { tracepoint: "sys_enter" } },
        ProgramSpec { name: "overhead_calib_exit", kind: ProgramKind::BtfTracePoint { tracepoint: "sys_exit" } },
    ],
    globals: &[],
};

/// The kernel's `uretprobe` syscall number on `arch` (none elsewhere).
pub fn uretprobe_nr(arch: &str) -> Option<u32> {
    (arch == "x86_64").then_some(335)
}

/// Every family's table, to name the programs by family.
pub type Tables = [&'static FamilyTable];

struct Shared {
    tables: &'static Tables,
    /// Every program of ours seen so far, by id: its name and its last
    /// counters (a family releases its programs at the window end, before
    /// the final snapshot: their counts are read before that, and kept).
    seen: BTreeMap<u32, (String, stats::Runs)>,
    /// Open while the window is: the kernel keeps run statistics.
    stats: Option<OwnedFd>,
    calibration: Calibration,
    notes: Vec<String>,
}

/// The pair of collectors: the first goes first in the list, the second
/// last. `tables`: every family's (`families::tables`).
pub fn collectors(tables: &'static Tables) -> (Box<dyn Collector>, Box<dyn Collector>) {
    let shared = Arc::new(Mutex::new(Shared {
        tables,
        seen: BTreeMap::new(),
        stats: None,
        calibration: Calibration::default(),
        notes: Vec::new(),
    }));
    (Box::new(OverheadStart(shared.clone())), Box::new(OverheadReport(shared)))
}

impl Shared {
    /// Reads the counters of the programs we hold now into `seen`.
    fn refresh(&mut self) {
        let runs = stats::own_programs();
        let unnamed: BTreeMap<u32, stats::Runs> =
            runs.iter().filter(|(id, _)| !self.seen.contains_key(id)).map(|(id, r)| (*id, *r)).collect();
        let names = if unnamed.is_empty() { BTreeMap::new() } else { stats::names(&unnamed) };
        for (id, r) in runs {
            if let Some((_, last)) = self.seen.get_mut(&id) {
                // Monotonic counters: the larger is the later.
                last.runs = last.runs.max(r.runs);
                last.run_ns = last.run_ns.max(r.run_ns);
            } else if let Some(name) = names.get(&id) {
                self.seen.insert(id, (name.clone(), r));
            }
        }
    }
}

/// Turns on the run statistics and calibrates, before the other families attach.
pub struct OverheadStart(Arc<Mutex<Shared>>);

impl Collector for OverheadStart {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Calibration]
    }

    fn name(&self) -> &'static str {
        "overhead calibration"
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match stats::enable() {
            Ok(fd) => s.stats = Some(fd),
            Err(e) => s.notes.push(format!("{e}: our programs' run time is not measured")),
        }
        let mut notes = Vec::new();
        s.calibration = match cache::load() {
            Some(kept) => kept,
            None => {
                let c = calibrate::calibrate(cx, &TABLE, &mut notes);
                cache::store(&c);
                c
            }
        };
        *cx.calibration = s.calibration.clone();
        s.notes.extend(notes);
        // The calibration is not part of the window: nothing is attached
        // yet, and the window opens now (its length stays what `--duration`
        // asked for).
        let now = crate::os::clock::monotonic_ns();
        set_window_start(&mut cx.kernel.ebpf, now)?;
        cx.window.start = now;
        cx.window.started_unix_ms = crate::os::clock::unix_ms();
        Ok(())
    }

    fn snapshot(&mut self, _cx: &mut Cx<'_>, _rec: &mut Recording) -> Result<(), ProbeError> {
        Ok(())
    }

    /// First to detach: the other families' programs are still loaded.
    fn detach(&mut self, _cx: &mut Cx<'_>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).refresh();
    }
}

/// Fills `tracer_overhead`, once every other family has filled its part.
pub struct OverheadReport(Arc<Mutex<Shared>>);

impl Collector for OverheadReport {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Targets]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Overhead]
    }

    /// Reads them: the account of what tracing cost reads every family's counts and each thread's wall time.
    fn needs(&self) -> &'static [Part] {
        &[Part::Syscalls, Part::Threads, Part::Cuda, Part::Memory]
    }

    fn name(&self) -> &'static str {
        "overhead"
    }

    fn attach(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        Ok(())
    }

    fn poll_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    /// Programs loaded and released during the window (per library) are
    /// counted as they go.
    fn poll(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).refresh();
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.refresh();
        let runs: BTreeMap<u32, stats::Runs> = s.seen.iter().map(|(id, (_, r))| (*id, *r)).collect();
        let names: BTreeMap<u32, String> = s.seen.iter().map(|(id, (n, _))| (*id, n.clone())).collect();
        let families = group_by_family(&runs, &names, s.tables);
        let (cpu_user_ns, cpu_system_ns, peak_rss_bytes) = stats::own_usage();
        let mut notes = s.notes.clone();
        if s.stats.is_none() {
            notes.push("program run time unknown: per-hit costs are the kernel mechanism's only".into());
        }
        let targets = cx.targets.to_targets();
        rec.tracer_overhead = Some(assemble(
            rec,
            &targets,
            s.calibration.clone(),
            families,
            TracerSelf { cpu_user_ns, cpu_system_ns, peak_rss_bytes },
            notes,
        ));
        Ok(())
    }
}

/// `WINDOW[0]`, the window start the kernel programs compare with.
fn set_window_start(ebpf: &mut aya::Ebpf, ns: u64) -> Result<(), ProbeError> {
    let map = ebpf.map_mut(tracer_common::maps::WINDOW).ok_or(ProbeError::MissingMap(tracer_common::maps::WINDOW))?;
    let mut arr: aya::maps::Array<&mut aya::maps::MapData, u64> =
        aya::maps::Array::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))?;
    arr.set(0, ns, 0).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))
}

/// The kernel keeps 15 bytes of a program's name.
fn kernel_name(name: &str) -> &str {
    name.get(..15).unwrap_or(name)
}

/// Our programs' counters by family (the calibration's own left out).
fn group_by_family(
    runs: &BTreeMap<u32, stats::Runs>,
    names: &BTreeMap<u32, String>,
    tables: &[&'static FamilyTable],
) -> Vec<FamilyOverhead> {
    let family_of: HashMap<&str, (&'static str, &'static str)> =
        tables.iter().flat_map(|t| t.programs.iter().map(move |p| (kernel_name(p.name), (t.family, p.name)))).collect();
    let mut out: BTreeMap<&str, BTreeMap<&str, ProgramRuns>> = BTreeMap::new();
    for (id, r) in runs {
        let Some(kname) = names.get(id) else { continue };
        let (family, name) = family_of.get(kname.as_str()).copied().unwrap_or(("other", "other"));
        if family == TABLE.family {
            continue;
        }
        // A program loaded more than once (per library, uprobe_multi): summed.
        let p = out.entry(family).or_default().entry(name).or_insert_with(|| ProgramRuns { name: name.to_owned(), ..Default::default() });
        p.runs = p.runs.saturating_add(r.runs);
        p.run_ns = p.run_ns.saturating_add(r.run_ns);
    }
    out.into_iter()
        .map(|(family, progs)| {
            let programs: Vec<ProgramRuns> = progs.into_values().collect();
            FamilyOverhead {
                family: family.to_owned(),
                hits: programs.iter().map(|p| p.runs).fold(0, u64::saturating_add),
                program_ns: programs.iter().map(|p| p.run_ns).fold(0, u64::saturating_add),
                programs,
            }
        })
        .collect()
}

/// Mean run time of the programs of `family` that `pick` selects, ns.
fn mean_run_ns(families: &[FamilyOverhead], family: &str, pick: impl Fn(&str) -> bool) -> f64 {
    let (runs, ns) = families
        .iter()
        .filter(|f| f.family == family)
        .flat_map(|f| &f.programs)
        .filter(|p| pick(&p.name))
        .fold((0u64, 0u64), |(r, n), p| (r.saturating_add(p.runs), n.saturating_add(p.run_ns)));
    if runs == 0 {
        0.0
    } else {
        ns as f64 / runs as f64
    }
}

fn is_return_program(name: &str) -> bool {
    name.ends_with("_return") || name.ends_with("_ret")
}

/// Builds `tracer_overhead` from the recording's own counts, and moves the
/// `uretprobe` syscall rows out of its syscall table.
pub fn assemble(
    rec: &mut Recording,
    targets: &[Target],
    calibration: Calibration,
    families: Vec<FamilyOverhead>,
    tracer: TracerSelf,
    mut notes: Vec<String>,
) -> TracerOverhead {
    // Per pid: syscalls (the uretprobe ones too: they pass the tracepoints).
    let mut syscalls: HashMap<u32, u64> = HashMap::new();
    for r in &rec.syscalls {
        *syscalls.entry(r.pid).or_default() += r.count;
    }
    let mut uret: HashMap<u32, (u64, u64)> = HashMap::new();
    if let Some(nr) = uretprobe_nr(&rec.host.arch) {
        rec.syscalls.retain(|r| {
            if r.nr != nr {
                return true;
            }
            let e = uret.entry(r.pid).or_default();
            e.0 = e.0.saturating_add(r.count);
            e.1 = e.1.saturating_add(r.total_ns);
            false
        });
    }
    // Per pid: CUDA entries and returns counted by the recording.
    let mut cuda: HashMap<u32, (u64, u64)> = HashMap::new();
    if let Some(c) = &rec.cuda {
        for call in &c.calls {
            let e = cuda.entry(call.pid).or_default();
            e.0 = e.0.saturating_add(call.count);
            e.1 = e.1.saturating_add(call.count);
        }
        // Sampled launches (`--max-overhead`): the hits are those seen.
        for l in &c.launches {
            cuda.entry(l.pid).or_default().0 += l.sampled.unwrap_or(l.count);
        }
        for l in &c.graph_launches {
            cuda.entry(l.pid).or_default().0 += l.count;
        }
    }
    // The runs the kernel counted against those the recording explains: a
    // runtime call that enters the driver runs the driver's probes too,
    // counted once in the recording (bounded: other processes using the
    // same library file fire the probes as well).
    let (entry_total, return_total) = cuda.values().fold((0u64, 0u64), |(a, b), (e, r)| (a + e, b + r));
    let runs_of = |pick: &dyn Fn(&str) -> bool| -> u64 {
        families.iter().filter(|f| f.family == "cuda").flat_map(|f| &f.programs).filter(|p| pick(&p.name)).map(|p| p.runs).sum()
    };
    let factor = |runs: u64, counted: u64| if counted == 0 || runs <= counted { 1.0 } else { (runs as f64 / counted as f64).min(4.0) };
    let f_entry = factor(runs_of(&|n| !is_return_program(n)), entry_total);
    let f_return = factor(runs_of(&is_return_program), return_total);
    let sys_prog = mean_run_ns(&families, "syscalls", |_| true);
    let per_syscall = calibration.syscall_tracepoints_ns + 2.0 * sys_prog;
    let per_entry = calibration.uprobe_ns + mean_run_ns(&families, "cuda", |n| !is_return_program(n));
    let per_return = calibration.uretprobe_ns + mean_run_ns(&families, "cuda", is_return_program);

    // Per pid: the memory family's `rss_stat` runs it caused, each its
    // program's measured mean run time (the tracepoint's own dispatch is
    // not calibrated: a lower bound).
    let memory: HashMap<u32, u64> =
        rec.memory.iter().flat_map(|m| &m.processes).filter(|p| p.rss_stat_events > 0).map(|p| (p.pid, p.rss_stat_events)).collect();
    let per_rss_stat = mean_run_ns(&families, "memory", |n| n == "mem_rss_stat");
    let mut wall: HashMap<u32, u64> = HashMap::new();
    for t in &rec.threads {
        let w = wall.entry(t.pid).or_default();
        *w = (*w).max(t.wall_ns);
    }
    let mut out_targets = Vec::new();
    for t in targets {
        let mut hits = BTreeMap::new();
        let mut added = BTreeMap::new();
        let n_sys = syscalls.get(&t.pid).copied().unwrap_or(0);
        if n_sys > 0 {
            hits.insert("syscalls".to_owned(), n_sys.saturating_mul(2));
            added.insert("syscalls".to_owned(), (n_sys as f64 * per_syscall) as u64);
        }
        if let Some(&(e, r)) = cuda.get(&t.pid) {
            let (e, r) = (e as f64 * f_entry, r as f64 * f_return);
            hits.insert("cuda".to_owned(), (e + r).round() as u64);
            added.insert("cuda".to_owned(), (e * per_entry + r * per_return) as u64);
        }
        if let Some(&n) = memory.get(&t.pid) {
            hits.insert("memory".to_owned(), n);
            added.insert("memory".to_owned(), (n as f64 * per_rss_stat) as u64);
        }
        let estimated_added_ns = added.values().copied().fold(0, u64::saturating_add);
        let wall_ns = wall.get(&t.pid).copied().filter(|w| *w > 0).unwrap_or(rec.duration_ns);
        let (uretprobe_syscalls, uretprobe_syscall_ns) = uret.get(&t.pid).copied().unwrap_or((0, 0));
        out_targets.push(TargetOverhead {
            pid: t.pid,
            comm: t.comm.clone(),
            hits,
            added_ns: added,
            estimated_added_ns,
            wall_ns,
            share_percent: if wall_ns == 0 { 0.0 } else { estimated_added_ns as f64 * 100.0 / wall_ns as f64 },
            uretprobe_syscalls,
            uretprobe_syscall_ns,
        });
    }
    out_targets.sort_by_key(|t| t.pid);
    if families.iter().any(|f| f.family == "sched" || f.family == "cpu_samples") {
        notes.push("scheduler and CPU-sampling programs run machine-wide: given per family, not in the per-target estimate".into());
    }
    if !memory.is_empty() {
        notes.push("memory: each kmem/rss_stat event of a target counts its program's measured run time; the tracepoint's own dispatch is not calibrated (a lower bound), and other processes' events cost them a target lookup each".into());
    }
    TracerOverhead { version: OVERHEAD_VERSION, calibration, families, targets: out_targets, tracer, startup: None, notes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{cuda::CudaReport, ThreadSyscall, ThreadTimes};

    fn row(pid: u32, nr: u32, count: u64, total_ns: u64) -> ThreadSyscall {
        ThreadSyscall {
            pid,
            tid: pid,
            nr,
            count,
            errors: 0,
            errnos: BTreeMap::new(),
            total_ns,
            max_ns: 0,
            hist_log2_ns: vec![0; 40],
            in_flight: 0,
            aggregated_threads: 0,
        }
    }

    fn family(name: &str, progs: &[(&str, u64, u64)]) -> FamilyOverhead {
        let programs: Vec<ProgramRuns> =
            progs.iter().map(|&(n, runs, run_ns)| ProgramRuns { name: n.into(), runs, run_ns }).collect();
        FamilyOverhead {
            family: name.into(),
            hits: programs.iter().map(|p| p.runs).sum(),
            program_ns: programs.iter().map(|p| p.run_ns).sum(),
            programs,
        }
    }

    #[test]
    fn estimate_is_hits_times_cost_and_uretprobe_moves_out() {
        let mut rec = crate::recording::tests::sample();
        rec.syscalls = vec![row(10, 0, 1000, 5000), row(10, 335, 100, 90_000)];
        rec.threads = vec![ThreadTimes { pid: 10, tid: 10, wall_ns: 1_000_000, ..Default::default() }];
        let mut cuda = CudaReport::default();
        cuda.launches.push(crate::recording::cuda::CudaLaunch {
            pid: 10,
            kernel: "k".into(),
            count: 50,
            site: Default::default(),
            api: "cudaLaunchKernel".into(),
            estimated: false,
            sampled: None,
        });
        rec.cuda = Some(cuda);
        let cal = Calibration { uprobe_ns: 5000.0, uretprobe_ns: 1000.0, syscall_tracepoints_ns: 100.0, took_ms: 1.0, cached: false };
        let fams = vec![
            family("syscalls", &[("sys_enter", 2200, 110_000), ("sys_exit", 2200, 110_000)]),
            // 100 launch runs for 50 counted: the driver's probes fire too.
            family("cuda", &[("cuda_launch", 100, 50_000), ("cuda_return", 0, 0)]),
        ];
        let targets = rec.targets.clone();
        let o = assemble(&mut rec, &targets, cal, fams, TracerSelf::default(), vec![]);
        // The uretprobe row left the table, counted as tracer time.
        assert!(rec.syscalls.iter().all(|r| r.nr != 335));
        let t = &o.targets[0];
        assert_eq!((t.uretprobe_syscalls, t.uretprobe_syscall_ns), (100, 90_000));
        // 1100 syscalls x (100 + 2 x 50) ns.
        assert_eq!(t.hits["syscalls"], 2200);
        assert_eq!(t.added_ns["syscalls"], 220_000);
        // 50 launches x 2 (runs / counted) x (5000 + 500) ns.
        assert_eq!(t.hits["cuda"], 100);
        assert_eq!(t.added_ns["cuda"], 550_000);
        assert_eq!(t.estimated_added_ns, 770_000);
        assert!((t.share_percent - 77.0).abs() < 1e-9);
    }

    #[test]
    fn memory_hits_are_rss_stat_events_times_the_program_mean() {
        use crate::recording::memory::{MemoryReport, ProcessMemory};
        let mut rec = crate::recording::tests::sample();
        rec.threads = vec![ThreadTimes { pid: 10, tid: 10, wall_ns: 1_000_000, ..Default::default() }];
        rec.memory = Some(MemoryReport {
            growth_sample_bytes: 1,
            processes: vec![ProcessMemory {
                pid: 10,
                rss_stat_events: 4000,
                ..Default::default()
            }],
        });
        // 10000 runs machine-wide at 30 ns each on average.
        let fams = vec![family("memory", &[("mem_rss_stat", 10_000, 300_000), ("mem_oom_victim", 0, 0)])];
        let targets = rec.targets.clone();
        let o = assemble(&mut rec, &targets, Calibration::default(), fams, TracerSelf::default(), vec![]);
        let t = &o.targets[0];
        assert_eq!((t.hits["memory"], t.added_ns["memory"]), (4000, 120_000));
        assert!(o.notes.iter().any(|n| n.contains("rss_stat")), "{:?}", o.notes);
    }

    #[test]
    fn programs_group_by_family_and_calibration_is_left_out() {
        let runs: BTreeMap<u32, stats::Runs> = [
            (1, stats::Runs { runs: 10, run_ns: 100 }),
            (2, stats::Runs { runs: 5, run_ns: 50 }),
            (3, stats::Runs { runs: 7, run_ns: 70 }),
            (4, stats::Runs { runs: 1, run_ns: 1 }),
        ]
        .into();
        let names: BTreeMap<u32, String> =
            [(1, "sys_enter".into()), (2, "cuda_launch".into()), (3, "cuda_launch".into()), (4, "overhead_calib_".into())].into();
        let tables = [&crate::families::syscalls::TABLE, &crate::families::cuda::programs::TABLE, &TABLE];
        let f = group_by_family(&runs, &names, &tables);
        let names: Vec<&str> = f.iter().map(|f| f.family.as_str()).collect();
        assert_eq!(names, ["cuda", "syscalls"]);
        assert_eq!(f[0].hits, 12);
        assert_eq!(f[0].programs.len(), 1);
    }
}
