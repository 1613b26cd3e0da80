//! `record --timeline`, user side: drains the kernel's `TIMELINE_EVENTS`
//! ring buffer (thread-state intervals, CPU samples, slow syscalls, thread
//! starts and exits; tracer-ebpf/src/timeline.rs) into a bounded buffer of
//! at most `--timeline-limit` events (the rest counted as dropped), adds
//! the process events the session delivers (fork, exec, exit), and writes
//! them into the recording's `timeline` with stacks symbolized. The CUDA
//! collector adds every CUDA call itself (cuda/timeline.rs).
//!
//! Off (the default), the kernel programs see `TIMELINE_ENABLED` = 0 and
//! submit nothing, and this collector is not in the list.

use std::{collections::HashMap, time::Duration};

use aya::maps::{PerCpuArray, RingBuf};
use tracer_common::{
    sched::{NO_STACK, REASON_GIL, STATE_OFF_CPU, STATE_RUNNABLE, STATE_RUNNING},
    timeline::{TimelineEvent, KIND_SAMPLE, KIND_STATE, KIND_SYSCALL, KIND_THREAD_EXIT, KIND_THREAD_START},
};

use crate::{
    os::clock,
    engine::{Bounded, Part, Collector, Cx, Handle, FamilyTable, GlobalSpec, GlobalValue, TargetEvent, ring::Records},
    os::probe::ProbeError,
    recording::{
        timeline::{LifecycleEvent, LifecycleKind, SampleEvent, StateInterval, SyscallEvent, ThreadState},
        Frame, OffCpuReason, Recording,
    },
};

pub static TABLE: FamilyTable = FamilyTable {
    family: "timeline",
    programs: &[],
    globals: &[GlobalSpec { name: "TIMELINE_ENABLED", value: |i| Ok(GlobalValue::U32(u32::from(i.opts.timeline_limit.is_some()))) }],
};

/// How often the ring buffer (8 MiB, ~130 000 records) is drained.
const DRAIN_EVERY: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct TimelineCollector {
    /// Events kept per source (`--timeline-limit`); None: no timeline.
    limit: Option<u64>,
    ring: Option<Records<TimelineEvent>>,
    events: Bounded<TimelineEvent>,
    lifecycle: Vec<LifecycleEvent>,
    /// (pid, user, kernel, Python stack) -> index into `stacks`.
    stack_index: HashMap<(u32, i32, i32, u64), u32>,
    stacks: Vec<Vec<Frame>>,
}


/// The interval's state as the timeline names it (None: not an interval to show).
fn state_of(state: u32, r: u32) -> Option<(ThreadState, Option<OffCpuReason>)> {
    match state {
        STATE_RUNNING => Some((ThreadState::OnCpu, None)),
        // Woken to take the GIL and waiting for a CPU: still GIL time (as in the wall-time table).
        STATE_RUNNABLE if r == REASON_GIL => Some((ThreadState::OffCpu, Some(OffCpuReason::Gil))),
        STATE_RUNNABLE => Some((ThreadState::Runqueue, None)),
        STATE_OFF_CPU => Some((ThreadState::OffCpu, Some(OffCpuReason::from_code(r)))),
        _ => None,
    }
}

impl TimelineCollector {
    fn drain(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        ring.drain(|ev| self.events.push(ev));
    }

    fn stack(&mut self, cx: &mut Cx<'_>, pid: u32, user: i32, kernel: i32, py: u64) -> Result<Option<u32>, ProbeError> {
        if user == NO_STACK && kernel == NO_STACK && py == 0 {
            return Ok(None);
        }
        let key = (pid, user, kernel, py);
        if let Some(i) = self.stack_index.get(&key) {
            return Ok(Some(*i));
        }
        let frames = cx.frames(pid, user, kernel, py)?;
        let i = self.stacks.len() as u32;
        self.stacks.push(frames);
        self.stack_index.insert(key, i);
        Ok(Some(i))
    }

    fn kernel_lost(cx: &mut Cx<'_>) -> u64 {
        let Some(map) = cx.kernel.ebpf.map(tracer_common::maps::TIMELINE_LOST) else { return 0 };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else { return 0 };
        arr.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

impl TimelineCollector {
    pub fn new(limit: Option<u64>) -> Self {
        TimelineCollector { limit, ..Default::default() }
    }
}

impl Collector for TimelineCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Stacks]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Timeline]
    }

    /// Reads them: the CUDA family's calls, put into the timeline first, are kept beside the kernel's events.
    fn needs(&self) -> &'static [Part] {
        &[Part::Timeline]
    }

    fn name(&self) -> &'static str {
        "timeline"
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        let Some(limit) = self.limit else { return Ok(()) };
        self.events = Bounded::new(limit);
        let map = cx.kernel.ebpf.take_map(tracer_common::maps::TIMELINE_EVENTS).ok_or(ProbeError::MissingMap(tracer_common::maps::TIMELINE_EVENTS))?;
        self.ring = Some(Records::new(RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::TIMELINE_EVENTS, e))?, "timeline_short_records"));
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        let ts_ns = clock::monotonic_ns().saturating_sub(cx.window.start);
        let (kind, pid, comm) = match ev {
            TargetEvent::Forked { pid, comm, .. } => (LifecycleKind::ProcessStart, *pid, Some(comm.clone())),
            TargetEvent::Execed { pid, comm } => (LifecycleKind::Exec, *pid, Some(comm.clone())),
            TargetEvent::Exited { pid } => (LifecycleKind::ProcessExit, *pid, None),
            TargetEvent::Appeared { .. } | TargetEvent::Mapped { .. } => return Ok(()),
        };
        if (self.lifecycle.len() as u64) < self.events.limit {
            self.lifecycle.push(LifecycleEvent { kind, pid, tid: pid, ts_ns, comm });
        } else {
            self.events.dropped += 1;
        }
        Ok(())
    }

    /// Off (`--timeline` not given): nothing to drain, no reason to wake.
    fn poll_every(&self) -> Duration {
        if self.ring.is_some() {
            DRAIN_EVERY
        } else {
            Duration::from_secs(1)
        }
    }

    fn poll(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.drain();
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        let Some(limit) = self.limit else { return Ok(()) };
        self.drain();
        let start = cx.window.start;
        let rel = |t: u64| t.saturating_sub(start);
        let in_kernel = Self::kernel_lost(cx);
        if let Some(ring) = self.ring.as_ref() {
            ring.report(cx.sink);
        }
        let mut tl = rec.timeline.take().unwrap_or_default();
        tl.window_start_mono_ns = start;
        tl.limit = limit;
        tl.dropped += self.events.dropped + in_kernel;
        tl.dropped_in_kernel += in_kernel;
        tl.lifecycle.extend(self.lifecycle.iter().cloned());
        let events = std::mem::take(&mut self.events.items);
        for e in &events {
            match e.kind {
                KIND_STATE => {
                    let Some((state, reason)) = state_of(e.state, e.reason) else { continue };
                    let (begin_ns, end_ns) = (rel(e.begin_ns), rel(e.end_ns));
                    if end_ns <= begin_ns {
                        continue;
                    }
                    let stack = if state == ThreadState::OffCpu {
                        self.stack(cx, e.pid, e.user_stack, e.kernel_stack, e.py_stack)?
                    } else {
                        None
                    };
                    tl.states.push(StateInterval { pid: e.pid, tid: e.tid, state, reason, begin_ns, end_ns, stack });
                }
                KIND_SAMPLE => {
                    let stack = self.stack(cx, e.pid, e.user_stack, e.kernel_stack, e.py_stack)?;
                    tl.samples.push(SampleEvent { pid: e.pid, tid: e.tid, ts_ns: rel(e.begin_ns), stack });
                }
                KIND_SYSCALL => {
                    let stack = self.stack(cx, e.pid, e.user_stack, NO_STACK, e.py_stack)?;
                    tl.syscalls.push(SyscallEvent {
                        pid: e.pid,
                        tid: e.tid,
                        name: crate::system::syscall_name(&rec.host.arch, e.state),
                        begin_ns: rel(e.begin_ns),
                        end_ns: rel(e.end_ns),
                        stack,
                    });
                }
                KIND_THREAD_START | KIND_THREAD_EXIT => {
                    let kind = if e.kind == KIND_THREAD_START { LifecycleKind::ThreadStart } else { LifecycleKind::ThreadExit };
                    tl.lifecycle.push(LifecycleEvent { kind, pid: e.pid, tid: e.tid, ts_ns: rel(e.begin_ns), comm: None });
                }
                _ => {}
            }
        }
        self.events.items = events;
        tl.stacks = self.stacks.clone();
        tl.states.sort_by_key(|s| (s.pid, s.tid, s.begin_ns));
        tl.samples.sort_by_key(|s| (s.ts_ns, s.tid));
        tl.syscalls.sort_by_key(|s| (s.begin_ns, s.tid));
        tl.lifecycle.sort_by_key(|s| s.ts_ns);
        if tl.dropped > 0 {
            cx.sink.state_note(
                "timeline_dropped",
                format!(
                    "timeline: {} events not kept ({} past --timeline-limit {limit}, {} lost in the kernel ring buffer); the timeline is incomplete",
                    tl.dropped,
                    tl.dropped - tl.dropped_in_kernel,
                    tl.dropped_in_kernel
                ),
            );
        }
        rec.timeline = Some(tl);
        Ok(())
    }
}
