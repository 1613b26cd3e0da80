//! One tracing window from attach to detach, as [`super::run::Engine`]
//! drives it: what is checked before (the target, the privileges, the
//! kernel's BTF), the window opened (the object loaded with every family's
//! globals), its snapshots into a recording, and its end. The `record`
//! command's loop is [`super::record`]. It names no probe family.

use std::{collections::BTreeMap, path::PathBuf};

use aya::{
    maps::{Array, MapData},
    Ebpf,
};

pub use crate::engine::RecordOptions;
use super::{
    ebpf_log,
    programs::{self, FamilyTable, LoadError, LoadInputs},
    targets::{self, Launched, TargetError},
    Collector, Context, Kernel,
};
use crate::{
    os::{btf_offsets::KernelBtf, clock, probe::ProbeError, procfs, tracefs},
    recording::{HostInfo, Recording, FORMAT_VERSION},
    system,
};

pub const DEFAULT_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("nothing to trace")]
    NoTarget,
    #[error("tracing needs root or CAP_BPF+CAP_PERFMON (this process lacks {})", missing_tracing_caps().join(" and "))]
    NotPermitted,
    #[error("kernel BTF not found at {0}")]
    NoBtf(PathBuf),
    #[error("cannot parse kernel BTF at {path}: {detail}")]
    BadBtf { path: PathBuf, detail: String },
    #[error("cannot write the recording to {path}: {source}")]
    Output { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] LoadError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("unsupported architecture {0}")]
    Arch(&'static str),
    #[error(transparent)]
    Recording(#[from] crate::recording::RecordingError),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Order(#[from] super::OrderError),
}

impl RecordError {
    pub fn hint(&self) -> &str {
        match self {
            Self::NoTarget => "give -p PID (repeatable) and/or a command after `--`",
            Self::NotPermitted => "run as root (sudo), or grant CAP_BPF and CAP_PERFMON; see `infertrace doctor`",
            Self::NoBtf(_) | Self::BadBtf { .. } => {
                "use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or point INFERTRACE_BTF at a BTF file for this kernel"
            }
            Self::Output { .. } => "choose a writable path with -o FILE",
            Self::Target(e) => e.hint(),
            Self::Load(LoadError::TooLittleMemory(_) | LoadError::OutOfMemory { .. }) => {
                "raise the memory limit of infertrace's cgroup (128 MiB is enough with the defaults)"
            }
            Self::Load(_) | Self::Probe(_) => "run `infertrace doctor` to check the kernel's eBPF support",
            Self::Arch(_) => "infertrace supports x86_64 and aarch64",
            Self::Recording(_) => "check free space and permissions of the output directory",
            Self::Signals(_) => "retry",
            Self::Order(_) => "a bug in infertrace's families: please report it",
        }
    }
}

const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_PERFMON: u64 = 1 << 38;
const CAP_BPF: u64 = 1 << 39;

/// Root or CAP_BPF+CAP_PERFMON (CAP_SYS_ADMIN implies both on older kernels).
pub fn has_tracing_privileges() -> bool {
    missing_tracing_caps().is_empty()
}

/// The capabilities this process lacks to trace (none with CAP_SYS_ADMIN,
/// which implies both), e.g. `["CAP_PERFMON"]` when it holds CAP_BPF only.
pub fn missing_tracing_caps() -> Vec<&'static str> {
    missing_caps(procfs::own_effective_caps().unwrap_or(0))
}

fn missing_caps(effective: u64) -> Vec<&'static str> {
    if effective & CAP_SYS_ADMIN != 0 {
        return Vec::new();
    }
    [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(bit, _)| effective & bit == 0)
        .map(|(_, name)| name)
        .collect()
}

pub fn btf_path() -> PathBuf {
    std::env::var_os("INFERTRACE_BTF").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_BTF))
}

/// The kernel's BTF, read and parsed once for the whole recording.
pub fn load_btf() -> Result<KernelBtf, RecordError> {
    let path = btf_path();
    if !path.exists() {
        return Err(RecordError::NoBtf(path));
    }
    KernelBtf::load(&path).map_err(|detail| RecordError::BadBtf { path, detail })
}

/// What `record` and `top` check before anything is attached: a target,
/// pids that exist, the privileges; then reads the kernel's BTF.
pub fn preflight(opts: &RecordOptions) -> Result<KernelBtf, RecordError> {
    if opts.pids.is_empty() && opts.command.is_empty() {
        return Err(RecordError::NoTarget);
    }
    for &pid in &opts.pids {
        targets::validate_pid(pid)?;
    }
    if !has_tracing_privileges() {
        return Err(RecordError::NotPermitted);
    }
    load_btf()
}

/// Mounts tracefs if needed, launches the command (held before its exec),
/// loads the object with every family's globals and opens the window.
pub(crate) fn open_context(opts: RecordOptions, btf: KernelBtf, argv: Vec<String>, tables: &[&'static FamilyTable]) -> Result<Context, RecordError> {
    let arch = system::arch_constants().ok_or(RecordError::Arch(std::env::consts::ARCH))?;
    let mut notes = Vec::new();
    let tracefs = match tracefs::ensure_mounted() {
        Ok((p, mounted)) => {
            if mounted {
                notes.push(format!("mounted tracefs at {}", p.display()));
            }
            Some(p)
        }
        Err(e) => {
            notes.push(e.to_string());
            None
        }
    };
    let launched = if opts.command.is_empty() { None } else { Some(Launched::spawn(&opts.command)?) };
    if let Some((bytes, path)) = super::memory::own_limit() {
        if let Ok(d) = super::memory::divisor(Some((bytes, path.clone()))) {
            if d > 1 {
                notes.push(format!(
                    "memory limit {} MiB ({}): the large kernel maps have 1/{d} of their default entries (~{} MiB of maps)",
                    bytes >> 20,
                    path.display(),
                    super::memory::maps_mib(d)
                ));
            }
        }
    }
    let inputs = LoadInputs { opts: &opts, arch, btf: &btf, tracefs: tracefs.as_deref() };
    let ebpf = programs::load_object(tables, &inputs)?;
    let mut cx = Context::new(Kernel::new(ebpf, btf, tracefs), opts, argv, clock::monotonic_ns());
    cx.targets.launched = launched;
    for n in notes {
        cx.sink.note(n);
    }
    if cx.opts.debug_ebpf {
        match ebpf_log::start(&mut cx.kernel.ebpf) {
            Ok(log) => cx.ebpf_log = log,
            Err(e) => cx.sink.note(format!("--debug-ebpf: {e}")),
        }
    }
    set_window(&mut cx.kernel.ebpf, WINDOW_START, cx.window.start)?;
    Ok(cx)
}

/// What every collector has so far, as a recording (the window goes on).
/// After [`close`], the final recording.
pub(crate) fn snapshot(cx: &mut Context, collectors: &mut [Box<dyn Collector>]) -> Result<Recording, RecordError> {
    cx.stacks.invalidate();
    let mut rec = empty_recording(cx);
    let order = super::snapshot_order(collectors).map_err(RecordError::Order)?;
    for i in order {
        let c = &mut collectors[i];
        c.snapshot(&mut cx.view(c.uses()), &mut rec)?;
    }
    // Once every family has resolved its stacks: Python frames that could
    // not be resolved, per process and cause.
    for (pid, problems) in cx.stacks.python_problems() {
        for (i, (topic, text)) in problems.into_iter().enumerate() {
            cx.sink.state_note_on(topic, format!("python_unresolved_{pid}_{i}"), format!("pid {pid}: {text}"));
        }
    }
    // Files of targets refused (FIFOs, devices, oversized or malformed
    // files, lists cut at their caps): one note, with the counts so far.
    if let Some(text) = crate::os::procfs::refused::note() {
        cx.sink.state_note("target_files_refused", text);
    }
    rec.targets = cx.targets.to_targets();
    if let (Some(o), Some(s)) = (rec.tracer_overhead.as_mut(), cx.startup.as_ref()) {
        o.startup = Some(s.clone());
    }
    cx.sink.fill(&mut rec);
    rec.attribute_folded_stacks();
    rec.sort_stacks();
    Ok(rec)
}

/// The counts so far, without stacks: the snapshots of the collectors
/// that [count](Collector::counts), with [`Cx::counts_only`](super::Cx::counts_only) set.
pub(crate) fn counts_snapshot(cx: &mut Context, collectors: &mut [Box<dyn Collector>]) -> Result<Recording, RecordError> {
    // The stack maps as they are now: the CUDA rows are keyed by call site,
    // and a stack captured since the last snapshot would read as unknown.
    cx.stacks.invalidate();
    let mut rec = empty_recording(cx);
    let order: Vec<usize> =
        super::snapshot_order(collectors).map_err(RecordError::Order)?.into_iter().filter(|i| collectors[*i].counts()).collect();
    cx.counts_only = true;
    let mut done = Ok(());
    for i in order {
        let c = &mut collectors[i];
        done = c.snapshot(&mut cx.view(c.uses()), &mut rec);
        if done.is_err() {
            break;
        }
    }
    cx.counts_only = false;
    done?;
    rec.stacks.clear();
    rec.targets = cx.targets.to_targets();
    cx.sink.fill(&mut rec);
    Ok(rec)
}

fn empty_recording(cx: &Context) -> Recording {
    Recording {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host_info(),
        started_unix_ms: cx.window.started_unix_ms,
        duration_ns: cx.window.now_or_end().saturating_sub(cx.window.start),
        argv: cx.argv.clone(),
        targets: Vec::new(),
        syscalls: Vec::new(),
        threads: Vec::new(),
        stacks: Vec::new(),
        runqueue_hist: BTreeMap::new(),
        sample_hz: 0,
        cuda: None,
        lost: BTreeMap::new(),
        notes: Vec::new(),
        details: Vec::new(),
        cut: None,
        timeline: None,
        tracer_overhead: None,
        asyncio: None,
        memory: None,
        gil_holders: Vec::new(),
    }
}

/// Ends the window: detaches every program and polls the collectors a
/// last time (the caller then delivers the last target events and takes
/// the final [`snapshot`]).
/// With `detach` false the programs stay attached (they count nothing
/// after the end): for a process about to exit, whose exit releases them.
pub(crate) fn end_window(cx: &mut Context, collectors: &mut [Box<dyn Collector>], detach: bool) -> Result<(), RecordError> {
    // First tell the kernel programs: detaching takes time, and what
    // happens meanwhile (threads started after the end) is not in the
    // window. The end is read after the kernel has it: a busy machine can
    // hold this thread between the two, and every event the programs kept
    // must fall inside the window.
    set_window(&mut cx.kernel.ebpf, WINDOW_END, clock::monotonic_ns())?;
    cx.window.end = Some(clock::monotonic_ns());
    if detach {
        for c in collectors.iter_mut() {
            c.detach(&mut cx.view(c.uses()));
        }
    }
    for c in collectors.iter_mut() {
        c.poll(&mut cx.view(c.uses()))?;
    }
    Ok(())
}

/// Slots of the kernel's `WINDOW` array: when the window opened and closed.
const WINDOW_START: u32 = 0;
const WINDOW_END: u32 = 1;

fn set_window(ebpf: &mut Ebpf, slot: u32, ns: u64) -> Result<(), RecordError> {
    let map = ebpf.map_mut(tracer_common::maps::WINDOW).ok_or(ProbeError::MissingMap(tracer_common::maps::WINDOW))?;
    let mut arr: Array<&mut MapData, u64> = Array::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))?;
    arr.set(slot, ns, 0).map_err(|e| ProbeError::map(tracer_common::maps::WINDOW, e))?;
    Ok(())
}

pub(crate) fn host_info() -> HostInfo {
    let read = |name: &str| procfs::sysctl(name).unwrap_or_default();
    HostInfo {
        hostname: read("kernel/hostname"),
        kernel_release: read("kernel/osrelease"),
        arch: std::env::consts::ARCH.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_missing_capability() {
        assert_eq!(missing_caps(0), ["CAP_BPF", "CAP_PERFMON"]);
        assert_eq!(missing_caps(CAP_BPF), ["CAP_PERFMON"]);
        assert_eq!(missing_caps(CAP_PERFMON), ["CAP_BPF"]);
        assert!(missing_caps(CAP_BPF | CAP_PERFMON).is_empty());
        assert!(missing_caps(CAP_SYS_ADMIN).is_empty());
    }
}
