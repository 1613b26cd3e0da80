//! infertrace: eBPF tracer that tells where the time of a Python / GPU
//! inference service goes. This library holds everything but the process
//! entry point, in seven layers (docs/architecture.md has the data flow):
//!
//! - [`families`]: one folder per probe family (process, syscalls, sched,
//!   cpu_samples, python, cuda, nvml, asyncio, timeline, exec_watch,
//!   overhead), named as in `tracer-ebpf` and `tracer-common`, and the list
//!   of them;
//! - [`engine`]: the collector lifecycle, the shared context, the session
//!   loop that `record`, `top` and `agent` run on;
//! - [`os`]: procfs, tracefs, BTF, ELF, the kernel object, uprobe links,
//!   clocks, native symbolization;
//! - [`recording`]: the recording model, a leaf;
//! - [`report`]: the formats, reading only the model;
//! - [`system`]: syscall and errno names;
//! - [`cli`]: the subcommands.

pub mod cli;
pub mod engine;
pub mod families;
pub mod os;
pub mod recording;
pub mod report;
pub mod system;
