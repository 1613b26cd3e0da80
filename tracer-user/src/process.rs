//! Following targets, user side: the kernel adds children forked by a target
//! to `TARGETS` itself (no early syscall is missed); this module attaches
//! those programs, reads the fork/exec/exit events from the ring buffer, and
//! manages the target set.

use std::path::Path;

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint},
    Btf, Ebpf,
};
use tracer_common::{
    counters,
    proc_events::{ProcEvent, KIND_EXEC, KIND_EXIT, KIND_FORK},
};

use crate::probe::{self, ProbeError};

/// A lifecycle event of a target, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Forked { pid: u32, parent: u32, comm: String },
    Execed { pid: u32, comm: String },
    Exited { pid: u32 },
}

pub struct ProcessFollower {
    events: RingBuf<MapData>,
    /// Why fork following is off, when it is.
    pub disabled_reason: Option<String>,
}

fn comm_string(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

impl ProcessFollower {
    /// Attaches the lifecycle programs. Fork following needs tracefs (for the
    /// classic `task_newtask` tracepoint); without it the recording is kept
    /// but notes that children are not followed.
    pub fn attach(ebpf: &mut Ebpf, btf: &Btf, tracefs: Option<&Path>) -> Result<Self, ProbeError> {
        let mut disabled_reason = None;
        match tracefs {
            Some(_) => {
                let prog: &mut TracePoint = probe::program(ebpf, "task_newtask")?;
                prog.load().map_err(|e| ProbeError::load("task_newtask", e))?;
                prog.attach("task", "task_newtask").map_err(|e| ProbeError::attach("task_newtask", e))?;
            }
            None => disabled_reason = Some("tracefs unavailable: forked children are not followed".to_owned()),
        }
        for (name, tp) in [("sched_process_exec", "sched_process_exec"), ("sched_process_exit", "sched_process_exit")] {
            let prog: &mut BtfTracePoint = probe::program(ebpf, name)?;
            prog.load(tp, btf).map_err(|e| ProbeError::load(name, e))?;
            prog.attach().map_err(|e| ProbeError::attach(name, e))?;
        }
        let map = ebpf.take_map("PROC_EVENTS").ok_or(ProbeError::MissingMap("PROC_EVENTS"))?;
        let events = RingBuf::try_from(map).map_err(|e| ProbeError::map("PROC_EVENTS", e))?;
        Ok(Self { events, disabled_reason })
    }

    /// Drains the pending lifecycle events (non-blocking).
    pub fn poll(&mut self) -> Vec<Lifecycle> {
        let mut out = Vec::new();
        while let Some(item) = self.events.next() {
            if item.len() < std::mem::size_of::<ProcEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole ProcEvent; read_unaligned copes with alignment.
            let ev: ProcEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            out.push(match ev.kind {
                KIND_FORK => Lifecycle::Forked { pid: ev.pid, parent: ev.ppid, comm: comm_string(&ev.comm) },
                KIND_EXEC => Lifecycle::Execed { pid: ev.pid, comm: comm_string(&ev.comm) },
                KIND_EXIT => Lifecycle::Exited { pid: ev.pid },
                _ => continue,
            });
        }
        out
    }
}

fn targets_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, u32, u8>, ProbeError> {
    probe::hash_map(ebpf, "TARGETS")
}

/// Invalidates the kernel's per-CPU target caches after a change.
fn bump_generation(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    let map = ebpf.map_mut("TARGETS_GEN").ok_or(ProbeError::MissingMap("TARGETS_GEN"))?;
    let mut arr: Array<&mut MapData, u64> = Array::try_from(map).map_err(|e| ProbeError::map("TARGETS_GEN", e))?;
    let gen = arr.get(&0, 0).unwrap_or(0);
    arr.set(0, gen.wrapping_add(1), 0).map_err(|e| ProbeError::map("TARGETS_GEN", e))
}

pub fn add_target(ebpf: &mut Ebpf, pid: u32, flags: u8) -> Result<(), ProbeError> {
    targets_map(ebpf)?.insert(pid, flags, 0).map_err(|e| ProbeError::map("TARGETS", e))?;
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

/// Drop counters summed over CPUs, by name (only non-zero ones).
pub fn lost_counters(ebpf: &mut Ebpf) -> Result<Vec<(String, u64)>, ProbeError> {
    let map = ebpf.map_mut("COUNTERS").ok_or(ProbeError::MissingMap("COUNTERS"))?;
    let arr: PerCpuArray<&mut MapData, u64> = PerCpuArray::try_from(map).map_err(|e| ProbeError::map("COUNTERS", e))?;
    let mut out = Vec::new();
    for (i, name) in counters::NAMES.iter().enumerate() {
        let vals = arr.get(&(i as u32), 0).map_err(|e| ProbeError::map("COUNTERS", e))?;
        let sum: u64 = vals.iter().sum();
        if sum > 0 {
            out.push(((*name).to_owned(), sum));
        }
    }
    Ok(out)
}
