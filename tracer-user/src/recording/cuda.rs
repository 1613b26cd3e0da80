//! The CUDA part of a recording: calls, launches, GPU samples, findings and
//! the libraries probed (serde types; filled by `crate::families::cuda`, rendered by
//! `crate::report`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracer_common::cuda::{api, KIND_NONE};

use super::{Frame, UNKNOWN};

/// Where a call came from: the leaf Python frame, or the first native
/// frame outside libcudart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Site {
    pub fn unknown() -> Self {
        Site { function: UNKNOWN.to_owned(), file: None, line: None }
    }

    pub fn of_frame(f: &Frame) -> Self {
        Site { function: f.function.clone(), file: f.file.clone(), line: f.line }
    }

    /// `function (file:line)`, or what of it is known.
    pub fn display(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{} ({}:{})", self.function, f, l),
            (Some(f), None) => format!("{} ({})", self.function, f),
            _ => self.function.clone(),
        }
    }
}

/// Names of the `cudaError_t` values a tracer is likely to see.
pub fn error_name(rc: i32) -> &'static str {
    match rc {
        0 => "cudaSuccess",
        1 => "cudaErrorInvalidValue",
        2 => "cudaErrorMemoryAllocation",
        3 => "cudaErrorInitializationError",
        4 => "cudaErrorCudartUnloading",
        35 => "cudaErrorInsufficientDriver",
        46 => "cudaErrorDevicesUnavailable",
        100 => "cudaErrorNoDevice",
        101 => "cudaErrorInvalidDevice",
        400 => "cudaErrorInvalidResourceHandle",
        600 => "cudaErrorNotReady",
        700 => "cudaErrorIllegalAddress",
        712 => "cudaErrorHostMemoryAlreadyRegistered",
        713 => "cudaErrorHostMemoryNotRegistered",
        719 => "cudaErrorLaunchFailure",
        999 => "cudaErrorUnknown",
        _ => "",
    }
}

/// What a CUDA call does, by its API function.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CallClass {
    /// `cudaMemcpy*`, `cuMemcpy*`.
    Copy,
    /// Stream, device (context) or event synchronize.
    Sync,
    /// A kernel launch.
    Launch,
    /// Device or host memory: allocate, free, register, unregister.
    Memory,
    /// An NCCL collective or point-to-point call (schema 1.x addition).
    Collective,
    Other,
}

impl CallClass {
    /// The class of API id `api` (`tracer_common::cuda::api`): what the
    /// collector stores on each call.
    pub fn of_api(id: u32) -> CallClass {
        if api::is_copy(id) {
            CallClass::Copy
        } else if api::is_sync(id) {
            CallClass::Sync
        } else if api::entry_only(id) {
            CallClass::Launch
        } else if api::is_collective(id) {
            CallClass::Collective
        } else if api::is_vmm(id)
            || api::is_torch_allocator(id)
            || matches!(
                api::canonical(id),
                api::MALLOC | api::FREE | api::HOST_ALLOC | api::MALLOC_HOST | api::HOST_REGISTER | api::FREE_HOST | api::HOST_UNREGISTER
            )
        {
            CallClass::Memory
        } else {
            CallClass::Other
        }
    }

    /// The class of a probed function by its name (`api` of a call or a
    /// timeline event, as [`api_name`] wrote it): `Other` for a name that is
    /// not one of them.
    pub fn of_name(name: &str) -> CallClass {
        api::NAMES.iter().position(|n| *n == name).map_or(CallClass::Other, |id| CallClass::of_api(id as u32))
    }

    /// The class of a native stack frame's function: a probed function's
    /// ([`of_name`](Self::of_name)); another CUDA copy (`cudaMemcpy*`,
    /// `cuMemcpy*`) or synchronize (`cu*Synchronize*`) by its name. A
    /// thread inside a query (`cudaEventQuery`, `cudaStreamQuery`) is
    /// polling the GPU: a sync, for what the thread's time is; one inside
    /// `ncclGroupStart`/`ncclGroupEnd` (which launches the group's
    /// collectives, and may block) is in a collective.
    pub fn of_symbol(name: &str) -> CallClass {
        match api::NAMES.iter().position(|n| *n == name).map(|id| id as u32) {
            Some(id) if api::is_query(id) => return CallClass::Sync,
            Some(id) if api::is_nccl(id) => return CallClass::Collective,
            _ => {}
        }
        match CallClass::of_name(name) {
            CallClass::Other if name.starts_with("cu") && name.contains("Synchronize") => CallClass::Sync,
            CallClass::Other if name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy") => CallClass::Copy,
            class => class,
        }
    }
}

/// One CUDA runtime API called from one site with one copy kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CudaCall {
    pub pid: u32,
    pub api: String,
    /// `HtoD`, `DtoH`, `DtoD`, `HtoH`, `Default` (as passed) for copies, else null.
    pub kind: Option<String>,
    /// What the call does, from its API id (format 2; absent from format 1
    /// recordings: [`CudaCall::class`] derives it from `api` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<CallClass>,
    pub count: u64,
    /// Copied (copies) or allocated/registered (memory calls) bytes.
    pub bytes: u64,
    pub total_ns: u64,
    /// Calls that did not return `cudaSuccess`.
    pub errors: u64,
    pub site: Site,
    /// Return code -> calls (from the per-call events; may miss some when
    /// events were lost).
    #[serde(default)]
    pub return_codes: BTreeMap<i32, u64>,
    /// Copies whose host side was in pinned memory / in pageable memory
    /// (from the per-call events; H2D, D2H, H2H only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pageable: Option<u64>,
    /// Calls of this row (counted above) whose per-call event was lost
    /// (ring buffer full, `cuda_events_lost`): `return_codes`, `pinned` and
    /// `pageable` miss them, and the detector did not see them.
    #[serde(default)]
    pub events_lost: u64,
    /// Queries (`cudaEventQuery`, `cudaStreamQuery` and the driver's;
    /// schema 1.x addition, absent for other calls): the calls that found
    /// the work still running (`cudaErrorNotReady`, 600; not counted in
    /// `errors`): polls. `poll_waits`: the waits polling ended (a query
    /// that found the work done after not-ready answers on its thread),
    /// and `poll_ns` their wall time, from the first not-ready query to
    /// the one that found the work done: how long threads spun. Queries
    /// send a per-call event only when they fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_waits: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_ns: Option<u64>,
    /// Waits on NCCL collectives (schema 1.x addition; syncs, queries and
    /// collectives only): for a sync, or a query that ended a polling
    /// wait, the waits whose stream, event or device had a collective
    /// queued since it was last waited on (directly, or through an event
    /// record and `cudaStreamWaitEvent`), and their time: the host
    /// waiting for the collective (and the GPU work queued before it). For
    /// a collective, the host waits that covered it, on any thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_waits: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_wait_ns: Option<u64>,
}

impl CudaCall {
    /// What the call does: as recorded, else (format 1) by its API name.
    pub fn class(&self) -> CallClass {
        self.class.unwrap_or_else(|| CallClass::of_name(&self.api))
    }

    /// An event record, a stream's wait on an event, or a query (by its
    /// API name).
    pub fn is_event_or_query(&self) -> bool {
        api::NAMES
            .iter()
            .position(|n| *n == self.api)
            .is_some_and(|id| api::is_event_record(id as u32) || api::is_stream_wait_event(id as u32) || api::is_query(id as u32))
    }
}

/// Launches of one kernel from one site.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CudaLaunch {
    pub pid: u32,
    /// The kernel's host stub, symbolized and demangled; else its address in hex.
    pub kernel: String,
    /// Launches; an estimate when `estimated` (`--max-overhead`).
    pub count: u64,
    pub site: Site,
    /// `cudaLaunchKernel` or `cudaLaunchKernel_ptsz`.
    pub api: String,
    /// `--max-overhead` sampled the launches and part of the window went
    /// unprobed: `count` is estimated from `sampled`, the launches seen in
    /// the slices (schema 1.x addition; `cuda.launch_sampling`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<u64>,
}

/// NCCL calls of one API on one communicator from one site (from the
/// per-call events; schema 1.x addition).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CudaCollective {
    pub pid: u32,
    /// `ncclAllReduce`, `ncclAllGather`, ..., `ncclSend`, `ncclRecv`.
    pub api: String,
    /// The communicator (`ncclComm_t`), `0x...`.
    pub comm: String,
    pub count: u64,
    /// count x the datatype's size, summed.
    pub bytes: u64,
    /// Host time in the calls (they enqueue work on a stream).
    pub total_ns: u64,
    pub errors: u64,
    pub site: Site,
    /// Host waits that covered these calls (a sync of their stream, of an
    /// event recorded behind them, of the device) and their time (schema
    /// 1.x addition; absent when the site's calls are split over more
    /// than one communicator: the calls table has them per site).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_waits: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_wait_ns: Option<u64>,
}

/// Launches of one CUDA graph from one site (`cudaGraphLaunch`,
/// `cuGraphLaunch` and their `_ptsz` forms): entry only, like kernel
/// launches (schema 1.x addition).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GraphLaunch {
    pub pid: u32,
    /// `graph captured at FUNCTION (FILE:LINE)`, the line whose
    /// `cudaStreamBeginCapture` made the graph instantiated into the
    /// executable graph launched; else `cudaGraphExec 0x...` (its capture
    /// was not seen).
    pub graph: String,
    pub count: u64,
    pub site: Site,
    pub api: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_at: Option<Site>,
}

/// The stream captures made from one site (its `cudaStreamBeginCapture`
/// line) that ended with a graph: the launches and copies recorded into
/// the graphs, which are not counted as launches or copies (schema 1.x
/// addition).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GraphCapture {
    pub pid: u32,
    pub site: Site,
    pub captures: u64,
    /// Kernel launches captured, in all.
    pub kernels: u64,
    /// Copies captured, and their bytes.
    pub copies: u64,
    pub copy_bytes: u64,
    /// Host time from the captures' begin to their end.
    pub capture_ns: u64,
}

/// `--max-overhead`: how the launches were sampled (docs/overhead.md, "An
/// overhead budget").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LaunchSampling {
    /// The budget, percent of a target thread's time.
    pub budget_percent: f64,
    /// Time the launch probes were on and launches counted.
    pub probed_ns: u64,
    /// From the first launch seen to the window's end: what the estimates
    /// stand for.
    pub span_ns: u64,
    pub slices: u64,
    /// The last share of the time the probes were on (1: on all the time).
    pub duty: f64,
    /// The largest share of a target thread's time the launch probes
    /// took while they were on (what the duty is sized from).
    pub probe_share: f64,
    /// The probes' cost per launch counted, measured in the slices: our
    /// launch programs' hits there (a runtime launch whose driver launch
    /// is probed too is two), each at the calibrated trap cost of its
    /// function's first instruction (emulated or single-stepped), plus
    /// their measured run time.
    pub per_launch_ns: f64,
    /// The mean trap cost of those hits.
    pub trap_ns: f64,
    /// Launches seen in the slices.
    pub sampled_launches: u64,
    /// Launch probe hits outside the slices, while their probes were
    /// being attached or released: paid by the targets, not counted (the
    /// time off is lengthened to keep their cost within the budget).
    #[serde(default)]
    pub stray_hits: u64,
    /// Whether the launch counts are estimates (some of the span unprobed).
    pub estimated: bool,
    /// Slices whose probes could not be attached (first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// One NVML reading of one GPU (`crate::families::nvml`): whole-device figures, all
/// processes on the GPU, not only the targets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// When it was taken, ns since the window start (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// NVML device index (nvmlDeviceGetHandleByIndex; not CUDA_VISIBLE_DEVICES order).
    pub gpu: u32,
    /// Share of the last NVML sample period in which a kernel ran (nvmlDeviceGetUtilizationRates.gpu).
    pub util_percent: f64,
    /// Device memory in use (nvmlDeviceGetMemoryInfo).
    pub mem_used_bytes: u64,
    /// Share of the period in which device memory was read or written (.memory).
    #[serde(default)]
    pub mem_util_percent: f64,
    #[serde(default)]
    pub mem_total_bytes: u64,
    /// PCIe throughput, device -> host / host -> device (nvmlDeviceGetPcieThroughput,
    /// KB/s x 1024); null when the GPU or the library does not report it.
    #[serde(default)]
    pub pcie_tx_bytes_per_s: Option<u64>,
    #[serde(default)]
    pub pcie_rx_bytes_per_s: Option<u64>,
    /// Name and UUID of the GPU, on its first sample only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// Something the detector flagged: its kind, numbers and site. The
/// sentence that describes it and the advice are the report's to write
/// (`crate::report::findings`), from these numbers; recordings of format 1
/// carry them as written at record time, and those are shown as they are.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Finding {
    /// `small_htod_copies`, `sync_after_copy`, `pageable_copy`,
    /// `tiny_dtoh_sync`, `repeated_upload`, `copy_time_share`,
    /// `device_memory_leak`, `graph_recaptured`, `sync_polling`,
    /// `launch_bound`, `gpu_memory_near_capacity`, `gpu_memory_growth`.
    pub kind: String,
    /// `high`, `medium` or `low`.
    pub severity: String,
    pub pid: u32,
    pub site: Site,
    /// Occurrences of the pattern (copies, copy+sync pairs, allocations).
    pub count: u64,
    pub bytes: u64,
    /// Time the pattern cost (copies and the syncs that waited for them).
    pub time_ns: u64,
    /// Format 1: the sentence, as written at record time. Absent from
    /// format 2 on (the report writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Format 1: the advice, as written at record time. Absent from
    /// format 2 on (the report writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    /// Calls whose per-call event was lost (ring buffer full) where the
    /// finding looked: at its site, or in its whole process for
    /// `copy_time_share` (which sums the process's sites). Counts, bytes,
    /// times and copy->sync pairs come from the kernel's aggregates and
    /// stay exact; what only the events tell (pinned or pageable host
    /// memory, sizes, contents, allocations and frees) misses these calls,
    /// so a finding that rests on it may be understated. 0: nothing lost there.
    #[serde(default)]
    pub events_lost: u64,
    // The numbers the sentence is written from, beyond count, bytes and
    // time_ns (format 2; absent from format 1 and where they do not apply).
    /// The direction of the copies (`HtoD`, `DtoH`): every kind but
    /// `device_memory_leak` and `copy_time_share`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_kind: Option<String>,
    /// The site's copies in that direction, and how many of them failed
    /// (did not return `cudaSuccess`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
    /// `tiny_dtoh_sync`: the largest of the copies (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// `device_memory_leak`: the allocations the site made (`count` of
    /// them were never freed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocs: Option<u64>,
    /// `copy_time_share`: the window `time_ns` is a share of, and the part
    /// of `time_ns` spent at the finding's site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_time_ns: Option<u64>,
    /// `sync_polling`: the waits the not-ready queries (`count`) were
    /// spent in; `time_ns` is their wall time (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<u64>,
    /// `launch_bound`: the distinct kernels the launches (`count`) were
    /// of, and launches per second of the window; `time_ns` is their
    /// estimated host time (schema 1.x addition). `gpu_memory_growth`:
    /// `per_s` is the growth in bytes per second, `bytes` the growth,
    /// `time_ns` how long it grew, `count` the line's allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_s: Option<f64>,
    /// `gpu_memory_near_capacity`: the GPU (NVML index) and its memory;
    /// `bytes` is the most in use, `count` the samples at or above the
    /// threshold (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
}

impl Finding {
    /// Whether [`events_lost`](Self::events_lost) counts the whole
    /// process's lost events (else the site's).
    pub fn events_lost_process_wide(&self) -> bool {
        self.kind == "copy_time_share"
    }
}

/// A libcudart (or an executable with cudart inside) that was probed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CudaLibrary {
    /// The path as the first process seen mapping it named it.
    pub path: String,
    /// Functions probed in it.
    pub functions: Vec<String>,
    /// Targets seen mapping it.
    pub pids: Vec<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct CudaReport {
    pub calls: Vec<CudaCall>,
    pub launches: Vec<CudaLaunch>,
    pub gpu_samples: Vec<GpuSample>,
    pub findings: Vec<Finding>,
    #[serde(default)]
    pub libraries: Vec<CudaLibrary>,
    /// Length of the tracing window (for shares of wall time).
    #[serde(default)]
    pub window_ns: u64,
    /// One-line notices (libraries probed later, probes that failed, NVML...).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per-call events lost in all (ring buffer full, `cuda_events_lost`):
    /// `calls` and `launches` are still exact, the findings and the
    /// per-call columns are not (a site whose events were all lost may lack
    /// a finding).
    #[serde(default)]
    pub events_lost: u64,
    /// Calls or launches missing from `calls` and `launches` (an aggregate
    /// map full, or a call whose return was never seen: `cuda_lost`).
    #[serde(default)]
    pub calls_lost: u64,
    /// Driver functions (libcuda) no longer probed in a process because it
    /// reached them only through its runtime (schema 1.x addition;
    /// docs/cuda.md, "One probe hit per runtime call"). Direct calls of
    /// such a function while it was off (`off_s` in all) are not counted.
    #[serde(default)]
    pub driver_probes_off: Vec<DriverProbesOff>,
    /// `--max-overhead`: launches probed in time slices, their counts
    /// estimated (schema 1.x addition). None: every launch was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_sampling: Option<LaunchSampling>,
    /// Graph launches by graph and site (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graph_launches: Vec<GraphLaunch>,
    /// Stream captures by site (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graph_captures: Vec<GraphCapture>,
    /// NCCL calls by API, communicator and site (schema 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<CudaCollective>,
    /// Device memory held by the allocation calls, per process and line
    /// (schema 1.x addition; docs/memory.md#gpu-memory-by-line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_memory: Vec<DeviceMemory>,
}

/// Device memory a process's allocation calls held (`cudaMalloc*`,
/// pool allocations, `cuMemAlloc*`, `cuMemCreate`; less their frees and
/// releases, in call order): at the end of the window and at most.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DeviceMemory {
    pub pid: u32,
    /// What allocation calls (`cudaMalloc`, pools, `cuMemCreate`) hold from
    /// the device: for PyTorch, what its caching allocator reserved.
    pub held_bytes: u64,
    pub peak_held_bytes: u64,
    /// By the line that allocated, most held first.
    pub lines: Vec<DeviceMemoryLine>,
    /// PyTorch (its allocator's USDT probes attached): bytes in tensors
    /// at the end of the window and at most (schema 1.x addition). Reserved
    /// less allocated is what the caching allocator holds without tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    /// Tensors by the line that asked for them, most held first (schema
    /// 1.x addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_lines: Vec<DeviceMemoryLine>,
    /// `held_bytes` and `allocated_bytes` over the window as they changed:
    /// `[ns from the window's start, bytes]`, the last value of each
    /// 100 ms (coarser past 4096 points); schema 1.x addition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_series: Vec<[u64; 2]>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated_series: Vec<[u64; 2]>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DeviceMemoryLine {
    pub site: Site,
    /// Successful or not; `frees`: of those, freed (or released) in the window.
    pub allocs: u64,
    pub frees: u64,
    /// Still allocated at the end of the window.
    pub held_bytes: u64,
    /// The most it held at once (its allocations less its frees, in call
    /// order; a line reached by several native paths: at most their sum).
    pub peak_held_bytes: u64,
}

/// One driver function a process reached only through its runtime, whose
/// probes were taken off in that process (entry and return), with the
/// periodic re-checks that look for direct calls.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DriverProbesOff {
    pub pid: u32,
    pub function: String,
    /// The driver library (as the collector opened it).
    pub library: String,
    /// Seconds into the window when it first went off.
    pub off_at_s: f64,
    /// Its calls made inside runtime calls until then (none direct).
    pub calls_through_runtime: u64,
    /// Re-checks (probed again for a short slice) that saw no direct call.
    pub rechecks: u64,
    /// When a re-check saw direct calls: probed from then on. Direct calls
    /// between its going off and this were missed.
    #[serde(default)]
    pub direct_seen_at_s: Option<f64>,
    /// Seconds it was off in all: direct calls in that time are not counted.
    pub off_s: f64,
}

pub fn kind_name(kind: u32) -> Option<&'static str> {
    match kind {
        0 => Some("HtoH"),
        1 => Some("HtoD"),
        2 => Some("DtoH"),
        3 => Some("DtoD"),
        4 => Some("Default"),
        KIND_NONE => None,
        _ => Some("Invalid"),
    }
}

/// The name of NCCL's `ncclResult_t` value `rc`.
pub fn nccl_error_name(rc: i32) -> &'static str {
    match rc {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "",
    }
}

pub fn api_name(api: u32) -> String {
    api::NAMES.get(api as usize).map(|s| (*s).to_owned()).unwrap_or_else(|| format!("api{api}"))
}

/// A GPU is near capacity at this share of its memory in use.
pub const NEAR_CAPACITY: f64 = 0.90;

/// `gpu_memory_near_capacity`: per GPU whose NVML samples showed at least
/// [`NEAR_CAPACITY`] of its memory in use: how many samples, the most in
/// use; named at the line of the traced process that held the most device
/// memory at the end (none when no allocation call was seen).
pub fn gpu_memory_near_capacity(samples: &[GpuSample], device_memory: &[DeviceMemory]) -> Vec<Finding> {
    let mut per_gpu: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.mem_total_bytes > 0) {
        if s.mem_used_bytes as f64 >= NEAR_CAPACITY * s.mem_total_bytes as f64 {
            let e = per_gpu.entry(s.gpu).or_default();
            e.0 += 1;
            e.1 = e.1.max(s.mem_used_bytes);
            e.2 = s.mem_total_bytes;
        }
    }
    let holder = device_memory.iter().filter(|d| d.held_bytes > 0).max_by_key(|d| d.held_bytes);
    per_gpu
        .into_iter()
        .map(|(gpu, (count, used, total))| Finding {
            kind: "gpu_memory_near_capacity".into(),
            severity: (if used as f64 >= 0.97 * total as f64 { "high" } else { "medium" }).into(),
            pid: holder.map_or(0, |d| d.pid),
            site: holder.and_then(|d| d.lines.first()).map(|l| l.site.clone()).unwrap_or_default(),
            count,
            bytes: used,
            gpu: Some(gpu),
            capacity_bytes: Some(total),
            ..Default::default()
        })
        .collect()
}

/// `gpu_memory_growth`: the device memory of process `d` grew steadily (in
/// tensors where PyTorch's allocator reported, else held by allocation
/// calls), by the rule of host memory growth
/// ([`crate::recording::memory::steady_growth`]); named at the line holding
/// the most at the end. `bytes`: grown; `per_s`: the slope; `time_ns`: the
/// growth phase's span.
pub fn gpu_memory_growth(d: &DeviceMemory) -> Option<Finding> {
    use crate::recording::memory::{steady_growth, MemPoint};
    let series = if d.allocated_bytes.is_some() { &d.allocated_series } else { &d.held_series };
    let t0 = series.first()?[0];
    let points: Vec<MemPoint> = series.iter().map(|&[t, v]| MemPoint { t_ns: t.saturating_sub(t0), rss: v, ..Default::default() }).collect();
    let (slope, _fit, grown) = steady_growth(&points)?;
    let top = points.iter().enumerate().max_by_key(|(i, p)| (p.rss, *i)).map_or(0, |(_, p)| p.t_ns);
    let lines = if d.allocated_bytes.is_some() { &d.tensor_lines } else { &d.lines };
    Some(Finding {
        kind: "gpu_memory_growth".into(),
        severity: "medium".into(),
        pid: d.pid,
        site: lines.first().map(|l| l.site.clone()).unwrap_or_default(),
        count: lines.first().map_or(0, |l| l.allocs),
        bytes: grown,
        time_ns: top,
        per_s: Some(slope),
        ..Default::default()
    })
}

/// Findings, most severe first, then the costliest.
pub fn rank_findings(findings: &mut [Finding]) {
    let rank = |s: &str| match s {
        "high" => 0,
        "medium" => 1,
        _ => 2,
    };
    findings.sort_by(|a, b| {
        rank(&a.severity)
            .cmp(&rank(&b.severity))
            .then(b.time_ns.cmp(&a.time_ns))
            .then(b.count.cmp(&a.count))
            .then(a.kind.cmp(&b.kind))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_device_memory_growth_is_a_finding_at_the_line_holding_most() {
        let line = |l: u32, held: u64| DeviceMemoryLine { site: Site { line: Some(l), ..Default::default() }, allocs: 60, held_bytes: held, ..Default::default() };
        // 4 MiB every 100 ms for 6 s, then the exit frees everything.
        let mut series: Vec<[u64; 2]> = (0..=60).map(|i| [1_000_000_000 + i * 100_000_000, i * (4 << 20)]).collect();
        series.push([7_200_000_000, 0]);
        let d = DeviceMemory {
            pid: 3,
            allocated_bytes: Some(240 << 20),
            tensor_lines: vec![line(12, 240 << 20), line(20, 0)],
            lines: vec![line(99, 512 << 20)],
            allocated_series: series.clone(),
            held_series: series.clone(),
            ..Default::default()
        };
        let f = gpu_memory_growth(&d).expect("steady growth");
        assert_eq!((f.kind.as_str(), f.pid, f.site.line, f.bytes, f.time_ns), ("gpu_memory_growth", 3, Some(12), 240 << 20, 6_000_000_000));
        assert!((f.per_s.unwrap() - 40.0 * (1 << 20) as f64).abs() < 1.0, "{f:?}");
        // Without tensors: the allocation calls' lines.
        let segments = DeviceMemory { allocated_bytes: None, ..d.clone() };
        assert_eq!(gpu_memory_growth(&segments).and_then(|f| f.site.line), Some(99));
        // A short or flat series: none.
        assert!(gpu_memory_growth(&DeviceMemory { allocated_series: series[..20].to_vec(), ..d.clone() }).is_none());
        let flat: Vec<[u64; 2]> = (0..60).map(|i| [i * 100_000_000, 64 << 20]).collect();
        assert!(gpu_memory_growth(&DeviceMemory { allocated_series: flat, ..d }).is_none());
    }

    #[test]
    fn a_call_class_from_its_name_is_the_one_from_its_id() {
        for id in 0..api::COUNT + 2 {
            let name = api_name(id);
            assert_eq!(CallClass::of_name(&name), CallClass::of_api(id), "{name}");
            let polls = id < api::COUNT && api::is_query(id);
            let nccl = id < api::COUNT && api::is_nccl(id);
            let want = if polls {
                CallClass::Sync
            } else if nccl {
                CallClass::Collective
            } else {
                CallClass::of_api(id)
            };
            assert_eq!(CallClass::of_symbol(&name), want, "{name}");
            // What the name tests said before the class was stored.
            let sync = name.starts_with("cu") && name.contains("Synchronize");
            let copy = name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy");
            assert_eq!(CallClass::of_api(id) == CallClass::Sync, sync, "{name}");
            assert_eq!(CallClass::of_api(id) == CallClass::Copy, copy, "{name}");
        }
        assert_eq!(CallClass::of_name("cudaMalloc"), CallClass::Memory);
        assert_eq!(CallClass::of_name("cuLaunchKernelEx"), CallClass::Launch);
        assert_eq!(CallClass::of_name("cudaMemcpy3D"), CallClass::Other);
        assert_eq!(CallClass::of_symbol("cudaMemcpy3D"), CallClass::Copy);
        assert_eq!(CallClass::of_symbol("cudaThreadSynchronize"), CallClass::Sync);
    }
}
