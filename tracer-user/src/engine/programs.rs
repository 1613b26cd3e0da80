//! The program table: each probe family describes its kernel programs,
//! where they attach and the load-time globals they read, once, in a
//! [`FamilyTable`] next to its collector. The loader (`load_object`), the
//! collectors (`ProgramSpec::attach`), `infertrace doctor` and the tests
//! all read the same tables.

use std::path::Path;

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent},
        tp_btf::BtfTracePointLinkId,
        trace_point::TracePointLinkId,
        BtfTracePoint, PerfEvent, TracePoint, UProbe,
    },
    Btf, Ebpf, EbpfLoader,
};

use super::{Kernel, RecordOptions};
use crate::{
    os::btf_offsets::{KernelBtf, LazyBtf},
    os::probe::{self, ProbeError},
    system::ArchConstants,
};

/// How a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// A BTF-enabled tracepoint (`tp_btf`).
    BtfTracePoint { tracepoint: &'static str },
    /// A classic tracepoint (its id is read from tracefs).
    TracePoint { category: &'static str, name: &'static str },
    /// The software CPU clock, one perf event per online CPU, at `-F` Hz.
    CpuClock,
    /// A uprobe or uretprobe, attached by the collector to each library it
    /// finds (the attach point is a file offset known only then).
    UProbe,
}

#[derive(Clone, Copy, Debug)]
pub struct ProgramSpec {
    /// The program's name in the object.
    pub name: &'static str,
    pub kind: ProgramKind,
}

/// A value for a global of the object, fixed at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalValue {
    U32(u32),
    U64(u64),
}

/// What a global's value is computed from.
pub struct LoadInputs<'a> {
    pub opts: &'a RecordOptions,
    pub arch: ArchConstants,
    pub btf: &'a KernelBtf,
    pub tracefs: Option<&'a Path>,
}

impl LoadInputs<'_> {
    /// Offset of `member` in `struct task_struct`.
    pub fn task_member(&self, member: &str) -> Result<u64, String> {
        self.btf.offsets.member_offset("task_struct", member).map(u64::from).map_err(|e| e.to_string())
    }

    /// Offset of a field of a classic tracepoint's record, `default` when
    /// tracefs is unavailable.
    pub fn tracepoint_field(&self, category: &str, name: &str, field: &str, default: u32) -> u32 {
        self.tracefs.and_then(|t| crate::os::tracefs::field_offset(t, category, name, field).ok()).unwrap_or(default)
    }
}

pub struct GlobalSpec {
    /// The `#[no_mangle] static` in tracer-ebpf.
    pub name: &'static str,
    pub value: fn(&LoadInputs<'_>) -> Result<GlobalValue, String>,
}

/// Everything one probe family has in the kernel object.
pub struct FamilyTable {
    pub family: &'static str,
    pub programs: &'static [ProgramSpec],
    pub globals: &'static [GlobalSpec],
}

impl FamilyTable {
    pub fn program(&self, name: &str) -> Option<&'static ProgramSpec> {
        self.programs.iter().find(|p| p.name == name)
    }
}

/// What every family shares in the object (`tracer-ebpf/src/main.rs`):
/// the target set, the window, the drop counters, the native stacks; and
/// the switch for the kernel-side diagnostics (`record --debug-ebpf`).
pub static CORE: FamilyTable = FamilyTable {
    family: "core",
    programs: &[],
    globals: &[GlobalSpec {
        name: crate::engine::ebpf_log::DEBUG_GLOBAL,
        value: |i| Ok(GlobalValue::U32(u32::from(i.opts.debug_ebpf))),
    }],
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("global {name}: {detail}")]
    Global { name: &'static str, detail: String },
    #[error("{0}")]
    Object(String),
    #[error("{name}={value}: {detail}")]
    Env { name: &'static str, value: String, detail: &'static str },
    #[error(transparent)]
    TooLittleMemory(#[from] super::memory::TooLittleMemory),
    /// The kernel refused memory for a map (ENOMEM: the cgroup's limit).
    #[error("creating the kernel maps ran out of memory ({detail}); the maps take {maps_mib} MiB here")]
    OutOfMemory { detail: String, maps_mib: u64 },
}

/// Test-only, undocumented for users: the size in bytes of the CUDA
/// per-call event ring (`CUDA_EVENTS`, 2 MiB by default; a power of two, at
/// least one page). The tests set it tiny to force and check the reporting
/// of lost events.
pub const CUDA_RING_ENV: &str = "INFERTRACE_TEST_CUDA_RING_BYTES";

/// The ring size asked for in [`CUDA_RING_ENV`], if any.
fn cuda_ring_bytes() -> Result<Option<u32>, LoadError> {
    let Some(v) = std::env::var_os(CUDA_RING_ENV) else { return Ok(None) };
    let value = v.to_string_lossy().into_owned();
    let err = |detail| LoadError::Env { name: CUDA_RING_ENV, value: value.clone(), detail };
    let n: u32 = value.trim().parse().map_err(|_| err("not a number of bytes"))?;
    if !n.is_power_of_two() || n < 4096 {
        return Err(err("must be a power of two, at least 4096"));
    }
    Ok(Some(n))
}

/// Loads the object with every family's globals set.
pub fn load_object(tables: &[&FamilyTable], inputs: &LoadInputs<'_>) -> Result<Ebpf, LoadError> {
    let mut values = Vec::new();
    for spec in tables.iter().flat_map(|t| t.globals) {
        let v = (spec.value)(inputs).map_err(|detail| LoadError::Global { name: spec.name, detail })?;
        values.push((spec.name, v));
    }
    let mut loader = EbpfLoader::new();
    loader.btf(Some(&inputs.btf.btf));
    if let Some(n) = cuda_ring_bytes()? {
        loader.map_max_entries(tracer_common::maps::CUDA_EVENTS, n);
    }
    let divisor = super::memory::divisor(super::memory::own_limit())?;
    if divisor > 1 {
        for (name, entries) in super::memory::SCALED {
            loader.map_max_entries(name, (entries / divisor).max(1024));
        }
    }
    if inputs.opts.timeline_limit.is_none() {
        // `record --timeline` off: the ring stays empty; one page, not 8 MiB.
        loader.map_max_entries(tracer_common::maps::TIMELINE_EVENTS, 4096);
    }
    for (name, v) in &values {
        match v {
            GlobalValue::U32(x) => loader.override_global(name, x, true),
            GlobalValue::U64(x) => loader.override_global(name, x, true),
        };
    }
    loader.load(probe::object_bytes()).map_err(|e| {
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            detail = format!("{detail}: {s}");
            source = s.source();
        }
        if detail.contains("Cannot allocate memory") || detail.contains("os error 12") || detail.contains("code -12") {
            LoadError::OutOfMemory { detail, maps_mib: super::memory::maps_mib(divisor) }
        } else {
            LoadError::Object(detail)
        }
    })
}

/// An attachment, to detach at the window end.
pub enum Link {
    Btf(BtfTracePointLinkId),
    TracePoint(TracePointLinkId),
    Perf(Vec<PerfEventLinkId>),
}

impl ProgramSpec {
    /// Loads the program into the kernel (the verifier runs here).
    pub fn load(&self, ebpf: &mut Ebpf, btf: &Btf) -> Result<(), ProbeError> {
        self.load_lazy(ebpf, || btf)
    }

    /// [`load`](Self::load), with aya's BTF parse made (by `btf`) only for
    /// a `tp_btf` program.
    fn load_lazy<'b>(&self, ebpf: &mut Ebpf, btf: impl FnOnce() -> &'b Btf) -> Result<(), ProbeError> {
        let name = self.name;
        let r = match self.kind {
            ProgramKind::BtfTracePoint { tracepoint } => probe::program::<BtfTracePoint>(ebpf, name)?.load(tracepoint, btf()),
            ProgramKind::TracePoint { .. } => probe::program::<TracePoint>(ebpf, name)?.load(),
            ProgramKind::CpuClock => probe::program::<PerfEvent>(ebpf, name)?.load(),
            ProgramKind::UProbe => probe::program::<UProbe>(ebpf, name)?.load(),
        };
        r.map_err(|e| ProbeError::load(name, e))
    }

    /// Loads and attaches the program (not for uprobes, attached per file,
    /// nor for CPU-clock programs: [`attach_sampling`](Self::attach_sampling)).
    pub fn attach(&self, kernel: &mut Kernel) -> Result<Link, ProbeError> {
        self.attach_at(kernel, None)
    }

    /// Loads and attaches a program, a CPU-clock one sampling every CPU
    /// `hz` times a second.
    pub fn attach_sampling(&self, kernel: &mut Kernel, hz: u64) -> Result<Link, ProbeError> {
        self.attach_at(kernel, Some(hz))
    }

    fn attach_at(&self, kernel: &mut Kernel, hz: Option<u64>) -> Result<Link, ProbeError> {
        let lazy: &LazyBtf = &kernel.btf.btf;
        self.load_lazy(&mut kernel.ebpf, || lazy)?;
        let name = self.name;
        let err = |e| ProbeError::attach(name, e);
        Ok(match self.kind {
            ProgramKind::BtfTracePoint { .. } => Link::Btf(probe::program::<BtfTracePoint>(&mut kernel.ebpf, name)?.attach().map_err(err)?),
            ProgramKind::TracePoint { category, name: tp } => {
                Link::TracePoint(probe::program::<TracePoint>(&mut kernel.ebpf, name)?.attach(category, tp).map_err(err)?)
            }
            ProgramKind::CpuClock => {
                let hz = hz.ok_or(ProbeError::WrongProgramType(name))?;
                let prog = probe::program::<PerfEvent>(&mut kernel.ebpf, name)?;
                let cpus = aya::util::online_cpus().map_err(|(_, e)| ProbeError::Io("reading online CPUs", e))?;
                let mut links = Vec::new();
                for cpu in cpus {
                    let scope = PerfEventScope::AllProcessesOneCpu { cpu };
                    let config = PerfEventConfig::Software(SoftwareEvent::CpuClock);
                    links.push(prog.attach(config, scope, SamplePolicy::Frequency(hz), false).map_err(err)?);
                }
                Link::Perf(links)
            }
            ProgramKind::UProbe => return Err(ProbeError::WrongProgramType(name)),
        })
    }
}

/// Attached programs of one family, detached together.
#[derive(Default)]
pub struct Links(Vec<(&'static ProgramSpec, Link)>);

impl Links {
    pub fn attach(&mut self, kernel: &mut Kernel, spec: &'static ProgramSpec) -> Result<(), ProbeError> {
        let link = spec.attach(kernel)?;
        self.0.push((spec, link));
        Ok(())
    }

    /// [`attach`](Self::attach), a CPU-clock program sampling at `hz`.
    pub fn attach_sampling(&mut self, kernel: &mut Kernel, spec: &'static ProgramSpec, hz: u64) -> Result<(), ProbeError> {
        let link = spec.attach_sampling(kernel, hz)?;
        self.0.push((spec, link));
        Ok(())
    }

    /// Detaches everything (errors ignored: the object's drop detaches too).
    pub fn detach(&mut self, ebpf: &mut Ebpf) {
        for (spec, link) in self.0.drain(..) {
            let name = spec.name;
            match link {
                Link::Btf(l) => {
                    if let Ok(p) = probe::program::<BtfTracePoint>(ebpf, name) {
                        let _ = p.detach(l);
                    }
                }
                Link::TracePoint(l) => {
                    if let Ok(p) = probe::program::<TracePoint>(ebpf, name) {
                        let _ = p.detach(l);
                    }
                }
                Link::Perf(ls) => {
                    if let Ok(p) = probe::program::<PerfEvent>(ebpf, name) {
                        for l in ls {
                            let _ = p.detach(l);
                        }
                    }
                }
            }
        }
    }
}
