//! The embedded kernel object and small typed accessors shared by the
//! probe families (programs, maps, the `COUNTERS` array).

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray},
    programs::{Program, ProgramError},
    Ebpf,
};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("eBPF program `{0}` missing from the object")]
    MissingProgram(&'static str),
    #[error("eBPF program `{0}` has an unexpected type")]
    WrongProgramType(&'static str),
    #[error("eBPF map `{0}` missing from the object")]
    MissingMap(&'static str),
    #[error("loading eBPF program `{name}` failed: {detail}")]
    Load { name: &'static str, detail: String },
    #[error("attaching eBPF program `{name}` failed: {source}")]
    Attach { name: &'static str, source: ProgramError },
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("eBPF map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
}

impl ProbeError {
    /// Keeps an error one line: a verifier rejection carries the whole
    /// verifier log, of which only the end says why.
    pub fn load(name: &'static str, source: ProgramError) -> Self {
        let full = source.to_string().replace('\n', " ");
        const KEEP: usize = 600;
        let detail = match full.find("Verifier output:") {
            Some(at) if full.len() - at > KEEP => {
                let tail_start = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() - KEEP).unwrap_or(at);
                format!("{} ... {}", &full[..at + "Verifier output:".len()], &full[tail_start..])
            }
            _ => full,
        };
        Self::Load { name, detail }
    }
    pub fn attach(name: &'static str, source: ProgramError) -> Self {
        Self::Attach { name, source }
    }
    pub fn map(name: &'static str, source: MapError) -> Self {
        Self::Map { name, source }
    }
}

/// The compiled kernel programs, embedded at build time.
pub fn object_bytes() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/infertrace"))
}

/// Program `name`, converted to its concrete type.
pub fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, ProbeError>
where
    &'a mut P: TryFrom<&'a mut Program>,
{
    let prog = ebpf.program_mut(name).ok_or(ProbeError::MissingProgram(name))?;
    prog.try_into().map_err(|_| ProbeError::WrongProgramType(name))
}

/// `COUNTERS[idx]` summed over CPUs.
pub fn counter(ebpf: &mut Ebpf, idx: u32) -> Result<u64, ProbeError> {
    let map = ebpf.map_mut(tracer_common::maps::COUNTERS).ok_or(ProbeError::MissingMap(tracer_common::maps::COUNTERS))?;
    let arr: PerCpuArray<&mut MapData, u64> = PerCpuArray::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::COUNTERS, e))?;
    let vals = arr.get(&idx, 0).map_err(|e| ProbeError::map(tracer_common::maps::COUNTERS, e))?;
    Ok(vals.iter().sum())
}

/// Hash map `name`, borrowed from the object.
pub fn hash_map<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<BpfHashMap<&'a mut MapData, K, V>, ProbeError> {
    let map = ebpf.map_mut(name).ok_or(ProbeError::MissingMap(name))?;
    BpfHashMap::try_from(map).map_err(|e| ProbeError::map(name, e))
}
