//! The one loop `record`, `top` and `agent` run on: an [`Engine`] holds
//! the window (the context and the collectors), wakes a collector as soon
//! as the kernel writes to its ring buffer, and runs each collector's poll
//! at its own period. A command adds its own arms beside
//! [`Engine::step`] in its `select!` (signals, checkpoints, screen
//! refreshes, agent windows) and calls [`Engine::snapshot`] and
//! [`Engine::close`].

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use super::{
    session::{self, RecordError},
    Collector, Context, Families, RecordOptions, TargetEvent,
};
use crate::{os::btf_offsets::KernelBtf, recording::{Origin, Recording}};

/// What woke [`Engine::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stepped {
    /// A collector's ring buffer had records: taken, events delivered.
    Woken,
    /// The tick: the polls that were due ran.
    Ticked,
}

/// One tracing window and the collectors that fill it.
pub struct Engine {
    pub(in crate::engine) cx: Context,
    collectors: Vec<Box<dyn Collector>>,
    wakers: Wakers,
    /// When each collector's poll last ran (None: not yet).
    last_poll: Vec<Option<Instant>>,
}

/// A poll this close to its due time (a fraction of its period) runs with
/// the one that woke the loop: periods of 20 and 25 ms share one wake-up,
/// not two out of phase.
const COALESCE: u32 = 4;
/// The wait when no collector polls (none attached).
const IDLE_POLL: Duration = Duration::from_millis(100);

/// Whether a poll last run at `last`, every `every`, runs at `now`: when
/// due, or within a [`COALESCE`]th of its period of being due.
fn poll_is_due(now: Instant, last: Option<Instant>, every: Duration) -> bool {
    last.is_none_or(|last| now + every / COALESCE >= last + every)
}

impl Engine {
    /// Opens the window: loads the object with every family's globals,
    /// attaches every collector, delivers the targets (`opts.pids`, the
    /// launched `opts.command`), then lets a launched command run. Call
    /// inside a tokio runtime. Probes are attached to descriptors this
    /// process owns: whatever ends it, the kernel detaches them.
    pub fn open(opts: RecordOptions, argv: Vec<String>, btf: KernelBtf, families: Families) -> Result<Engine, RecordError> {
        let mut startup = super::startup::Startup::begin();
        let mut cx = session::open_context(opts, btf, argv, (families.tables)())?;
        startup.phase("context");
        let mut collectors = (families.collectors)(&cx.opts);
        for c in collectors.iter_mut() {
            c.attach(&mut cx.view(c.uses()))?;
            startup.phase(c.name());
        }
        let named = cx.opts.pids.clone();
        for &pid in &named {
            cx.targets.emit(TargetEvent::Appeared { pid, origin: Origin::Attached });
        }
        if cx.opts.descendants {
            attach_descendants(&mut cx, &named);
        }
        if let Some(pid) = cx.targets.launched.as_ref().map(|l| l.pid) {
            cx.targets.emit(TargetEvent::Appeared { pid, origin: Origin::Launched });
        }
        dispatch(&mut cx, &mut collectors)?;
        startup.phase("targets");
        cx.sink.detail(startup.line());
        cx.startup = Some(startup.cost());
        if let Some(l) = cx.targets.launched.as_mut() {
            l.release()?;
        }
        let wakers = Wakers::new(&collectors, &mut cx);
        // Every poll is due at once: the first turn runs them all.
        let last_poll = vec![None; collectors.len()];
        Ok(Engine { cx, collectors, wakers, last_poll })
    }

    /// When the next poll is due: each collector's period is asked again
    /// here (it may change: Python polls every 4 ms while an interpreter
    /// starts, every 25 ms otherwise), so the loop wakes only as often as
    /// the collectors need, not at the shortest period any could ask for.
    fn next_poll(&self) -> Instant {
        let now = Instant::now();
        let due = self.collectors.iter().zip(&self.last_poll).map(|(c, at)| at.map_or(now, |at| at + c.poll_every()));
        due.min().unwrap_or(now + IDLE_POLL)
    }

    /// Waits for a collector's wake-up or the next due poll and runs what
    /// is due. Cancel-safe: a `select!` may drop it for another arm.
    pub async fn step(&mut self) -> Result<Stepped, RecordError> {
        let next = tokio::time::Instant::from_std(self.next_poll());
        tokio::select! {
            woken = self.wakers.ready() => {
                for i in woken {
                    let c = &mut self.collectors[i];
                    c.wake(&mut self.cx.view(c.uses()))?;
                }
                self.dispatch()?;
                Ok(Stepped::Woken)
            }
            _ = tokio::time::sleep_until(next) => {
                self.poll_due()?;
                Ok(Stepped::Ticked)
            }
        }
    }

    /// Delivers the events queued in the context (targets the caller
    /// added with [`TargetSet::emit`](super::TargetSet::emit)) to every collector.
    pub fn dispatch(&mut self) -> Result<(), RecordError> {
        dispatch(&mut self.cx, &mut self.collectors)
    }

    /// Runs every collector's poll that is due, then delivers the events. A
    /// poll within a [`COALESCE`]th of its period of being due runs now, so
    /// the collectors' polls fall into step and share wake-ups.
    fn poll_due(&mut self) -> Result<(), RecordError> {
        let now = Instant::now();
        for (c, at) in self.collectors.iter_mut().zip(self.last_poll.iter_mut()) {
            if poll_is_due(now, *at, c.poll_every()) {
                *at = Some(now);
                c.poll(&mut self.cx.view(c.uses()))?;
            }
        }
        let r = self.dispatch();
        // Programs are loaded at start and when a library appears (CUDA):
        // aya's BTF parse is made again then, not held for good.
        self.cx.kernel.btf.release();
        r
    }

    /// What every collector has so far, as a recording (the window goes on).
    pub fn snapshot(&mut self) -> Result<Recording, RecordError> {
        session::snapshot(&mut self.cx, &mut self.collectors)
    }

    /// The counts so far (syscalls, wall time, CUDA calls, lost events)
    /// without stacks: only the collectors that [count](Collector::counts)
    /// take part, and no stack is resolved. Cheap enough for every few
    /// seconds (the agent's live `/metrics`); the window goes on.
    pub fn counts(&mut self) -> Result<Recording, RecordError> {
        session::counts_snapshot(&mut self.cx, &mut self.collectors)
    }

    /// The traced processes (the agent adds and drops its own; events it
    /// [emits](super::TargetSet::emit) go out at the next [`dispatch`](Self::dispatch)).
    pub fn targets(&mut self) -> &mut super::TargetSet {
        &mut self.cx.targets
    }

    /// The loaded object (the agent's exec watch attaches to it).
    pub fn kernel(&mut self) -> &mut super::Kernel {
        &mut self.cx.kernel
    }

    /// Where notes and lost counts go.
    pub fn sink(&mut self) -> &mut super::Sink {
        &mut self.cx.sink
    }

    /// Targets still alive.
    pub fn alive(&self) -> usize {
        self.cx.targets.alive_count()
    }

    /// The collectors' few words for a status line.
    pub fn status(&self) -> impl Iterator<Item = String> + '_ {
        self.collectors.iter().filter_map(|c| c.status())
    }

    /// Drops everything kept of these processes (exited, and covered by a
    /// window): memory stays flat under process churn (the agent).
    pub fn forget(&mut self, pids: &HashSet<u32>) {
        for c in self.collectors.iter_mut() {
            c.forget(&mut self.cx.view(c.uses()), pids);
        }
        self.cx.targets.exited.forget(pids);
        self.cx.sink.forget(pids);
        if let Err(e) = self.cx.stacks.forget(&mut self.cx.kernel.ebpf, pids) {
            self.cx.sink.note(format!("the user stacks of {} exited processes could not be freed in the kernel: {e}", pids.len()));
        }
        self.cx.targets.states.retain(|pid, _| !pids.contains(pid));
    }

    /// Closes the window (every program detached, the last events taken)
    /// and returns the final recording.
    pub async fn close(&mut self) -> Result<Recording, RecordError> {
        self.close_with(true, false).await
    }

    /// The last window of a process about to exit (the agent, on a
    /// signal): the window ends in the kernel (the programs count nothing
    /// after it) and the final snapshot is taken without detaching first.
    /// Detaching thousands of uprobes can take longer than the grace a
    /// signal leaves, and the process's exit releases them all (nothing is
    /// pinned); so do the collectors when they are dropped.
    pub async fn close_for_exit(&mut self) -> Result<Recording, RecordError> {
        self.close_with(false, false).await
    }

    /// [`close_for_exit`](Self::close_for_exit) with a [counts](Self::counts)
    /// snapshot: no stack resolved, for a last window that must be written
    /// sooner than a full snapshot takes.
    pub async fn close_counts_for_exit(&mut self) -> Result<Recording, RecordError> {
        self.close_with(false, true).await
    }

    async fn close_with(&mut self, detach: bool, counts_only: bool) -> Result<Recording, RecordError> {
        session::end_window(&mut self.cx, &mut self.collectors, detach)?;
        dispatch(&mut self.cx, &mut self.collectors)?;
        let rec = if counts_only {
            session::counts_snapshot(&mut self.cx, &mut self.collectors)?
        } else {
            session::snapshot(&mut self.cx, &mut self.collectors)?
        };
        if let Some(log) = self.cx.ebpf_log.take() {
            log.finish().await;
        }
        Ok(rec)
    }
}

/// Delivers the queued target events to every collector.
/// At most this many existing descendants are taken per named process.
pub const MAX_DESCENDANTS: usize = 4096;

/// `record -p PID` traces the process's existing descendants too (the
/// workers a DataLoader or a multiprocessing pool started before the
/// attach): each one live is attached like a named process; a note per
/// named process says how many, and which could not be (gone, zombies).
fn attach_descendants(cx: &mut Context, named: &[u32]) {
    let mut seen: std::collections::BTreeSet<u32> = named.iter().copied().collect();
    for &pid in named {
        let found = crate::os::procfs::descendants(pid, MAX_DESCENDANTS);
        let capped = found.len() >= MAX_DESCENDANTS;
        let (mut taken, mut missed) = (Vec::new(), Vec::new());
        for d in found.into_iter().filter(|d| seen.insert(*d)) {
            if crate::os::procfs::is_alive(d) {
                cx.targets.emit(TargetEvent::Appeared { pid: d, origin: Origin::Attached });
                taken.push(d);
            } else {
                missed.push(d);
            }
        }
        if taken.is_empty() && missed.is_empty() {
            continue;
        }
        let list = |v: &[u32]| {
            let mut s: Vec<String> = v.iter().take(16).map(u32::to_string).collect();
            if v.len() > 16 {
                s.push(format!("and {} more", v.len() - 16));
            }
            s.join(", ")
        };
        let mut note = format!(
            "-p {pid}: also traced its {} existing descendant process{}{}{} (--no-descendants leaves them out)",
            taken.len(),
            if taken.len() == 1 { "" } else { "es" },
            if taken.is_empty() { String::new() } else { format!(": {}", list(&taken)) },
            if capped { format!("; the first {MAX_DESCENDANTS} only") } else { String::new() }
        );
        if !missed.is_empty() {
            note.push_str(&format!("; not traced, exited before the attach: {}", list(&missed)));
        }
        cx.sink.note(note);
    }
}

pub(crate) fn dispatch(cx: &mut Context, collectors: &mut [Box<dyn Collector>]) -> Result<(), RecordError> {
    while let Some(ev) = cx.targets.next_event() {
        for c in collectors.iter_mut() {
            c.target(&mut cx.view(c.uses()), &ev)?;
        }
    }
    Ok(())
}

/// The collectors' [`wake_fd`](Collector::wake_fd)s, registered with the
/// runtime (a duplicate of each descriptor, so no borrow of the collector
/// is held across the loop): the loop wakes as soon as the kernel writes
/// to one of those ring buffers, rather than at the next tick.
struct Wakers(Vec<(usize, tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>)>);

impl Wakers {
    fn new(collectors: &[Box<dyn Collector>], cx: &mut Context) -> Wakers {
        let mut v = Vec::new();
        for (i, c) in collectors.iter().enumerate() {
            let Some(fd) = c.wake_fd() else { continue };
            match register(fd) {
                Ok(a) => v.push((i, a)),
                Err(e) => cx.sink.note(format!("{}: events wait for the next poll ({e})", c.name())),
            }
        }
        Wakers(v)
    }

    /// The indexes of the collectors whose descriptor is readable, once at
    /// least one is (never, with none). Readiness is cleared before the
    /// collector reads, so a record written meanwhile wakes again.
    async fn ready(&self) -> Vec<usize> {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        std::future::poll_fn(|task| {
            let mut woken = Vec::new();
            for (i, fd) in &self.0 {
                match fd.poll_read_ready(task) {
                    std::task::Poll::Ready(Ok(mut guard)) => {
                        guard.clear_ready();
                        woken.push(*i);
                    }
                    // An error from the reactor: no wake (taking it for one
                    // would spin); the ticks still poll that collector.
                    std::task::Poll::Ready(Err(_)) | std::task::Poll::Pending => {}
                }
            }
            if woken.is_empty() {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(woken)
            }
        })
        .await
    }
}

/// A duplicate of `fd`, registered with the runtime for readability (a
/// ring buffer the kernel wakes; the agent's exec events use it too).
pub fn register(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    fd.try_clone_to_owned().and_then(|owned| {
        // SAFETY: an OwnedFd's descriptor stays open and the same until
        // the AsyncFd that owns it is dropped.
        unsafe { tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop as `step` runs it, on a simulated clock: (wake-ups, runs of
    /// each poll) over `span` for polls of these periods.
    fn simulate(periods: &[Duration], span: Duration) -> (usize, Vec<usize>) {
        let t0 = Instant::now();
        let mut last = vec![None; periods.len()];
        let mut runs = vec![0; periods.len()];
        let (mut now, mut wakes) = (t0, 0);
        while now < t0 + span {
            wakes += 1;
            for (i, every) in periods.iter().enumerate() {
                if poll_is_due(now, last[i], *every) {
                    last[i] = Some(now);
                    runs[i] += 1;
                }
            }
            now = periods.iter().zip(&last).filter_map(|(e, l)| Some((*l)? + *e)).min().expect("periods");
        }
        (wakes, runs)
    }

    #[test]
    fn polls_of_near_periods_share_wake_ups_and_keep_their_rates() {
        let ms = Duration::from_millis;
        // Python and asyncio (25 ms), the process follower (100 ms), the
        // counters (1 s), a timeline drain (20 ms).
        let (wakes, runs) = simulate(&[ms(25), ms(25), ms(100), ms(1000), ms(20)], Duration::from_secs(1));
        assert!(wakes <= 51, "{wakes} wake-ups in 1 s for polls every 20 ms at the shortest");
        // No poll runs more often than its period allows (early by a quarter
        // at most), nor falls behind it.
        for (every, n) in [25u64, 25, 100, 1000, 20].iter().zip(&runs) {
            let most = 1000 * 4 / (3 * every) + 1;
            let least = 1000 / (2 * every);
            assert!((least as usize..=most as usize).contains(n), "a {every} ms poll ran {n} times in 1 s");
        }
        // Alone, a poll wakes the loop at its own period only.
        let (wakes, runs) = simulate(&[ms(25)], Duration::from_secs(1));
        assert_eq!((wakes, runs[0]), (40, 40));
    }
}
