//! What the text and JSON reports say about a recording's timeline
//! (`record --timeline`): events kept by source and events dropped.

use serde::Serialize;

use crate::recording::timeline::Timeline;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TimelineSummary {
    pub states: u64,
    pub samples: u64,
    pub syscalls: u64,
    pub cuda_calls: u64,
    pub lifecycle: u64,
    /// `--timeline-limit` (per source).
    pub limit: u64,
    /// Events not kept (past the limit or lost in the kernel): the timeline is incomplete when > 0.
    pub dropped: u64,
    pub dropped_in_kernel: u64,
}

impl TimelineSummary {
    pub fn of(t: &Timeline) -> Self {
        TimelineSummary {
            states: t.states.len() as u64,
            samples: t.samples.len() as u64,
            syscalls: t.syscalls.len() as u64,
            cuda_calls: t.cuda.len() as u64,
            lifecycle: t.lifecycle.len() as u64,
            limit: t.limit,
            dropped: t.dropped,
            dropped_in_kernel: t.dropped_in_kernel,
        }
    }

    /// One line for the text report.
    pub fn line(&self) -> String {
        let kept = self.states + self.samples + self.syscalls + self.cuda_calls + self.lifecycle;
        let mut s = format!(
            "timeline: {kept} events ({} thread states, {} CPU samples, {} slow syscalls, {} CUDA calls, {} starts/exits), {} dropped",
            self.states, self.samples, self.syscalls, self.cuda_calls, self.lifecycle, self.dropped
        );
        if self.dropped > 0 {
            s.push_str(&format!(" (limit {} per source; {} lost in the kernel)", self.limit, self.dropped_in_kernel));
        }
        s.push_str("; `infertrace report FILE --format perfetto -o trace.pftrace` shows it\n");
        s
    }
}
