//! What `infertrace record` was asked to do (the CLI's flags, parsed).

use std::{path::PathBuf, time::Duration};

/// `record -F`: CPU samples per second.
pub const DEFAULT_FREQUENCY: u64 = 99;
/// `record --gpu-sample-hz`: NVML readings per second.
pub const DEFAULT_GPU_SAMPLE_HZ: u32 = 5;
/// `record --slow-syscall`, as the flag's default text (checked against
/// [`RecordOptions::default`] by the CLI's tests).
pub const DEFAULT_SLOW_SYSCALL: &str = "1ms";
/// `record -F`: the most CPU samples per second (0 turns sampling off).
pub const MAX_FREQUENCY: u64 = 10_000;
/// `record --max-overhead`: the smallest and largest budget, percent.
pub const MIN_MAX_OVERHEAD: f64 = 0.1;
pub const MAX_MAX_OVERHEAD: f64 = 100.0;
/// `record --duration`: the longest window.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// `record --slow-syscall`: the shortest threshold (0 turns it off)...
pub const MIN_SLOW_SYSCALL: Duration = Duration::from_micros(1);
/// ... and the longest.
pub const MAX_SLOW_SYSCALL: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Copy, Debug)]
pub struct SchedOptions {
    /// Scheduler accounting and CPU sampling on.
    pub enabled: bool,
    /// CPU sampling frequency in Hz (0: no sampling).
    pub frequency: u64,
    /// Capture user+kernel stacks when a thread goes off CPU.
    pub offcpu_stacks: bool,
}

#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub pids: Vec<u32>,
    /// Also trace the existing descendants of `pids` (`record -p`; off
    /// with `--no-descendants`; children started later are followed anyway).
    pub descendants: bool,
    pub sched: SchedOptions,
    /// Syscalls at least this slow get stacks (None: off).
    pub slow_syscall: Option<Duration>,
    /// Attribute time to Python stacks in CPython processes.
    pub python: bool,
    /// Probe the CUDA runtime (libcudart) in the targets.
    pub cuda: bool,
    /// Also probe the CUDA driver API (libcuda) when `cuda` is on.
    pub cuda_driver: bool,
    /// NVML GPU samples per second while `cuda` is on (crate::families::nvml, 1-10).
    pub gpu_sample_hz: u32,
    /// Kernel-side diagnostics (aya-log) printed on stderr.
    pub debug_ebpf: bool,
    pub command: Vec<String>,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
    /// Replace the output with the recording so far this often, marked cut
    /// (crate::engine::checkpoint; None: no checkpoints).
    pub checkpoint_every: Option<Duration>,
    pub quiet: bool,
    /// `--timeline`: keep timestamped events, at most this many per source (None: off).
    pub timeline_limit: Option<u64>,
    /// asyncio event loops (`--async`, `--no-async`, `--blocked-loop`).
    pub asyncio: AsyncOptions,
    /// `--max-overhead PCT`: the share of a target's time the probes may
    /// add; past it, CUDA launches are probed in time slices and their
    /// counts estimated (`crate::families::cuda::slicer`). None: every launch probed.
    pub max_overhead: Option<f64>,
    /// Resident memory per process (crate::families::memory; `record`
    /// only: `--no-memory` turns it off).
    pub memory: bool,
}

/// The defaults of `infertrace record` (what `doctor` loads the object with).
impl Default for SchedOptions {
    fn default() -> Self {
        SchedOptions { enabled: true, frequency: DEFAULT_FREQUENCY, offcpu_stacks: true }
    }
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            pids: Vec::new(),
            descendants: false,
            sched: SchedOptions::default(),
            slow_syscall: Some(Duration::from_millis(1)),
            python: true,
            cuda: true,
            cuda_driver: true,
            gpu_sample_hz: DEFAULT_GPU_SAMPLE_HZ,
            debug_ebpf: false,
            command: Vec::new(),
            duration: None,
            output: None,
            checkpoint_every: Some(Duration::from_secs(10)),
            quiet: false,
            timeline_limit: None,
            asyncio: AsyncOptions::default(),
            max_overhead: None,
            memory: false,
        }
    }
}

/// `record --async` (crate::families::python::asyncio::record): asyncio event loops.
#[derive(Clone, Copy, Debug)]
pub struct AsyncOptions {
    /// `--no-async` turns it off.
    pub enabled: bool,
    /// `--blocked-loop`: a step at least this long is a blocked loop.
    pub blocked_threshold: Duration,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        AsyncOptions { enabled: true, blocked_threshold: Duration::from_millis(20) }
    }
}
