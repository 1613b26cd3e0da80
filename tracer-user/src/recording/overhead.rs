//! `tracer_overhead`: what tracing cost, as the tracer measured it
//! (`crate::families::overhead` fills it; docs/report-schema.md, "tracer_overhead").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the `tracer_overhead` object (additive changes keep it).
pub const OVERHEAD_VERSION: u32 = 1;

/// The tracer's own account of its cost.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TracerOverhead {
    pub version: u32,
    /// The kernel mechanism's cost per hit on this machine, measured at
    /// startup with empty programs.
    pub calibration: Calibration,
    /// Hits and program time per probe family, machine-wide (every run of
    /// our programs, targets or not; from the kernel's BPF run statistics).
    pub families: Vec<FamilyOverhead>,
    /// Per target: hits, the estimated time added, its share of wall time.
    pub targets: Vec<TargetOverhead>,
    /// The tracer process itself.
    pub tracer: TracerSelf,
    /// The tracer's start-up (opening the engine), phase by phase (schema
    /// 1.x addition; absent from recordings made before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<StartupCost>,
    /// What the estimate leaves out or could not measure.
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Calibration {
    /// One uprobe hit (entry trap, empty program), ns; 0: not measured.
    pub uprobe_ns: f64,
    /// What a uretprobe adds to a probed call (return trap, empty program), ns.
    pub uretprobe_ns: f64,
    /// The syscall tracepoints' slow path with empty enter and exit
    /// programs, per syscall, ns.
    pub syscall_tracepoints_ns: f64,
    /// Milliseconds the calibration took.
    pub took_ms: f64,
    /// Taken from the calibration kept for this boot, kernel and tracer
    /// version (`/run/infertrace`), not measured in this run (schema 1.x
    /// addition; `took_ms` is then the kept calibration's).
    #[serde(default)]
    pub cached: bool,
}

/// One probe family's programs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FamilyOverhead {
    pub family: String,
    /// Runs of the family's programs (each a probe hit).
    pub hits: u64,
    /// Time inside the programs, summed (the trap is not included).
    pub program_ns: u64,
    pub programs: Vec<ProgramRuns>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ProgramRuns {
    pub name: String,
    pub runs: u64,
    pub run_ns: u64,
}

/// One target's share.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TargetOverhead {
    pub pid: u32,
    pub comm: String,
    /// Probe hits in this process, per family (`syscalls`: enter and exit
    /// per syscall; `cuda`: entries and returns).
    pub hits: BTreeMap<String, u64>,
    /// Estimated time the probes added to this process, per family, ns.
    pub added_ns: BTreeMap<String, u64>,
    /// Their sum.
    pub estimated_added_ns: u64,
    /// The process's time in the window (its longest thread's), ns.
    pub wall_ns: u64,
    /// `estimated_added_ns / wall_ns`, percent.
    pub share_percent: f64,
    /// The kernel's `uretprobe` syscall (x86_64 nr 335, Linux 6.11+): how
    /// the return trap of a uretprobe enters the kernel. Tracer time, not
    /// the target's own: left out of the syscall table and counted here.
    #[serde(default)]
    pub uretprobe_syscalls: u64,
    #[serde(default)]
    pub uretprobe_syscall_ns: u64,
}

/// Wall and CPU time of the tracer's start-up, from its first step to the
/// moment the targets are traced (the window's first events).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StartupCost {
    pub wall_ns: u64,
    /// The tracer's CPU time (user + system) over those phases.
    pub cpu_ns: u64,
    /// In order: `context` (the kernel object loaded with its maps), one
    /// per family (its programs loaded, verified and attached; the
    /// overhead family's is the calibration), `targets` (the named targets
    /// attached: descendants, per-target probes).
    pub phases: Vec<StartupPhase>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StartupPhase {
    pub phase: String,
    pub wall_ns: u64,
    pub cpu_ns: u64,
}

/// The tracer process (user space; the programs run in the targets' time).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TracerSelf {
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    /// Peak resident memory (VmHWM), bytes.
    pub peak_rss_bytes: u64,
}
