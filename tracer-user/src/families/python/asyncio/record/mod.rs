//! `record --async` (on by default): asyncio event loops, from outside
//! (docs/python.md, "asyncio in record").
//!
//! Two sources, joined here:
//! - the kernel (`tracer-ebpf/src/asyncio.rs`): every `epoll_wait` /
//!   `epoll_pwait` / `epoll_pwait2` entry and return of a target thread,
//!   with its CPU time and run-queue wait so far ([`loops`]): the exact
//!   iterations of a loop, busy and idle, and every step longer than the
//!   threshold (`--blocked-loop`, default 20 ms);
//! - a userspace sampler ([`sampler`], 200 Hz) reading the Python stacks
//!   of the targets' threads, which names the threads that run a loop,
//!   the line each long step ran and what it did (a blocking syscall or
//!   CPU), the busy time by line, and, through the task reader
//!   ([`tasks`], CPython 3.14+), each task's time running, awaiting (by
//!   `await` line and what it awaits) and ready.
//!
//! The report ([`crate::recording::asyncio::AsyncioReport`]) holds the
//! threads the sampler saw in `BaseEventLoop._run_once` only.

pub mod loops;
pub mod sampler;
pub mod tasks;

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use aya::{
    maps::{PerCpuArray, RingBuf},
    programs::{trace_point::TracePointLinkId, TracePoint},
};
use tracer_common::asyncio::{SelectorEvent, SELECTOR_SYSCALLS};

use crate::{
    engine::{Part, Collector, Cx, Handle, FamilyTable, GlobalSpec, GlobalValue, LoadInputs, ProgramKind, ProgramSpec, TargetEvent, ring::Records},
    os::probe::{self, ProbeError},
    recording::{
        asyncio::{AsyncFinding, AsyncLine, AsyncioReport, AwaitKind, EventLoop, LineTime, StepActivity},
        attribution::{Charged, SiteRef},
        Recording,
    },
};
use loops::{LongStep, LoopIterations};
use sampler::{Sampler, ThreadSample, Tick};
use tasks::TaskAccounts;

/// Python stacks of loop threads read per second.
pub const SAMPLE_HZ: u32 = 200;
/// `record --blocked-loop`'s default, as asyncio's own slow-callback warning.
pub const DEFAULT_BLOCKED_LOOP: &str = "20ms";

const ENTER: ProgramSpec =
    ProgramSpec { name: "asyncio_selector_enter", kind: ProgramKind::TracePoint { category: "syscalls", name: "sys_enter_epoll_wait" } };
const EXIT: ProgramSpec =
    ProgramSpec { name: "asyncio_selector_exit", kind: ProgramKind::TracePoint { category: "syscalls", name: "sys_exit_epoll_wait" } };

fn nested_offset(i: &LoadInputs<'_>, outer: &str, inner_struct: &str, member: &str) -> Result<GlobalValue, String> {
    let o = &i.btf.offsets;
    // Unknown (another kernel's layout): 0, the programs then send no CPU split.
    let off = o
        .member_offset("task_struct", outer)
        .and_then(|a| o.member_offset(inner_struct, member).map(|b| u64::from(a) + u64::from(b)))
        .unwrap_or(0);
    Ok(GlobalValue::U64(off))
}

/// Both programs (each attached to the enter or exit tracepoint of every
/// syscall of [`SELECTOR_SYSCALLS`]; the table names the first).
pub static TABLE: FamilyTable = FamilyTable {
    family: "asyncio",
    programs: &[ENTER, EXIT],
    globals: &[
        GlobalSpec { name: "TASK_SUM_EXEC_OFFSET", value: |i| nested_offset(i, "se", "sched_entity", "sum_exec_runtime") },
        GlobalSpec { name: "TASK_RUN_DELAY_OFFSET", value: |i| nested_offset(i, "sched_info", "sched_info", "run_delay") },
    ],
};

pub use crate::engine::AsyncOptions;

/// Samples of a loop thread kept to name its long steps.
const KEEP_SAMPLES: Duration = Duration::from_secs(3);

#[derive(Default)]
struct LoopThread {
    thread_name: Option<String>,
    first_ts: Option<u64>,
    last_ts: Option<u64>,
    samples: VecDeque<(u64, ThreadSample)>,
    /// Busy samples by (user line, the frame beneath).
    lines: HashMap<(AsyncLine, Option<AsyncLine>), u64>,
    tasks: TaskAccounts,
    tasks_unavailable: Option<String>,
}

#[derive(Default)]
struct StepGroup {
    count: u64,
    total_ns: u64,
    max_ns: u64,
}

#[derive(Default)]
pub struct AsyncioCollector {
    links: Vec<(&'static str, TracePointLinkId)>,
    ring: Option<Records<SelectorEvent>>,
    sampler: Option<Sampler>,
    threshold_ns: u64,
    iterations: HashMap<(u32, u32), LoopIterations>,
    loops: HashMap<(u32, u32), LoopThread>,
    /// Long steps named: (pid, tid, line, doing) -> count, total, max.
    steps: HashMap<(u32, u32, AsyncLine, Doing), StepGroup>,
    /// Long steps no sample fell in, per loop thread.
    unsampled: HashMap<(u32, u32), u64>,
    arch: String,
    /// The sampler's notes on hostile or corrupted memory, for the sink.
    walk_notes: Vec<String>,
}

/// What a long step did: CPU, or a blocking syscall (named when the
/// samples caught it).
type Doing = (StepActivity, Option<String>);

fn line(s: &SiteRef) -> AsyncLine {
    AsyncLine { function: s.function.clone(), file: s.file.clone(), line: s.line }
}

fn key_of(c: &Charged) -> (AsyncLine, Option<AsyncLine>) {
    (line(&c.site), c.beneath.as_ref().map(line))
}

impl AsyncioCollector {
    fn drain(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        ring.drain(|e| {
            self.iterations.entry((e.pid, e.tid)).or_insert_with(|| LoopIterations::new(e.ts_ns)).event(&e, self.threshold_ns);
        });
    }

    fn take_ticks(&mut self) {
        let Some(s) = self.sampler.as_ref() else { return };
        let ticks: Vec<Tick> = s.rx.try_iter().collect();
        for mut t in ticks {
            self.walk_notes.append(&mut t.notes);
            let single = (t.threads.len() == 1).then(|| t.threads[0].tid);
            for th in &t.threads {
                let lt = self.loops.entry((t.pid, th.tid)).or_default();
                lt.first_ts.get_or_insert(t.ts_ns);
                lt.last_ts = Some(t.ts_ns);
                if lt.thread_name.is_none() {
                    lt.thread_name.clone_from(&th.thread_name);
                }
                if !th.in_selector {
                    if let Some(c) = &th.site {
                        *lt.lines.entry(key_of(c)).or_default() += 1;
                    }
                }
                match &t.tasks {
                    Ok(all) => {
                        for l in all.iter().filter(|l| l.tid == th.tid || (l.tid == 0 && single == Some(th.tid))) {
                            lt.tasks.tick(l, !th.in_selector);
                        }
                    }
                    Err(e) => lt.tasks_unavailable = Some(e.clone()),
                }
                lt.samples.push_back((t.ts_ns, th.clone()));
                while lt.samples.front().is_some_and(|(ts, _)| ts + (KEEP_SAMPLES.as_nanos() as u64) < t.ts_ns) {
                    lt.samples.pop_front();
                }
            }
        }
    }

    /// Names the long steps of loop threads (all of them: `final_`), or
    /// those that ended a while ago (the samples of their end have arrived).
    fn resolve(&mut self, now: u64, final_: bool) {
        for (&(pid, tid), it) in self.iterations.iter_mut() {
            let Some(lt) = self.loops.get(&(pid, tid)) else {
                // Not (yet) known as a loop thread: keep a few seconds.
                it.pending.retain(|s| s.end_ns + 3_000_000_000 > now && !final_);
                continue;
            };
            let (ready, later): (Vec<LongStep>, Vec<LongStep>) =
                it.pending.drain(..).partition(|s| final_ || s.end_ns + 100_000_000 <= now);
            it.pending = later;
            for s in ready {
                let Some((at, doing)) = name_step(lt, &s, &self.arch) else {
                    // No sample fell in it (before the loop was found, or
                    // the sampler was late): counted, not a finding.
                    *self.unsampled.entry((pid, tid)).or_default() += 1;
                    continue;
                };
                let g = self.steps.entry((pid, tid, at, doing)).or_default();
                let d = s.end_ns - s.start_ns;
                g.count += 1;
                g.total_ns += d;
                g.max_ns = g.max_ns.max(d);
            }
        }
    }

    fn report(&self) -> Option<AsyncioReport> {
        if self.loops.is_empty() {
            return None;
        }
        let mut loops = Vec::new();
        let mut findings = Vec::new();
        let mut keys: Vec<&(u32, u32)> = self.loops.keys().collect();
        keys.sort();
        for &(pid, tid) in keys {
            let lt = &self.loops[&(pid, tid)];
            let mut el = EventLoop { pid, tid, thread_name: lt.thread_name.clone(), ..Default::default() };
            if let Some(it) = self.iterations.get(&(pid, tid)) {
                // From the first selector event to the last: a loop that
                // ended (its thread went on, or is exiting) is not busy.
                el.wall_ns = it.last_ns.saturating_sub(it.first_ns);
                el.iterations = it.iterations;
                el.busy_ns = it.busy_ns;
                el.idle_ns = it.idle_ns;
                el.busy_on_cpu_ns = it.busy_on_cpu_ns;
                el.busy_runqueue_ns = it.busy_runqueue_ns;
                el.busy_blocked_ns = it.busy_blocked_ns;
                el.lag_mean_ns = it.lag_mean_ns(el.wall_ns);
                el.lag_p99_ns = it.busy_quantile(0.99);
                el.lag_max_ns = it.busy_max_ns;
            }
            el.long_steps_unsampled = self.unsampled.get(&(pid, tid)).copied().unwrap_or(0);
            let total: u64 = lt.lines.values().sum();
            let mut lines: Vec<LineTime> = lt
                .lines
                .iter()
                .map(|((at, beneath), n)| LineTime {
                    at: at.clone(),
                    beneath: beneath.clone(),
                    ns: if total == 0 { 0 } else { ((u128::from(el.busy_ns) * u128::from(*n)) / u128::from(total)) as u64 },
                    samples: *n,
                })
                .collect();
            lines.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.at.cmp(&b.at)));
            el.lines = lines;
            // Task time: each stratum's ticks (loop idle / busy) weighted by
            // the stratum's exact time; without the kernel's iterations,
            // by the mean interval between samples.
            let w = if el.wall_ns > 0 {
                lt.tasks.weights(el.idle_ns, el.busy_ns)
            } else {
                let span = lt.last_ts.zip(lt.first_ts).map_or(0, |(l, f)| l - f);
                let n = (lt.tasks.ticks[0] + lt.tasks.ticks[1]).max(1);
                let m = span as f64 / n as f64;
                [m, m]
            };
            el.tasks = lt.tasks.report(&w);
            if el.tasks.is_empty() {
                el.tasks_unavailable = lt.tasks_unavailable.clone().or_else(|| Some("no task seen".into()));
            }
            // Work serialized behind run_in_executor: the loop mostly idle
            // while its tasks await thread-pool futures.
            let exec = lt.tasks.awaiting_by_kind(AwaitKind::Executor, &w);
            let exec_ns: u64 = exec.iter().map(|e| e.1).sum();
            if el.wall_ns > 0 && el.idle_ns * 2 >= el.wall_ns && exec_ns * 2 >= el.wall_ns {
                if let Some((at, top)) = exec.first() {
                    findings.push(AsyncFinding {
                        kind: "executor_serialized".into(),
                        pid,
                        tid,
                        at: at.clone(),
                        count: exec.len() as u64,
                        total_ns: exec_ns,
                        max_ns: *top,
                        loop_idle_ns: Some(el.idle_ns),
                        loop_wall_ns: Some(el.wall_ns),
                        ..Default::default()
                    });
                }
            }
            loops.push(el);
        }
        let mut steps: Vec<_> = self.steps.iter().collect();
        steps.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(b.0)));
        for ((pid, tid, at, (step, syscall)), g) in steps {
            findings.insert(
                findings.iter().take_while(|f| f.kind == "blocked_event_loop").count(),
                AsyncFinding {
                    kind: "blocked_event_loop".into(),
                    pid: *pid,
                    tid: *tid,
                    at: at.clone(),
                    count: g.count,
                    total_ns: g.total_ns,
                    max_ns: g.max_ns,
                    step: Some(*step),
                    syscall: syscall.clone(),
                    ..Default::default()
                },
            );
        }
        Some(AsyncioReport { blocked_threshold_ns: self.threshold_ns, sample_hz: SAMPLE_HZ, loops, findings })
    }

    fn kernel_lost(cx: &Cx<'_>) -> u64 {
        let Some(map) = cx.kernel.ebpf.map(tracer_common::maps::ASYNC_LOST) else { return 0 };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else { return 0 };
        arr.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

/// The user line a long step ran (the commonest among its samples off the
/// selector) and what it did: CPU, or the blocking syscall it sat in.
fn name_step(lt: &LoopThread, s: &LongStep, arch: &str) -> Option<(AsyncLine, Doing)> {
    let mut sites: HashMap<AsyncLine, u64> = HashMap::new();
    let mut calls: HashMap<Option<u32>, u64> = HashMap::new();
    for (_, th) in lt.samples.iter().filter(|(ts, th)| *ts >= s.start_ns && *ts <= s.end_ns && !th.in_selector) {
        if let Some(c) = &th.site {
            *sites.entry(line(&c.site)).or_default() += 1;
        }
        *calls.entry(th.syscall).or_default() += 1;
    }
    let at = sites.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0))).map(|x| x.0)?;
    let off_cpu = s.blocked_ns > s.on_cpu_ns;
    let doing = if off_cpu {
        let nr = calls.iter().filter_map(|(k, n)| k.map(|k| (k, *n))).max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        (StepActivity::Syscall, nr.map(|(nr, _)| crate::system::syscall_name(arch, nr)))
    } else {
        (StepActivity::Cpu, None)
    };
    Some((at, doing))
}

impl AsyncioCollector {
    /// `opts.blocked_threshold`: a step at least this long is a blocked loop.
    pub fn new(opts: AsyncOptions) -> Self {
        AsyncioCollector { threshold_ns: opts.blocked_threshold.as_nanos() as u64, ..Default::default() }
    }
}

impl Collector for AsyncioCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Asyncio]
    }

    fn name(&self) -> &'static str {
        "asyncio"
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.arch = std::env::consts::ARCH.to_owned();
        if cx.kernel.tracefs.is_none() {
            cx.sink.note("tracefs unavailable: asyncio loops get no busy/idle split nor blocked-loop findings");
        } else {
            for spec in [&ENTER, &EXIT] {
                let kernel = &mut *cx.kernel;
                spec.load(&mut kernel.ebpf, &kernel.btf.btf)?;
                let prog = probe::program::<TracePoint>(&mut cx.kernel.ebpf, spec.name)?;
                let dir = if spec.name == ENTER.name { "enter" } else { "exit" };
                for sc in SELECTOR_SYSCALLS {
                    // epoll_pwait2 is missing before Linux 5.11: not fatal.
                    if let Ok(l) = prog.attach("syscalls", &format!("sys_{dir}_{sc}")) {
                        self.links.push((spec.name, l));
                    }
                }
            }
            let map = cx.kernel.ebpf.take_map(tracer_common::maps::ASYNC_EVENTS).ok_or(ProbeError::MissingMap(tracer_common::maps::ASYNC_EVENTS))?;
            self.ring = Some(Records::new(RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::ASYNC_EVENTS, e))?, "asyncio_short_records"));
        }
        match Sampler::start(SAMPLE_HZ) {
            Ok(mut s) => {
                if let Some(n) = s.priority_note.take() {
                    cx.sink.note(n);
                }
                self.sampler = Some(s);
            }
            Err(e) => cx.sink.note(format!("cannot start the asyncio sampler ({e}): no asyncio report")),
        }
        Ok(())
    }

    fn target(&mut self, _cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        let Some(s) = self.sampler.as_ref() else { return Ok(()) };
        match ev {
            TargetEvent::Appeared { pid, .. } | TargetEvent::Forked { pid, .. } => s.add(*pid),
            TargetEvent::Execed { pid, .. } => s.reset(*pid),
            TargetEvent::Exited { pid } => s.remove(*pid),
            TargetEvent::Mapped { .. } => {}
        }
        Ok(())
    }

    fn poll_every(&self) -> Duration {
        Duration::from_millis(25)
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.take_ticks();
        for note in self.walk_notes.drain(..) {
            cx.sink.note(note);
        }
        self.drain();
        self.resolve(crate::os::clock::monotonic_ns(), false);
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        self.take_ticks();
        for note in self.walk_notes.drain(..) {
            cx.sink.note(note);
        }
        self.drain();
        self.resolve(cx.window.now_or_end(), cx.window.end.is_some());
        cx.sink.set_lost("asyncio_events_lost", Self::kernel_lost(cx));
        if let Some(ring) = self.ring.as_ref() {
            ring.report(cx.sink);
        }
        rec.asyncio = self.report();
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        if let Some(s) = self.sampler.as_mut() {
            s.finish();
        }
        for (name, l) in self.links.drain(..) {
            if let Ok(p) = probe::program::<TracePoint>(&mut cx.kernel.ebpf, name) {
                let _ = p.detach(l);
            }
        }
    }

    fn status(&self) -> Option<String> {
        (!self.loops.is_empty()).then(|| format!("{} event loop{}", self.loops.len(), if self.loops.len() == 1 { "" } else { "s" }))
    }
}
