//! The `infertrace` command line: one module per subcommand, each with
//! its arguments and the code that runs it; `main.rs` only calls [`main`].

pub mod agent;
pub mod diff;
pub mod doctor;
pub mod dump;
pub mod parse;
pub mod record;
pub mod report;
pub mod top;

use std::{io::Write as _, process::ExitCode};

use clap::{Parser, Subcommand};

use crate::report::fmt::printable;

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
pub struct Cli {
    #[command(subcommand)]
    command: Command,
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
    Record(record::RecordArgs),
    /// Print the current Python stack of every thread of a live process, like `py-spy dump`.
    #[command(after_help = "Works on a process that is blocked, spinning or waiting for the GIL; the process is not stopped.\nCPython 3.8-3.15 with the GIL (shared libpython or static builds; a newer CPython through the layout it publishes).\n\
With --async: the task tree of every asyncio event loop instead, from the offsets CPython 3.14 and 3.15 publish \
for debuggers (what `python -m asyncio pstree` reads); earlier versions are refused with a one-line error.\n\n\
Examples:\n  infertrace dump -p 1234\n  infertrace dump -p 1234 --async --format json")]
    Dump(dump::DumpArgs),
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
    Top(top::args::TopArgs),
    /// Render a recording (needs no privileges).
    #[command(after_help = "Examples:\n  infertrace report rec.itr\n  infertrace report rec.itr --format svg --profile off-cpu -o offcpu.svg\n  infertrace report rec.itr --format folded | flamegraph.pl > cpu.svg")]
    Report(report::ReportArgs),
    /// Compare two recordings (the verify step): per process, per bottleneck class, per Python line and per CUDA site.
    #[command(after_help = "Processes are matched by command line. Figures are milliseconds of thread time per second of \
window, so recordings of different lengths compare; `total` is the window length in seconds.\n\
--fail-if-slower PCT --metric METRIC, for CI: METRIC is `total`, a class (python_compute, native_compute, gil, io, \
waiting_on_threads, polling, sleeping, other_wait, cpu_starvation, gpu_sync, copy_work, collective, native_pool), a Python line `file.py:LINE` \
or a CUDA site `cuda:file.py:LINE` (the names the report prints).\n\
Exit codes: 0 compared (and not slower beyond PCT); 3 METRIC regressed by more than PCT percent; \
1 an error (unreadable recording, a METRIC in neither recording); 2 a bad command line.\n\n\
Examples:\n  infertrace diff before.itr after.itr\n  infertrace diff before.itr after.itr --fail-if-slower 10 --metric gpu_sync\n  \
infertrace diff before.itr after.itr --fail-if-slower 5 --metric serve.py:42 --format json")]
    Diff(diff::DiffArgs),
    /// Trace selected processes continuously: rolling windows into a directory, Prometheus metrics over HTTP.
    #[command(after_help = agent::args::AFTER_HELP)]
    Agent(agent::args::AgentArgs),
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(args) => agent::args::run(args),
        Command::Doctor => doctor::run(),
        Command::Dump(args) => dump::run(args),
        Command::Report(args) => report::run(args),
        Command::Top(args) => top::args::run(args),
        Command::Diff(args) => diff::run(args),
        Command::Record(args) => record::run(args),
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

pub fn main() -> ExitCode {
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
        assert!(l.ends_with("(hint: possible values: text, json, folded, svg, speedscope, pprof, perfetto, html)"), "{l}");
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
