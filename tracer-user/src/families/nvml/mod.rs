//! GPU sampling through NVML, during `infertrace record` (docs/cuda.md).
//!
//! [`Sampler::start`] runs a thread of its own that loads NVML with the
//! `nvml-wrapper` crate (a `dlopen` of `libnvidia-ml.so.1` at run time: the
//! binary neither links to it nor needs it), then reads every GPU at 1-10 Hz:
//! utilization, memory, PCIe throughput. [`Sampler::finish`] stops it and
//! returns the samples of the window with one status line; where NVML is
//! missing or unusable that line is the one notice, and there are no samples.
//! Nothing here panics on what the library does or lacks: a function missing
//! from it is checked before use (nvml-wrapper-sys would panic calling it),
//! and the thread runs under `catch_unwind` anyway.

use std::{
    collections::BTreeSet,
    ffi::OsString,
    panic::{self, AssertUnwindSafe},
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    enum_wrappers::device::PcieUtilCounter,
    error::{nvml_try, NvmlError},
    Device, Nvml,
};

use crate::{
    os::clock,
    engine::{Part, Collector, Cx, Handle, FamilyTable, Sink, Topic},
    os::probe::ProbeError,
    recording::{
        cuda::{CudaReport, GpuSample},
        Recording,
    },
};

/// The library nvml-wrapper loads (found through the dynamic loader's path).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// Environment variable naming another library file (or name) to load.
pub const LIB_ENV: &str = "INFERTRACE_NVML_LIB";
pub const MIN_HZ: u32 = 1;
pub const MAX_HZ: u32 = 10;
pub const DEFAULT_HZ: u32 = crate::engine::DEFAULT_GPU_SAMPLE_HZ;
/// How long [`Sampler::finish`] waits for the thread (nvmlInit can take
/// seconds on a machine whose GPUs are not in persistence mode).
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Why there are no GPU samples.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    #[error("{0} not found")]
    NotFound(String),
    #[error("cannot load {lib}: {detail}")]
    Load { lib: String, detail: String },
    #[error("{lib} has no {function}")]
    MissingFunction { lib: String, function: &'static str },
    #[error("{call} failed: {source}")]
    Call { call: &'static str, source: NvmlError },
    #[error("no GPU found")]
    NoGpu,
    #[error("none of the {0} GPUs could be opened")]
    NoUsableGpu(u32),
    #[error("NVML did not answer within {0} s")]
    Timeout(u64),
    #[error("the sampler failed: {0}")]
    Panicked(String),
    #[error("cannot start the sampling thread: {0}")]
    Thread(String),
}

impl NvmlUnavailable {
    /// The one line the report carries.
    pub fn notice(&self) -> String {
        match self {
            Self::NoGpu => "NVML found no GPU: no GPU utilization samples".into(),
            _ => format!("NVML not available ({self}): no GPU utilization samples"),
        }
    }
}

/// `nvmlDeviceGetPcieThroughput` reports KB/s (KiB, as nvidia-smi and DCGM
/// read it).
pub fn kb_per_s_to_bytes(kb: u32) -> u64 {
    u64::from(kb) * 1024
}

/// What a sampler leaves for the recording.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GpuSampling {
    /// Every GPU's readings inside the window, in the order taken; the first
    /// of each GPU carries its name and UUID.
    pub samples: Vec<GpuSample>,
    /// One line: what was sampled, or why nothing was ([`NvmlUnavailable::notice`]).
    pub status: String,
    /// Further one-line notes (a GPU that could not be opened, a metric a
    /// GPU does not report, a rate not reached).
    pub notes: Vec<String>,
}

impl GpuSampling {
    /// Puts the samples into the recording's CUDA report (made for them
    /// when no CUDA library was probed), the status line and notes into the
    /// sink (which puts them beside the CUDA report, or in the recording's
    /// notes when there is none). The status line is the only NVML line.
    pub fn merge_into(self, rec: &mut Recording, sink: &mut Sink, window_ns: u64) {
        match rec.cuda.as_mut() {
            Some(report) => {
                report.gpu_samples = self.samples;
                let near = crate::recording::cuda::gpu_memory_near_capacity(&report.gpu_samples, &report.device_memory);
                if !near.is_empty() {
                    report.findings.extend(near);
                    crate::recording::cuda::rank_findings(&mut report.findings);
                }
            }
            None if !self.samples.is_empty() => {
                let findings = crate::recording::cuda::gpu_memory_near_capacity(&self.samples, &[]);
                rec.cuda = Some(CudaReport { gpu_samples: self.samples, window_ns, findings, ..Default::default() });
            }
            None => {}
        }
        sink.note_on(Topic::Gpu, self.status);
        for n in self.notes {
            sink.note_on(Topic::Gpu, n);
        }
    }
}

/// The NVML collector: a sampler thread for the whole window, its samples
/// merged at the end (NVML has no kernel programs).
#[derive(Default)]
pub struct NvmlCollector {
    /// Samples per second (`--gpu-sample-hz`).
    hz: u32,
    sampler: Option<Sampler>,
}

impl NvmlCollector {
    pub fn new(hz: u32) -> Self {
        NvmlCollector { hz, sampler: None }
    }
}

pub static TABLE: FamilyTable = FamilyTable { family: "nvml", programs: &[], globals: &[] };

impl Collector for NvmlCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Window]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Cuda]
    }

    /// Reads them: the GPU samples join the CUDA family's report.
    fn needs(&self) -> &'static [Part] {
        &[Part::Cuda]
    }

    fn name(&self) -> &'static str {
        "nvml"
    }

    /// Starts the sampler thread (loading NVML can take seconds).
    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.sampler = Some(Sampler::start(SamplerOptions::new(self.hz, cx.window.start)));
        Ok(())
    }

    /// The samples arrive when the sampler stops: at the window end only.
    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        if let (Some(end), Some(sampler)) = (cx.window.end, self.sampler.take()) {
            sampler.finish(end).merge_into(rec, cx.sink, end.saturating_sub(cx.window.start));
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// Rounds per second (clamped to [`MIN_HZ`]..=[`MAX_HZ`]).
    pub hz: u32,
    /// `clock::monotonic_ns()` at the window start: samples are timed from it.
    pub window_start_ns: u64,
    /// The library to load: `$INFERTRACE_NVML_LIB`, else [`DEFAULT_LIB`].
    pub lib: OsString,
}

impl SamplerOptions {
    pub fn new(hz: u32, window_start_ns: u64) -> Self {
        let lib = std::env::var_os(LIB_ENV).filter(|v| !v.is_empty()).unwrap_or_else(|| DEFAULT_LIB.into());
        SamplerOptions { hz: hz.clamp(MIN_HZ, MAX_HZ), window_start_ns, lib }
    }
}

/// What the thread found.
struct Collected {
    samples: Vec<GpuSample>,
    /// (index, name, uuid) of the GPUs sampled.
    gpus: Vec<(u32, Option<String>, Option<String>)>,
    notes: Vec<String>,
    rounds: u64,
    sampling: Duration,
}

type Outcome = Result<Collected, NvmlUnavailable>;

/// A sampling thread. Dropping it without [`finish`](Self::finish) stops
/// the thread too (the stop channel closes).
pub struct Sampler {
    opts: SamplerOptions,
    stop: mpsc::Sender<()>,
    result: mpsc::Receiver<Outcome>,
}

impl Sampler {
    /// Starts sampling in the background; never blocks, never fails (a
    /// failure becomes the status line at [`finish`](Self::finish)).
    pub fn start(opts: SamplerOptions) -> Sampler {
        let (stop, stop_rx) = mpsc::channel::<()>();
        let (tx, result) = mpsc::channel::<Outcome>();
        let spawn_tx = tx.clone();
        let thread_opts = opts.clone();
        let spawned = thread::Builder::new().name("infertrace-nvml".into()).spawn(move || {
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| run(&thread_opts, &stop_rx)))
                .unwrap_or_else(|p| Err(NvmlUnavailable::Panicked(panic_message(p.as_ref()))));
            let _ = tx.send(outcome);
        });
        if let Err(e) = spawned {
            let _ = spawn_tx.send(Err(NvmlUnavailable::Thread(e.to_string())));
        }
        Sampler { opts, stop, result }
    }

    /// Stops the thread and returns the samples taken up to `window_end_ns`
    /// (`clock::monotonic_ns()` at the window end).
    pub fn finish(self, window_end_ns: u64) -> GpuSampling {
        let _ = self.stop.send(());
        let outcome = match self.result.recv_timeout(FINISH_WAIT) {
            Ok(o) => o,
            Err(RecvTimeoutError::Timeout) => Err(NvmlUnavailable::Timeout(FINISH_WAIT.as_secs())),
            Err(RecvTimeoutError::Disconnected) => {
                Err(NvmlUnavailable::Panicked("the sampling thread ended without a result".into()))
            }
        };
        assemble(self.opts.hz, window_end_ns.saturating_sub(self.opts.window_start_ns), outcome)
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
        .replace('\n', " ")
}

/// The samples inside the window (`ts_ns <= window_ns`), names and UUIDs on
/// each GPU's first one, the status line and the notes.
fn assemble(hz: u32, window_ns: u64, outcome: Outcome) -> GpuSampling {
    let c = match outcome {
        Ok(c) => c,
        Err(e) => return GpuSampling { samples: Vec::new(), status: e.notice(), notes: Vec::new() },
    };
    let mut samples: Vec<GpuSample> = c.samples.into_iter().filter(|s| s.ts_ns <= window_ns).collect();
    for (index, name, uuid) in &c.gpus {
        if let Some(s) = samples.iter_mut().find(|s| s.gpu == *index) {
            s.name = name.clone();
            s.uuid = uuid.clone();
        }
    }
    let mut notes = c.notes;
    notes.extend(rate_note(hz, c.rounds, c.sampling));
    let n = c.gpus.len();
    let status = format!(
        "NVML: {n} GPU{} sampled at {hz} Hz ({} samples)",
        if n == 1 { "" } else { "s" },
        samples.len()
    );
    GpuSampling { samples, status, notes }
}

/// A note when the rounds fell well short of `hz` over at least a second
/// (each PCIe throughput query takes ~20 ms in the driver).
fn rate_note(hz: u32, rounds: u64, sampling: Duration) -> Option<String> {
    let secs = sampling.as_secs_f64();
    if secs < 1.0 || hz == 0 {
        return None;
    }
    let expected = secs * f64::from(hz);
    let reached = rounds as f64 / secs;
    ((rounds as f64) < 0.8 * expected).then(|| {
        format!(
            "NVML sampling reached {reached:.1} of {hz} Hz (each GPU's PCIe throughput query takes ~20 ms in the driver)"
        )
    })
}

/// The next round: index and how long to wait for it, given the time since
/// the first round. Rounds that are already late are skipped, not bunched.
fn next_round(elapsed: Duration, period: Duration, last: u64) -> (u64, Duration) {
    let period_ns = period.as_nanos().max(1);
    let due_now = (elapsed.as_nanos() / period_ns) as u64 + 1;
    let next = due_now.max(last + 1);
    let at = Duration::from_nanos((u128::from(next) * period_ns).min(u128::from(u64::MAX)) as u64);
    (next, at.saturating_sub(elapsed))
}

/// Shuts NVML down on drop, unless the library lacks `nvmlShutdown`
/// (nvml-wrapper's own drop would then panic): then it is left loaded.
struct Session(Option<Nvml>);

impl Session {
    fn nvml(&self) -> Option<&Nvml> {
        self.0.as_ref()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(nvml) = self.0.take() {
            if nvml.lib().nvmlShutdown.is_ok() {
                drop(nvml);
            } else {
                std::mem::forget(nvml);
            }
        }
    }
}

fn init_error(lib: &str, e: NvmlError) -> NvmlUnavailable {
    match e {
        NvmlError::LibloadingError(le) => {
            let detail = le.to_string();
            if detail.contains("No such file or directory") {
                NvmlUnavailable::NotFound(lib.to_owned())
            } else {
                NvmlUnavailable::Load { lib: lib.to_owned(), detail }
            }
        }
        NvmlError::FailedToLoadSymbol(_) => NvmlUnavailable::MissingFunction { lib: lib.to_owned(), function: "nvmlInit_v2" },
        other => NvmlUnavailable::Call { call: "nvmlInit_v2", source: other },
    }
}

/// The functions every round needs; checked once, so that a library
/// without them is one notice.
fn check_functions(nvml: &Nvml, lib: &str) -> Result<(), NvmlUnavailable> {
    let l = nvml.lib();
    let missing = |function: &'static str| NvmlUnavailable::MissingFunction { lib: lib.to_owned(), function };
    if l.nvmlDeviceGetCount_v2.is_err() {
        return Err(missing("nvmlDeviceGetCount_v2"));
    }
    if l.nvmlDeviceGetHandleByIndex_v2.is_err() {
        return Err(missing("nvmlDeviceGetHandleByIndex_v2"));
    }
    if l.nvmlDeviceGetUtilizationRates.is_err() {
        return Err(missing("nvmlDeviceGetUtilizationRates"));
    }
    if l.nvmlDeviceGetMemoryInfo_v2.is_err() && l.nvmlDeviceGetMemoryInfo.is_err() {
        return Err(missing("nvmlDeviceGetMemoryInfo"));
    }
    Ok(())
}

/// One GPU being sampled.
struct Gpu<'n> {
    index: u32,
    device: Device<'n>,
    name: Option<String>,
    uuid: Option<String>,
    /// Still worth asking for PCIe throughput.
    pcie: bool,
    /// Calls whose failure was noted already.
    noted: BTreeSet<&'static str>,
}

impl Gpu<'_> {
    fn note(&mut self, notes: &mut Vec<String>, call: &'static str, what: String) {
        if self.noted.insert(call) {
            notes.push(format!("GPU {}: {what}", self.index));
        }
    }

    fn read(&mut self, nvml: &Nvml, ts_ns: u64, notes: &mut Vec<String>) -> Option<GpuSample> {
        let util = match self.device.utilization_rates() {
            Ok(u) => u,
            Err(e) => {
                self.note(notes, "util", format!("nvmlDeviceGetUtilizationRates failed ({e}): no samples while it fails"));
                return None;
            }
        };
        let (used, total) = match memory(nvml, &self.device) {
            Ok(m) => m,
            Err(e) => {
                self.note(notes, "memory", format!("nvmlDeviceGetMemoryInfo failed ({e}): no samples while it fails"));
                return None;
            }
        };
        let tx = self.pcie(PcieUtilCounter::Send, notes);
        let rx = self.pcie(PcieUtilCounter::Receive, notes);
        Some(GpuSample {
            ts_ns,
            gpu: self.index,
            util_percent: f64::from(util.gpu),
            mem_used_bytes: used,
            mem_util_percent: f64::from(util.memory),
            mem_total_bytes: total,
            pcie_tx_bytes_per_s: tx,
            pcie_rx_bytes_per_s: rx,
            name: None,
            uuid: None,
        })
    }

    fn pcie(&mut self, counter: PcieUtilCounter, notes: &mut Vec<String>) -> Option<u64> {
        if !self.pcie {
            return None;
        }
        match self.device.pcie_throughput(counter) {
            Ok(kb) => Some(kb_per_s_to_bytes(kb)),
            Err(e) => {
                let why = match e {
                    NvmlError::NotSupported => "not supported by this GPU".to_owned(),
                    NvmlError::FailedToLoadSymbol(_) => "nvmlDeviceGetPcieThroughput missing from the library".to_owned(),
                    other => format!("nvmlDeviceGetPcieThroughput failed: {other}"),
                };
                self.pcie = false;
                self.note(notes, "pcie", format!("PCIe throughput not available ({why}): pcie_*_bytes_per_s are null"));
                None
            }
        }
    }
}

/// (used, total) bytes: `nvmlDeviceGetMemoryInfo_v2`, else the v1 function
/// (drivers before R510 lack v2).
fn memory(nvml: &Nvml, device: &Device<'_>) -> Result<(u64, u64), NvmlError> {
    match device.memory_info() {
        Ok(m) => Ok((m.used, m.total)),
        Err(e) => memory_v1(nvml, device).map_err(|_| e),
    }
}

fn memory_v1(nvml: &Nvml, device: &Device<'_>) -> Result<(u64, u64), NvmlError> {
    let f = nvml.lib().nvmlDeviceGetMemoryInfo.as_ref().map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // nvmlMemory_t is { unsigned long long total, free, used }.
    let mut m = [0u64; 3];
    // SAFETY: the function has NVML's signature (bindgen) and is given a
    // device handle of this NVML instance and 24 writable, 8-aligned bytes.
    nvml_try(unsafe { f(device.handle(), m.as_mut_ptr().cast()) })?;
    Ok((m[2], m[0]))
}

/// The thread: load, list the GPUs, then sample until told to stop.
fn run(opts: &SamplerOptions, stop: &mpsc::Receiver<()>) -> Outcome {
    let lib = opts.lib.to_string_lossy().into_owned();
    let nvml = Nvml::builder().lib_path(&opts.lib).init().map_err(|e| init_error(&lib, e))?;
    let session = Session(Some(nvml));
    let Some(nvml) = session.nvml() else { return Err(NvmlUnavailable::Panicked("NVML session lost".into())) };
    check_functions(nvml, &lib)?;
    let count = nvml.device_count().map_err(|source| NvmlUnavailable::Call { call: "nvmlDeviceGetCount_v2", source })?;
    if count == 0 {
        return Err(NvmlUnavailable::NoGpu);
    }
    let mut notes = Vec::new();
    let mut gpus = Vec::new();
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => gpus.push(Gpu {
                index,
                name: device.name().ok(),
                uuid: device.uuid().ok(),
                device,
                pcie: true,
                noted: BTreeSet::new(),
            }),
            Err(e) => notes.push(format!("GPU {index}: not sampled (nvmlDeviceGetHandleByIndex_v2 failed: {e})")),
        }
    }
    if gpus.is_empty() {
        return Err(NvmlUnavailable::NoUsableGpu(count));
    }
    let period = Duration::from_nanos(1_000_000_000 / u64::from(opts.hz.clamp(MIN_HZ, MAX_HZ)));
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let (mut round, mut rounds) = (0u64, 0u64);
    loop {
        for g in &mut gpus {
            let ts_ns = clock::monotonic_ns().saturating_sub(opts.window_start_ns);
            samples.extend(g.read(nvml, ts_ns, &mut notes));
        }
        rounds += 1;
        let (next, wait) = next_round(t0.elapsed(), period, round);
        round = next;
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let sampling = t0.elapsed();
    let info = gpus.iter().map(|g| (g.index, g.name.clone(), g.uuid.clone())).collect();
    drop(gpus);
    Ok(Collected { samples, gpus: info, notes, rounds, sampling })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts_ns: u64, gpu: u32) -> GpuSample {
        GpuSample { ts_ns, gpu, util_percent: 50.0, mem_used_bytes: 1 << 30, ..Default::default() }
    }

    #[test]
    fn pcie_kb_per_s() {
        assert_eq!(kb_per_s_to_bytes(0), 0);
        assert_eq!(kb_per_s_to_bytes(1000), 1_024_000);
        assert_eq!(kb_per_s_to_bytes(u32::MAX), u64::from(u32::MAX) * 1024);
    }

    #[test]
    fn notices() {
        assert_eq!(
            NvmlUnavailable::NotFound(DEFAULT_LIB.into()).notice(),
            "NVML not available (libnvidia-ml.so.1 not found): no GPU utilization samples"
        );
        let m = NvmlUnavailable::MissingFunction { lib: DEFAULT_LIB.into(), function: "nvmlDeviceGetUtilizationRates" };
        assert_eq!(m.notice(), "NVML not available (libnvidia-ml.so.1 has no nvmlDeviceGetUtilizationRates): no GPU utilization samples");
        let c = NvmlUnavailable::Call { call: "nvmlInit_v2", source: NvmlError::DriverNotLoaded };
        assert_eq!(c.notice(), "NVML not available (nvmlInit_v2 failed: NVIDIA driver is not loaded): no GPU utilization samples");
        assert_eq!(NvmlUnavailable::NoGpu.notice(), "NVML found no GPU: no GPU utilization samples");
        assert!(!NvmlUnavailable::Panicked("x".into()).notice().contains('\n'));
        assert!(matches!(
            init_error("l", NvmlError::FailedToLoadSymbol("x".into())),
            NvmlUnavailable::MissingFunction { function: "nvmlInit_v2", .. }
        ));
    }

    #[test]
    fn rounds_skip_late_ones() {
        let p = Duration::from_millis(100);
        assert_eq!(next_round(Duration::from_millis(3), p, 0), (1, Duration::from_millis(97)));
        assert_eq!(next_round(Duration::from_millis(105), p, 1), (2, Duration::from_millis(95)));
        // A round that took 250 ms: rounds 2 and 3 are skipped, not bunched.
        assert_eq!(next_round(Duration::from_millis(350), p, 1), (4, Duration::from_millis(50)));
        // Woken a little early: never the same round twice.
        assert_eq!(next_round(Duration::from_millis(199), p, 2), (3, Duration::from_millis(101)));
    }

    #[test]
    fn rate_falls_short() {
        assert_eq!(rate_note(10, 10, Duration::from_millis(500)), None);
        assert_eq!(rate_note(10, 19, Duration::from_secs(2)), None);
        let n = rate_note(10, 12, Duration::from_secs(2)).expect("note");
        assert!(n.contains("6.0 of 10 Hz"), "{n}");
    }

    #[test]
    fn assembles_the_window() {
        let c = Collected {
            samples: vec![sample(5, 0), sample(6, 1), sample(100, 0), sample(101, 1), sample(300, 0)],
            gpus: vec![(0, Some("A".into()), Some("GPU-a".into())), (1, Some("B".into()), None)],
            notes: vec!["GPU 1: x".into()],
            rounds: 3,
            sampling: Duration::from_millis(300),
        };
        let g = assemble(10, 200, Ok(c));
        assert_eq!(g.samples.len(), 4);
        assert_eq!(g.samples[0].name.as_deref(), Some("A"));
        assert_eq!(g.samples[0].uuid.as_deref(), Some("GPU-a"));
        assert_eq!(g.samples[1].name.as_deref(), Some("B"));
        assert_eq!(g.samples[1].uuid, None);
        assert!(g.samples[2..].iter().all(|s| s.name.is_none()));
        assert_eq!(g.status, "NVML: 2 GPUs sampled at 10 Hz (4 samples)");
        assert_eq!(g.notes, vec!["GPU 1: x".to_owned()]);

        let e = assemble(5, 200, Err(NvmlUnavailable::NoGpu));
        assert!(e.samples.is_empty() && e.notes.is_empty());
        assert_eq!(e.status, NvmlUnavailable::NoGpu.notice());
    }

    #[test]
    fn merges_once() {
        let g = GpuSampling { samples: vec![sample(1, 0)], status: "NVML: s".into(), notes: vec!["n".into()] };
        let blank = || {
            let mut r = crate::recording::tests::sample();
            r.notes.clear();
            r.cuda = None;
            r
        };
        // A CUDA report with notes of its own: the status and notes follow them.
        let mut rec = blank();
        rec.cuda = Some(CudaReport { notes: vec!["cuda".into()], ..Default::default() });
        let mut sink = Sink::default();
        g.clone().merge_into(&mut rec, &mut sink, 10);
        sink.fill(&mut rec);
        let r = rec.cuda.as_ref().expect("report");
        assert_eq!(r.notes, vec!["cuda".to_owned(), "NVML: s".to_owned(), "n".to_owned()]);
        assert_eq!(r.gpu_samples.len(), 1);
        assert!(rec.notes.is_empty());
        // No CUDA runtime probed: a report for the samples.
        let (mut rec, mut sink) = (blank(), Sink::default());
        g.merge_into(&mut rec, &mut sink, 10);
        sink.fill(&mut rec);
        let r = rec.cuda.expect("report");
        assert_eq!((r.window_ns, r.gpu_samples.len(), r.notes.len()), (10, 1, 2));
        // Nothing sampled and no CUDA: the notice goes to the recording's notes.
        let (mut rec, mut sink) = (blank(), Sink::default());
        let none = GpuSampling { status: "NVML not available".into(), ..Default::default() };
        none.merge_into(&mut rec, &mut sink, 10);
        sink.fill(&mut rec);
        assert!(rec.cuda.is_none());
        assert_eq!(rec.notes, vec!["NVML not available".to_owned()]);
    }

    #[test]
    fn missing_library_is_one_notice() {
        let dir = std::env::temp_dir().join(format!("infertrace-nvml-none-{}", std::process::id()));
        let lib = dir.join(DEFAULT_LIB);
        let opts = SamplerOptions { hz: 10, window_start_ns: clock::monotonic_ns(), lib: lib.clone().into() };
        let s = Sampler::start(opts);
        std::thread::sleep(Duration::from_millis(50));
        let g = s.finish(clock::monotonic_ns());
        assert!(g.samples.is_empty() && g.notes.is_empty(), "{g:?}");
        assert_eq!(g.status, format!("NVML not available ({} not found): no GPU utilization samples", lib.display()));
    }
}
