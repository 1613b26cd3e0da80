//! The timeline of a recording (`record --timeline`): timestamped events,
//! kept in a bounded buffer. Times are ns since the window start
//! (CLOCK_MONOTONIC, the kernel's `bpf_ktime_get_ns`, converted once by
//! subtracting `window_start_mono_ns`), like `cuda.gpu_samples[].ts_ns`.
//! GPU (NVML) samples are not repeated here: they are in
//! `cuda.gpu_samples` with the same clock.

use serde::{Deserialize, Serialize};

use super::{cuda::Site, Frame, OffCpuReason};

/// Default of `record --timeline-limit`: events kept per source.
pub const DEFAULT_LIMIT: u64 = 1_000_000;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// CLOCK_MONOTONIC ns of the window start (what the times are relative to).
    pub window_start_mono_ns: u64,
    /// `--timeline-limit`: events kept per source (kernel events; CUDA calls).
    pub limit: u64,
    /// Events not kept: past the limit, or lost by the kernel (ring buffer
    /// full). The timeline is incomplete when this is not 0.
    pub dropped: u64,
    /// Of `dropped`: those the kernel could not submit (ring buffer full).
    #[serde(default)]
    pub dropped_in_kernel: u64,
    /// Thread-state intervals, per thread in time order.
    #[serde(default)]
    pub states: Vec<StateInterval>,
    /// CPU samples.
    #[serde(default)]
    pub samples: Vec<SampleEvent>,
    /// Syscalls slower than `--slow-syscall`.
    #[serde(default)]
    pub syscalls: Vec<SyscallEvent>,
    /// Every CUDA call (copy, sync, launch, alloc...) seen.
    #[serde(default)]
    pub cuda: Vec<CudaCallEvent>,
    /// Thread and process starts, execs and exits.
    #[serde(default)]
    pub lifecycle: Vec<LifecycleEvent>,
    /// Stacks referenced by index (`stack`), leaf first.
    #[serde(default)]
    pub stacks: Vec<Vec<Frame>>,
}

/// What a thread was doing.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ThreadState {
    /// Running on a CPU.
    OnCpu,
    /// Runnable, waiting for a CPU.
    Runqueue,
    /// Blocked; `reason` says why (`gil`: waiting to take a CPython GIL).
    OffCpu,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StateInterval {
    pub pid: u32,
    pub tid: u32,
    pub state: ThreadState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<OffCpuReason>,
    pub begin_ns: u64,
    pub end_ns: u64,
    /// Off-CPU intervals: the stack captured when it began (index into `stacks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SampleEvent {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SyscallEvent {
    pub pid: u32,
    pub tid: u32,
    /// Syscall name (or `syscall_N`).
    pub name: String,
    pub begin_ns: u64,
    pub end_ns: u64,
    /// The user and Python stack at its return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CudaCallEvent {
    pub pid: u32,
    pub tid: u32,
    /// The API function, as in `cuda.calls[].api`.
    pub api: String,
    /// Copy kind as in `cuda.calls[].kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub bytes: u64,
    pub begin_ns: u64,
    pub end_ns: u64,
    /// cudaError_t / CUresult returned.
    pub rc: i32,
    /// The call site, as in `cuda.calls[].site`.
    pub site: Site,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleKind {
    /// A thread (or a process's first thread) started (kernel time).
    ThreadStart,
    /// A thread exited (kernel time).
    ThreadExit,
    /// A process was forked (time the tracer learnt of it, within ms).
    ProcessStart,
    /// A process called exec (time the tracer learnt of it, within ms).
    Exec,
    /// A process exited (time the tracer learnt of it, within ms).
    ProcessExit,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LifecycleEvent {
    pub kind: LifecycleKind,
    pub pid: u32,
    /// The thread (thread events); the pid for process events.
    pub tid: u32,
    pub ts_ns: u64,
    /// The new program's name (exec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
}
