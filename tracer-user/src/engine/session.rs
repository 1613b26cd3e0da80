//! `infertrace record`: one tracing window from attach to detach. The
//! session loads the object, builds the list of collectors
//! (`crate::families`) and drives them through one lifecycle
//! (`crate::engine`): attach, target events, polls, and the final snapshot
//! into a recording. It names no probe family.

use std::{
    collections::BTreeMap,
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    Ebpf,
};

pub use crate::engine::RecordOptions;
use super::{
    checkpoint::Checkpoints,
    ebpf_log,
    programs::{self, FamilyTable, LoadError, LoadInputs},
    run::{Engine, Stepped},
    targets::{self, Launched, TargetError},
    Collector, Context, Families,
};
use crate::{
    os::{btf_offsets::KernelBtf, clock, probe::ProbeError, procfs, tracefs},
    recording::{output::Output, HostInfo, Recording, RecordingError, FORMAT_VERSION},
    system,
};

pub const DEFAULT_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("nothing to trace")]
    NoTarget,
    #[error("tracing needs root or CAP_BPF+CAP_PERFMON (this process lacks {})", missing_tracing_caps().join(" and "))]
    NotPermitted,
    #[error("kernel BTF not found at {0}")]
    NoBtf(PathBuf),
    #[error("cannot parse kernel BTF at {path}: {detail}")]
    BadBtf { path: PathBuf, detail: String },
    #[error("cannot write the recording to {path}: {source}")]
    Output { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] LoadError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("unsupported architecture {0}")]
    Arch(&'static str),
    #[error(transparent)]
    Recording(#[from] crate::recording::RecordingError),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Order(#[from] super::OrderError),
}

impl RecordError {
    pub fn hint(&self) -> &str {
        match self {
            Self::NoTarget => "give -p PID (repeatable) and/or a command after `--`",
            Self::NotPermitted => "run as root (sudo), or grant CAP_BPF and CAP_PERFMON; see `infertrace doctor`",
            Self::NoBtf(_) | Self::BadBtf { .. } => {
                "use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or point INFERTRACE_BTF at a BTF file for this kernel"
            }
            Self::Output { .. } => "choose a writable path with -o FILE",
            Self::Target(e) => e.hint(),
            Self::Load(_) | Self::Probe(_) => "run `infertrace doctor` to check the kernel's eBPF support",
            Self::Arch(_) => "infertrace supports x86_64 and aarch64",
            Self::Recording(_) => "check free space and permissions of the output directory",
            Self::Signals(_) => "retry",
            Self::Order(_) => "a bug in infertrace's families: please report it",
        }
    }
}

/// Why the window closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
    TargetsExited,
}

pub struct Outcome {
    pub recording: Recording,
    pub path: PathBuf,
    pub reason: StopReason,
    /// Whether the recording reached `path`; the report can be printed either way.
    pub written: Result<(), NotWritten>,
}

/// The final recording could not be written (a full disk, `-o /dev/full`).
#[derive(Debug)]
pub struct NotWritten {
    pub path: PathBuf,
    pub error: RecordingError,
    /// The window of the last checkpoint, which `path` still holds, marked cut.
    pub checkpoint_ns: Option<u64>,
}

impl std::fmt::Display for NotWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match &self.error {
            RecordingError::Write { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        match self.checkpoint_ns {
            None => write!(f, "nothing was written to {}: {why}", self.path.display()),
            Some(ns) => write!(
                f,
                "the recording was not written to {}: {why}; it holds the checkpoint of the first {:.1}s, marked cut",
                self.path.display(),
                ns as f64 / 1e9
            ),
        }
    }
}

const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_PERFMON: u64 = 1 << 38;
const CAP_BPF: u64 = 1 << 39;

/// Root or CAP_BPF+CAP_PERFMON (CAP_SYS_ADMIN implies both on older kernels).
pub fn has_tracing_privileges() -> bool {
    missing_tracing_caps().is_empty()
}

/// The capabilities this process lacks to trace (none with CAP_SYS_ADMIN,
/// which implies both), e.g. `["CAP_PERFMON"]` when it holds CAP_BPF only.
pub fn missing_tracing_caps() -> Vec<&'static str> {
    missing_caps(procfs::own_effective_caps().unwrap_or(0))
}

fn missing_caps(effective: u64) -> Vec<&'static str> {
    if effective & CAP_SYS_ADMIN != 0 {
        return Vec::new();
    }
    [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(bit, _)| effective & bit == 0)
        .map(|(_, name)| name)
        .collect()
}

pub fn btf_path() -> PathBuf {
    std::env::var_os("INFERTRACE_BTF").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_BTF))
}

/// The kernel's BTF, read and parsed once for the whole recording.
pub fn load_btf() -> Result<KernelBtf, RecordError> {
    let path = btf_path();
    if !path.exists() {
        return Err(RecordError::NoBtf(path));
    }
    KernelBtf::load(&path).map_err(|detail| RecordError::BadBtf { path, detail })
}

fn default_output() -> PathBuf {
    PathBuf::from(format!("infertrace-{}.itr", clock::local_timestamp()))
}

/// Checks the output up front, so a bad path fails before any probe, without
/// touching it: an existing recording stays as it is until there is
/// something to replace it with.
fn prepare_output(path: &Path) -> Result<Output, RecordError> {
    Output::prepare(path).map_err(|source| RecordError::Output { path: path.to_owned(), source })
}

/// What `record` and `top` check before anything is attached: a target,
/// pids that exist, the privileges; then reads the kernel's BTF.
pub fn preflight(opts: &RecordOptions) -> Result<KernelBtf, RecordError> {
    if opts.pids.is_empty() && opts.command.is_empty() {
        return Err(RecordError::NoTarget);
    }
    for &pid in &opts.pids {
        targets::validate_pid(pid)?;
    }
    if !has_tracing_privileges() {
        return Err(RecordError::NotPermitted);
    }
    load_btf()
}

/// Runs one recording window. Probes are attached to file descriptors owned
/// by this process: whatever ends it (return, panic, SIGKILL), the kernel
/// detaches them.
pub async fn record(opts: RecordOptions, argv: Vec<String>, families: Families) -> Result<Outcome, RecordError> {
    let btf = preflight(&opts)?;
    let out_path = opts.output.clone().unwrap_or_else(default_output);
    let output = prepare_output(&out_path)?;
    // On an error, the output holds the last checkpoint (marked cut), if any.
    let (recording, reason, checkpoint_ns) = record_inner(opts, argv, btf, families, &output, snapshot_path(&out_path)).await?;
    let written = output.write(&recording).map_err(|error| NotWritten {
        path: out_path.clone(),
        error,
        // Unless it went with its directory.
        checkpoint_ns: checkpoint_ns.filter(|_| out_path.is_file()),
    });
    Ok(Outcome { recording, path: out_path, reason, written })
}

/// Mounts tracefs if needed, launches the command (held before its exec),
/// loads the object with every family's globals and opens the window.
pub(crate) fn open_context(opts: RecordOptions, btf: KernelBtf, argv: Vec<String>, tables: &[&'static FamilyTable]) -> Result<Context, RecordError> {
    let arch = system::arch_constants().ok_or(RecordError::Arch(std::env::consts::ARCH))?;
    let mut notes = Vec::new();
    let tracefs = match tracefs::ensure_mounted() {
        Ok((p, mounted)) => {
            if mounted {
                notes.push(format!("mounted tracefs at {}", p.display()));
            }
            Some(p)
        }
        Err(e) => {
            notes.push(e.to_string());
            None
        }
    };
    let launched = if opts.command.is_empty() { None } else { Some(Launched::spawn(&opts.command)?) };
    let inputs = LoadInputs { opts: &opts, arch, btf: &btf, tracefs: tracefs.as_deref() };
    let ebpf = programs::load_object(tables, &inputs)?;
    let mut cx = Context::new(ebpf, btf, tracefs, opts, argv, clock::monotonic_ns());
    cx.targets.launched = launched;
    for n in notes {
        cx.sink.note(n);
    }
    if cx.opts.debug_ebpf {
        match ebpf_log::start(&mut cx.ebpf) {
            Ok(log) => cx.ebpf_log = log,
            Err(e) => cx.sink.note(format!("--debug-ebpf: {e}")),
        }
    }
    set_window(&mut cx.ebpf, WINDOW_START, cx.window_start)?;
    Ok(cx)
}

/// What every collector has so far, as a recording (the window goes on).
/// After [`close`], the final recording.
pub(crate) fn snapshot(cx: &mut Context, collectors: &mut [Box<dyn Collector>]) -> Result<Recording, RecordError> {
    cx.stacks.invalidate();
    let mut rec = Recording {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host_info(),
        started_unix_ms: cx.started_unix_ms,
        duration_ns: cx.now_or_end().saturating_sub(cx.window_start),
        argv: cx.argv.clone(),
        targets: Vec::new(),
        syscalls: Vec::new(),
        threads: Vec::new(),
        stacks: Vec::new(),
        runqueue_hist: BTreeMap::new(),
        sample_hz: 0,
        cuda: None,
        lost: BTreeMap::new(),
        notes: Vec::new(),
        cut: None,
        timeline: None,
        tracer_overhead: None,
        asyncio: None,
    };
    let order = super::snapshot_order(collectors).map_err(RecordError::Order)?;
    for i in order {
        collectors[i].snapshot(cx, &mut rec)?;
    }
    // Once every family has resolved its stacks: Python frames that could
    // not be resolved, per process and cause.
    for (pid, problems) in cx.stacks.python_problems() {
        for (i, text) in problems.into_iter().enumerate() {
            cx.sink.state_note(format!("python_unresolved_{pid}_{i}"), format!("pid {pid}: {text}"));
        }
    }
    rec.targets = cx.targets.to_targets();
    cx.sink.fill(&mut rec);
    rec.attribute_folded_stacks();
    rec.sort_stacks();
    Ok(rec)
}

/// Closes the window: detaches every program, takes the last events, and
/// returns the final recording.
pub(crate) fn close(cx: &mut Context, collectors: &mut [Box<dyn Collector>]) -> Result<Recording, RecordError> {
    // First tell the kernel programs: detaching takes time, and what
    // happens meanwhile (threads started after the end) is not in the
    // window. The end is read after the kernel has it: a busy machine can
    // hold this thread between the two, and every event the programs kept
    // must fall inside the window.
    set_window(&mut cx.ebpf, WINDOW_END, clock::monotonic_ns())?;
    cx.window_end = Some(clock::monotonic_ns());
    for c in collectors.iter_mut() {
        c.detach(cx);
    }
    for c in collectors.iter_mut() {
        c.poll(cx)?;
    }
    super::run::dispatch(cx, collectors)?;
    snapshot(cx, collectors)
}

/// The window, from attach to the final recording; with it, the window of
/// the last checkpoint written to the output (which the final recording has
/// not replaced yet).
async fn record_inner(
    opts: RecordOptions,
    argv: Vec<String>,
    btf: KernelBtf,
    families: Families,
    output: &Output,
    snapshot_to: PathBuf,
) -> Result<(Recording, StopReason, Option<u64>), RecordError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).map_err(RecordError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RecordError::Signals)?;
    // A closed terminal (or `kill -HUP`) ends the window like SIGTERM.
    let mut sighup = signal(SignalKind::hangup()).map_err(RecordError::Signals)?;
    let mut sigusr1 = signal(SignalKind::user_defined1()).map_err(RecordError::Signals)?;
    let mut engine = Engine::open(opts, argv, btf, families)?;
    let status = StatusLine::new(engine.cx.opts.quiet);
    let t0 = Instant::now();
    // A window too long for the clock has no deadline (the CLI caps --duration).
    let deadline = engine.cx.opts.duration.and_then(|d| tokio::time::Instant::now().checked_add(d));
    // One period into the window, then every period: not at once, when a
    // launched command is loading its libraries (the first snapshot
    // symbolizes, which holds the loop up for a while).
    // A period too long to add to now means none.
    let first = engine.cx.opts.checkpoint_every.and_then(|every| Some((tokio::time::Instant::now().checked_add(every)?, every)));
    let mut checkpoints = first.and_then(|_| Checkpoints::new(output));
    let (first, every) = first.unwrap_or_else(|| (tokio::time::Instant::now(), Duration::from_secs(3600)));
    let mut checkpoint_tick = tokio::time::interval_at(first, every);
    checkpoint_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reason = loop {
        tokio::select! {
            _ = sigint.recv() => break StopReason::Signal,
            _ = sigterm.recv() => break StopReason::Signal,
            _ = sighup.recv() => break StopReason::Signal,
            _ = sigusr1.recv() => {
                // A failed snapshot does not end the window.
                if let Err(e) = write_snapshot(&mut engine, &snapshot_to) {
                    warn(&format!("snapshot not written: {e}"));
                }
            }
            _ = checkpoint_tick.tick(), if checkpoints.is_some() => {
                if let Some(cps) = checkpoints.as_mut() {
                    // A long snapshot spaces the next ones out: the loop is
                    // held up for checkpoints a tenth of the time at most.
                    let held = take_checkpoint(&mut engine, cps).saturating_mul(10);
                    if held > every {
                        checkpoint_tick.reset_after(held);
                    }
                }
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() => break StopReason::Duration,
            stepped = engine.step() => {
                if stepped? == Stepped::Ticked {
                    let alive = engine.alive();
                    status.show(t0.elapsed(), alive, engine.status());
                    if alive == 0 {
                        break StopReason::TargetsExited;
                    }
                }
            }
        }
    };
    status.clear();
    let recording = engine.close().await?;
    // The final write must come after the last checkpoint's rename.
    let checkpoint_ns = checkpoints.as_mut().and_then(|cps| {
        if let Some(w) = cps.finish() {
            warn(&w);
        }
        cps.last().map(|w| w.duration_ns)
    });
    Ok((recording, reason, checkpoint_ns))
}

/// Starts writing a checkpoint unless the last one is still being written
/// (then this one is skipped: the next comes one period later). A failed
/// checkpoint does not end the window. Returns how long the snapshot held
/// the loop up.
fn take_checkpoint(engine: &mut Engine, cps: &mut Checkpoints) -> Duration {
    let (busy, warning) = cps.poll();
    if let Some(w) = warning {
        warn(&w);
    }
    if busy {
        return Duration::ZERO;
    }
    let t0 = Instant::now();
    let warning = match engine.snapshot() {
        Ok(rec) => cps.start(rec),
        Err(e) => Some(format!("checkpoint not taken ({e}); recording goes on")),
    };
    if let Some(w) = warning {
        warn(&w);
    }
    t0.elapsed()
}

/// One line on stderr, even with `-q` (something the user must know); a
/// closed stderr is not an error.
fn warn(line: &str) {
    let _ = writeln!(std::io::stderr(), "infertrace: {line}");
}

/// `serve.itr` -> `serve.snapshot.itr`, beside it.
fn snapshot_path(out: &Path) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "infertrace".into());
    out.with_file_name(format!("{stem}.snapshot.itr"))
}

/// SIGUSR1: the recording so far, written beside the output (atomically:
/// a reader never sees half a file); the window goes on.
fn write_snapshot(engine: &mut Engine, path: &Path) -> Result<(), RecordError> {
    let output = prepare_output(path)?;
    let rec = engine.snapshot()?;
    output.write(&rec)?;
    if !engine.cx.opts.quiet {
        warn(&format!("snapshot of the first {:.1}s written to {}", rec.duration_ns as f64 / 1e9, path.display()));
    }
    Ok(())
}

/// Slots of the kernel's `WINDOW` array: when the window opened and closed.
const WINDOW_START: u32 = 0;
const WINDOW_END: u32 = 1;

fn set_window(ebpf: &mut Ebpf, slot: u32, ns: u64) -> Result<(), RecordError> {
    let map = ebpf.map_mut(tracer_common::maps::WINDOW).ok_or(ProbeError::MissingMap(tracer_common::maps::WINDOW))?;
    let mut arr: Array<&mut MapData, u64> = Array::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))?;
    arr.set(slot, ns, 0).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))?;
    Ok(())
}

pub(crate) fn host_info() -> HostInfo {
    let read = |name: &str| procfs::sysctl(name).unwrap_or_default();
    HostInfo {
        hostname: read("kernel/hostname"),
        kernel_release: read("kernel/osrelease"),
        arch: std::env::consts::ARCH.to_owned(),
    }
}

/// The one-line status on stderr: rewritten in place on a terminal, a line
/// every 5 s otherwise, nothing with `-q`.
struct StatusLine {
    enabled: bool,
    tty: bool,
    last: std::cell::Cell<Option<Instant>>,
}

impl StatusLine {
    fn new(quiet: bool) -> Self {
        Self { enabled: !quiet, tty: std::io::stderr().is_terminal(), last: std::cell::Cell::new(None) }
    }

    fn show(&self, elapsed: Duration, alive: usize, parts: impl Iterator<Item = String>) {
        if !self.enabled {
            return;
        }
        let every = if self.tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
        if self.last.get().is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last.set(Some(Instant::now()));
        let mut line = format!(
            "infertrace: recording {:.1}s, {} target{} alive",
            elapsed.as_secs_f64(),
            alive,
            if alive == 1 { "" } else { "s" },
        );
        for p in parts {
            line.push_str(", ");
            line.push_str(&p);
        }
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
        let _ = err.flush();
    }

    fn clear(&self) {
        if self.enabled && self.tty && self.last.get().is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_missing_capability() {
        assert_eq!(missing_caps(0), ["CAP_BPF", "CAP_PERFMON"]);
        assert_eq!(missing_caps(CAP_BPF), ["CAP_PERFMON"]);
        assert_eq!(missing_caps(CAP_PERFMON), ["CAP_BPF"]);
        assert!(missing_caps(CAP_BPF | CAP_PERFMON).is_empty());
        assert!(missing_caps(CAP_SYS_ADMIN).is_empty());
    }
}
