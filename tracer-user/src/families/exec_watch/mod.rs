//! A probe family of `infertrace agent` only (`crate::cli::agent`): exec events of every process for the agent's selection (`agent_exec` on
//! `sched_process_exec`, ring buffer `AGENT_EXECS`): a process that starts
//! after the agent and matches is picked up at its exec, not by a scan.
//! Attached by the agent only.

use aya::maps::RingBuf;
use tracer_common::process::{ProcEvent, KIND_EXEC};

use crate::{
    engine::{programs::Links, ring::Records, FamilyTable, Kernel, ProgramKind, ProgramSpec, Sink},
    os::probe::ProbeError,
};

const AGENT_EXEC: ProgramSpec =
    ProgramSpec { name: "agent_exec", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_process_exec" } };

pub static TABLE: FamilyTable = FamilyTable { family: "exec_watch", programs: &[AGENT_EXEC], globals: &[] };

pub struct ExecWatch {
    pub ring: Records<ProcEvent>,
    links: Links,
}

impl ExecWatch {
    pub fn attach(kernel: &mut Kernel) -> Result<ExecWatch, ProbeError> {
        let mut links = Links::default();
        links.attach(kernel, &AGENT_EXEC)?;
        let map = kernel.ebpf.take_map(tracer_common::maps::AGENT_EXECS).ok_or(ProbeError::MissingMap(tracer_common::maps::AGENT_EXECS))?;
        let ring = RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::AGENT_EXECS, e))?;
        Ok(ExecWatch { ring: Records::new(ring, "exec_watch_short_records"), links })
    }

    /// The pids that exec'd since the last call (items too short to be a
    /// record are counted in `sink`).
    pub fn drain(&mut self, sink: &mut Sink) -> Vec<u32> {
        let mut out = Vec::new();
        self.ring.drain(|ev| {
            if ev.kind == KIND_EXEC {
                out.push(ev.pid);
            }
        });
        self.ring.report(sink);
        out
    }

    pub fn detach(&mut self, kernel: &mut Kernel) {
        self.links.detach(&mut kernel.ebpf);
    }
}
