//! The `infertrace` command line.

use std::{
    io::Write as _,
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use infertrace::{checkpoint, collect, doctor, nvml, python, recording::Recording, report, report::folded::Profile, sched::SchedOptions, session};

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
        #[arg(short = 'p', long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// Stop after this long (e.g. 500ms, 10s, 2m, 1h; a bare number is seconds).
        #[arg(short, long, value_parser = parse_duration, value_name = "DURATION")]
        duration: Option<Duration>,
        /// Recording file to write [default: infertrace-<timestamp>.itr].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Replace FILE with the recording so far this often, marked cut, so a killed tracer leaves it (0 turns it off).
        #[arg(long, value_parser = parse_duration_or_zero, default_value = checkpoint::DEFAULT_EVERY, value_name = "DURATION")]
        checkpoint_every: Duration,
        /// No status line on stderr.
        #[arg(short, long)]
        quiet: bool,
        /// Format of the report printed at the end (`report` renders the recording in any format later).
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// CPU sampling frequency in Hz, on every CPU (0 turns sampling off).
        #[arg(short = 'F', long, default_value_t = collect::DEFAULT_FREQUENCY, value_name = "HZ")]
        frequency: u64,
        /// Syscall accounting only: no scheduler tracing, no CPU sampling (lowest overhead).
        #[arg(long)]
        no_sched: bool,
        /// Do not capture stacks when threads go off CPU.
        #[arg(long)]
        no_offcpu_stacks: bool,
        /// Syscalls at least this slow get their Python and native stacks recorded (0 turns it off).
        #[arg(long, value_parser = parse_duration_or_zero, default_value = collect::DEFAULT_SLOW_SYSCALL, value_name = "DURATION")]
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
        /// Command to launch and trace, with its fork/exec children.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Print the current Python stack of every thread of a live process, like `py-spy dump`.
    #[command(after_help = "Works on a process that is blocked, spinning or waiting for the GIL; the process is not stopped.\nCPython 3.8-3.15 with the GIL (shared libpython or static builds; a newer CPython through the layout it publishes).")]
    Dump {
        /// The process.
        #[arg(short = 'p', long = "pid", value_name = "PID")]
        pid: u32,
        #[arg(long, value_enum, default_value = "text")]
        format: DumpFormat,
        /// Also show native frames below the Python ones (text only).
        #[arg(long)]
        native: bool,
    },
    /// Render a recording (needs no privileges).
    #[command(after_help = "Examples:\n  infertrace report rec.itr\n  infertrace report rec.itr --format svg --profile off-cpu -o offcpu.svg\n  infertrace report rec.itr --format folded | flamegraph.pl > cpu.svg")]
    Report {
        /// The .itr file written by `infertrace record`.
        file: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Which time the folded/svg output weighs: CPU samples, off-CPU time, or both (wall).
        #[arg(long, value_enum, default_value = "cpu")]
        profile: Profile,
        /// Write the report here instead of stdout.
        #[arg(short, long, value_name = "OUT")]
        output: Option<PathBuf>,
    },
}

/// `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("invalid duration `{s}` (examples: 500ms, 10s, 2m)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("invalid duration unit `{unit}` in `{s}` (use ms, s, m or h)")),
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("duration must be positive: `{s}`"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

fn render(rec: &Recording, format: Format, profile: Profile) -> anyhow::Result<String> {
    Ok(match format {
        Format::Text => report::text::render(rec),
        Format::Json => report::json::render(rec),
        Format::Folded => report::folded::render(rec, profile),
        Format::Svg => report::svg::render(rec, profile).map_err(|e| match e {
            report::svg::SvgError::Empty => anyhow::anyhow!(
                "no {} stacks in this recording (hint: record with sampling on (-F 99) and scheduler tracing (no --no-sched))",
                profile.title()
            ),
            other => anyhow::anyhow!("rendering the flame graph failed: {other}"),
        })?,
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Doctor => {
            let (text, ok) = doctor::render(&doctor::run_checks());
            print!("{text}");
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Dump { pid, format, native } => {
            infertrace::targets::validate_pid(pid).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
            let mut interp = match python::Interpreter::attach(pid) {
                Ok(Some(i)) => i,
                Ok(None) => bail!("pid {pid} is not running CPython (hint: `infertrace dump` reads CPython {} stacks)", python::SUPPORTED),
                Err(e @ python::PythonError::Unsupported { .. }) => {
                    bail!("pid {pid}: {e}; no Python stacks to dump (hint: `infertrace record -p {pid}` still traces its {})", python::STILL_TRACED)
                }
                Err(e) => bail!("{e} (hint: {})", e.hint()),
            };
            if let Some(note) = interp.layout_note() {
                eprintln!("note: {note}");
            }
            let dumps = interp.dump().map_err(|e| anyhow::anyhow!("reading the stacks of pid {pid} failed: {e} (hint: retry; the process may have exited)"))?;
            match format {
                DumpFormat::Text => print!("{}", report::dump::render_dump_text(&dumps, native)),
                DumpFormat::Json => print!("{}", report::dump::render_dump_json(&dumps)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { file, format, profile, output } => {
            let rec = Recording::read(&file).map_err(|e| anyhow::anyhow!("{e} (hint: pass a .itr file written by `infertrace record`)"))?;
            let text = render(&rec, format, profile)?;
            match output {
                Some(out) => std::fs::write(&out, text)
                    .with_context(|| format!("cannot write {} (hint: choose a writable path)", out.display()))?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Record { pids, duration, output, checkpoint_every, quiet, format, frequency, no_sched, no_offcpu_stacks, slow_syscall, no_python, no_cuda, no_cuda_driver, gpu_sample_hz, debug_ebpf, command } => {
            if frequency > 10_000 {
                bail!("--frequency {frequency} is too high (hint: use at most 10000 Hz; 99 is the default)");
            }
            let sched = SchedOptions { enabled: !no_sched, frequency, offcpu_stacks: !no_offcpu_stacks };
            let slow_syscall = (!slow_syscall.is_zero()).then_some(slow_syscall);
            let checkpoint_every = (!checkpoint_every.is_zero()).then_some(checkpoint_every);
            let opts = session::RecordOptions { pids, sched, slow_syscall, python: !no_python, cuda: !no_cuda, cuda_driver: !no_cuda_driver, gpu_sample_hz, debug_ebpf, command, duration, output, checkpoint_every, quiet };
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
                out.write_all(report.as_bytes()).and_then(|()| out.flush())
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, then the hint.
            let msg = e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ");
            // A closed stderr is no reason to panic.
            let _ = writeln!(std::io::stderr(), "error: {}", msg.replace('\n', " "));
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
        assert_eq!(parse_duration_or_zero(collect::DEFAULT_SLOW_SYSCALL).unwrap(), d.slow_syscall.unwrap());
        assert_eq!((d.sched.frequency, d.gpu_sample_hz), (collect::DEFAULT_FREQUENCY, nvml::DEFAULT_HZ));
        assert_eq!(parse_duration_or_zero(checkpoint::DEFAULT_EVERY).ok(), d.checkpoint_every);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5x").is_err());
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
