//! `infertrace agent`'s command line (the agent itself is `crate::cli::agent`).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Context as _};
use clap::Args;
use crate::{
    cli::agent::{self, select::Selector, windows::Retention, AgentOptions},
    engine::{self, RecordOptions, SchedOptions},
    recording::limits,
};
use regex::Regex;

pub const AFTER_HELP: &str = "Selection: a process is traced when it meets every criterion given (repeated --pid values are \
alternatives). Running processes are found by a scan of /proc at start (and every 5 s); a process that starts later is \
picked up at its exec, through a kernel event. Children of a target are followed; a target that exec's into something \
the selection does not name is dropped at once, one that stops matching otherwise (renamed, moved to another \
cgroup) at the next scan.\n\
Windows: every --window, the recording of that window (exact counts: the difference of two cumulative snapshots) is \
written into --out-dir (default /var/lib/infertrace) as infertrace-agent-<time>-<seq>.itr, mode 0640, atomically (a \
new temporary file renamed within the directory; a name already taken is left alone and the next one used); the \
oldest beyond --keep / --max-size are removed. `infertrace report FILE` renders one.\n\
HTTP on --listen (default 127.0.0.1:9475): /metrics (OpenMetrics text, for Prometheus), /healthz, /targets (JSON: \
host PID, PID in its namespace, container id, why it is traced), /report/latest (the last window's JSON report), /report/latest.html (its page). \
Command lines there and in the windows keep the program and the Python script or module; other arguments are \
redacted (--show-args keeps them). Metrics are updated at each window's end. The endpoints run on threads of their own: a stalled collection loop never \
silences them, and /healthz answers 503 (with the age) when the loop has not turned for 15 s. Each connection has 5 s \
for its whole exchange; at most 64 are open at once (a new one evicts the oldest).\n\
Access: --auth-token-file FILE (mode 0600; read once at start) makes every endpoint but /healthz require \
`Authorization: Bearer TOKEN` (401 otherwise); --tls-cert and --tls-key (PEM) serve HTTPS only. Anyone who can reach \
--listen otherwise reads the targets' (redacted) command lines, metrics and reports.\n\
SIGTERM / SIGINT / SIGHUP write the current window and exit 0, within 2 s: a loop that cannot finish by then is left, \
with a line on stderr and exit code 4 (no last window); targets exiting never stop the agent.\n\
Examples:\n  infertrace agent --python --window 60s --out-dir /var/lib/infertrace\n  \
infertrace agent --container 3f1b2c --listen 0.0.0.0:9475 --auth-token-file /etc/infertrace/token\n  \
infertrace agent --python --tls-cert /etc/infertrace/tls.crt --tls-key /etc/infertrace/tls.key\n  infertrace agent --comm '^gunicorn' --cmdline 'serve\\.py'";

#[derive(Args)]
pub struct AgentArgs {
    /// Trace this process (repeatable; values are alternatives).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = crate::cli::parse::parse_pid, allow_negative_numbers = true)]
    pids: Vec<u32>,
    /// Processes whose name (comm, 15 characters at most) matches this regular expression.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    comm: Option<Regex>,
    /// Processes whose command line (arguments joined by spaces) matches this regular expression.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    cmdline: Option<Regex>,
    /// Processes running this executable (absolute path, as /proc/PID/exe shows it).
    #[arg(long, value_name = "PATH")]
    exe: Option<String>,
    /// Processes in this cgroup or below it (path as in /proc/PID/cgroup, e.g. /system.slice/app.service).
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
    /// Processes in the container whose id starts with this (docker, containerd, CRI-O, podman; from the cgroup path).
    #[arg(long, value_name = "ID")]
    container: Option<String>,
    /// Every CPython process.
    #[arg(long)]
    python: bool,
    /// Length of one window (e.g. 10s, 60s, 5m; 1s to 24h).
    #[arg(long, value_name = "DURATION", default_value = agent::DEFAULT_WINDOW, value_parser = parse_window, allow_hyphen_values = true)]
    window: Duration,
    /// Directory of the windows' recordings (created 0750 if missing, and again should it be removed). Refused
    /// when owned by someone other than root or this user, or writable by others without the sticky bit.
    #[arg(long, value_name = "DIR", default_value = agent::DEFAULT_OUT_DIR)]
    out_dir: PathBuf,
    /// Keep at most this many windows (0: no limit).
    #[arg(long, value_name = "N", default_value_t = agent::DEFAULT_KEEP)]
    keep: usize,
    /// Keep at most this much of windows on disk (e.g. 500MiB; the newest is always kept).
    #[arg(long, value_name = "SIZE", value_parser = limits::parse_size)]
    max_size: Option<u64>,
    /// Address of the HTTP endpoints (/metrics /healthz /targets /report/latest /report/latest.html).
    #[arg(long, value_name = "ADDR:PORT", default_value = agent::http::DEFAULT_LISTEN)]
    listen: String,
    /// Require `Authorization: Bearer TOKEN` on every endpoint but /healthz; TOKEN is this file's content
    /// (read once at start; the file must not be accessible to group or others: chmod 600).
    #[arg(long, value_name = "FILE")]
    auth_token_file: Option<PathBuf>,
    /// Serve HTTPS only, with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CPU sampling frequency in Hz, 0 to 10000 (0 turns sampling off).
    #[arg(short = 'F', long, default_value_t = engine::DEFAULT_FREQUENCY, value_name = "HZ",
          value_parser = crate::cli::parse::parse_frequency, allow_negative_numbers = true)]
    frequency: u64,
    /// Syscall accounting only: no scheduler tracing, no CPU sampling.
    #[arg(long)]
    no_sched: bool,
    /// Do not resolve Python stacks.
    #[arg(long)]
    no_python: bool,
    /// Do not probe CUDA, nor sample the GPUs.
    #[arg(long)]
    no_cuda: bool,
    /// Do not follow resident memory in the kernel (kmem/rss_stat): no resident growth by line
    /// (infertrace_resident_growth_bytes_total) and no OOM kills (infertrace_oom_kills_total); the
    /// resident gauges, page faults and memory stalls, read from /proc and the scheduler, stay.
    #[arg(long)]
    no_memory: bool,
    /// No line on stderr per window.
    #[arg(short, long)]
    quiet: bool,
    /// Show targets' command lines whole in /targets, /report/latest and the windows. By default only the
    /// program and, for Python, the script or module are kept: arguments often carry secrets (--api-key=...).
    #[arg(long)]
    show_args: bool,
    /// An overhead budget, 0.1 to 100 (percent of a target's time): past it, CUDA launches are probed in
    /// time slices and their counts estimated (as `record --max-overhead`; docs/overhead.md).
    #[arg(long, value_name = "PCT", value_parser = crate::cli::parse::parse_max_overhead, allow_negative_numbers = true)]
    max_overhead: Option<f64>,
}

fn parse_regex(s: &str) -> Result<Regex, String> {
    Regex::new(s).map_err(|e| format!("`{s}` is not a valid regular expression ({})", e.to_string().lines().last().unwrap_or("")))
}

fn parse_window(s: &str) -> Result<Duration, String> {
    crate::cli::parse::parse_span(s, Duration::from_secs(1), Duration::from_secs(24 * 3600))
}

pub fn run(a: AgentArgs) -> anyhow::Result<ExitCode> {
    let selector = Selector {
        pids: a.pids,
        comm: a.comm,
        cmdline: a.cmdline,
        exe: a.exe,
        cgroup: a.cgroup,
        container: a.container,
        python: a.python,
    };
    let record = RecordOptions {
        sched: SchedOptions { enabled: !a.no_sched, frequency: a.frequency, offcpu_stacks: true },
        python: !a.no_python,
        cuda: !a.no_cuda,
        memory: !a.no_memory,
        checkpoint_every: None,
        quiet: true,
        asyncio: crate::families::python::asyncio::record::AsyncOptions { enabled: false, ..Default::default() },
        max_overhead: a.max_overhead,
        ..RecordOptions::default()
    };
    let mut http = agent::http::ServeOptions::default();
    if let Some(path) = &a.auth_token_file {
        match agent::auth::Token::from_file(path) {
            Ok(t) => http.token = Some(t),
            Err(e) => bail!("{e} (hint: write the token alone in a file only root can read, and pass it with --auth-token-file)"),
        }
    }
    match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => match agent::tls::server_config(cert, key) {
            Ok(c) => http.tls = Some(c),
            Err(e) => bail!("{e} (hint: --tls-cert takes a PEM certificate chain, --tls-key its PEM private key)"),
        },
        (None, None) => {}
        _ => bail!("--tls-cert and --tls-key go together (hint: give both, PEM files: the certificate chain and its private key)"),
    }
    let opts = AgentOptions {
        selector,
        window: a.window,
        retention: Retention::new(a.out_dir, a.keep, a.max_size),
        listen: a.listen,
        record,
        quiet: a.quiet,
        show_args: a.show_args,
        http,
    };
    let argv: Vec<String> = std::env::args().collect();
    agent::tune_malloc();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    if let Err(e) = rt.block_on(agent::run(opts, argv)) {
        bail!("{e} (hint: {})", e.hint());
    }
    Ok(ExitCode::SUCCESS)
}
