//! What `infertrace top` shows, computed from consecutive snapshots of the
//! live session: every snapshot is cumulative since the window opened, so
//! the rates (per second) are the differences between the last two,
//! divided by the time between them. [`State::update`] takes a snapshot
//! and returns the [`Model`] the view draws; it keeps only the cumulative
//! values it needs for the next difference, not the recordings.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    recording::{FrameKind, OffCpuReason, Recording, StackKind, StackRecord, ThreadTimes},
    report::{
        fmt::printable,
        rows::{stack_weight, syscall_rows},
        text::walltime,
    },
};

/// A value since the window opened and its part in the last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    pub recent: u64,
    pub total: u64,
}

/// One thread (or the summed exited threads of a process, `tid` 0).
#[derive(Clone, Debug, Default)]
pub struct ThreadRow {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Exited threads summed in this row (0 for a live thread's own row).
    pub aggregated_threads: u64,
    /// The times of the last interval.
    pub recent: ThreadTimes,
    /// The times since the window opened.
    pub total: ThreadTimes,
}

/// One Python function (the Python leaf of the stacks), with its hottest line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionRow {
    /// `function (file.py:line)`, escaped for the terminal.
    pub name: String,
    /// The off-CPU reason (`io`, `lock`, `poll`, `sleep`, `other`, `gil`);
    /// empty for on-CPU samples.
    pub reason: &'static str,
    /// On-CPU: samples; off-CPU: nanoseconds.
    pub amount: Amount,
}

/// One syscall of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyscallRow {
    pub pid: u32,
    pub name: String,
    pub calls: Amount,
    pub time_ns: Amount,
}

/// Host<->device copies of one direction (`HtoD`, `DtoH`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyRow {
    pub kind: String,
    pub copies: Amount,
    pub bytes: Amount,
    pub time_ns: Amount,
}

/// A CUDA finding, and when `top` first saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FindingRow {
    /// Seconds into the window at the snapshot that first had it.
    pub first_seen_s: f64,
    pub severity: String,
    pub kind: String,
    pub pid: u32,
    pub site: String,
    pub message: String,
}

/// Everything one screen shows.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// The window so far.
    pub elapsed_ns: u64,
    /// Between the last two snapshots (the whole window at the first).
    pub interval_ns: u64,
    /// (pid, comm) of every target.
    pub processes: Vec<(u32, String)>,
    /// Targets still alive (set by the caller, which knows).
    pub alive: usize,
    pub threads: Vec<ThreadRow>,
    pub verdict: Vec<String>,
    pub python_cpu: Vec<FunctionRow>,
    pub python_wait: Vec<FunctionRow>,
    pub sample_hz: u64,
    pub syscalls: Vec<SyscallRow>,
    /// None: no CUDA library probed in the targets.
    pub copies: Option<Vec<CopyRow>>,
    /// Newest first.
    pub findings: Vec<FindingRow>,
    pub lost_events: u64,
    /// The session's notes (what could not be traced or resolved), escaped.
    pub notes: Vec<String>,
}

impl Model {
    /// `amount` of the last interval as a rate per second.
    pub fn per_second(&self, recent: u64) -> f64 {
        if self.interval_ns == 0 {
            return 0.0;
        }
        recent as f64 * 1e9 / self.interval_ns as f64
    }
}

/// The cumulative values of the previous snapshot.
#[derive(Default)]
pub struct State {
    prev_elapsed_ns: u64,
    threads: BTreeMap<(u32, u32), ThreadTimes>,
    functions: BTreeMap<(bool, &'static str, String, String), u64>,
    syscalls: BTreeMap<(u32, String), (u64, u64)>,
    copies: BTreeMap<String, (u64, u64, u64)>,
    findings: Vec<FindingRow>,
    seen_findings: BTreeSet<(String, u32, String)>,
}

/// `now - before`, never below 0 (a row summed anew, a restarted counter).
fn delta(now: u64, before: u64) -> u64 {
    now.saturating_sub(before)
}

fn thread_delta(now: &ThreadTimes, before: Option<&ThreadTimes>) -> ThreadTimes {
    let Some(b) = before else { return now.clone() };
    let mut d = now.clone();
    d.wall_ns = delta(now.wall_ns, b.wall_ns);
    d.on_cpu_ns = delta(now.on_cpu_ns, b.on_cpu_ns);
    d.syscall_ns = delta(now.syscall_ns, b.syscall_ns);
    d.runqueue_ns = delta(now.runqueue_ns, b.runqueue_ns);
    d.off_cpu.io_ns = delta(now.off_cpu.io_ns, b.off_cpu.io_ns);
    d.off_cpu.lock_ns = delta(now.off_cpu.lock_ns, b.off_cpu.lock_ns);
    d.off_cpu.poll_ns = delta(now.off_cpu.poll_ns, b.off_cpu.poll_ns);
    d.off_cpu.sleep_ns = delta(now.off_cpu.sleep_ns, b.off_cpu.sleep_ns);
    d.off_cpu.other_ns = delta(now.off_cpu.other_ns, b.off_cpu.other_ns);
    d.off_cpu.gil_ns = delta(now.off_cpu.gil_ns, b.off_cpu.gil_ns);
    d.off_cpu.memory_ns = delta(now.off_cpu.memory_ns, b.off_cpu.memory_ns);
    let (m, bm) = (&now.off_cpu.memory, &b.off_cpu.memory);
    d.off_cpu.memory = crate::recording::MemoryWaits {
        page_fault_ns: delta(m.page_fault_ns, bm.page_fault_ns),
        reclaim_ns: delta(m.reclaim_ns, bm.reclaim_ns),
        compaction_ns: delta(m.compaction_ns, bm.compaction_ns),
        throttle_ns: delta(m.throttle_ns, bm.throttle_ns),
    };
    d
}


/// The Python function a stack's time belongs to: its Python leaf, as
/// (function, file name, line).
fn python_leaf(s: &StackRecord) -> Option<(String, String, u32)> {
    let f = s.frames.iter().find(|f| f.kind == FrameKind::Python)?;
    let file = f.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
    Some((f.function.clone(), file.to_owned(), f.line.unwrap_or(0)))
}

/// Python functions since the window opened: (on-CPU?, reason, function,
/// file) -> (weight, weight per line).
type Functions = BTreeMap<(bool, &'static str, String, String), (u64, BTreeMap<u32, u64>)>;

fn functions(rec: &Recording) -> Functions {
    let mut by_fn: Functions = BTreeMap::new();
    for s in &rec.stacks {
        let (cpu, reason) = match s.kind {
            StackKind::Cpu => (true, ""),
            StackKind::OffCpu => (false, s.reason.map_or("other", OffCpuReason::name)),
            StackKind::Gil => (false, "gil"),
            StackKind::Syscall => continue,
        };
        let Some((function, file, line)) = python_leaf(s) else { continue };
        let w = stack_weight(s);
        let e = by_fn.entry((cpu, reason, function, file)).or_default();
        e.0 = e.0.saturating_add(w);
        let l = e.1.entry(line).or_default();
        *l = l.saturating_add(w);
    }
    by_fn
}

impl State {
    pub fn new() -> State {
        State::default()
    }

    /// The screen for snapshot `rec`; remembers its totals for the next one.
    pub fn update(&mut self, rec: &Recording) -> Model {
        let interval_ns = delta(rec.duration_ns, self.prev_elapsed_ns);
        self.prev_elapsed_ns = rec.duration_ns;
        let mut m = Model {
            elapsed_ns: rec.duration_ns,
            interval_ns,
            processes: rec.targets.iter().map(|t| (t.pid, printable(&t.comm).into_owned())).collect(),
            verdict: super::verdict_lines(rec),
            sample_hz: rec.sample_hz,
            lost_events: rec.lost_events(),
            notes: rec.notes.iter().map(|n| printable(n).into_owned()).collect(),
            ..Model::default()
        };
        m.processes.sort();

        let mut threads = BTreeMap::new();
        for t in &rec.threads {
            let key = (t.pid, t.tid);
            m.threads.push(ThreadRow {
                pid: t.pid,
                tid: t.tid,
                comm: printable(&t.comm).into_owned(),
                aggregated_threads: t.aggregated_threads,
                recent: thread_delta(t, self.threads.get(&key)),
                total: t.clone(),
            });
            threads.insert(key, t.clone());
        }
        self.threads = threads;

        let mut prev_fns = BTreeMap::new();
        for ((cpu, reason, function, file), (w, lines)) in functions(rec) {
            let hot = lines.iter().max_by_key(|(_, w)| **w).map(|(l, _)| *l).unwrap_or(0);
            let key = (cpu, reason, function, file);
            let recent = delta(w, self.functions.get(&key).copied().unwrap_or(0));
            let row = FunctionRow {
                name: format!("{} ({}:{hot})", printable(&key.2), printable(&key.3)),
                reason,
                amount: Amount { recent, total: w },
            };
            if cpu {
                m.python_cpu.push(row);
            } else {
                m.python_wait.push(row);
            }
            prev_fns.insert(key, w);
        }
        self.functions = prev_fns;

        let mut prev_sys = BTreeMap::new();
        for (pid, rows) in syscall_rows(rec) {
            for r in rows {
                let key = (pid, r.name.clone());
                let (c0, t0) = self.syscalls.get(&key).copied().unwrap_or((0, 0));
                m.syscalls.push(SyscallRow {
                    pid,
                    name: printable(&r.name).into_owned(),
                    calls: Amount { recent: delta(r.count, c0), total: r.count },
                    time_ns: Amount { recent: delta(r.total_ns, t0), total: r.total_ns },
                });
                prev_sys.insert(key, (r.count, r.total_ns));
            }
        }
        self.syscalls = prev_sys;

        if let Some(cuda) = &rec.cuda {
            let mut by_kind: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
            for c in cuda.calls.iter() {
                let Some(kind) = &c.kind else { continue };
                let e = by_kind.entry(kind.clone()).or_default();
                e.0 = e.0.saturating_add(c.count);
                e.1 = e.1.saturating_add(c.bytes);
                e.2 = e.2.saturating_add(c.total_ns);
            }
            let rows = by_kind
                .iter()
                .map(|(kind, &(n, b, t))| {
                    let (n0, b0, t0) = self.copies.get(kind).copied().unwrap_or((0, 0, 0));
                    CopyRow {
                        kind: printable(kind).into_owned(),
                        copies: Amount { recent: delta(n, n0), total: n },
                        bytes: Amount { recent: delta(b, b0), total: b },
                        time_ns: Amount { recent: delta(t, t0), total: t },
                    }
                })
                .collect();
            m.copies = Some(rows);
            self.copies = by_kind;
            for f in &cuda.findings {
                let key = (f.kind.clone(), f.pid, f.site.display());
                if self.seen_findings.insert(key) {
                    self.findings.push(FindingRow {
                        first_seen_s: rec.duration_ns as f64 / 1e9,
                        severity: printable(&f.severity).into_owned(),
                        kind: printable(&f.kind).into_owned(),
                        pid: f.pid,
                        site: printable(&f.site.display()).into_owned(),
                        message: printable(&crate::report::findings::cuda_message(f)).into_owned(),
                    });
                }
            }
        }
        m.findings = self.findings.iter().rev().cloned().collect();
        m
    }
}

/// The wall-time parts of a thread row, as in the text report's bars.
pub fn parts(t: &ThreadTimes) -> [(char, u64); 10] {
    walltime::parts(t)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::recording::{cuda::CudaReport, Frame, OffCpuTimes};

    pub fn thread(pid: u32, tid: u32, wall: u64, on: u64, sleep: u64) -> ThreadTimes {
        ThreadTimes {
            pid,
            tid,
            comm: "worker".into(),
            wall_ns: wall,
            on_cpu_ns: on,
            off_cpu: OffCpuTimes { sleep_ns: sleep, ..Default::default() },
            ..Default::default()
        }
    }

    pub fn cpu_stack(pid: u32, function: &str, line: u32, samples: u64) -> StackRecord {
        StackRecord {
            kind: StackKind::Cpu,
            reason: None,
            pid,
            tid: pid,
            samples,
            weight_ns: 0,
            syscall: None,
            frames: vec![Frame { function: function.into(), file: Some("/srv/app.py".into()), line: Some(line), kind: FrameKind::Python, module: None }],
        }
    }

    /// A one-process recording: `secs` into the window, the main thread
    /// on CPU 90% of it, `fib` with `samples` samples.
    pub fn snapshot(secs: u64, samples: u64) -> Recording {
        let mut rec = crate::recording::tests::sample();
        let ns = secs * 1_000_000_000;
        rec.duration_ns = ns;
        rec.targets[0].comm = "python3".into();
        rec.sample_hz = 99;
        rec.threads = vec![thread(10, 10, ns, ns / 10 * 9, ns / 10)];
        rec.stacks = vec![cpu_stack(10, "fib", 7, samples)];
        rec
    }

    #[test]
    fn rates_are_differences_of_consecutive_snapshots() {
        let mut st = State::new();
        let m = st.update(&snapshot(1, 99));
        assert_eq!(m.interval_ns, 1_000_000_000);
        assert_eq!(m.python_cpu[0].amount, Amount { recent: 99, total: 99 });
        let m = st.update(&snapshot(3, 297));
        assert_eq!(m.interval_ns, 2_000_000_000);
        assert_eq!(m.python_cpu[0].amount, Amount { recent: 198, total: 297 });
        assert_eq!(m.python_cpu[0].name, "fib (app.py:7)");
        assert!((m.per_second(198) - 99.0).abs() < 1e-9);
        let t = &m.threads[0];
        assert_eq!((t.recent.wall_ns, t.recent.on_cpu_ns, t.total.wall_ns), (2_000_000_000, 1_800_000_000, 3_000_000_000));
    }

    #[test]
    fn counters_that_go_back_give_zero_not_a_wrap() {
        let mut st = State::new();
        st.update(&snapshot(2, 500));
        let m = st.update(&snapshot(3, 100));
        assert_eq!(m.python_cpu[0].amount.recent, 0);
    }

    #[test]
    fn copies_per_second_and_new_findings() {
        use crate::recording::cuda::{CudaCall, Finding, Site};
        let copy = |count: u64, bytes: u64| CudaCall {
            pid: 10,
            api: "cudaMemcpy".into(),
            kind: Some("HtoD".into()),
            class: None,
            count,
            bytes,
            total_ns: count * 1000,
            errors: 0,
            site: Site::unknown(),
            return_codes: Default::default(),
            pinned: None,
            pageable: None,
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        };
        let finding = Finding {
            kind: "pageable_copy".into(),
            severity: "medium".into(),
            pid: 10,
            site: Site::unknown(),
            count: 1,
            bytes: 1,
            time_ns: 1,
            message: Some("m".into()),
            advice: Some("a".into()),
            ..Default::default()
        };
        let mut st = State::new();
        let mut rec = snapshot(1, 0);
        rec.cuda = Some(CudaReport { calls: vec![copy(10, 1 << 20)], ..Default::default() });
        let m = st.update(&rec);
        assert!(m.findings.is_empty());
        let mut rec = snapshot(2, 0);
        rec.cuda = Some(CudaReport { calls: vec![copy(30, 3 << 20)], findings: vec![finding.clone()], ..Default::default() });
        let m = st.update(&rec);
        let c = &m.copies.as_ref().unwrap()[0];
        assert_eq!((c.copies.recent, c.bytes.recent, c.copies.total), (20, 2 << 20, 30));
        assert_eq!(m.findings.len(), 1);
        assert_eq!(m.findings[0].first_seen_s, 2.0);
        // The same finding again is not new.
        let mut rec = snapshot(3, 0);
        rec.cuda = Some(CudaReport { calls: vec![copy(30, 3 << 20)], findings: vec![finding], ..Default::default() });
        let m = st.update(&rec);
        assert_eq!((m.findings.len(), m.findings[0].first_seen_s), (1, 2.0));
    }
}
