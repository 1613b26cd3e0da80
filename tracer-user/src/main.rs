//! The `infertrace` command line.

mod agent_cli;

use std::{
    io::Write as _,
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use infertrace::{
    checkpoint, collect, doctor, nvml, python,
    recording::{limits, ReadLimits, Recording},
    report::{self, fmt::printable, folded::Profile},
    sched::SchedOptions,
    session,
};

#[derive(Parser)]
#[command(
    name = "infertrace",
    version,
    about = "Where does the time of a Python / GPU inference service go? Traced from outside, with eBPF.",
    long_about = "infertrace attaches eBPF probes to running processes (or a command it launches, with its \
children) and accounts for their time from outside, without restarting them: every syscall counted and \
timed in the kernel; each thread's wall time split into on-CPU, off-CPU by reason (I/O, locks, polling, \
sleep, GIL) and run-queue delay; CPU samples and off-CPU stacks; for CPython 3.8-3.15, each of these \
attributed to the Python line that caused it; for CUDA programs, every host<->device copy, sync and \
kernel launch by call site, with findings about wasteful copy patterns, and NVML GPU samples. \
Needs root (or CAP_BPF+CAP_PERFMON) and a kernel with BTF; run `infertrace doctor` to check a machine.\n\n\
Examples:\n  infertrace record -p 1234 --duration 30s\n  infertrace record -- python3 serve.py\n  \
infertrace report infertrace-20260101-120000.itr --format json\n  infertrace dump -p 1234"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// strace -c style tables, wall-time breakdown and top stacks.
    Text,
    /// Machine-readable report (docs/report-schema.md).
    Json,
    /// Folded stacks (flamegraph.pl, inferno, speedscope).
    Folded,
    /// A flame graph, rendered in-process.
    Svg,
    /// speedscope JSON (speedscope.app): one profile per thread, for --profile cpu|off-cpu|wall.
    Speedscope,
    /// Gzipped pprof profile.proto (go tool pprof, Pyroscope, Grafana): samples/count, cpu/nanoseconds,
    /// off_cpu/nanoseconds, a `thread` label per sample (binary; use -o FILE).
    Pprof,
    /// Perfetto protobuf trace of the timeline (ui.perfetto.dev; needs `record --timeline`; binary, use -o FILE).
    Perfetto,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DumpFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Check whether tracing can work on this machine (privileges, kernel, BTF, tracefs...).
    Doctor,
    /// Trace processes and write a recording, then print the report.
    #[command(after_help = "Stops on Ctrl-C / SIGTERM / SIGHUP, at --duration, or when every target has exited, then writes the \
recording and prints the report.\n\
The output is replaced whole (written to .FILE.tmp-PID beside it, then renamed), never before tracing starts: a failed \
launch leaves an existing FILE as it was. Every --checkpoint-every, FILE is replaced with the recording so far, \
marked cut: a tracer killed (kill -9, a crash) leaves its last checkpoint, which `report` reads and says is cut.\n\
SIGUSR1 writes the recording so far beside the output (FILE.snapshot.itr, replaced at each signal) and goes on.\n\
Probes are owned by this process: however it ends (even kill -9), the kernel removes them.")]
    Record {
        /// Attach to a running process (all its threads, and threads it starts later). Repeatable.
        #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
        pids: Vec<u32>,
        /// Stop after this long (e.g. 500ms, 10s, 2m, 1h, 1d; a bare number is seconds; at most 365d).
        #[arg(short, long, value_parser = parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
        duration: Option<Duration>,
        /// Recording file to write [default: infertrace-<timestamp>.itr].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Replace FILE with the recording so far this often, marked cut, so a killed tracer leaves it (0 turns it off).
        #[arg(long, value_parser = parse_checkpoint_every, default_value = checkpoint::DEFAULT_EVERY, value_name = "DURATION", allow_hyphen_values = true)]
        checkpoint_every: Duration,
        /// No status line on stderr.
        #[arg(short, long)]
        quiet: bool,
        /// Format of the report printed at the end (`report` renders the recording in any format later).
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// CPU sampling frequency in Hz, on every CPU, 0 to 10000 (0 turns sampling off).
        #[arg(short = 'F', long, default_value_t = collect::DEFAULT_FREQUENCY, value_name = "HZ",
              value_parser = parse_frequency, allow_negative_numbers = true)]
        frequency: u64,
        /// Syscall accounting only: no scheduler tracing, no CPU sampling (lowest overhead).
        #[arg(long)]
        no_sched: bool,
        /// Do not capture stacks when threads go off CPU.
        #[arg(long)]
        no_offcpu_stacks: bool,
        /// Syscalls at least this slow get their Python and native stacks recorded, 1us to 24h (0 turns it off).
        #[arg(long, value_parser = parse_slow_syscall, default_value = collect::DEFAULT_SLOW_SYSCALL, value_name = "DURATION",
              allow_hyphen_values = true)]
        slow_syscall: Duration,
        /// Do not look for CPython in the targets (native stacks only).
        #[arg(long)]
        no_python: bool,
        /// Do not probe CUDA (libcudart, libcuda) in the targets, and do not sample the GPUs.
        #[arg(long)]
        no_cuda: bool,
        /// Probe libcudart only, not the driver API (libcuda): runtime calls, which each enter the driver,
        /// then hit one probe pair instead of two, but driver calls made directly (cuBLAS, Triton...) go unseen.
        #[arg(long)]
        no_cuda_driver: bool,
        /// GPU utilization, memory and PCIe samples per second through NVML, 1 to 10 (when NVML is present).
        #[arg(long, default_value_t = nvml::DEFAULT_HZ, value_name = "HZ", allow_negative_numbers = true,
              value_parser = clap::value_parser!(u32).range(i64::from(nvml::MIN_HZ)..=i64::from(nvml::MAX_HZ)))]
        gpu_sample_hz: u32,
        /// Print the kernel programs' rare diagnostics on stderr (a Python stack walk that met a frame it
        /// could not read, a CUDA argument that could not be read); off by default.
        #[arg(long)]
        debug_ebpf: bool,
        /// Also keep a timeline: timestamped thread-state intervals, slow syscalls, CUDA calls, CPU samples,
        /// thread and process starts and exits (for `report --format perfetto`); off by default (the probes then skip it with one branch).
        #[arg(long)]
        timeline: bool,
        /// With --timeline: events kept per source (kernel events; CUDA calls), 1000 to 100000000; the rest are
        /// counted as dropped and reported.
        #[arg(long, value_name = "N", default_value_t = infertrace::recording::timeline::DEFAULT_LIMIT,
              value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
        timeline_limit: u64,
        /// Command to launch and trace, with its fork/exec children.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
        /// asyncio event loops (on by default; this flag only says so): each loop's busy, idle and lag,
        /// blocked-loop findings, and per task (CPython 3.14+) time running, awaiting by `await` line, and ready.
        #[arg(long = "async", overrides_with = "no_async")]
        async_on: bool,
        /// Do not look for asyncio event loops (no selector probes, no stack sampler).
        #[arg(long)]
        no_async: bool,
        /// An event-loop step (a callback or task step between two selector calls) that runs at least this
        /// long without yielding is a blocked loop, 1ms to 1h (asyncio's own slow-callback warning is 100 ms
        /// in debug mode; 20 ms is one frame of a 50 Hz service).
        #[arg(long, value_parser = parse_blocked_loop, default_value = infertrace::asyncio::DEFAULT_BLOCKED_LOOP, value_name = "DURATION")]
        blocked_loop: Duration,
        /// An overhead budget, 0.1 to 100 (percent of a target's time): when the CUDA launch probes would add
        /// more, they are attached in time slices (for example 2 ms on, then off) sized to the budget, and the
        /// launch counts are estimated from the slices and marked as estimates (their measured error and the
        /// slowdown left are in docs/overhead.md, "An overhead budget"). Off by
        /// default: every launch is probed and counted exactly.
        #[arg(long, value_name = "PCT", value_parser = parse_max_overhead, allow_negative_numbers = true)]
        max_overhead: Option<f64>,
    },
    /// Print the current Python stack of every thread of a live process, like `py-spy dump`.
    #[command(after_help = "Works on a process that is blocked, spinning or waiting for the GIL; the process is not stopped.\nCPython 3.8-3.15 with the GIL (shared libpython or static builds; a newer CPython through the layout it publishes).\n\
With --async: the task tree of every asyncio event loop instead, from the offsets CPython 3.14 and 3.15 publish \
for debuggers (what `python -m asyncio pstree` reads); earlier versions are refused with a one-line error.\n\n\
Examples:\n  infertrace dump -p 1234\n  infertrace dump -p 1234 --async --format json")]
    Dump {
        /// The process.
        #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
        pid: u32,
        #[arg(long, value_enum, default_value = "text")]
        format: DumpFormat,
        /// Also show native frames below the Python ones (text only).
        #[arg(long)]
        native: bool,
        /// Instead of the threads' stacks, the asyncio task tree of every event loop (like
        /// `python -m asyncio pstree`): each task's name and id, state (running, awaiting what,
        /// ready, done), coroutine stack with the line of each `await`, the tasks awaiting it.
        /// CPython 3.14+ (the asyncio offsets it publishes). The process is held still
        /// (ptrace-seized, no signal) for the few milliseconds of the read, as py-spy's dump does.
        #[arg(long = "async", conflicts_with = "native")]
        async_tasks: bool,
    },
    /// A live view of running processes, redrawn every second (like `top`): wall-time bars, verdict, hot code.
    #[command(after_help = "Shows, per thread, a bar of the wall-time split (on-CPU, syscalls, run-queue, GIL, io, lock, \
poll, sleep, other; the letters of the text report's legend); the verdict so far; the top Python functions by on-CPU \
samples and by off-CPU wait; the top syscalls by time; CUDA copies per second and bytes; the CUDA findings as they \
appear. Rates are the difference of two consecutive snapshots, per second.\n\
Keys: q (or Esc, Ctrl-C) quits; Tab / Shift-Tab / 1-6 switch views (overview, threads, python, syscalls, cuda, \
findings); s cycles the order: last interval (rates, busiest first), since start (totals), name.\n\
Needs a terminal (stdout a TTY). Quitting (q, SIGTERM, SIGHUP) restores the terminal and detaches every probe, \
as `record` does at its end.\n\n\
Examples:\n  infertrace top -p 1234\n  infertrace top --python")]
    Top {
        /// Trace a running process (all its threads, and processes it starts). Repeatable.
        #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
        pids: Vec<u32>,
        /// Also every running CPython process (an executable named python*, or one that maps libpython*).
        #[arg(long)]
        python: bool,
        /// How often the screen is redrawn, 100ms to 1m.
        #[arg(long, value_parser = parse_refresh, default_value = "1s", value_name = "DURATION", allow_hyphen_values = true)]
        refresh: Duration,
        /// CPU sampling frequency in Hz, on every CPU, 0 to 10000 (0 turns sampling off).
        #[arg(short = 'F', long, default_value_t = collect::DEFAULT_FREQUENCY, value_name = "HZ",
              value_parser = parse_frequency, allow_negative_numbers = true)]
        frequency: u64,
        /// Do not probe CUDA (libcudart, libcuda), and do not sample the GPUs.
        #[arg(long)]
        no_cuda: bool,
    },
    /// Render a recording (needs no privileges).
    #[command(after_help = "Examples:\n  infertrace report rec.itr\n  infertrace report rec.itr --format svg --profile off-cpu -o offcpu.svg\n  infertrace report rec.itr --format folded | flamegraph.pl > cpu.svg")]
    Report {
        /// The .itr file written by `infertrace record`.
        file: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Which time the folded/svg/speedscope output weighs: CPU samples, off-CPU time, or both (wall).
        #[arg(long, value_enum, default_value = "cpu")]
        profile: Profile,
        /// Write the report here instead of stdout.
        #[arg(short, long, value_name = "OUT")]
        output: Option<PathBuf>,
        /// Read at most this much inflated recording data (e.g. 512MiB, 4GiB), for a file you trust. By
        /// default: 1GiB, and past 64MiB at most 100 times the file's size (a gzip bomb inflates 1000 times).
        /// Reading needs a few times this in memory.
        #[arg(long, value_name = "SIZE", value_parser = parse_max_inflated, allow_hyphen_values = true)]
        max_inflated: Option<u64>,
    },
    /// Compare two recordings (the verify step): per process, per bottleneck class, per Python line and per CUDA site.
    #[command(after_help = "Processes are matched by command line. Figures are milliseconds of thread time per second of \
window, so recordings of different lengths compare; `total` is the window length in seconds.\n\
--fail-if-slower PCT --metric METRIC, for CI: METRIC is `total`, a class (python_compute, native_compute, gil, io, \
waiting_on_threads, polling, sleeping, other_wait, cpu_starvation, gpu_sync, copy_work, native_pool), a Python line `file.py:LINE` \
or a CUDA site `cuda:file.py:LINE` (the names the report prints).\n\
Exit codes: 0 compared (and not slower beyond PCT); 3 METRIC regressed by more than PCT percent; \
1 an error (unreadable recording, a METRIC in neither recording); 2 a bad command line.\n\n\
Examples:\n  infertrace diff before.itr after.itr\n  infertrace diff before.itr after.itr --fail-if-slower 10 --metric gpu_sync\n  \
infertrace diff before.itr after.itr --fail-if-slower 5 --metric serve.py:42 --format json")]
    Diff {
        /// The recording before the change.
        before: PathBuf,
        /// The recording after it.
        after: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: DumpFormat,
        /// Exit with code 3 when --metric grew by more than PCT percent (e.g. 10).
        #[arg(long, value_name = "PCT", value_parser = parse_pct, allow_negative_numbers = true)]
        fail_if_slower: Option<f64>,
        /// What --fail-if-slower checks: total, a class, file.py:LINE or cuda:file.py:LINE.
        #[arg(long, value_name = "METRIC", default_value = "total")]
        metric: String,
        /// Read at most this much inflated data per recording (as for `report`).
        #[arg(long, value_name = "SIZE", value_parser = parse_max_inflated, allow_hyphen_values = true)]
        max_inflated: Option<u64>,
    },
    /// Trace selected processes continuously: rolling windows into a directory, Prometheus metrics over HTTP.
    #[command(after_help = agent_cli::AFTER_HELP)]
    Agent(agent_cli::AgentArgs),
}

/// `diff --fail-if-slower`: a percentage, 0 or more.
fn parse_pct(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        Ok(_) => Err(format!("`{s}` is not a percentage of 0 or more (e.g. 10)")),
        Err(_) => Err(format!("`{s}` is not a number (a percentage, e.g. 10)")),
    }
}

/// `500ms`, `10s`, `2m`, `1h`, `1d`, or a bare number of seconds, from
/// `min` to `max` (inclusive); out-of-range values are refused here, before
/// anything is attached, and never reach a `Duration` conversion.
fn parse_span(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!("`{s}` is negative (a duration is positive, e.g. 10s)"));
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("invalid duration `{s}` (examples: 500ms, 10s, 2m)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        _ => return Err(format!("invalid duration unit `{unit}` in `{s}` (use us, ms, s, m, h or d)")),
    };
    let range = || format!("{} to {}", fmt_span(min), fmt_span(max));
    if !(secs > 0.0 && secs.is_finite()) || secs < min.as_secs_f64() {
        return Err(format!("`{s}` is too short (use {})", range()));
    }
    if secs > max.as_secs_f64() {
        return Err(format!("`{s}` is too long (use {})", range()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `1us`, `24h`, `365d`: the bounds in [`parse_span`]'s messages.
fn fmt_span(d: Duration) -> String {
    match d.as_secs() {
        0 if d.as_micros() < 1000 => format!("{}us", d.as_micros()),
        0 => format!("{}ms", d.as_millis()),
        s if s % 86400 == 0 && s > 86400 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s => format!("{s}s"),
    }
}

/// `record --duration`: 1 ms to [`collect::MAX_DURATION`].
fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(1), collect::MAX_DURATION)
}

/// `record --slow-syscall`: 0 (off), or [`collect::MIN_SLOW_SYSCALL`] to
/// [`collect::MAX_SLOW_SYSCALL`].
fn parse_slow_syscall(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_span(s, collect::MIN_SLOW_SYSCALL, collect::MAX_SLOW_SYSCALL).map_err(|e| format!("{e}, or 0 to turn it off"))
}

/// `record --max-overhead`: a percentage, 0.1 to 100.
pub(crate) fn parse_max_overhead(s: &str) -> Result<f64, String> {
    let p = parse_pct(s)?;
    if !(collect::MIN_MAX_OVERHEAD..=collect::MAX_MAX_OVERHEAD).contains(&p) {
        return Err(format!(
            "`{s}` is out of range: the budget is {} to {} (percent of a target's time)",
            collect::MIN_MAX_OVERHEAD,
            collect::MAX_MAX_OVERHEAD
        ));
    }
    Ok(p)
}

/// `record --blocked-loop`: 1 ms to 1 h.
fn parse_blocked_loop(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(1), Duration::from_secs(3600))
}

/// `record --checkpoint-every`: 0 (off), or 10 ms to 24 h.
fn parse_checkpoint_every(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_span(s, Duration::from_millis(10), Duration::from_secs(24 * 3600)).map_err(|e| format!("{e}, or 0 to turn it off"))
}

/// `top --refresh`: 100 ms to 1 min.
fn parse_refresh(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(100), Duration::from_secs(60))
}

/// `record -F`: 0 (off) to [`collect::MAX_FREQUENCY`] Hz.
fn parse_frequency(s: &str) -> Result<u64, String> {
    let max = collect::MAX_FREQUENCY;
    let range = format!("use 0 (off) to {max} Hz; {} is the default", collect::DEFAULT_FREQUENCY);
    match s.trim().parse::<i128>() {
        Ok(hz) if (0..=i128::from(max)).contains(&hz) => Ok(hz as u64),
        Ok(_) => Err(format!("{s} Hz is out of range ({range})")),
        Err(_) => Err(format!("`{s}` is not a whole number of Hz ({range})")),
    }
}

/// `-p`: a process id, 1 or more.
fn parse_pid(s: &str) -> Result<u32, String> {
    match s.trim().parse::<i128>() {
        Ok(pid) if pid >= 1 && pid <= i128::from(u32::MAX) => Ok(pid as u32),
        Ok(_) => Err(format!("{s} is not a pid (pids are positive numbers; `ps -e` lists them)")),
        Err(_) => Err(format!("`{s}` is not a pid (a number, e.g. -p 1234)")),
    }
}

/// `report --max-inflated`: a size of at least 1 MiB.
fn parse_max_inflated(s: &str) -> Result<u64, String> {
    let v = limits::parse_size(s)?;
    if v < 1 << 20 {
        return Err(format!("`{s}` is too small (at least 1MiB; the default is 1GiB)"));
    }
    Ok(v)
}

fn render(rec: &Recording, format: Format, profile: Profile) -> anyhow::Result<Vec<u8>> {
    Ok(match format {
        Format::Text => report::text::render(rec).into_bytes(),
        Format::Json => report::json::render(rec).into_bytes(),
        Format::Folded => report::folded::render(rec, profile).into_bytes(),
        Format::Speedscope => report::speedscope::render(rec, profile).into_bytes(),
        Format::Perfetto => report::perfetto::render(rec).map_err(|e| {
            anyhow::anyhow!("{e}: no events to put in a Perfetto trace (hint: record with `infertrace record --timeline ...`)")
        })?,
        Format::Pprof => report::pprof::render(rec).context("encoding the pprof profile (hint: retry; this is an in-memory step)")?,
        Format::Svg => report::svg::render(rec, profile).map_err(|e| match e {
            report::svg::SvgError::Empty => anyhow::anyhow!(
                "no {} stacks in this recording (hint: record with sampling on (-F 99) and scheduler tracing (no --no-sched))",
                profile.title()
            ),
            other => anyhow::anyhow!("rendering the flame graph failed: {other}"),
        })?
        .into_bytes(),
    })
}

/// `dump --async`: the asyncio task tree (python/asyncio, report/async_dump).
fn dump_async(interp: &mut python::Interpreter, format: DumpFormat) -> anyhow::Result<ExitCode> {
    use infertrace::python::asyncio::AsyncioReader;
    let pid = interp.pid();
    let reader = AsyncioReader::new(interp).map_err(|e| anyhow::anyhow!("pid {pid}: {e} (hint: {})", e.hint()))?;
    // A task list the loop is changing right now reads inconsistent: read again.
    let mut tries = 0;
    let loops = loop {
        match reader.read(interp) {
            Ok(l) => break l,
            Err(python::asyncio::AsyncioError::Inconsistent { .. }) if tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => bail!("reading the asyncio tasks of pid {pid} failed: {e} (hint: {})", e.hint()),
        }
    };
    match format {
        DumpFormat::Text => print!("{}", report::async_dump::render_async_text(&loops)),
        DumpFormat::Json => print!("{}", report::async_dump::render_async_json(&loops)),
    }
    Ok(ExitCode::SUCCESS)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(args) => agent_cli::run(args),
        Command::Doctor => {
            let (text, ok) = doctor::render(&doctor::run_checks());
            print!("{text}");
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Dump { pid, format, native, async_tasks } => {
            infertrace::targets::validate_pid(pid).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
            // --async: hold the process still from the attach (which checks its
            // frames) to the end of the read (python/pause.rs); let go on return.
            let _paused = async_tasks.then(|| {
                let (paused, not_held) = python::pause::Paused::pause(pid);
                if not_held > 0 {
                    eprintln!("note: {not_held} thread(s) of pid {pid} could not be paused (already traced?): reading while they run");
                }
                paused
            });
            let mut interp = match python::Interpreter::attach(pid) {
                Ok(Some(i)) => i,
                Ok(None) => bail!("pid {pid} is not running CPython (hint: `infertrace dump` reads CPython {} stacks)", python::SUPPORTED),
                Err(e @ python::PythonError::Unsupported { .. }) => {
                    bail!("pid {pid}: {e}; no Python stacks to dump (hint: `infertrace record -p {pid}` still traces its {})", python::STILL_TRACED)
                }
                Err(e) => bail!("{e} (hint: {})", e.hint()),
            };
            if let Some(note) = interp.layout_note() {
                eprintln!("note: {}", printable(note));
            }
            if async_tasks {
                return dump_async(&mut interp, format);
            }
            let dumps = interp.dump().map_err(|e| anyhow::anyhow!("reading the stacks of pid {pid} failed: {e} (hint: retry; the process may have exited)"))?;
            match format {
                DumpFormat::Text => print!("{}", report::dump::render_dump_text(&dumps, native)),
                DumpFormat::Json => print!("{}", report::dump::render_dump_json(&dumps)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { file, format, profile, output, max_inflated } => {
            let limits = max_inflated.map(ReadLimits::plain).unwrap_or_default();
            let rec = Recording::read_limited(&file, limits)
                .map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
            let text = render(&rec, format, profile)?;
            match output {
                Some(out) => std::fs::write(&out, text)
                    .with_context(|| format!("cannot write {} (hint: choose a writable path)", out.display()))?,
                None => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&text).and_then(|()| out.flush()).context("cannot write the report to stdout (hint: use -o FILE)")?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Top { pids, python, refresh, frequency, no_cuda } => {
            if pids.is_empty() && !python {
                bail!("nothing to watch (hint: give -p PID (repeatable) or --python)");
            }
            let sched = SchedOptions { frequency, ..SchedOptions::default() };
            let record = session::RecordOptions { pids, sched, cuda: !no_cuda, asyncio: infertrace::asyncio::AsyncOptions { enabled: false, ..Default::default() }, ..session::RecordOptions::default() };
            let opts = infertrace::top::TopOptions { record, python, refresh };
            let argv: Vec<String> = std::env::args().collect();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let outcome = rt.block_on(infertrace::top::run(opts, argv)).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
            let secs = outcome.recording.duration_ns as f64 / 1e9;
            let _ = writeln!(std::io::stderr(), "infertrace top: watched {} process{} for {secs:.1}s; every probe detached", outcome.pids.len(), if outcome.pids.len() == 1 { "" } else { "es" });
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff { before, after, format, fail_if_slower, metric, max_inflated } => {
            let limits = max_inflated.map(ReadLimits::plain).unwrap_or_default();
            let read = |p: &PathBuf| Recording::read_limited(p, limits).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()));
            let d = report::diff::diff(&read(&before)?, &read(&after)?);
            // The metric is checked before anything is printed: a wrong name is an error, not a pass.
            let checked = match fail_if_slower {
                Some(pct) => Some((
                    pct,
                    report::diff::metric(&d, &metric).map_err(|e| {
                        anyhow::anyhow!("{e} (hint: `total`, a class such as `gpu_sync`, or a line as the diff prints it, e.g. `serve.py:42` or `cuda:serve.py:40`)")
                    })?,
                )),
                None => None,
            };
            match format {
                DumpFormat::Text => print!("{}", report::diff::render_text(&d)),
                DumpFormat::Json => print!("{}", report::diff::render_json(&d)),
            }
            let Some((pct, c)) = checked else { return Ok(ExitCode::SUCCESS) };
            let change = c.change_pct.map(|p| format!("{p:+.1}%")).unwrap_or_else(|| "no time before".into());
            let regressed = match c.change_pct {
                Some(p) => p > pct,
                None => c.after > 0.0,
            };
            let verdict = if regressed { format!("REGRESSED beyond {pct}%") } else { format!("within {pct}%") };
            let _ = writeln!(std::io::stderr(), "infertrace diff: {} {:.3} -> {:.3} ({change}): {verdict}", printable(&c.metric), c.before, c.after);
            Ok(if regressed { ExitCode::from(3) } else { ExitCode::SUCCESS })
        }
        Command::Record { pids, duration, output, checkpoint_every, quiet, format, frequency, no_sched, no_offcpu_stacks, slow_syscall, no_python, no_cuda, no_cuda_driver, gpu_sample_hz, debug_ebpf, timeline, timeline_limit, command, async_on, no_async, blocked_loop, max_overhead } => {
            let sched = SchedOptions { enabled: !no_sched, frequency, offcpu_stacks: !no_offcpu_stacks };
            let slow_syscall = (!slow_syscall.is_zero()).then_some(slow_syscall);
            let checkpoint_every = (!checkpoint_every.is_zero()).then_some(checkpoint_every);
            let opts = session::RecordOptions { pids, sched, slow_syscall, python: !no_python, cuda: !no_cuda, cuda_driver: !no_cuda_driver, gpu_sample_hz, debug_ebpf, command, duration, output, checkpoint_every, quiet, timeline_limit: timeline.then_some(timeline_limit), asyncio: infertrace::asyncio::AsyncOptions { enabled: async_on || !no_async, blocked_threshold: blocked_loop }, max_overhead };
            let argv: Vec<String> = std::env::args().collect();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let outcome = match rt.block_on(session::record(opts, argv)) {
                Ok(o) => o,
                Err(e) => bail!("{e} (hint: {})", e.hint()),
            };
            // The report is printed whether or not the recording could be written.
            let report = render(&outcome.recording, format, Profile::Cpu)?;
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
    }
}

/// A command-line error as one line, `error: <what> (hint: <remedy>)`,
/// like every other error: clap's message, its tip as the hint (or where to
/// read the options), without its usage block. Help and version print as
/// clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    let args: Vec<String> = std::env::args().collect();
    eprintln!("{}", usage_error_line(&e.render().to_string(), &args));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// The one line for clap's `rendered` error, given the command line `args`.
fn usage_error_line(rendered: &str, args: &[String]) -> String {
    use clap::CommandFactory;
    let mut what = String::new();
    let mut tips = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if let Some(m) = line.strip_prefix("error: ") {
            what = m.to_owned();
        } else if let Some(t) = line.strip_prefix("tip: ") {
            tips.push(t.to_owned());
        } else if let Some(v) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // `[possible values: text, json, ...]`
            tips.push(v.to_owned());
        }
    }
    let sub = args.get(1).filter(|a| Cli::command().get_subcommands().any(|c| c.get_name() == a.as_str()));
    let command = match sub {
        Some(sub) => format!("infertrace {sub}"),
        None => "infertrace".to_owned(),
    };
    // clap's "to pass '-x' as a value, use '-- -x'" is wrong for `record`,
    // where what follows `--` is the command to launch.
    if command.ends_with(" record") {
        tips.retain(|t| !t.contains("'-- "));
    }
    let hint = if tips.is_empty() { format!("`{command} --help` lists the options") } else { tips.join("; ") };
    if what.is_empty() {
        what = rendered.lines().next().unwrap_or("invalid command line").to_owned();
    }
    format!("error: {} (hint: {})", printable(&what), printable(&hint))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, then the hint; names and
            // paths in it escaped for the terminal.
            let msg = e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ");
            // A closed stderr is no reason to panic.
            let _ = writeln!(std::io::stderr(), "error: {}", printable(&msg.replace('\n', " ")));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_defaults_are_the_options_defaults() {
        let d = collect::RecordOptions::default();
        assert_eq!(parse_slow_syscall(collect::DEFAULT_SLOW_SYSCALL).unwrap(), d.slow_syscall.unwrap());
        assert_eq!((d.sched.frequency, d.gpu_sample_hz), (collect::DEFAULT_FREQUENCY, nvml::DEFAULT_HZ));
        assert_eq!(parse_checkpoint_every(checkpoint::DEFAULT_EVERY).ok(), d.checkpoint_every);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("365d").unwrap(), collect::MAX_DURATION);
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn huge_and_negative_values_are_refused_in_one_line() {
        for bad in ["3000000000000000h", "6000000000000000h", "366d", "1e400", "99999999999999999999999999999", "-1", "-5s", "inf", "NaN"] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(parse_duration("3000000000000000h").unwrap_err().contains("too long (use 1ms to 365d)"));
        assert!(parse_duration("-1").unwrap_err().contains("negative"));
        assert_eq!(parse_slow_syscall("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_slow_syscall("24h").unwrap(), collect::MAX_SLOW_SYSCALL);
        for bad in ["6000000000000000h", "25h", "100ns", "0.0000001", "-1ms"] {
            let e = parse_slow_syscall(bad).expect_err(bad);
            assert!(e.ends_with("or 0 to turn it off") || e.contains("negative"), "{e}");
        }
        assert_eq!(parse_frequency("0"), Ok(0));
        assert_eq!(parse_frequency("10000"), Ok(10_000));
        for bad in ["10001", "-1", "18446744073709551616", "1.5", "x"] {
            assert!(parse_frequency(bad).expect_err(bad).contains("0 (off) to 10000 Hz"));
        }
        assert_eq!(parse_pid("1"), Ok(1));
        for bad in ["0", "-1", "4294967296", "x"] {
            assert!(parse_pid(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_max_inflated("4GiB"), Ok(4 << 30));
        assert!(parse_max_inflated("1K").is_err());
    }

    /// What the binary prints for bad command lines: one line, clap's tip
    /// as the hint unless it is wrong for `record`.
    #[test]
    fn usage_errors_are_one_line() {
        use clap::Parser as _;
        let line = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(_) => panic!("{args:?} accepted"),
            Err(e) => usage_error_line(&e.render().to_string(), &args.iter().map(|a| a.to_string()).collect::<Vec<_>>()),
        };
        let l = line(&["infertrace", "record", "--duration", "-1", "--", "true"]);
        assert!(l.starts_with("error: invalid value '-1' for '--duration <DURATION>': `-1` is negative"), "{l}");
        assert!(l.ends_with("(hint: `infertrace record --help` lists the options)"), "{l}");
        let l = line(&["infertrace", "record", "-x", "--", "true"]);
        assert!(!l.contains("'-- "), "{l}");
        let l = line(&["infertrace", "record", "-F", "-1", "--", "true"]);
        assert!(l.contains("-1 Hz is out of range"), "{l}");
        let l = line(&["infertrace", "report", "x.itr", "--formt", "json"]);
        assert!(l.contains("(hint: a similar argument exists: '--format')"), "{l}");
        let l = line(&["infertrace", "report", "x.itr", "--format", "\x1b]0;PWNED\x07"]);
        assert!(!l.chars().any(char::is_control), "{l:?}");
        assert!(l.ends_with("(hint: possible values: text, json, folded, svg, speedscope, pprof, perfetto)"), "{l}");
    }

    #[test]
    fn cli_parses() {
        Cli::command_for_test();
    }

    impl Cli {
        fn command_for_test() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
        }
    }
}
