//! CUDA runtime and driver tracing, collector side: [`collector`] (the
//! lifecycle: finding libraries, probing them, replaying events),
//! [`programs`] (the kernel programs and globals), [`report`] (the CUDA part
//! of a recording), [`discovery`] (which mapped files hold CUDA),
//! [`search`] (which files a target could load CUDA from), [`replay`]
//! (per-call events in order, drained by a thread of their own: [`drain`]),
//! [`findings`] (the detector's rules), [`slicer`] (`--max-overhead`:
//! the launch probes in time slices), [`no_device`] (the note when a
//! process found no usable device) and [`kernel_names`] (driver kernel
//! handles named, C++ names demangled).

mod collector;
pub mod discovery;
mod drain;
mod driver_gate;
pub mod findings;
mod graph_state;
mod graphs;
mod kernel_names;
mod no_device;
pub mod programs;
pub mod replay;
mod assemble;
pub mod search;
pub mod slicer;
mod timeline;

/// Calls of a driver function made inside runtime calls (and none direct)
/// after which its probes come off in that process: below this, its traps
/// cost at most ~10 ms in all on a slow VM, not worth a blind spot.
pub const HOT_NESTED: u64 = 1000;
/// How long a function stays off before it is probed again for a re-check.
pub const RECHECK_EVERY_NS: u64 = 5_000_000_000;

pub use collector::{CudaCollector, CudaOptions};
pub use findings::Thresholds;
pub use crate::recording::cuda::{api_name, kind_name, CudaCall, CudaLaunch, CudaLibrary, CudaReport, Finding, GpuSample, Site};
