//! One lifecycle for every probe family.
//!
//! A [`Collector`] is the user side of one probe family (process follower,
//! syscalls, wall time, CPU samples, Python, CUDA, NVML). The session
//! (`crate::engine::session`) drives a list of them through the same steps:
//!
//! 1. [`attach`](Collector::attach) to the loaded object (programs and
//!    load-time globals are described in the family's [`FamilyTable`]);
//! 2. [`target`](Collector::target) for every [`TargetEvent`]: a target
//!    appeared, forked, exec'd or exited;
//! 3. [`poll`](Collector::poll) every [`poll_every`](Collector::poll_every);
//! 4. [`snapshot`](Collector::snapshot): what it has so far, into a
//!    [`Recording`], without stopping (any number of times);
//! 5. [`detach`](Collector::detach) at the window end, then a last
//!    `snapshot` makes the final recording.
//!
//! Everything the families share lives in the [`Context`], grouped into
//! handles with one job each: the [`Kernel`] (the loaded object, the
//! kernel BTF), the [`Window`], the [`TargetSet`] (with the policy for
//! exited threads, [`ExitedThreads`], and the target events), the
//! [`Stacks`](stacks::Stacks) resolver (one symbolizer, the Python frame
//! resolver), the probe calibration, and the [`Sink`], the one channel for
//! notes and lost-event counters. A collector is handed a [`Cx`]: the sink,
//! and the handles it declares in [`Collector::uses`] (`handles`).

mod bounded;
mod order;
pub mod checkpoint;
pub mod ebpf_log;
mod exited;
mod handles;
pub mod memory;
mod options;
pub mod record;
pub mod run;
pub mod session;
pub mod stacks;
mod startup;
pub mod targets;
pub mod release;
pub mod programs;
pub mod ring;
mod sink;
mod target_set;

use std::time::Duration;

pub use bounded::Bounded;
pub use order::{snapshot_order, OrderError, Part};
pub use exited::{ExitedThreads, Verdict, KEEP_PER_PROCESS};
pub use handles::{Cx, Grant, Handle, Kernel, Window};
pub use options::{
    AsyncOptions, RecordOptions, SchedOptions, DEFAULT_FREQUENCY, DEFAULT_GPU_SAMPLE_HZ, DEFAULT_SLOW_SYSCALL, MAX_DURATION, MAX_FREQUENCY,
    MAX_MAX_OVERHEAD, MAX_SLOW_SYSCALL, MIN_MAX_OVERHEAD, MIN_SLOW_SYSCALL,
};
pub use programs::{FamilyTable, GlobalSpec, GlobalValue, LoadInputs, ProgramKind, ProgramSpec};
pub use sink::{Sink, Topic};
pub use target_set::{TargetSet, TargetState};

use crate::{os::probe::ProbeError, recording::{Origin, Recording}, engine::stacks::Stacks};

/// The probe families a window runs, given by the caller
/// (`crate::families::list()`), so that the engine names none.
#[derive(Clone, Copy)]
pub struct Families {
    /// Every family's table, in load order (one object holds them all).
    pub tables: fn() -> &'static [&'static FamilyTable],
    /// The collectors the options ask for, in the order they see every step.
    pub collectors: fn(&RecordOptions) -> Vec<Box<dyn Collector>>,
}

/// A change in the set of traced processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetEvent {
    /// A process given on the command line (`Attached`) or launched by us
    /// (`Launched`, still held before its exec when this is sent).
    Appeared { pid: u32, origin: Origin },
    /// A child forked by a target (the kernel already traces it).
    Forked { pid: u32, parent: u32, comm: String },
    Execed { pid: u32, comm: String },
    Exited { pid: u32 },
    /// A target mapped a file executable (the dynamic loader brought in a
    /// library, dlopen), at `ts_ns` (CLOCK_MONOTONIC, when `mmap`
    /// returned); the mapping is in its maps now. Sent only while
    /// [`TargetSet::mappings_followed`].
    Mapped { pid: u32, ts_ns: u64 },
}

impl TargetEvent {
    /// The process the event is about.
    pub fn pid(&self) -> u32 {
        match self {
            TargetEvent::Appeared { pid, .. }
            | TargetEvent::Forked { pid, .. }
            | TargetEvent::Execed { pid, .. }
            | TargetEvent::Exited { pid }
            | TargetEvent::Mapped { pid, .. } => *pid,
        }
    }
}

/// What every collector shares during one recording, grouped into the
/// handles a collector declares ([`Collector::uses`]); a collector sees it
/// only through its [`Cx`]. Private to the engine.
pub struct Context {
    pub(in crate::engine) kernel: Kernel,
    pub(in crate::engine) window: Window,
    /// The whole options: the engine's. A family gets its own slice when
    /// its collector is made (`families::collectors`).
    pub(in crate::engine) opts: RecordOptions,
    /// The command line infertrace ran with.
    pub(in crate::engine) argv: Vec<String>,
    pub(in crate::engine) targets: TargetSet,
    pub(in crate::engine) stacks: Stacks,
    pub(in crate::engine) sink: Sink,
    /// The reader of the kernel's diagnostics (`--debug-ebpf`), if on.
    pub(in crate::engine) ebpf_log: Option<crate::engine::ebpf_log::EbpfLog>,
    /// What one probe hit costs here, measured at startup by the overhead
    /// family (zeros until then, or where it could not be measured).
    pub(in crate::engine) calibration: crate::recording::overhead::Calibration,
    /// The engine's start-up, once open (`tracer_overhead.startup`).
    pub(in crate::engine) startup: Option<crate::recording::overhead::StartupCost>,
    /// Set during a counts-only snapshot ([`run::Engine::counts`]): see
    /// [`Cx::counts_only`].
    pub(in crate::engine) counts_only: bool,
}

impl Context {
    pub(in crate::engine) fn new(kernel: Kernel, opts: RecordOptions, argv: Vec<String>, window_start: u64) -> Self {
        Context {
            kernel,
            window: Window { started_unix_ms: crate::os::clock::unix_ms(), start: window_start, end: None },
            opts,
            argv,
            targets: TargetSet::default(),
            stacks: Stacks::default(),
            sink: Sink::default(),
            ebpf_log: None,
            calibration: Default::default(),
            startup: None,
            counts_only: false,
        }
    }
}

/// The user side of one probe family. Errors are for what breaks the
/// recording (a map missing from the object); anything a target can cause
/// goes to the sink as a note.
pub trait Collector {
    /// Short name, for error context.
    fn name(&self) -> &'static str;

    /// Loads and attaches the family's programs (or prepares to, for probes
    /// attached per file later).
    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError>;

    /// A target appeared, forked, exec'd or exited.
    fn target(&mut self, _cx: &mut Cx<'_>, _ev: &TargetEvent) -> Result<(), ProbeError> {
        Ok(())
    }

    /// How often [`poll`](Self::poll) runs. Asked again before every wait
    /// of the loop, so it may change with the collector's state (a short
    /// period only while there is something to catch): the loop wakes at
    /// the earliest period any collector asks for now.
    fn poll_every(&self) -> Duration {
        Duration::from_millis(100)
    }

    /// Periodic work: drain ring buffers, retire dead threads, re-scan.
    fn poll(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        Ok(())
    }

    /// A descriptor that becomes readable when this collector has
    /// something that should not wait for the next poll (a ring buffer the
    /// kernel wakes); the session then calls [`wake`](Self::wake) at once.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// [`wake_fd`](Self::wake_fd) became readable: take what is there
    /// (events go to [`TargetSet::emit`], delivered right after).
    fn wake(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        Ok(())
    }

    /// The handles of the context this collector reaches through its
    /// [`Cx`] (the sink is every collector's). Any other handle is absent
    /// from its view: reaching one panics. Declared here, checked on the
    /// source by a test (`families::tests`).
    fn uses(&self) -> &'static [Handle] {
        &[]
    }

    /// The parts of the recording this family fills in its
    /// [`snapshot`](Self::snapshot) (others may read them in theirs).
    fn provides(&self) -> &'static [Part] {
        &[]
    }

    /// The parts other families fill that this one reads in its
    /// [`snapshot`](Self::snapshot): the engine runs their snapshots first
    /// ([`snapshot_order`]). A part no collector of the window provides is
    /// simply absent. Declared here, checked on the source by a test.
    fn needs(&self) -> &'static [Part] {
        &[]
    }

    /// Fills this family's part of `rec` with what it has so far. Called at
    /// any moment; after [`detach`](Self::detach), the final one.
    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError>;

    /// Whether this family's snapshot runs in a counts-only snapshot
    /// ([`run::Engine::counts`]: the agent's live metrics, every few
    /// seconds): by default those that fill the syscall table, the wall
    /// time or the CUDA report; a family whose snapshot sets lost-event
    /// counters says so too.
    fn counts(&self) -> bool {
        self.provides().iter().any(|p| matches!(p, Part::Syscalls | Part::Threads | Part::Cuda))
    }

    /// Stops the kernel side (the maps stay readable). Idempotent.
    fn detach(&mut self, _cx: &mut Cx<'_>) {}

    /// A few words for the status line (`123 syscalls`), if any.
    fn status(&self) -> Option<String> {
        None
    }

    /// The long-running agent (`crate::cli::agent`) no longer needs anything of
    /// these processes: they exited and a window has covered their end.
    /// Drops what is kept of them, so that memory stays flat under process
    /// churn. Their rows leave the following snapshots.
    fn forget(&mut self, _cx: &mut Cx<'_>, _pids: &std::collections::HashSet<u32>) {}
}
