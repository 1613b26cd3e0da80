//! CUDA runtime and driver tracing, collector side: [`collector`] (the
//! lifecycle: finding libraries, probing them, replaying events),
//! [`programs`] (the kernel programs and globals), [`report`] (the CUDA part
//! of a recording), [`discovery`] (which mapped files hold CUDA),
//! [`search`] (which files a target could load CUDA from), [`replay`]
//! (per-call events in order, drained by a thread of their own: [`drain`])
//! and [`findings`] (the detector's rules).

mod collector;
pub mod discovery;
mod drain;
mod driver_gate;
pub mod findings;
pub mod programs;
pub mod replay;
mod report;
pub mod search;
pub mod slicer;
mod timeline;

pub use collector::CudaCollector;
pub use findings::Thresholds;
pub use crate::recording::cuda::{api_name, kind_name, CudaCall, CudaLaunch, CudaLibrary, CudaReport, Finding, GpuSample, Site};
