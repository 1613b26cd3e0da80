//! `infertrace record`'s window: preflight, the [`Engine`] with the
//! command's own arms (signals, the deadline, checkpoints, a snapshot on
//! SIGUSR1, the status line), and the final recording written to its
//! output. The window's lifecycle is the engine's ([`super::run`],
//! [`super::session`]).

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    checkpoint::Checkpoints,
    run::{Engine, Stepped},
    session::{preflight, RecordError},
    Families, RecordOptions,
};
use crate::{
    os::{btf_offsets::KernelBtf, clock},
    recording::{output::Output, Recording, RecordingError},
};

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

fn default_output() -> PathBuf {
    PathBuf::from(format!("infertrace-{}.itr", clock::local_timestamp()))
}

/// Checks the output up front, so a bad path fails before any probe, without
/// touching it: an existing recording stays as it is until there is
/// something to replace it with.
fn prepare_output(path: &Path) -> Result<Output, RecordError> {
    Output::prepare(path).map_err(|source| RecordError::Output { path: path.to_owned(), source })
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
