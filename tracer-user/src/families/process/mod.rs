//! The process follower: the kernel adds children forked by a target to
//! `TARGETS` itself (no early syscall is missed); this collector puts the
//! explicit targets there, attaches the fork/exec/exit programs, turns their
//! ring-buffer records into `TargetEvent`s for every collector, keeps the
//! target set (who is alive, what exec changed), snapshots the targets'
//! mappings for the symbolizer, and reports the kernel's drop counters.

use std::time::{Duration, Instant};

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, RingBuf},
    Ebpf,
};
use tracer_common::{
    counters,
    process::{ProcEvent, KIND_EXEC, KIND_EXIT, KIND_FORK, KIND_MAPPED},
    target_flags,
};

use crate::{
    engine::{
        programs::Links, ring::Records, Collector, Cx, Handle, FamilyTable, Topic, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec, TargetEvent,
        TargetState,
    },
    os::probe::{self, ProbeError},
    os::procfs,
    recording::{Origin, Recording},
};

/// Fork following needs tracefs (the classic `task_newtask` tracepoint).
const NEWTASK: ProgramSpec =
    ProgramSpec { name: "task_newtask", kind: ProgramKind::TracePoint { category: "task", name: "task_newtask" } };

pub static TABLE: FamilyTable = FamilyTable {
    family: "process",
    programs: &[
        NEWTASK,
        ProgramSpec { name: "sched_process_exec", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_process_exec" } },
        ProgramSpec { name: "sched_process_exit", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_process_exit" } },
    ],
    globals: &[
        GlobalSpec {
            name: "NEWTASK_PID_OFFSET",
            value: |i| Ok(GlobalValue::U32(i.tracepoint_field("task", "task_newtask", "pid", 8))),
        },
        GlobalSpec {
            name: "NEWTASK_FLAGS_OFFSET",
            value: |i| Ok(GlobalValue::U32(i.tracepoint_field("task", "task_newtask", "clone_flags", 32))),
        },
    ],
};

/// How long after a fork or exec the mappings are snapshot again (the
/// dynamic loader maps the libraries right after exec).
const REOBSERVE_AFTER: Duration = Duration::from_millis(200);
/// How often every live target's mappings are snapshot again (dlopen).
const REOBSERVE_ALL: Duration = Duration::from_secs(1);
/// How often the target set is checked against the kernel's and /proc (a
/// backstop for lost fork and exit records: a /proc read per target and a
/// walk of a 16k-bucket map, too much for every 100 ms poll).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The process follower: the target set in the kernel, lifecycle events
/// from it, the mappings snapshot for symbolization, the drop counters.
#[derive(Default)]
pub struct ProcessCollector {
    events: Option<Records<ProcEvent>>,
    links: Links,
    /// Processes whose mappings to snapshot again, and when.
    reobserve: Vec<(u32, Instant)>,
    last_observe_all: Option<Instant>,
    last_sweep: Option<Instant>,
    /// Targets whose exit record arrived since the last poll.
    exiting: Vec<u32>,
}

fn comm_string(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

impl ProcessCollector {
    /// Drains the pending lifecycle events (non-blocking).
    fn drain(&mut self) -> Vec<TargetEvent> {
        let mut out = Vec::new();
        let Some(rb) = self.events.as_mut() else { return out };
        rb.drain(|ev| {
            out.push(match ev.kind {
                KIND_FORK => TargetEvent::Forked { pid: ev.pid, parent: ev.ppid, comm: comm_string(&ev.comm) },
                KIND_EXEC => TargetEvent::Execed { pid: ev.pid, comm: comm_string(&ev.comm) },
                KIND_EXIT => TargetEvent::Exited { pid: ev.pid },
                KIND_MAPPED => TargetEvent::Mapped { pid: ev.pid, ts_ns: ev.ts_ns },
                _ => return,
            })
        });
        out
    }

    /// Adds targets the kernel followed but whose events we missed, marks the
    /// dead, and removes them from the kernel set (so a reused pid is not
    /// traced).
    fn sweep(cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        for pid in kernel_targets(&mut cx.kernel.ebpf)? {
            cx.targets.entry(pid, Origin::Followed);
        }
        let alive: Vec<u32> = cx.targets.states.values().filter(|s| s.alive).map(|s| s.target.pid).collect();
        Self::mark_dead(cx, &alive)
    }

    /// Of `pids`, those /proc no longer shows alive are marked dead and
    /// removed from the kernel set.
    fn mark_dead(cx: &mut Cx<'_>, pids: &[u32]) -> Result<(), ProbeError> {
        for &pid in pids {
            let Some(st) = cx.targets.states.get_mut(&pid).filter(|s| s.alive) else { continue };
            if !procfs::is_alive(pid) {
                st.alive = false;
                remove_target(&mut cx.kernel.ebpf, pid)?;
            }
        }
        Ok(())
    }

    /// Hands the drained events on; exits are checked at the next poll
    /// (the exit tracepoint fires before the process is a zombie).
    fn deliver(&mut self, cx: &mut Cx<'_>) {
        for ev in self.drain() {
            if let TargetEvent::Exited { pid } = ev {
                self.exiting.push(pid);
            }
            cx.targets.emit(ev);
        }
    }
}

impl Collector for ProcessCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Targets, Handle::Stacks]
    }

    fn name(&self) -> &'static str {
        "process"
    }

    /// Its snapshot sets the lost-event counters.
    fn counts(&self) -> bool {
        true
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        for spec in TABLE.programs {
            if spec.name == NEWTASK.name && cx.kernel.tracefs.is_none() {
                cx.sink.note("tracefs unavailable: forked children are not followed");
                continue;
            }
            self.links.attach(&mut cx.kernel, spec)?;
        }
        // The syscall family's `sys_exit` reports executable mappings here.
        cx.targets.mappings_followed = true;
        let map = cx.kernel.ebpf.take_map(tracer_common::maps::PROC_EVENTS).ok_or(ProbeError::MissingMap(tracer_common::maps::PROC_EVENTS))?;
        self.events = Some(Records::new(RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::PROC_EVENTS, e))?, "process_short_records"));
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        match ev {
            TargetEvent::Appeared { pid, origin: Origin::Launched } => {
                add_target(&mut cx.kernel.ebpf, *pid, target_flags::LAUNCHED)?;
                if let Some(st) = cx.targets.launched_state() {
                    cx.targets.insert(st);
                }
            }
            TargetEvent::Appeared { pid, origin } => {
                // `Followed`: picked up at its exec by the agent's selection
                // (born inside the window: no call of it was in flight at attach).
                let flags = if *origin == Origin::Followed { target_flags::FOLLOWED } else { target_flags::EXPLICIT };
                add_target(&mut cx.kernel.ebpf, *pid, flags)?;
                cx.targets.insert(TargetState::observe(*pid, *origin));
                cx.stacks.symbolizer.observe_process(*pid);
            }
            TargetEvent::Forked { pid, parent, comm } => {
                cx.stacks.symbolizer.observe_process(*pid);
                let st = cx.targets.entry(*pid, Origin::Followed);
                st.target.ppid = Some(*parent);
                if st.target.comm.is_empty() {
                    st.target.comm = comm.clone();
                }
                self.reobserve.push((*pid, Instant::now() + REOBSERVE_AFTER));
            }
            TargetEvent::Execed { pid, comm } => {
                let st = cx.targets.entry(*pid, Origin::Followed);
                st.target.comm = comm.clone();
                if st.target.origin == Origin::Followed {
                    // What fork copied from the parent is stale after exec.
                    st.target.exe = None;
                    st.target.cmdline.clear();
                }
                st.refresh();
                cx.stacks.symbolizer.observe_process(*pid);
                self.reobserve.push((*pid, Instant::now() + REOBSERVE_AFTER));
            }
            TargetEvent::Exited { pid } => {
                if let Some(st) = cx.targets.states.get_mut(pid) {
                    st.refresh();
                }
            }
            TargetEvent::Mapped { .. } => {}
        }
        Ok(())
    }

    /// The kernel wakes the session when it writes to `PROC_EVENTS`: an
    /// exec or a new executable mapping is delivered at once, not at the
    /// next poll (a library dlopen'd may be called right after).
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.events.as_ref().map(|rb| rb.as_fd())
    }

    fn wake(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.deliver(cx);
        Ok(())
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.deliver(cx);
        let now = Instant::now();
        let symbolizer = &mut cx.stacks.symbolizer;
        self.reobserve.retain(|&(pid, due)| {
            if due > now {
                return true;
            }
            symbolizer.reobserve_process(pid);
            false
        });
        if self.last_observe_all.is_none_or(|t| t.elapsed() >= REOBSERVE_ALL) {
            self.last_observe_all = Some(now);
            // Libraries loaded since (dlopen): keep the snapshots current.
            for st in cx.targets.states.values().filter(|s| s.alive) {
                symbolizer.reobserve_process(st.target.pid);
            }
        }
        cx.targets.reap_launched();
        if self.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            self.last_sweep = Some(now);
            self.exiting.clear();
            return Self::sweep(cx);
        }
        // Those that reported an exit: a record of a process that exited
        // ends at the next poll, not at the next sweep. Still alive (a
        // leader gone before its threads): the sweep watches it.
        let exiting = std::mem::take(&mut self.exiting);
        Self::mark_dead(cx, &exiting)
    }

    /// The launched command's exit status is reaped by `poll` (the session
    /// polls once more before the final snapshot).
    fn snapshot(&mut self, cx: &mut Cx<'_>, _rec: &mut Recording) -> Result<(), ProbeError> {
        for (i, name) in counters::NAMES.iter().enumerate() {
            let idx = i as u32;
            if counters::is_loss(idx) {
                let n = probe::counter(&mut cx.kernel.ebpf, idx)?;
                cx.sink.set_lost(*name, n);
            }
        }
        let collided = probe::counter(&mut cx.kernel.ebpf, counters::STACKS_COLLIDED)?;
        if collided > 0 {
            let text = format!(
                "{collided} native stacks could not be stored (their bucket in the kernel's stack map held another stack): their events and times are kept, their native frames show as {}",
                crate::recording::STACK_LOST
            );
            cx.sink.state_note_on(Topic::Detail, "native_stacks_collided", text);
        }
        if let Some(rb) = self.events.as_ref() {
            rb.report(cx.sink);
        }
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        self.links.detach(&mut cx.kernel.ebpf);
    }
}

fn targets_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, u32, u8>, ProbeError> {
    probe::hash_map(ebpf, tracer_common::maps::TARGETS)
}

/// Invalidates the kernel's per-CPU target caches after a change.
fn bump_generation(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    let map = ebpf.map_mut(tracer_common::maps::TARGETS_GEN).ok_or(ProbeError::MissingMap(tracer_common::maps::TARGETS_GEN))?;
    let mut arr: Array<&mut MapData, u64> = Array::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::TARGETS_GEN, e))?;
    let gen = arr.get(&0, 0).unwrap_or(0);
    arr.set(0, gen.wrapping_add(1), 0).map_err(|e| ProbeError::map(tracer_common::maps::TARGETS_GEN, e))
}

pub fn add_target(ebpf: &mut Ebpf, pid: u32, flags: u8) -> Result<(), ProbeError> {
    targets_map(ebpf)?.insert(pid, flags, 0).map_err(|e| ProbeError::map(tracer_common::maps::TARGETS, e))?;
    bump_generation(ebpf)
}

pub fn remove_target(ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
    let _ = targets_map(ebpf)?.remove(&pid);
    bump_generation(ebpf)
}

/// Every pid in the kernel's target set.
pub fn kernel_targets(ebpf: &mut Ebpf) -> Result<Vec<u32>, ProbeError> {
    Ok(targets_map(ebpf)?.keys().filter_map(Result::ok).collect())
}
