//! `infertrace record`: trace processes, write a recording, print the report.

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Context as _};
use clap::Args;

use super::{
    parse::{parse_blocked_loop, parse_checkpoint_every, parse_duration, parse_frequency, parse_max_overhead, parse_pid, parse_slow_syscall},
    report::{render, Format},
};
use crate::{
    engine::{self, checkpoint, session},
    families::{nvml, sched::SchedOptions},
    report::folded::Profile,
};

#[derive(Args)]
pub struct RecordArgs {
    /// Attach to a running process: all its threads, the threads and processes it starts later, and
    /// the descendants it has now (a DataLoader's or a multiprocessing pool's workers). Repeatable.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
    pub pids: Vec<u32>,
    /// With -p: leave out the processes' existing descendants (children they start later are still followed).
    #[arg(long)]
    pub no_descendants: bool,
    /// Stop after this long (e.g. 500ms, 10s, 2m, 1h, 1d; a bare number is seconds; at most 365d).
    #[arg(short, long, value_parser = parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
    pub duration: Option<Duration>,
    /// Recording file to write [default: infertrace-<timestamp>.itr].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace FILE with the recording so far this often, marked cut, so a killed tracer leaves it (0 turns it off).
    #[arg(long, value_parser = parse_checkpoint_every, default_value = checkpoint::DEFAULT_EVERY, value_name = "DURATION", allow_hyphen_values = true)]
    pub checkpoint_every: Duration,
    /// No status line on stderr.
    #[arg(short, long)]
    pub quiet: bool,
    /// Format of the report printed at the end (`report` renders the recording in any format later).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Text report: show every process, row, stack, histogram and detail (by default a compact report: the
    /// busiest processes and the top rows, two screens for a short run).
    #[arg(short, long)]
    pub verbose: bool,
    /// CPU sampling frequency in Hz, on every CPU, 0 to 10000 (0 turns sampling off).
    #[arg(short = 'F', long, default_value_t = engine::DEFAULT_FREQUENCY, value_name = "HZ",
          value_parser = parse_frequency, allow_negative_numbers = true)]
    pub frequency: u64,
    /// Syscall accounting only: no scheduler tracing, no CPU sampling (lowest overhead).
    #[arg(long)]
    pub no_sched: bool,
    /// Do not capture stacks when threads go off CPU.
    #[arg(long)]
    pub no_offcpu_stacks: bool,
    /// Syscalls at least this slow get their Python and native stacks recorded, 1us to 24h (0 turns it off).
    #[arg(long, value_parser = parse_slow_syscall, default_value = engine::DEFAULT_SLOW_SYSCALL, value_name = "DURATION",
          allow_hyphen_values = true)]
    pub slow_syscall: Duration,
    /// Do not look for CPython in the targets (native stacks only).
    #[arg(long)]
    pub no_python: bool,
    /// Do not probe CUDA (libcudart, libcuda) in the targets, and do not sample the GPUs.
    #[arg(long)]
    pub no_cuda: bool,
    /// Probe libcudart only, not the driver API (libcuda): runtime calls, which each enter the driver,
    /// then hit one probe pair instead of two, but driver calls made directly (Triton, CuPy's kernels...)
    /// go unseen, and so does all the work of libraries that carry a stripped runtime of their own
    /// (cuBLAS, cuDNN, NCCL: their kernels are seen only as driver launches).
    #[arg(long)]
    pub no_cuda_driver: bool,
    /// GPU utilization, memory and PCIe samples per second through NVML, 1 to 10 (when NVML is present).
    #[arg(long, default_value_t = nvml::DEFAULT_HZ, value_name = "HZ", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(i64::from(nvml::MIN_HZ)..=i64::from(nvml::MAX_HZ)))]
    pub gpu_sample_hz: u32,
    /// Print the kernel programs' rare diagnostics on stderr (a Python stack walk that met a frame it
    /// could not read, a CUDA argument that could not be read); off by default.
    #[arg(long)]
    pub debug_ebpf: bool,
    /// Also keep a timeline: timestamped thread-state intervals, slow syscalls, CUDA calls, CPU samples,
    /// thread and process starts and exits (for `report --format perfetto`); off by default (the probes then skip it with one branch).
    #[arg(long)]
    pub timeline: bool,
    /// With --timeline: events kept per source (kernel events; CUDA calls), 1000 to 100000000; the rest are
    /// counted as dropped and reported.
    #[arg(long, value_name = "N", default_value_t = crate::recording::timeline::DEFAULT_LIMIT,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub timeline_limit: u64,
    /// Command to launch and trace, with its fork/exec children.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// asyncio event loops (on by default; this flag only says so): each loop's busy, idle and lag,
    /// blocked-loop findings, and per task (CPython 3.14+) time running, awaiting by `await` line, and ready.
    #[arg(long = "async", overrides_with = "no_async")]
    pub async_on: bool,
    /// Do not look for asyncio event loops (no selector probes, no stack sampler).
    #[arg(long)]
    pub no_async: bool,
    /// An event-loop step (a callback or task step between two selector calls) that runs at least this
    /// long without yielding is a blocked loop, 1ms to 1h (asyncio's own slow-callback warning is 100 ms
    /// in debug mode; 20 ms is one frame of a 50 Hz service).
    #[arg(long, value_parser = parse_blocked_loop, default_value = crate::families::python::asyncio::record::DEFAULT_BLOCKED_LOOP, value_name = "DURATION")]
    pub blocked_loop: Duration,
    /// An overhead budget, 0.1 to 100 (percent of a target's time): when the CUDA launch probes would add
    /// more, they are attached in time slices (for example 2 ms on, then off) sized to the budget, and the
    /// launch counts are estimated from the slices and marked as estimates (their measured error and the
    /// slowdown left are in docs/overhead.md, "An overhead budget"). Off by
    /// default: every launch is probed and counted exactly.
    #[arg(long, value_name = "PCT", value_parser = parse_max_overhead, allow_negative_numbers = true)]
    pub max_overhead: Option<f64>,
    /// Do not follow resident memory: no RSS series (anon/file/shmem/swap), peak, growth rate, nor the
    /// "resident growth by line" table (the kmem/rss_stat tracepoint, a stack sampled per 512 KiB grown).
    #[arg(long)]
    pub no_memory: bool,
}

pub fn run(args: RecordArgs) -> anyhow::Result<ExitCode> {
    let RecordArgs { pids, no_descendants, duration, output, checkpoint_every, quiet, format, verbose, frequency, no_sched, no_offcpu_stacks, slow_syscall, no_python, no_cuda, no_cuda_driver, gpu_sample_hz, debug_ebpf, timeline, timeline_limit, command, async_on, no_async, blocked_loop, max_overhead, no_memory } = args;
    let sched = SchedOptions { enabled: !no_sched, frequency, offcpu_stacks: !no_offcpu_stacks };
    let slow_syscall = (!slow_syscall.is_zero()).then_some(slow_syscall);
    let checkpoint_every = (!checkpoint_every.is_zero()).then_some(checkpoint_every);
    let opts = session::RecordOptions { pids, descendants: !no_descendants, sched, slow_syscall, python: !no_python, cuda: !no_cuda, cuda_driver: !no_cuda_driver, gpu_sample_hz, debug_ebpf, command, duration, output, checkpoint_every, quiet, timeline_limit: timeline.then_some(timeline_limit), asyncio: crate::families::python::asyncio::record::AsyncOptions { enabled: async_on || !no_async, blocked_threshold: blocked_loop }, max_overhead, memory: !no_memory };
    let argv: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = match rt.block_on(engine::record::record(opts, argv, crate::families::list())) {
        Ok(o) => o,
        Err(e) => bail!("{e} (hint: {})", e.hint()),
    };
    // The report is printed whether or not the recording could be written.
    let report = render(&outcome.recording, format, Profile::Cpu, verbose)?;
    let printed = {
        let mut out = std::io::stdout().lock();
        out.write_all(&report).and_then(|()| out.flush())
    };
    if let Err(e) = outcome.written {
        bail!("{e} (hint: {})", if printed.is_ok() { "the report above is what was recorded; choose a writable path with -o FILE" } else { "choose a writable path with -o FILE" });
    }
    if let Err(e) = printed {
        bail!("cannot print the report: {e} (hint: the recording is in {}; `infertrace report` renders it)", outcome.path.display());
    }
    if !quiet {
        let _ = writeln!(std::io::stderr(), "infertrace: recording written to {}", outcome.path.display());
    }
    Ok(ExitCode::SUCCESS)
}
