//! `cargo xtask bench`: slowdown of Python workloads under infertrace and
//! under the usual alternatives, in one table.
//!
//! The workloads (tests/workloads/), each printing its cost per iteration:
//!
//! - `syscall loop` (syscall_loop.py): `os.write(out, os.read(fd, 64))`, two
//!   syscalls per iteration (goal: infertrace <= 1.4x); also infertrace with
//!   scheduler tracing off, infertrace tracing an idle process instead (the
//!   floor: syscall tracepoints on, programs exiting at once), the syscall
//!   tracers (bpftrace, strace, perf
//!   trace), the stack profilers and py-spy.
//! - `cpu loop` (cpu_loop.py): pure-Python arithmetic, no syscalls: what
//!   99 Hz sampling and scheduler tracing cost a busy interpreter
//!   (goal: infertrace <= 1.05x).
//! - `gil hand-off` (bench_gil.py): a pure-Python loop beside a spinning
//!   thread at a 5 us switch interval: ~8,000 GIL waits a second, each
//!   with its holder read in the kernel.
//! - `fib` (bench_fib.py): recursive fib(15) per iteration, a deep
//!   ever-changing Python stack: the cost of Python attribution (goal:
//!   infertrace <= 1.05x), against `--no-python` and against
//!   `py-spy record --rate 99 --nonblocking` sampling at the same rate.
//! - `ping-pong` (pingpong.py): two processes bouncing a byte over two
//!   pipes, context-switch heavy; both processes are traced
//!   (goal: infertrace <= 1.3x); also with --no-offcpu-stacks and
//!   --no-sched, to show where the cost goes.
//! - `cuda copy` / `cuda launch` / `cuda graph` / `cuda event` (bench_cuda.py), with libcudart over
//!   libcuda probed (the default) and with `--no-cuda-driver`: a 0-byte
//!   `cudaMemcpyAsync` (probed on entry and return) or a `cudaLaunchKernel`
//!   (probed on entry only) through ctypes, against tests/cudasim's stand-in
//!   libcudart (built into target/bench/cudasim), where both calls are
//!   near-free; the line under the table gives infertrace's cost per call,
//!   traced minus untraced ns/call.
//! - `cuda budget` (bench_cuda.py step): a launch and 300 iterations of
//!   Python arithmetic per step (a model step's framework work between
//!   launches), untraced, under `record -p` and under `record -p
//!   --max-overhead 2` (goal: 1.02x untraced, issue 14); median of 5
//!   chunks of ~2 s, so that each chunk holds whole slicing periods.
//! - `cuda burst` (bench_cuda_burst.py running tests/cudasim/cuda_burst.c):
//!   4 threads making pinned 256-byte copies and stream syncs on the
//!   stand-in as fast as they can for 10 s (the iterations column is
//!   seconds); ns/iter is per call of any thread, and the line under the
//!   table gives the calls per second, untraced and traced.
//! - `stop` (bench_cuda.py, only holding the stand-in libraries): how long
//!   `infertrace record -p` takes from SIGINT (the end of the window) to
//!   its exit with the stand-in libcudart and libcuda probed (66
//!   functions), against `--no-cuda`; median of 5 runs each (goal: 1.5 s).
//!   Releasing uprobes waits for the kernel: this is what it costs.
//!
//! All but the syscall loop report the median of equal chunks of their loop,
//! so that a burst of unrelated load on a shared machine moves the result
//! less; as root, workloads and tracers run at nice -20 for the same reason.
//! The untraced baseline is the median of runs spread over the workload's
//! group (one before each traced mode, one after the last, at least 3), so
//! that load that comes and goes weighs on it as on the traced runs.
//!
//! infertrace runs with its defaults (Python attribution, CUDA probes,
//! scheduler tracing and 99 Hz sampling on); the references are
//! `perf record -g -F 99`, a bpftrace offcputime-style script
//! (sched_switch timestamps per thread, summed by kernel and user stack) and
//! py-spy.
//!
//! Each traced mode starts the workload first, attaches the tracer to its
//! pid(s) while the workload waits on stdin, then releases the loop, so that
//! start-up costs of the tracers are never measured. Slow tracers get fewer
//! iterations: ns/iter is what is compared.
use std::{
    cell::OnceCell,
    fs::{self, File},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{
    bench_floors::{self, Floor},
    tasks, util,
};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Untraced,
    /// `infertrace record <flags> -p`; no flags: its defaults (scheduler
    /// tracing, off-CPU stacks, 99 Hz sampling).
    Infertrace(&'static [&'static str]),
    Bpftrace,
    Strace,
    Perf,
    /// `perf record -g -F 99 -p`.
    PerfRecord,
    /// bpftrace offcputime-style script.
    BpftraceOffcpu,
    /// `py-spy record --rate 99 --nonblocking --pid`.
    PySpy,
    /// bpftrace with empty actions on the kernel mechanism alone
    /// (bench_floors.rs).
    Floor(Floor),
}

struct Mode {
    kind: Kind,
    label: &'static str,
    /// The program that must be on PATH (None: nothing needed).
    tool: Option<&'static str>,
    iterations: u64,
    /// Largest acceptable slowdown (shown in the table, not enforced).
    goal: Option<f64>,
    /// Largest acceptable ratio to the workload's floor (shown, not
    /// enforced).
    floor_goal: Option<f64>,
}

const fn mode(
    kind: Kind,
    label: &'static str,
    tool: Option<&'static str>,
    iterations: u64,
) -> Mode {
    Mode {
        kind,
        label,
        tool,
        iterations,
        goal: None,
        floor_goal: None,
    }
}

const PERF_RECORD: &str = "perf record -g -F 99";
const BPFTRACE_OFFCPU: &str = "bpftrace offcputime";
const PY_SPY: &str = "py-spy record --rate 99 --nonblocking";
const INFERTRACE: &str = "infertrace record -p";

struct Bench {
    /// Name in the table.
    name: &'static str,
    /// Script under tests/workloads/.
    script: &'static str,
    /// Arguments before the iteration count.
    args: &'static [&'static str],
    /// Runs against tests/cudasim's stand-in libcudart (a private build in
    /// target/bench/cudasim): CUDART and FAKE_KERNELS are set, infertrace
    /// modes pass `--probed` (the loop waits for the uprobe), and the line
    /// under the table gives infertrace's cost per call under this name.
    cuda_probe: Option<&'static str>,
    /// ns/iter is per call of several threads: the line under the table
    /// gives calls per second, untraced and traced, under this name.
    calls_per_s: Option<&'static str>,
    /// The floor mode that infertrace rows are compared with (one of
    /// `modes`).
    floor: Option<Kind>,
    /// The first mode is the untraced baseline.
    modes: &'static [Mode],
}

const fn workload(name: &'static str, script: &'static str, modes: &'static [Mode]) -> Bench {
    Bench {
        name,
        script,
        args: &[],
        cuda_probe: None,
        calls_per_s: None,
        floor: None,
        modes,
    }
}

/// Pseudo flags of `Kind::Infertrace`: trace an idle process instead of
/// the workload, which then pays only for the syscall tracepoints being on
/// (every syscall of the machine takes the kernel's slow path) and the
/// programs' early exit: the floor of any syscall tracepoint tracer.
const ELSEWHERE: &[&str] = &["<elsewhere>"];

/// Pseudo flags of `Kind::Infertrace`: `infertrace agent --pid` (its
/// defaults, one 60 s window, HTTP on a free loopback port) instead of
/// `record -p`: the same probes, plus the agent's exec program.
const AGENT: &[&str] = &["<agent>"];

/// `infertrace record -p` with its defaults and a goal.
const fn infertrace_default(iterations: u64, goal: Option<f64>) -> Mode {
    Mode {
        goal,
        ..mode(Kind::Infertrace(&[]), INFERTRACE, None, iterations)
    }
}

/// `infertrace record -p` with its defaults and a goal as a ratio to the
/// workload's floor.
const fn infertrace_vs_floor(iterations: u64, floor_goal: f64) -> Mode {
    Mode {
        floor_goal: Some(floor_goal),
        ..mode(Kind::Infertrace(&[]), INFERTRACE, None, iterations)
    }
}

/// A floor mode (bpftrace, empty actions).
const fn floor(f: Floor, label: &'static str, iterations: u64) -> Mode {
    mode(Kind::Floor(f), label, Some("bpftrace"), iterations)
}

/// The modes of the CUDA rows (copy, launch, graph): untraced, both
/// floors, infertrace against its row's floor, and without the driver.
const CUDA_MODES: &[Mode] = &[
    mode(Kind::Untraced, "untraced", Some("gcc"), 200_000),
    floor(Floor::Uprobe, "floor: uprobe (entry), empty", 50_000),
    floor(Floor::UprobeUretprobe, "floor: uprobe+uretprobe, empty", 50_000),
    infertrace_vs_floor(50_000, 1.2),
    mode(Kind::Infertrace(&["--no-cuda-driver"]), "infertrace --no-cuda-driver -p", None, 50_000),
];

/// The launch row's modes: as [`CUDA_MODES`], with the floor of a runtime
/// launch and the driver launch it enters.
const LAUNCH_MODES: &[Mode] = &[
    mode(Kind::Untraced, "untraced", Some("gcc"), 200_000),
    floor(Floor::Uprobe, "floor: uprobe (entry), empty", 50_000),
    floor(Floor::UprobePlusDriver, "floor: uprobe + driver uprobe, empty", 50_000),
    infertrace_vs_floor(50_000, 1.2),
    mode(Kind::Infertrace(&["--no-cuda-driver"]), "infertrace --no-cuda-driver -p", None, 50_000),
];

const BENCHES: &[Bench] = &[
    Bench {
        // Our own tp_btf floor: bpftrace 0.17 has no raw tracepoints, and
        // its classic `tracepoint:` programs cost more than the tp_btf ones
        // infertrace uses (the raw_syscalls row is shown for reference).
        floor: Some(Kind::Infertrace(ELSEWHERE)),
        ..workload(
        "syscall loop",
        "syscall_loop.py",
        &[
            mode(Kind::Untraced, "untraced", None, 1_000_000),
            floor(Floor::Syscalls, "floor: raw_syscalls enter+exit, empty", 500_000),
            // Issue 14: within +0.25x of the idle-pid floor's ratio to
            // untraced (~1.58x): 1.83 / 1.58.
            infertrace_vs_floor(500_000, 1.16),
            mode(
                Kind::Infertrace(&["--no-sched"]),
                "infertrace --no-sched -p",
                None,
                500_000,
            ),
            // `record --timeline`: every scheduler interval and slow syscall submitted to a ring buffer.
            mode(
                Kind::Infertrace(&["--timeline"]),
                "infertrace --timeline -p",
                None,
                500_000,
            ),
            mode(Kind::Infertrace(AGENT), "infertrace agent --pid", None, 500_000),
            mode(
                Kind::Infertrace(ELSEWHERE),
                "infertrace on an idle pid (floor)",
                None,
                500_000,
            ),
            mode(
                Kind::Bpftrace,
                "bpftrace enter/exit hist",
                Some("bpftrace"),
                200_000,
            ),
            mode(Kind::Strace, "strace -c -f", Some("strace"), 20_000),
            mode(Kind::Perf, "perf trace -s", Some("perf"), 20_000),
            mode(Kind::PerfRecord, PERF_RECORD, Some("perf"), 500_000),
            mode(
                Kind::BpftraceOffcpu,
                BPFTRACE_OFFCPU,
                Some("bpftrace"),
                500_000,
            ),
            mode(Kind::PySpy, PY_SPY, Some("py-spy"), 500_000),
        ],
    )
    },
    workload(
        "cpu loop",
        "cpu_loop.py",
        &[
            mode(Kind::Untraced, "untraced", None, 10_000_000),
            infertrace_default(10_000_000, Some(1.05)),
            mode(Kind::PerfRecord, PERF_RECORD, Some("perf"), 10_000_000),
            mode(
                Kind::BpftraceOffcpu,
                BPFTRACE_OFFCPU,
                Some("bpftrace"),
                10_000_000,
            ),
        ],
    ),
    // GIL hand-offs (issue 26): ~8,000 waits a second between two pure-Python
    // threads; each is a GIL wait with its holder read in the kernel.
    workload(
        "gil hand-off",
        "bench_gil.py",
        &[
            mode(Kind::Untraced, "untraced", None, 4_000_000),
            infertrace_default(4_000_000, Some(1.15)),
            mode(
                Kind::Infertrace(&["--no-offcpu-stacks"]),
                "infertrace --no-offcpu-stacks -p",
                None,
                4_000_000,
            ),
            mode(Kind::Infertrace(&["--no-python"]), "infertrace --no-python -p", None, 4_000_000),
        ],
    ),
    // Resident memory (issue 25): an allocator taking and returning
    // ~3 GiB/s; the floor is an empty program on the same tracepoint.
    Bench {
        floor: Some(Kind::Floor(Floor::RssStat)),
        ..workload(
            "memory",
            "bench_memory.py",
            &[
                mode(Kind::Untraced, "untraced", None, 4_000),
                floor(Floor::RssStat, "floor: kmem:rss_stat, empty", 4_000),
                infertrace_vs_floor(4_000, 1.1),
                mode(Kind::Infertrace(&["--no-memory"]), "infertrace --no-memory -p", None, 4_000),
            ],
        )
    },
    // Python attribution: the Python stack walked at every sample of a
    // deep, ever-changing stack; without it (--no-python); py-spy sampling
    // the same process at the same rate.
    workload(
        "fib",
        "bench_fib.py",
        &[
            mode(Kind::Untraced, "untraced", None, 16_000),
            infertrace_default(16_000, Some(1.05)),
            mode(
                Kind::Infertrace(&["--no-python"]),
                "infertrace --no-python -p",
                None,
                16_000,
            ),
            mode(Kind::Infertrace(AGENT), "infertrace agent --pid", None, 16_000),
            mode(Kind::PySpy, PY_SPY, Some("py-spy"), 16_000),
        ],
    ),
    workload(
        "ping-pong",
        "pingpong.py",
        &[
            mode(Kind::Untraced, "untraced", None, 100_000),
            infertrace_default(100_000, Some(1.3)),
            // Where the cost goes: without off-CPU stacks, without the
            // scheduler probes.
            mode(
                Kind::Infertrace(&["--no-offcpu-stacks"]),
                "infertrace --no-offcpu-stacks -p",
                None,
                100_000,
            ),
            mode(
                Kind::Infertrace(&["--no-sched"]),
                "infertrace --no-sched -p",
                None,
                100_000,
            ),
            mode(
                Kind::Infertrace(&["--timeline"]),
                "infertrace --timeline -p",
                None,
                100_000,
            ),
            mode(Kind::PerfRecord, PERF_RECORD, Some("perf"), 100_000),
            mode(
                Kind::BpftraceOffcpu,
                BPFTRACE_OFFCPU,
                Some("bpftrace"),
                100_000,
            ),
        ],
    ),
    // CUDA probes, with the stand-in libcudart: per-call cost of a copy API
    // (entry and return probes) and of a launch API (entry probe only).
    Bench {
        args: &["copy"],
        floor: Some(Kind::Floor(Floor::UprobeUretprobe)),
        cuda_probe: Some("copy probe (entry+return)"),
        ..workload(
            "cuda copy",
            "bench_cuda.py",
            CUDA_MODES,
        )
    },
    // A runtime launch pays the driver's launch probe too (launch
    // functions are never taken off): its floor is both entry probes.
    Bench {
        args: &["launch"],
        floor: Some(Kind::Floor(Floor::UprobePlusDriver)),
        cuda_probe: Some("launch probe (entry only)"),
        ..workload(
            "cuda launch",
            "bench_cuda.py",
            LAUNCH_MODES,
        )
    },
    Bench {
        args: &["graph"],
        floor: Some(Kind::Floor(Floor::Uprobe)),
        cuda_probe: Some("graph launch probe (entry only)"),
        ..workload(
            "cuda graph",
            "bench_cuda.py",
            CUDA_MODES,
        )
    },
    Bench {
        args: &["event"],
        floor: Some(Kind::Floor(Floor::UprobeUretprobe)),
        cuda_probe: Some("event record probe (entry+return)"),
        ..workload(
            "cuda event",
            "bench_cuda.py",
            CUDA_MODES,
        )
    },
    // Issue 14: `--max-overhead 2` on a launch-heavy step (a launch and
    // ~4 us of Python here), against untraced and against the default probes.
    Bench {
        args: &["step"],
        cuda_probe: Some("budget"),
        ..workload(
            "cuda budget",
            "bench_cuda.py",
            &[
                mode(Kind::Untraced, "untraced", Some("gcc"), 2_000_000),
                mode(Kind::Infertrace(&[]), INFERTRACE, None, 400_000),
                Mode {
                    goal: Some(1.02),
                    ..mode(Kind::Infertrace(&["--max-overhead", "2"]), "infertrace --max-overhead 2 -p", None, 2_000_000)
                },
            ],
        )
    },
    // A burst of CUDA calls from 4 threads (the rate at which per-call
    // events must not be lost); iterations are seconds.
    Bench {
        cuda_probe: Some("burst"),
        calls_per_s: Some("cuda burst, 4 threads (stand-in libcudart)"),
        ..workload(
            "cuda burst",
            "bench_cuda_burst.py",
            &[
                mode(Kind::Untraced, "untraced", Some("gcc"), 10),
                infertrace_default(10, None),
            ],
        )
    },
];

/// What one iteration is, per workload (printed above the table).
const LEGEND: &[&str] = &[
    "syscall loop = Python `os.write(out, os.read(fd, 64))` (2 syscalls), whole loop",
    "cpu loop     = pure-Python arithmetic, median of 20 chunks",
    "memory       = mmap 1 MiB, touch its 256 pages, munmap (256 rss_stat events and a release), median of 20 chunks",
    "fib          = recursive pure-Python fib(15) (~2000 calls), median of 20 chunks",
    "ping-pong    = 1-byte round trip between two Python processes over two pipes (both \
     traced), median of 10 chunks",
    "cuda copy    = ctypes cudaMemcpyAsync of 0 bytes device-to-device on the stand-in \
     libcudart (tests/cudasim), median of 20 chunks",
    "cuda launch  = ctypes cudaLaunchKernel on the stand-in libcudart, median of 20 chunks",
    "cuda graph   = ctypes cudaGraphLaunch of a graph captured once (10 kernels) on the stand-in libcudart, median of 20 chunks",
    "cuda event   = ctypes cudaEventRecord(event, stream) on the stand-in libcudart, median of 20 chunks",
    "cuda budget  = a cudaLaunchKernel as above and 300 iterations of Python arithmetic, median \
     of 5 chunks of ~2 s (each holds whole 1 s slicing periods of --max-overhead)",
    "cuda burst   = one CUDA call of 4 C threads (pinned 256 B cudaMemcpyAsync + \
     cudaStreamSynchronize) on the stand-in libcudart over 10 s (iterations: seconds)",
];

/// Fewest untraced runs per workload (there is one before each traced mode
/// and one after the last); the median is the baseline.
const UNTRACED_RUNS: usize = 3;
/// Longest a single measured loop may take.
const LOOP_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest a tracer may take to attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a tracer may take to exit after SIGINT.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Runs of each `stop` measurement; the median is shown.
const STOP_RUNS: usize = 5;
/// Longest acceptable time from SIGINT to exit with CUDA probed (shown, not
/// enforced).
const STOP_GOAL_S: f64 = 1.5;

enum Outcome {
    Measured {
        ns_per_iter: f64,
        note: Option<String>,
    },
    Missing,
    Failed(String),
}

/// `only`: run the workloads whose name contains it (`--only`), without the
/// `stop` line.
pub fn bench(build: bool, stop_only: bool, only: Option<&str>) -> Result<()> {
    if build {
        tasks::build()?;
    }
    let ctx = Ctx::new()?;
    if !util::is_root() {
        eprintln!("WARNING: not root: the tracers below need root and will fail");
    }
    ensure_tracefs();
    if stop_only {
        let line = stop_times(&ctx)?;
        println!("{line}");
        return Ok(());
    }
    let started = Instant::now();

    let mut rows: Vec<(&Bench, &Mode, Outcome)> = Vec::new();
    let selected = |b: &&Bench| only.is_none_or(|o| b.name.contains(o));
    if BENCHES.iter().filter(selected).count() == 0 {
        bail!("--only {:?} names no workload (hint: e.g. --only cuda, --only \"syscall loop\")", only.unwrap_or(""));
    }
    for b in BENCHES.iter().filter(selected) {
        let script = util::workspace_root()
            .join("tests/workloads")
            .join(b.script);
        if !script.is_file() {
            bail!("{} is missing", script.display());
        }
        let (untraced, traced_modes) = b
            .modes
            .split_first()
            .filter(|(u, _)| u.kind == Kind::Untraced)
            .with_context(|| format!("{}: the first mode must be untraced", b.name))?;
        // The untraced runs are spread over the workload's group, one before
        // each traced mode and one after the last (at least UNTRACED_RUNS),
        // so that the baseline sees the same load on a shared machine as
        // the traced runs do.
        let mut baseline = if is_missing(&ctx, untraced) {
            None
        } else {
            Some(Untraced::default())
        };
        let mut group = Vec::new();
        for mode in traced_modes {
            if let Some(u) = baseline.as_mut() {
                u.run(&ctx, &script, b, untraced);
            }
            // Progress on stderr; stdout gets the table only.
            eprint!("bench: {:<13} {:<37} ", b.name, mode.label);
            let outcome = if baseline.is_none() || is_missing(&ctx, mode) {
                Outcome::Missing
            } else {
                match traced(&ctx, &script, b, mode) {
                    Ok(o) => o,
                    Err(e) => Outcome::Failed(format!("{e:#}")),
                }
            };
            match &outcome {
                Outcome::Measured { ns_per_iter, .. } => eprintln!("{ns_per_iter:.1} ns/iter"),
                Outcome::Missing => eprintln!("n/a (tool missing)"),
                Outcome::Failed(_) => eprintln!("failed"),
            }
            group.push((b, mode, outcome));
        }
        let outcome = match baseline.as_mut() {
            Some(u) => {
                u.run(&ctx, &script, b, untraced);
                while u.samples.len() < UNTRACED_RUNS && u.error.is_none() {
                    u.run(&ctx, &script, b, untraced);
                }
                u.outcome()
            }
            None => {
                eprintln!(
                    "bench: {:<13} {:<37} n/a (tool missing)",
                    b.name, untraced.label
                );
                Outcome::Missing
            }
        };
        rows.push((b, untraced, outcome));
        rows.extend(group);
    }

    let baseline = |b: &Bench| {
        rows.iter().find_map(|(rb, m, o)| match o {
            Outcome::Measured { ns_per_iter, .. }
                if std::ptr::eq(*rb, b) && m.kind == Kind::Untraced =>
            {
                Some(*ns_per_iter)
            }
            _ => None,
        })
    };
    eprintln!();
    println!("ns per iteration (cost of one loop iteration inside the workload):");
    for line in LEGEND {
        println!("  {line}");
    }
    if util::is_root() {
        println!("  workloads and tracers at nice -20");
    }
    // The floor of a workload (bench_floors.rs): its measured ns/iter.
    let floor_ns = |b: &Bench| {
        let f = b.floor?;
        rows.iter().find_map(|(rb, m, o)| match o {
            Outcome::Measured { ns_per_iter, .. }
                if std::ptr::eq(*rb, b) && m.kind == f =>
            {
                Some(*ns_per_iter)
            }
            _ => None,
        })
    };
    const W: [usize; 7] = [12, 37, 10, 12, 12, 9, 17];
    println!(
        "{:<w0$} {:<w1$} {:>w2$} {:>w3$} {:>w4$} {:>w5$} {:>w6$}",
        "workload",
        "mode",
        "iterations",
        "ns/iter",
        "vs untraced",
        "vs floor",
        "goal",
        w0 = W[0],
        w1 = W[1],
        w2 = W[2],
        w3 = W[3],
        w4 = W[4],
        w5 = W[5],
        w6 = W[6],
    );
    println!("{}", "-".repeat(W.iter().sum::<usize>() + W.len() - 1));
    let mut notes = Vec::new();
    let mut prev: Option<&str> = None;
    for (b, mode, outcome) in &rows {
        // The workload name once per group.
        let name = if prev == Some(b.name) { "" } else { b.name };
        prev = Some(b.name);
        let base = baseline(b);
        let (ns, ratio, vs_floor, goal) = match outcome {
            Outcome::Measured { ns_per_iter, note } => {
                if let Some(n) = note {
                    notes.push(format!("{} / {}: {n}", b.name, mode.label));
                }
                let r = base.map(|b| ns_per_iter / b);
                let ratio = r.map_or("n/a".to_string(), |r| format!("{r:.2}x"));
                let goal = match (mode.goal, r) {
                    (Some(g), Some(r)) if mode.kind != Kind::Untraced => {
                        format!("<= {g:.2}x {}", if r <= g { "met" } else { "MISSED" })
                    }
                    (Some(g), None) => format!("<= {g:.2}x"),
                    _ => String::new(),
                };
                // infertrace rows of a workload with a floor: the ratio to
                // it, and the goal as that ratio.
                let (vs_floor, floor_goal) = match mode.kind {
                    Kind::Infertrace(_) if b.floor.is_some() && b.floor != Some(mode.kind) => bench_floors::cells(
                        floor_ns(b).map(|f| ns_per_iter / f),
                        mode.floor_goal,
                    ),
                    _ => (String::new(), String::new()),
                };
                let goal = if floor_goal.is_empty() { goal } else { floor_goal };
                (format!("{ns_per_iter:.1}"), ratio, vs_floor, goal)
            }
            Outcome::Missing => {
                println!(
                    "{:<w0$} {:<w1$} {:>w2$}   n/a (tool missing)",
                    name,
                    mode.label,
                    mode.iterations,
                    w0 = W[0],
                    w1 = W[1],
                    w2 = W[2],
                );
                continue;
            }
            Outcome::Failed(why) => {
                notes.push(format!("{} / {}: FAILED: {why}", b.name, mode.label));
                ("failed".to_string(), String::new(), String::new(), String::new())
            }
        };
        println!(
            "{:<w0$} {:<w1$} {:>w2$} {:>w3$} {:>w4$} {:>w5$} {:>w6$}",
            name,
            mode.label,
            mode.iterations,
            ns,
            ratio,
            vs_floor,
            goal,
            w0 = W[0],
            w1 = W[1],
            w2 = W[2],
            w3 = W[3],
            w4 = W[4],
            w5 = W[5],
            w6 = W[6],
        );
    }
    for n in &notes {
        println!("  note: {n}");
    }
    let probes: Vec<String> = BENCHES
        .iter()
        .filter(selected)
        .filter(|b| b.modes.iter().any(|m| m.kind == Kind::Infertrace(&["--no-cuda-driver"])))
        .filter_map(|b| {
            let label = b.cuda_probe?;
            let traced = |kind: Kind| {
                rows.iter().find_map(|(rb, m, o)| match o {
                    Outcome::Measured { ns_per_iter, .. } if std::ptr::eq(*rb, b) && m.kind == kind => {
                        Some(*ns_per_iter)
                    }
                    _ => None,
                })
            };
            let cost = |t: Option<f64>| match (t, baseline(b)) {
                (Some(t), Some(u)) => format!("{:.0} ns/call", t - u),
                _ => "n/a".to_string(),
            };
            Some(format!(
                "{label}: {} (runtime + driver probed), {} (--no-cuda-driver)",
                cost(traced(Kind::Infertrace(&[]))),
                cost(traced(Kind::Infertrace(&["--no-cuda-driver"])))
            ))
        })
        .collect();
    if !probes.is_empty() {
        println!(
            "CUDA probes, {INFERTRACE} minus untraced (stand-in libcudart): {}",
            probes.join("; ")
        );
    }
    for b in BENCHES.iter().filter(selected) {
        let Some(label) = b.calls_per_s else { continue };
        let traced = rows.iter().find_map(|(rb, m, o)| match o {
            Outcome::Measured { ns_per_iter, .. } if std::ptr::eq(*rb, b) && m.kind == Kind::Infertrace(&[]) => Some(*ns_per_iter),
            _ => None,
        });
        let rate = |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{:.0} calls/s", 1e9 / ns));
        println!("{label}: {} untraced, {} traced ({INFERTRACE})", rate(baseline(b)), rate(traced));
    }
    let stop = if only.is_some() {
        Ok(String::new())
    } else {
        stop_times(&ctx)
    };
    match &stop {
        Ok(line) if line.is_empty() => {}
        Ok(line) => println!("{line}"),
        Err(e) => println!("stop (SIGINT to exit): FAILED: {e:#}"),
    }
    println!(
        "(total {:.0}s; tracer logs in {})",
        started.elapsed().as_secs_f64(),
        ctx.out_dir.display()
    );
    // A workload whose untraced run was not measured (but for a missing
    // tool) has no ratios: an error.
    let no_baseline: Vec<&str> = BENCHES
        .iter()
        .filter(selected)
        .filter(|b| {
            baseline(b).is_none()
                && !rows.iter().any(|(rb, m, o)| {
                    std::ptr::eq(*rb, *b)
                        && m.kind == Kind::Untraced
                        && matches!(o, Outcome::Missing)
                })
        })
        .map(|b| b.name)
        .collect();
    if !no_baseline.is_empty() {
        bail!(
            "the untraced baseline could not be measured for: {}",
            no_baseline.join(", ")
        );
    }
    if rows
        .iter()
        .any(|(_, m, o)| matches!(m.kind, Kind::Infertrace(_)) && matches!(o, Outcome::Failed(_)))
        || stop.is_err()
    {
        bail!("infertrace failed in the benchmark (see the notes above)");
    }
    Ok(())
}

/// The `stop` workload: bench_cuda.py with the stand-in libraries loaded,
/// never released (it only holds them; `Untraced`: no `--probed`).
const STOP_BENCH: Bench = Bench {
    args: &["copy"],
    cuda_probe: Some("stop"),
    ..workload("stop", "bench_cuda.py", &[])
};
const STOP_MODE: Mode = mode(Kind::Untraced, "holding the libraries", None, 1);

/// `stop`: the median time from SIGINT to exit of `infertrace record -p`,
/// with CUDA probed and with `--no-cuda`, as the line printed under the
/// table.
fn stop_times(ctx: &Ctx) -> Result<String> {
    if !util::infertrace_bin().is_file() {
        return Ok("stop (SIGINT to exit): n/a (no infertrace binary)".into());
    }
    let script = util::workspace_root().join("tests/workloads").join(STOP_BENCH.script);
    let mut functions = 0;
    let mut median = |flags: &[&str]| -> Result<f64> {
        let mut times = Vec::new();
        for run in 1..=STOP_RUNS {
            let label = format!("infertrace {}-p (run {run})", flags.iter().map(|f| format!("{f} ")).collect::<String>());
            eprint!("bench: {:<13} {label:<37} ", STOP_BENCH.name);
            let (secs, probed) = stop_once(ctx, &script, flags, run).inspect_err(|_| eprintln!("failed"))?;
            eprintln!("{secs:.3} s ({probed} CUDA functions probed)");
            functions = functions.max(probed);
            times.push(secs);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    };
    let cuda = median(&[])?;
    let no_cuda = median(&["--no-cuda"])?;
    let verdict = if cuda <= STOP_GOAL_S { "met" } else { "MISSED" };
    Ok(format!(
        "stop (SIGINT to exit, {INFERTRACE}, median of {STOP_RUNS}): {cuda:.2} s with {functions} CUDA functions probed \
         (goal <= {STOP_GOAL_S} s {verdict}), {no_cuda:.2} s with --no-cuda"
    ))
}

/// One `stop` run: attaches to a process holding the stand-in libraries,
/// waits until the probes are in place, sends SIGINT and times the exit.
/// Returns the seconds and the CUDA functions probed (from the report's
/// notes).
fn stop_once(ctx: &Ctx, script: &Path, flags: &[&str], run: usize) -> Result<(f64, usize)> {
    let w = Workload::start(ctx, script, &STOP_BENCH, &STOP_MODE)?;
    let name = slug(&["stop", &flags.join(" "), &run.to_string()]);
    let recording = ctx.out_dir.join(format!("{name}.itr"));
    let _ = fs::remove_file(&recording);
    let mut cmd = boosted(util::infertrace_bin());
    cmd.args(["record", "-q"]).args(flags).args(["-p", &w.pids[0].to_string(), "-o"]).arg(&recording);
    let mut t = Tracer::spawn(cmd, ctx.out_dir.join(format!("{name}.log")))?;
    t.wait_for_probes()?;
    let sent = Instant::now();
    util::signal(t.child.id(), util::SIGINT);
    let status = loop {
        if let Some(status) = t.child.try_wait()? {
            break status;
        }
        if sent.elapsed() > EXIT_TIMEOUT {
            bail!("infertrace did not exit within {EXIT_TIMEOUT:?} of SIGINT: {}", t.log_tail());
        }
        thread::sleep(Duration::from_millis(2));
    };
    let secs = sent.elapsed().as_secs_f64();
    if !status.success() {
        bail!("infertrace exited with {status}: {}", t.log_tail());
    }
    // `note: pid N: CUDA runtime PATH: 27 functions probed`
    let log = fs::read_to_string(&t.log).unwrap_or_default();
    let probed = log
        .lines()
        .filter_map(|l| l.strip_suffix(" functions probed"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .sum();
    if flags.is_empty() && probed == 0 {
        bail!("no CUDA function probed: {}", t.log_tail());
    }
    Ok((secs, probed))
}

struct Ctx {
    python: PathBuf,
    /// The real py-spy (next to the interpreter, else on PATH), not a pyenv
    /// shim in front of it.
    py_spy: Option<PathBuf>,
    out_dir: PathBuf,
    /// The stand-in libcudart, built on first use.
    cudasim: OnceCell<Result<PathBuf, String>>,
}

impl Ctx {
    fn new() -> Result<Self> {
        let out_dir = util::target_dir().join("bench");
        fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
        let python = util::python3()?;
        let py_spy = python
            .parent()
            .map(|d| d.join("py-spy"))
            .filter(|p| p.is_file())
            .or_else(|| util::which("py-spy"));
        Ok(Self {
            python,
            py_spy,
            out_dir,
            cudasim: OnceCell::new(),
        })
    }

    /// tests/cudasim/build.sh into target/bench/cudasim: a copy of the
    /// stand-in of our own, so that uprobes other tracers (tests running at
    /// the same time) put on target/cudasim's never reach the untraced runs.
    fn cudasim(&self) -> Result<&Path> {
        let built = self.cudasim.get_or_init(|| {
            let dir = self.out_dir.join("cudasim");
            let script = util::workspace_root().join("tests/cudasim/build.sh");
            util::output(Command::new("sh").arg(&script).arg(&dir))
                .map(|_| dir)
                .map_err(|e| format!("building the CUDA stand-in: {e:#}"))
        });
        match built {
            Ok(dir) => Ok(dir),
            Err(e) => bail!("{e}"),
        }
    }
}

/// A command for `program` that runs at nice -20 when we are root (through
/// `nice`, which execs it: the pid is the program's). Workloads and tracers
/// both run boosted, so that unrelated load on a shared machine (a build)
/// barely takes CPU from either and the ratios compare the tracers, not the
/// neighbours; a tracer's own CPU use still competes with the workload.
fn boosted(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if util::is_root() && util::which("nice").is_some() {
        let mut c = Command::new("nice");
        c.args(["-n", "-20"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// perf trace (and aya) need tracefs; a fresh machine does not mount it.
fn ensure_tracefs() {
    if Path::new("/sys/kernel/tracing/events").is_dir() || !util::is_root() {
        return;
    }
    let _ = Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .stderr(Stdio::null())
        .status();
}

/// Whether the program a mode needs is missing.
fn is_missing(ctx: &Ctx, mode: &Mode) -> bool {
    match mode.kind {
        Kind::PySpy => ctx.py_spy.is_none(),
        Kind::Infertrace(_) => !util::infertrace_bin().is_file(),
        _ => mode.tool.is_some_and(|t| util::which(t).is_none()),
    }
}

/// The untraced runs of one workload; their median is the baseline.
#[derive(Default)]
struct Untraced {
    /// ns/iter, in the order of the runs.
    samples: Vec<f64>,
    error: Option<String>,
}

impl Untraced {
    /// One more run, unless one has failed.
    fn run(&mut self, ctx: &Ctx, script: &Path, bench: &Bench, mode: &Mode) {
        if self.error.is_some() {
            return;
        }
        eprint!(
            "bench: {:<13} {:<37} ",
            bench.name,
            format!("{} (run {})", mode.label, self.samples.len() + 1)
        );
        match run_untraced(ctx, script, bench, mode) {
            Ok(ns) => {
                eprintln!("{ns:.1} ns/iter");
                self.samples.push(ns);
            }
            Err(e) => {
                eprintln!("failed");
                self.error = Some(format!("{e:#}"));
            }
        }
    }

    fn outcome(&self) -> Outcome {
        if let Some(e) = &self.error {
            return Outcome::Failed(e.clone());
        }
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let note = format!(
            "median of {n} runs, in run order: {}",
            self.samples
                .iter()
                .map(|s| format!("{s:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Outcome::Measured {
            ns_per_iter: median,
            note: Some(note),
        }
    }
}

fn run_untraced(ctx: &Ctx, script: &Path, bench: &Bench, mode: &Mode) -> Result<f64> {
    let mut w = Workload::start(ctx, script, bench, mode)?;
    let ns = w.release_and_measure()?;
    w.finish()?;
    Ok(ns)
}

/// The workload process, waiting for "go" on its stdin.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// The processes to trace: the one we started, then the ones it forked
    /// (from its `ready PID [PID...]` line).
    pids: Vec<u32>,
}

impl Workload {
    fn start(ctx: &Ctx, script: &Path, bench: &Bench, mode: &Mode) -> Result<Self> {
        let mut cmd = boosted(&ctx.python);
        cmd.arg(script)
            .args(bench.args)
            .arg(mode.iterations.to_string())
            .arg("--wait");
        if bench.cuda_probe.is_some() {
            let dir = ctx.cudasim()?;
            cmd.env("CUDART", dir.join("libcudart.so.12"))
                .env("FAKE_KERNELS", dir.join("libfakekernels.so"));
            // With a budget the launch probes come and go: no wait.
            let probed = match mode.kind {
                Kind::Infertrace(f) => !f.contains(&"--no-cuda") && !f.contains(&"--max-overhead"),
                Kind::Floor(f) => f.probes_user_code(),
                _ => false,
            };
            if probed {
                cmd.arg("--probed");
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", script.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut w = Self {
            child,
            stdin,
            lines,
            pids: Vec::new(),
        };
        let ready = w
            .next_line(Duration::from_secs(20))
            .context("workload did not start")?;
        w.pids = ready
            .strip_prefix("ready ")
            .map(|p| {
                p.split_whitespace()
                    .map(str::parse)
                    .collect::<Result<Vec<u32>, _>>()
            })
            .and_then(Result::ok)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| anyhow!("unexpected line from the workload: {ready:?}"))?;
        if w.pids[0] != w.child.id() {
            bail!(
                "workload reports pid {} but we started {}",
                w.pids[0],
                w.child.id()
            );
        }
        Ok(w)
    }

    fn next_line(&mut self, timeout: Duration) -> Result<String> {
        self.lines.recv_timeout(timeout).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => {
                anyhow!("no output from the workload within {timeout:?}")
            }
            mpsc::RecvTimeoutError::Disconnected => anyhow!("the workload exited early"),
        })
    }

    fn release_and_measure(&mut self) -> Result<f64> {
        let stdin = self.stdin.as_mut().context("workload already finished")?;
        stdin.write_all(b"go\n").context("releasing the workload")?;
        stdin.flush()?;
        let line = self.next_line(LOOP_TIMEOUT)?;
        line.strip_prefix("ns_per_iter ")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("unexpected line from the workload: {line:?}"))
    }

    /// Closes the workload's stdin (it exits then) and checks its status.
    fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for the workload")?;
        if !status.success() {
            bail!("the workload exited with {status}");
        }
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A tracer process attached to the workload; killed if dropped early.
struct Tracer {
    child: Child,
    log: PathBuf,
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            util::signal(self.child.id(), util::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

impl Tracer {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let line = util::display(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting `{line}`"))?;
        Ok(Self { child, log })
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            format!("(no output; log {})", self.log.display())
        } else {
            format!("{tail} (log {})", self.log.display())
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "tracer exited before the loop ran ({status}): {}",
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Waits until the log contains `needle`.
    fn wait_for_output(&mut self, needle: &str) -> Result<()> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            self.check_alive()?;
            if fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains(needle)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tracer did not print {needle:?} within {ATTACH_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the tracer holds BPF-link or perf-event file descriptors and
    /// their number has been stable for a second: attachment is done.
    fn wait_for_probes(&mut self) -> Result<()> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let mut last = 0usize;
        let mut stable_since = Instant::now();
        loop {
            self.check_alive()?;
            let n = probe_fds(self.child.id());
            if n != last {
                last = n;
                stable_since = Instant::now();
            } else if n > 0 && stable_since.elapsed() >= Duration::from_secs(1) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tracer did not attach within {ATTACH_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGINT and waits for the tracer to exit. Returns a note when
    /// it did not exit cleanly.
    fn stop(mut self) -> Result<Option<String>> {
        util::signal(self.child.id(), util::SIGINT);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // strace detaches, then re-raises SIGINT on itself: clean.
                use std::os::unix::process::ExitStatusExt as _;
                let clean = status.success() || status.signal() == Some(util::SIGINT);
                return Ok((!clean).then(|| {
                    format!(
                        "tracer exited with {status} after SIGINT: {}",
                        self.log_tail()
                    )
                }));
            }
            if Instant::now() > deadline {
                util::signal(self.child.id(), util::SIGKILL);
                let _ = self.child.wait();
                return Ok(Some(format!(
                    "tracer ignored SIGINT for {EXIT_TIMEOUT:?} and was killed"
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Number of BPF-link / perf-event fds a process holds.
fn probe_fds(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            // Attachments only: programs and maps exist before attaching.
            t.starts_with("anon_inode:")
                && (t.contains("bpf_link") || t.contains("bpf-link") || t.contains("perf_event"))
        })
        .count()
}

/// True once a ptrace tracer is attached to `pid`.
fn ptraced(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .is_some_and(|p| p != 0)
}

fn pid_list(pids: &[u32], sep: &str) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// A file-name-safe slug of `parts`.
fn slug(parts: &[&str]) -> String {
    let s: String = parts
        .join("-")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn traced(ctx: &Ctx, script: &Path, bench: &Bench, mode: &Mode) -> Result<Outcome> {
    let mut w = Workload::start(ctx, script, bench, mode)?;
    let pids = w.pids.clone();
    let name = slug(&[bench.name, mode.label]);
    let log = ctx.out_dir.join(format!("{name}.log"));
    // bpftrace filter on the process (tgid) of the current task.
    let filter = pids
        .iter()
        .map(|p| format!("pid == {p}"))
        .collect::<Vec<_>>()
        .join(" || ");

    // `ELSEWHERE`: infertrace traces an idle process, not the workload.
    let mut bystander: Option<Child> = None;
    let tracer = match mode.kind {
        Kind::Infertrace(flags) => {
            let bin = util::infertrace_bin();
            let recording = ctx.out_dir.join(format!("{name}.itr"));
            let _ = fs::remove_file(&recording);
            let mut cmd = boosted(&bin);
            if flags == AGENT {
                cmd.args(["agent", "-q", "--window", "60s", "--listen", "127.0.0.1:0", "--out-dir"]);
                cmd.arg(ctx.out_dir.join(format!("{name}.agent")));
                for p in &pids {
                    cmd.args(["--pid", &p.to_string()]);
                }
            } else {
                cmd.args(["record", "-q"]);
                if flags == ELSEWHERE {
                    let idle = Command::new("sleep").arg("3600").spawn().context("starting an idle process")?;
                    cmd.args(["-p", &idle.id().to_string()]);
                    bystander = Some(idle);
                } else {
                    cmd.args(flags);
                    for p in &pids {
                        cmd.args(["-p", &p.to_string()]);
                    }
                }
                cmd.arg("-o").arg(&recording);
            }
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_probes()?;
            t
        }
        Kind::Bpftrace => {
            let program = format!(
                "tracepoint:raw_syscalls:sys_enter /{filter}/ {{ @s[tid] = nsecs; }} \
                 tracepoint:raw_syscalls:sys_exit /@s[tid]/ {{ @h[args->id] = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
            );
            let mut cmd = boosted("bpftrace");
            cmd.args(["-e", &program]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_output("Attaching")?;
            t.wait_for_probes()?;
            t
        }
        Kind::BpftraceOffcpu => {
            // offcputime-style: at switch-out (current = prev) keep the
            // time and the stacks per thread; at switch-in sum the time
            // off CPU by (kernel stack, user stack, comm).
            let program = format!(
                "tracepoint:sched:sched_switch /{filter}/ {{ @start[tid] = nsecs; @ks[tid] = kstack; @us[tid] = ustack; }} \
                 tracepoint:sched:sched_switch /@start[args->next_pid]/ {{ $t = args->next_pid; \
                   @off[@ks[$t], @us[$t], args->next_comm] = sum(nsecs - @start[$t]); \
                   delete(@start[$t]); delete(@ks[$t]); delete(@us[$t]); }} \
                 END {{ clear(@start); clear(@ks); clear(@us); }}"
            );
            let mut cmd = boosted("bpftrace");
            cmd.args(["-e", &program]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_output("Attaching")?;
            t.wait_for_probes()?;
            t
        }
        Kind::Strace => {
            let mut cmd = boosted("strace");
            cmd.args(["-c", "-f", "-o", "/dev/null"]);
            for p in &pids {
                cmd.args(["-p", &p.to_string()]);
            }
            let mut t = Tracer::spawn(cmd, log)?;
            let deadline = Instant::now() + ATTACH_TIMEOUT;
            while !pids.iter().all(|p| ptraced(*p)) {
                t.check_alive()?;
                if Instant::now() > deadline {
                    bail!(
                        "strace did not attach within {ATTACH_TIMEOUT:?}: {}",
                        t.log_tail()
                    );
                }
                thread::sleep(Duration::from_millis(50));
            }
            thread::sleep(Duration::from_secs(1));
            t
        }
        Kind::Perf => {
            let mut cmd = boosted("perf");
            cmd.args([
                "trace",
                "-s",
                "-p",
                &pid_list(&pids, ","),
                "-o",
                "/dev/null",
            ]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_probes()?;
            t
        }
        Kind::PerfRecord => {
            let data = ctx.out_dir.join(format!("{name}.data"));
            let _ = fs::remove_file(&data);
            let mut cmd = boosted("perf");
            cmd.args([
                "record",
                "-g",
                "-F",
                "99",
                "-p",
                &pid_list(&pids, ","),
                "-o",
            ])
            .arg(&data);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_probes()?;
            t
        }
        Kind::PySpy => {
            let svg = ctx.out_dir.join(format!("{name}.svg"));
            let _ = fs::remove_file(&svg);
            let py_spy = ctx.py_spy.as_ref().context("py-spy is not installed")?;
            let mut cmd = boosted(py_spy);
            cmd.args([
                "record",
                "--rate",
                "99",
                "--pid",
                &pids[0].to_string(),
                "-o",
            ])
            .arg(&svg)
            .arg("--nonblocking");
            let mut t = Tracer::spawn(cmd, log)?;
            // Printed once it has read the interpreter's state; the first
            // samples follow.
            t.wait_for_output("Sampling process")?;
            thread::sleep(Duration::from_secs(1));
            t
        }
        Kind::Floor(f) => {
            let program = if f.probes_user_code() {
                let lib = ctx.cudasim()?.join("libcudart.so.12");
                let function = bench_floors::cuda_function(bench.args)
                    .with_context(|| format!("{}: a uprobe floor needs a CUDA workload", bench.name))?;
                f.program(&lib.to_string_lossy(), function)
            } else {
                f.program("", "")
            };
            let mut cmd = boosted("bpftrace");
            cmd.args(["-e", &program]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_output("Attaching")?;
            t.wait_for_probes()?;
            t
        }
        Kind::Untraced => unreachable!("untraced runs do not come here"),
    };

    let measured = w.release_and_measure();
    // Stop the tracer while its target still runs (infertrace, strace and
    // perf would otherwise end on their own when it exits), then let the
    // workload exit.
    let note = tracer.stop()?;
    if let Some(mut idle) = bystander {
        let _ = idle.kill();
        let _ = idle.wait();
    }
    let finished = w.finish();
    let ns_per_iter = measured?;
    if let Err(e) = finished {
        return Ok(Outcome::Failed(format!("{e:#}")));
    }
    Ok(Outcome::Measured { ns_per_iter, note })
}
