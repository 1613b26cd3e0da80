//! Loading the kernel object and small typed accessors shared by the probe
//! families (`syscalls`, `process`).

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError},
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
    #[error("loading eBPF program `{name}` failed: {source}")]
    Load { name: &'static str, source: ProgramError },
    #[error("attaching eBPF program `{name}` failed: {source}")]
    Attach { name: &'static str, source: ProgramError },
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("eBPF map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
}

impl ProbeError {
    pub fn load(name: &'static str, source: ProgramError) -> Self {
        Self::Load { name, source }
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

/// Hash map `name`, borrowed from the object.
pub fn hash_map<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<BpfHashMap<&'a mut MapData, K, V>, ProbeError> {
    let map = ebpf.map_mut(name).ok_or(ProbeError::MissingMap(name))?;
    BpfHashMap::try_from(map).map_err(|e| ProbeError::map(name, e))
}
