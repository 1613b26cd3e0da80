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
//! Everything the families share lives in the [`Context`]: the loaded
//! object, the kernel BTF (parsed once), the target set, the stack resolver
//! (one symbolizer, the Python frame resolver), the policy for exited
//! threads ([`ExitedThreads`]: which keep rows of their own) and the
//! [`Sink`], the one channel for notes and lost-event counters.

mod bounded;
mod order;
pub mod checkpoint;
pub mod ebpf_log;
mod exited;
pub mod memory;
mod options;
pub mod record;
pub mod run;
pub mod session;
pub mod stacks;
pub mod targets;
pub mod release;
pub mod programs;
pub mod ring;
mod sink;
mod target_set;

use std::{collections::VecDeque, path::PathBuf, time::Duration};

use aya::Ebpf;

pub use bounded::Bounded;
pub use order::{snapshot_order, OrderError, Part};
pub use exited::{ExitedThreads, Verdict, KEEP_PER_PROCESS};
pub use options::{
    AsyncOptions, RecordOptions, SchedOptions, DEFAULT_FREQUENCY, DEFAULT_GPU_SAMPLE_HZ, DEFAULT_SLOW_SYSCALL, MAX_DURATION, MAX_FREQUENCY,
    MAX_MAX_OVERHEAD, MAX_SLOW_SYSCALL, MIN_MAX_OVERHEAD, MIN_SLOW_SYSCALL,
};
pub use programs::{FamilyTable, GlobalSpec, GlobalValue, LoadInputs, ProgramKind, ProgramSpec};
pub use sink::{Sink, Topic};
pub use target_set::{TargetSet, TargetState};

use crate::{os::btf_offsets::KernelBtf, os::probe::ProbeError, recording::{Frame, Origin, Recording}, engine::stacks::Stacks};

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
    /// [`Context::mappings_followed`].
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

/// What every collector shares during one recording.
pub struct Context {
    pub ebpf: Ebpf,
    pub btf: KernelBtf,
    /// Where tracefs is mounted, when it could be.
    pub tracefs: Option<PathBuf>,
    /// The whole options: the engine's. A family gets its own slice when
    /// its collector is made (`families::collectors`).
    pub(in crate::engine) opts: RecordOptions,
    /// The command line infertrace ran with.
    pub argv: Vec<String>,
    /// Wall-clock time when the window opened, Unix ms.
    pub started_unix_ms: u64,
    /// CLOCK_MONOTONIC ns when the window opened.
    pub window_start: u64,
    /// Set when the window closed (the programs are detached).
    pub window_end: Option<u64>,
    pub targets: TargetSet,
    /// Which exited threads keep rows of their own (`exited`).
    pub exited: ExitedThreads,
    pub stacks: Stacks,
    pub sink: Sink,
    /// The reader of the kernel's diagnostics (`--debug-ebpf`), if on.
    pub ebpf_log: Option<crate::engine::ebpf_log::EbpfLog>,
    /// Whether the process follower reports every executable mapping of a
    /// target ([`TargetEvent::Mapped`], from the syscall family's
    /// `sys_exit`); when not, a collector that needs new libraries
    /// re-scans the maps instead.
    pub mappings_followed: bool,
    /// Duplicates of the object's map descriptors, taken before any family
    /// took its map out of [`ebpf`](Self::ebpf): what programs loaded
    /// outside aya are relocated against ([`crate::os::uprobe_multi`]).
    pub map_fds: crate::os::uprobe_multi::MapFds,
    /// What one probe hit costs here, measured at startup by the overhead
    /// family (zeros until then, or where it could not be measured).
    pub calibration: crate::recording::overhead::Calibration,
    /// Set during a counts-only snapshot ([`run::Engine::counts`]): stacks
    /// are not resolved ([`frames`](Self::frames) gives none) and a family
    /// may skip its stack rows.
    pub counts_only: bool,
    events: VecDeque<TargetEvent>,
}

impl Context {
    pub fn new(ebpf: Ebpf, btf: KernelBtf, tracefs: Option<PathBuf>, opts: RecordOptions, argv: Vec<String>, window_start: u64) -> Self {
        let map_fds = crate::os::uprobe_multi::MapFds::capture(&ebpf);
        Context {
            ebpf,
            btf,
            tracefs,
            opts,
            argv,
            started_unix_ms: crate::os::clock::unix_ms(),
            window_start,
            window_end: None,
            targets: TargetSet::default(),
            exited: ExitedThreads::default(),
            stacks: Stacks::default(),
            sink: Sink::default(),
            ebpf_log: None,
            mappings_followed: false,
            map_fds,
            calibration: Default::default(),
            counts_only: false,
            events: VecDeque::new(),
        }
    }

    /// Queues an event for every collector (delivered by the session). A
    /// [`TargetEvent::Mapped`] right behind an undelivered one of the same
    /// process (nothing of that process between them) is dropped: the
    /// collectors read the maps when it is delivered, which then hold both
    /// mappings, and a starting process maps dozens of libraries at once.
    pub fn emit(&mut self, ev: TargetEvent) {
        queue_event(&mut self.events, ev);
    }

    pub fn next_event(&mut self) -> Option<TargetEvent> {
        self.events.pop_front()
    }

    /// Leaf-first frames of a captured stack (see `crate::engine::stacks`).
    /// None during a counts-only snapshot.
    pub fn frames(&mut self, pid: u32, user_stack: i32, kernel_stack: i32, py_stack: u64) -> Result<Vec<Frame>, ProbeError> {
        if self.counts_only {
            return Ok(Vec::new());
        }
        self.stacks.frames(&mut self.ebpf, pid, user_stack, kernel_stack, py_stack)
    }

    /// The end of what a snapshot covers: the window end once closed, else now.
    pub fn now_or_end(&self) -> u64 {
        self.window_end.unwrap_or_else(crate::os::clock::monotonic_ns)
    }
}

/// [`Context::emit`]'s queue.
fn queue_event(events: &mut VecDeque<TargetEvent>, ev: TargetEvent) {
    if let TargetEvent::Mapped { pid, .. } = ev {
        let last_of_pid = events.iter().rev().find(|e| e.pid() == pid);
        if matches!(last_of_pid, Some(TargetEvent::Mapped { .. })) {
            return;
        }
    }
    events.push_back(ev);
}

/// The user side of one probe family. Errors are for what breaks the
/// recording (a map missing from the object); anything a target can cause
/// goes to the sink as a note.
pub trait Collector {
    /// Short name, for error context.
    fn name(&self) -> &'static str;

    /// Loads and attaches the family's programs (or prepares to, for probes
    /// attached per file later).
    fn attach(&mut self, cx: &mut Context) -> Result<(), ProbeError>;

    /// A target appeared, forked, exec'd or exited.
    fn target(&mut self, _cx: &mut Context, _ev: &TargetEvent) -> Result<(), ProbeError> {
        Ok(())
    }

    /// How often [`poll`](Self::poll) runs (at least every 25 ms tick).
    fn poll_every(&self) -> Duration {
        Duration::from_millis(100)
    }

    /// Periodic work: drain ring buffers, retire dead threads, re-scan.
    fn poll(&mut self, _cx: &mut Context) -> Result<(), ProbeError> {
        Ok(())
    }

    /// A descriptor that becomes readable when this collector has
    /// something that should not wait for the next poll (a ring buffer the
    /// kernel wakes); the session then calls [`wake`](Self::wake) at once.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// [`wake_fd`](Self::wake_fd) became readable: take what is there
    /// (events go to [`Context::emit`], delivered right after).
    fn wake(&mut self, _cx: &mut Context) -> Result<(), ProbeError> {
        Ok(())
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
    fn snapshot(&mut self, cx: &mut Context, rec: &mut Recording) -> Result<(), ProbeError>;

    /// Whether this family's snapshot runs in a counts-only snapshot
    /// ([`run::Engine::counts`]: the agent's live metrics, every few
    /// seconds): by default those that fill the syscall table, the wall
    /// time or the CUDA report; a family whose snapshot sets lost-event
    /// counters says so too.
    fn counts(&self) -> bool {
        self.provides().iter().any(|p| matches!(p, Part::Syscalls | Part::Threads | Part::Cuda))
    }

    /// Stops the kernel side (the maps stay readable). Idempotent.
    fn detach(&mut self, _cx: &mut Context) {}

    /// A few words for the status line (`123 syscalls`), if any.
    fn status(&self) -> Option<String> {
        None
    }

    /// The long-running agent (`crate::cli::agent`) no longer needs anything of
    /// these processes: they exited and a window has covered their end.
    /// Drops what is kept of them, so that memory stays flat under process
    /// churn. Their rows leave the following snapshots.
    fn forget(&mut self, _cx: &mut Context, _pids: &std::collections::HashSet<u32>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_queued_back_to_back_are_delivered_once() {
        let mut q = VecDeque::new();
        let mapped = |pid, ts_ns| TargetEvent::Mapped { pid, ts_ns };
        queue_event(&mut q, mapped(1, 10));
        queue_event(&mut q, mapped(1, 11));
        queue_event(&mut q, mapped(2, 12));
        queue_event(&mut q, mapped(1, 13));
        // Across an exec the maps are another program's: kept.
        queue_event(&mut q, TargetEvent::Execed { pid: 2, comm: "x".into() });
        queue_event(&mut q, mapped(2, 14));
        queue_event(&mut q, mapped(2, 15));
        assert_eq!(Vec::from(q.clone()), [mapped(1, 10), mapped(2, 12), TargetEvent::Execed { pid: 2, comm: "x".into() }, mapped(2, 14)]);
        // Once delivered, a new mapping is news again.
        q.clear();
        queue_event(&mut q, mapped(1, 16));
        assert_eq!(q.len(), 1);
    }
}
