//! `infertrace agent`: a long-running tracer. It selects processes
//! (`select`: already running ones by a scan of /proc, new ones at their
//! exec through a kernel event, `crate::families::exec_watch`), traces them with the same
//! collectors as `record` (`crate::engine::session` drives them), cuts one
//! recording per `--window` into `--out-dir` (`windows`: each the
//! difference of two cumulative snapshots, so windows add up exactly), and
//! serves `/metrics`, `/healthz`, `/targets`, `/report/latest` and `/report/latest.html`
//! (`http`, on threads of its own, `metrics`, `targets`; `auth` and `tls`
//! for `--auth-token-file` and `--tls-cert`; `/metrics` is brought up to
//! date every `PUBLISH_EVERY`, whatever the window). SIGTERM/SIGINT/SIGHUP
//! close the current window, write it, and exit 0, within 2 s even when
//! the loop is stalled (`shutdown`: then exit code 4 without the last
//! window); a target's exit never stops the agent.

pub mod container;
pub mod cuda_delta;
pub mod memory_delta;
pub mod cuda_metrics;
pub mod memory_metrics;
pub mod http;
pub mod labels;
pub mod metrics;
pub mod redact;
pub mod select;
pub mod targets;
pub mod windows;
pub mod args;
pub mod auth;
pub mod private_file;
pub mod shutdown;
pub mod tls;

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::fd::AsFd,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::os::procfs::refused;
use crate::{
    engine::{
        run::{self, Engine},
        session::{self, RecordError},
        RecordOptions, TargetEvent,
    },
    families::{self, exec_watch::ExecWatch},
    recording::{Origin, Recording},
    report,
};

use self::{
    http::{Heartbeat, Shared, SharedState},
    metrics::Metrics,
    select::{Candidate, Selector},
    targets::TargetInfo,
    windows::Retention,
};

/// `--window`'s default.
pub const DEFAULT_WINDOW: &str = "60s";
/// `--out-dir`'s default (absolute: not wherever the agent was started).
pub const DEFAULT_OUT_DIR: &str = "/var/lib/infertrace";
/// `--keep`'s default.
pub const DEFAULT_KEEP: usize = 60;
/// How often /proc is scanned again for processes that came to match
/// without an exec (moved into a cgroup) or whose exec event was missed.
const RESCAN_EVERY: Duration = Duration::from_secs(5);
/// How often `/metrics` is brought up to date between windows (a counts
/// snapshot, `Engine::counts`): scrapes read values at most this old,
/// whatever `--window` is.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(5);

pub struct AgentOptions {
    pub selector: Selector,
    pub window: Duration,
    pub retention: Retention,
    pub listen: String,
    /// The collectors' options (`pids`, `command`, `duration`, `output` and
    /// checkpoints are not used).
    pub record: RecordOptions,
    pub quiet: bool,
    /// Command lines whole in `/targets`, `/report/latest` and the windows
    /// (`--show-args`); by default only the program and script (`redact`).
    pub show_args: bool,
    /// `--auth-token-file`, `--tls-cert`/`--tls-key`.
    pub http: http::ServeOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("no selection")]
    NoSelection,
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("cannot use the output directory {path}: {source}")]
    OutDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl AgentError {
    pub fn hint(&self) -> &str {
        match self {
            Self::NoSelection => "select processes with --pid, --comm, --cmdline, --exe, --cgroup, --container or --python",
            Self::Listen { .. } => "choose a free address with --listen ADDR:PORT (e.g. 127.0.0.1:9475)",
            Self::OutDir { .. } => {
                "choose a directory only root or this user can write with --out-dir DIR (e.g. `mkdir -m 0750 DIR`), or fix its owner and mode"
            }
            Self::Record(e) => e.hint(),
        }
    }
}

impl From<crate::os::probe::ProbeError> for AgentError {
    fn from(e: crate::os::probe::ProbeError) -> Self {
        AgentError::Record(RecordError::Probe(e))
    }
}

impl From<crate::recording::RecordingError> for AgentError {
    fn from(e: crate::recording::RecordingError) -> Self {
        AgentError::Record(RecordError::Recording(e))
    }
}

fn say(quiet: bool, line: &str) {
    if !quiet {
        let _ = writeln!(std::io::stderr(), "infertrace agent: {line}");
    }
}

/// The agent's state between loop turns.
struct Agent {
    opts: AgentOptions,
    engine: Engine,
    info: BTreeMap<u32, TargetInfo>,
    /// The last cut's cumulative snapshot, as the next window needs it.
    prev: Option<windows::Baseline>,
    seq: u64,
    shared: SharedState,
    /// The counters `/metrics` serves, rendered into `shared` at each publish.
    metrics: Metrics,
    /// Targets found dead at the last window: forgotten after the next
    /// snapshot (by then every collector has drained their last events).
    dead_pending: std::collections::HashSet<u32>,
    /// The counts of refused target files when the last window was cut
    /// (`os::procfs::refused`: process-wide, since the agent started).
    refused_at_cut: [u64; 4],
    /// How long the last window's cut took (snapshot, difference, write).
    last_cut: Duration,
}

/// A last window (on a signal) is a full snapshot when the previous cut
/// took at most this long, else counts only: it must be written within
/// [`shutdown::GRACE`].
const LAST_CUT_FULL_WITHIN: Duration = Duration::from_millis(700);

impl Agent {
    /// Selects `pid` if it matches and is not traced yet.
    fn consider(&mut self, pid: u32, found_by: &'static str) {
        if self.info.get(&pid).is_some_and(|i| i.alive) {
            return;
        }
        if let Some(st) = self.engine.targets().states.get(&pid) {
            if st.alive {
                // A child a target forked: the kernel follows it already.
                if let Some(c) = Candidate::read(pid) {
                    if self.opts.selector.matches(&c).is_some() {
                        let info = self.target_info(&c, vec!["child of a target".into()], "fork");
                        self.info.insert(pid, info);
                    }
                }
                return;
            }
        }
        let Some(c) = Candidate::read(pid) else { return };
        let Some(why) = self.opts.selector.matches(&c) else { return };
        let origin = if found_by == "exec" { Origin::Followed } else { Origin::Attached };
        self.engine.targets().emit(TargetEvent::Appeared { pid, origin });
        let info = self.target_info(&c, why, found_by);
        self.info.insert(pid, info);
    }

    /// What `/targets` shows of a candidate: its command line redacted
    /// unless `--show-args`.
    fn target_info(&self, c: &Candidate, why: Vec<String>, found_by: &'static str) -> TargetInfo {
        let mut info = TargetInfo::new(c, why, found_by);
        if !self.opts.show_args {
            info.cmdline = redact::cmdline(&info.cmdline);
        }
        info
    }

    /// An exec: a new match, or a target that stopped matching.
    fn on_exec(&mut self, pid: u32) -> Result<(), AgentError> {
        let traced = self.engine.targets().states.get(&pid).is_some_and(|s| s.alive);
        if !traced {
            self.consider(pid, "exec");
            return Ok(());
        }
        let c = Candidate::read(pid);
        let matches = c.as_ref().and_then(|c| self.opts.selector.matches(c));
        match (c, matches) {
            (Some(c), Some(why)) => {
                let found = self.info.get(&pid).map(|i| i.found_by).unwrap_or("exec");
                let info = self.target_info(&c, why, found);
                self.info.insert(pid, info);
            }
            // Exec'd into something the selection does not name: dropped.
            (Some(_), None) => self.drop_target(pid)?,
            (None, _) => {}
        }
        Ok(())
    }

    /// Stops tracing `pid` (it no longer matches the selection).
    fn drop_target(&mut self, pid: u32) -> Result<(), AgentError> {
        crate::families::process::remove_target(&mut self.engine.kernel().ebpf, pid)?;
        if let Some(st) = self.engine.targets().states.get_mut(&pid) {
            st.alive = false;
        }
        if let Some(i) = self.info.get_mut(&pid) {
            i.alive = false;
        }
        Ok(())
    }

    /// New matches, and targets that stopped matching without an exec (a
    /// renamed thread group leader, a process moved to another cgroup):
    /// those are dropped.
    fn scan(&mut self) {
        let traced: Vec<u32> = self.info.iter().filter(|(_, i)| i.alive).map(|(pid, _)| *pid).collect();
        for pid in traced {
            let Some(c) = Candidate::read(pid) else { continue };
            if self.opts.selector.matches(&c).is_none() {
                if let Err(e) = self.drop_target(pid) {
                    say(false, &format!("could not drop pid {pid}, which no longer matches: {e}"));
                }
            }
        }
        for pid in select::all_pids() {
            self.consider(pid, "scan");
        }
    }

    /// Marks the targets the session saw exit.
    fn refresh_alive(&mut self) {
        for (pid, i) in self.info.iter_mut() {
            if i.alive {
                i.alive = self.engine.targets().states.get(pid).is_some_and(|s| s.alive);
            }
        }
        // Dead targets are forgotten once a window has covered their end.
        let targets_json = targets::render(&self.info);
        if let Ok(mut s) = self.shared.lock() {
            s.targets_json = targets_json;
        }
    }

    /// Brings `/metrics` up to the cumulative snapshot `cur` (a counts
    /// snapshot, or a window's) and renders it for the next scrapes.
    fn publish(&mut self, cur: &Recording) {
        let alive = self.info.values().filter(|i| i.alive).count();
        self.metrics.publish(cur, &self.info, alive);
        let body = self.metrics.encode();
        let mut s = match self.shared.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        s.metrics_text = body;
    }

    /// Writes the window that ends with the cumulative snapshot `cur`.
    fn emit_window(&mut self, cur: Recording) -> Result<(), AgentError> {
        self.refresh_alive();
        let (mut win, next) = windows::delta(cur, self.prev.as_ref());
        if !self.opts.show_args {
            redact::recording(&mut win);
        }
        // The refusals of this window, not those since the agent started.
        win.notes.retain(|n| !n.starts_with(refused::NOTE_PREFIX));
        win.notes.extend(refused::note_since(self.refused_at_cut));
        self.refused_at_cut = refused::counts();
        win.notes.push(format!(
            "agent window {} (every {:.0}s); counts are this window's, from the difference of two cumulative snapshots",
            self.seq,
            self.opts.window.as_secs_f64()
        ));
        self.seq += 1;
        let written = self.opts.retention.write(&win, self.seq);
        let latest = match report::json::render_gzip(&win) {
            Ok(gz) => Some(Arc::new(gz)),
            Err(e) => {
                say(false, &format!("window {}: no JSON report for /report/latest: {e}", self.seq));
                None
            }
        };
        let html = match report::html::render_gzip(&win) {
            Ok(gz) => Some(Arc::new(gz)),
            Err(e) => {
                say(false, &format!("window {}: no page for /report/latest.html: {e}", self.seq));
                None
            }
        };
        let covered = covered_targets(&win, self.info.keys().copied());
        let scrapes = {
            let mut s = match self.shared.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            // Without a new one the previous window's report stays.
            if let Some(gz) = latest {
                s.latest_report = Some(gz);
            }
            if let Some(gz) = html {
                s.latest_html = Some(gz);
            }
            if written.is_ok() {
                s.windows_written += 1;
            }
            s.metrics_scrapes
        };
        self.metrics.window_cut(&self.info, scrapes);
        self.publish(&next.rec);
        match written {
            Ok(p) => say(self.opts.quiet, &format!("window {} written to {} ({covered} targets)", self.seq, p.display())),
            // A failed write (a full disk) does not stop the agent.
            Err(e) => say(false, &format!("window {} not written: {e}", self.seq)),
        }
        // Processes found dead at the previous window are in `cur` with
        // their final values: nothing of them is needed any more.
        let forget = std::mem::take(&mut self.dead_pending);
        if !forget.is_empty() {
            self.engine.forget(&forget);
        }
        self.dead_pending =
            self.engine.targets().states.iter().filter(|(_, s)| !s.alive).map(|(pid, _)| *pid).collect();
        self.info.retain(|_, i| i.alive);
        self.prev = Some(next);
        // A cut allocates two cumulative snapshots, the window and its
        // renderings at once; what is freed after goes back to the system
        // (glibc keeps freed memory otherwise: the RSS would stay at the
        // biggest cut's peak for good).
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        Ok(())
    }
}

impl Agent {
    /// The last window: up to the signal, written before the probes are
    /// released (by the exit: see `shutdown`). When the last cut took too
    /// long to fit in the grace a signal leaves, it holds the counts only.
    async fn last_window(&mut self) -> Result<(), AgentError> {
        let counts_only = self.last_cut > LAST_CUT_FULL_WITHIN;
        let mut last = if counts_only { self.engine.close_counts_for_exit().await? } else { self.engine.close_for_exit().await? };
        if counts_only {
            last.notes.push(format!(
                "the last window (cut by a signal) holds counts only, no stacks: the previous cut took {:.1}s, longer than the {:.1}s a signal leaves",
                self.last_cut.as_secs_f64(),
                shutdown::GRACE.as_secs_f64()
            ));
        }
        self.emit_window(last)
    }
}

/// The targets a window covers: those with data in it, and those alive
/// at some moment of it (`info` still holds the targets that died in it:
/// they leave it after the window is written).
fn covered_targets(win: &Recording, info: impl Iterator<Item = u32>) -> usize {
    let mut pids: std::collections::HashSet<u32> = info.collect();
    pids.extend(win.targets.iter().map(|t| t.pid));
    pids.len()
}

/// Runs the agent until SIGTERM/SIGINT/SIGHUP.
/// glibc's allocator set for a process that runs for days with a big
/// allocation at every cut (snapshots, the window, its report), before any
/// thread starts. Blocks of 128 KiB and more are mapped and unmapped on
/// their own (glibc would otherwise raise that threshold as big blocks are
/// freed, and keep them in the heap, where they fragment it), and two
/// arenas, not 8 per core: the loop allocates, the HTTP threads copy.
/// Measured under the soak's load: RSS ~40 MB lower between cuts.
pub fn tune_malloc() {
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

pub async fn run(opts: AgentOptions, argv: Vec<String>) -> Result<(), AgentError> {
    if opts.selector.is_empty() {
        return Err(AgentError::NoSelection);
    }
    for &pid in &opts.selector.pids {
        crate::engine::targets::validate_pid(pid).map_err(RecordError::Target)?;
    }
    if !session::has_tracing_privileges() {
        return Err(RecordError::NotPermitted.into());
    }
    // Before any other thread starts (binding a host name starts one): they
    // all inherit the blocked signals, which only the signal thread takes.
    let shutdown = shutdown::install().map_err(|e| AgentError::Record(RecordError::Signals(e)))?;
    let dir = opts.retention.dir.clone();
    // Created if missing, checked (owner, mode), and a file created in it.
    opts.retention.open().map_err(|source| AgentError::OutDir { path: dir.clone(), source })?;
    let listener = tokio::net::TcpListener::bind(&opts.listen)
        .await
        .map_err(|source| AgentError::Listen { addr: opts.listen.clone(), source })?;
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| opts.listen.clone());
    let listener = listener.into_std().map_err(|source| AgentError::Listen { addr: opts.listen.clone(), source })?;

    let btf = session::load_btf()?;
    let mut record = opts.record.clone();
    record.pids.clear();
    record.command.clear();
    record.quiet = true;
    let mut engine = Engine::open(record, argv, btf, families::list())?;
    let mut execs = ExecWatch::attach(engine.kernel())?;
    let exec_fd = run::register(execs.ring.as_fd()).map_err(|e| AgentError::Record(RecordError::Signals(e)))?;

    let shared: SharedState = Arc::new(Mutex::new(Shared {
        metrics_text: String::new(),
        metrics_scrapes: 0,
        targets_json: targets::render(&BTreeMap::new()),
        latest_report: None,
        latest_html: None,
        windows_written: 0,
    }));
    let heartbeat = Heartbeat::new();
    let scheme = opts.http.scheme();
    http::start(listener, shared.clone(), heartbeat.clone(), opts.http.clone())
        .map_err(|source| AgentError::Listen { addr: local.clone(), source })?;
    let quiet = opts.quiet;
    let window = opts.window;
    let mut agent = Agent {
        opts,
        engine,
        info: BTreeMap::new(),
        prev: None,
        seq: 0,
        shared,
        metrics: Metrics::new(),
        dead_pending: std::collections::HashSet::new(),
        refused_at_cut: [0; 4],
        last_cut: Duration::ZERO,
    };
    agent.scan();
    agent.engine.dispatch()?;
    agent.refresh_alive();
    let first = agent.engine.counts()?;
    agent.publish(&first);
    say(quiet, &format!("listening on {scheme}://{local} (/metrics /healthz /targets /report/latest /report/latest.html); windows of {:.0}s into {}", window.as_secs_f64(), dir.display()));

    let start = tokio::time::Instant::now();
    let mut window_tick = tokio::time::interval_at(start + window, window);
    window_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rescan = tokio::time::interval_at(start + RESCAN_EVERY, RESCAN_EVERY);
    // A turn at least every second, so /healthz can tell a stalled loop
    // (http::STALE_AFTER) from an idle one.
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    // Between windows (a window's cut publishes too).
    let publish_every = PUBLISH_EVERY.min(window);
    let mut publish = tokio::time::interval_at(start + publish_every, publish_every);
    publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        heartbeat.beat();
        tokio::select! {
            _ = shutdown.stop() => break,
            _ = beat.tick() => {}
            ready = exec_fd.readable() => {
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                for pid in execs.drain(agent.engine.sink()) {
                    agent.on_exec(pid)?;
                }
                agent.engine.dispatch()?;
            }
            stepped = agent.engine.step() => {
                stepped?;
            }
            _ = rescan.tick() => {
                agent.scan();
                agent.engine.dispatch()?;
                agent.refresh_alive();
            }
            _ = window_tick.tick() => {
                let began = std::time::Instant::now();
                let cur = agent.engine.snapshot()?;
                agent.emit_window(cur)?;
                agent.last_cut = began.elapsed();
                publish.reset();
            }
            _ = publish.tick() => {
                let cur = agent.engine.counts()?;
                agent.publish(&cur);
            }
        }
    }
    agent.last_window().await?;
    shutdown.finished();
    execs.detach(agent.engine.kernel());
    say(quiet, "stopped; the last window is written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_the_targets_it_covers() {
        let mut win = crate::recording::tests::sample();
        let in_win: Vec<u32> = win.targets.iter().map(|t| t.pid).collect();
        assert!(!in_win.is_empty());
        // Nothing alive any more (the old count said 0): those with data count.
        assert_eq!(covered_targets(&win, std::iter::empty()), in_win.len());
        // A target alive through the window with no data counts too, once.
        assert_eq!(covered_targets(&win, [in_win[0], 999_999].into_iter()), in_win.len() + 1);
        win.targets.clear();
        assert_eq!(covered_targets(&win, std::iter::empty()), 0);
    }
}
