//! infertrace: eBPF tracer that tells where the time of a Python / GPU
//! inference service goes. This library holds everything but argument
//! parsing: the collector lifecycle (`collect`), the probe families
//! (`process`, `syscalls`, `sched`, `cpu_samples`, `pystacks`, `cuda`,
//! `nvml`; listed in `families`), the recording session (`session`), the
//! recording model (`recording`), the report renderers (`report`), the
//! `doctor` checks and the live view (`top`). docs/architecture.md has the data flow.

pub mod agent;
pub mod agent_exec;
pub mod btf_offsets;
pub mod checkpoint;
pub mod clock;
pub mod collect;
pub mod cpu_samples;
pub mod cuda;
pub mod doctor;
pub mod ebpf_log;
pub mod elf;
pub mod families;
pub mod nvml;
pub mod overhead;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod python;
pub mod pystacks;
pub mod recording;
#[cfg(test)]
mod recording_fuzz;
pub mod report;
pub mod sched;
pub mod session;
pub mod stacks;
pub mod symbolize;
pub mod system;
pub mod syscalls;
pub mod targets;
pub mod timeline;
pub mod top;
pub mod tracefs;
pub mod uprobe_multi;
