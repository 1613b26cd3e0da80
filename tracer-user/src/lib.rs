//! infertrace: eBPF tracer that tells where the time of a Python / GPU
//! inference service goes. This library holds everything but argument
//! parsing: probe families (`syscalls`, `process`), the recording format,
//! report renderers and the `doctor` checks.

pub mod btf_offsets;
pub mod clock;
pub mod cuda;
pub mod doctor;
pub mod ebpf_log;
pub mod nvml;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod python;
pub mod pystacks;
pub mod recording;
pub mod report;
pub mod sched;
pub mod session;
pub mod stacks;
pub mod symbolize;
pub mod system;
pub mod syscalls;
pub mod targets;
pub mod tracefs;
