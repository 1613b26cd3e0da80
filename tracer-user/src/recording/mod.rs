//! The recording file (`.itr`): what `record` writes and `report` reads.
//!
//! Layout (documented in docs/recording-format.md):
//! 8-byte magic `ITRACE\r\n`, u32 LE format version, u32 LE encoding
//! (1 = gzip-compressed JSON), then the encoded [`Recording`].
//!
//! This is the recording model: serde types only, shared by the collectors
//! that fill it and the reports that render it. It imports no collector.
//! Its files are written by `output` (where `record -o` goes) through
//! `safe_write` (created O_EXCL|O_NOFOLLOW in a directory it opened).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::{self, BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
};

use flate2::{read::GzDecoder, write::GzEncoder, Compression};
use serde::{Deserialize, Serialize};

pub mod asyncio;
pub mod attribution;
pub mod cuda;
pub mod limits;
pub mod memory;
pub mod output;
pub mod safe_write;
pub mod overhead;
pub mod timeline;

pub use limits::ReadLimits;
use limits::{fmt_size, Guard, LimitHit};

/// Function name of a frame that could not be resolved.
pub const UNKNOWN: &str = "[unknown]";
/// Function name of the frame that stands for a native stack the kernel
/// took but could not store (a collision in its stack map).
pub const STACK_LOST: &str = "[stack lost]";
/// The module of code in an anonymous executable mapping (JIT-generated).
pub const JIT_MODULE: &str = "[jit]";
/// The module of frames in generated code named by their process's perf
/// map (`/tmp/perf-PID.map`).
pub const JIT_PERF_MAP_MODULE: &str = "[jit: perf map]";

pub const MAGIC: &[u8; 8] = b"ITRACE\r\n";
/// 2: findings hold numbers, no words (CUDA `message` and `advice`, asyncio
/// `doing` and `advice` are absent: a reader of version 1 requires them).
/// Version 1 recordings are read as before.
pub const FORMAT_VERSION: u32 = 2;
pub(crate) const ENCODING_GZIP_JSON: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path} is a directory, not a recording")]
    IsDirectory { path: PathBuf },
    #[error("{path} is empty (0 bytes): no recording was written to it")]
    Empty { path: PathBuf },
    #[error("{path} is not an infertrace recording (bad magic)")]
    BadMagic { path: PathBuf },
    #[error("{path} has format version {found}; this infertrace reads up to {FORMAT_VERSION} (upgrade infertrace)")]
    TooNew { path: PathBuf, found: u32 },
    #[error("{path} uses unknown encoding {found}")]
    BadEncoding { path: PathBuf, found: u32 },
    #[error("{path} is truncated or corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path} inflates to more than {} (the reading limit); not read", fmt_size(*limit))]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path} inflates more than {ratio} times its size ({} from {}): a decompression bomb?; not read", fmt_size(*inflated), fmt_size(*compressed))]
    Bomb { path: PathBuf, ratio: u64, inflated: u64, compressed: u64 },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

impl RecordingError {
    /// What to do about it, for the one-line error.
    pub fn hint(&self) -> String {
        match self {
            Self::Open { .. } => "check the path and its permissions".into(),
            Self::IsDirectory { path } => format!("pass a .itr file, e.g. one of `ls {}/*.itr`", path.display()),
            Self::Empty { .. } => "the recorder stopped before writing it (killed, or the disk was full); record again".into(),
            Self::BadMagic { .. } => "pass a .itr file written by `infertrace record`".into(),
            Self::TooNew { .. } | Self::BadEncoding { .. } => "read it with the infertrace that wrote it, or upgrade".into(),
            Self::Corrupt { .. } => "the file was cut short or altered; record again, or read a snapshot".into(),
            Self::TooLarge { limit, .. } => format!(
                "if the file is trusted, raise the limit, e.g. `--max-inflated {}`; reading needs a few times that in memory",
                fmt_size(limit.saturating_mul(4).max(4 << 30)).replace(' ', "")
            ),
            Self::Bomb { .. } => {
                "if the file is trusted, read it with an explicit limit, e.g. `--max-inflated 4GiB`; reading needs a few times that in memory".into()
            }
            Self::Write { .. } => "check free space and permissions of the output directory".into(),
        }
    }
}

/// Where a target came from.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Named with `-p`.
    Attached,
    /// The command given after `--`.
    Launched,
    /// Forked by a target while tracing.
    Followed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub exe: Option<String>,
    pub cmdline: Vec<String>,
    pub origin: Origin,
    /// Exit status of a launched command (negative: killed by that signal).
    pub exit_code: Option<i32>,
}

/// Syscall statistics of one thread for one syscall number.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadSyscall {
    pub pid: u32,
    pub tid: u32,
    pub nr: u32,
    pub count: u64,
    pub errors: u64,
    /// errno -> number of failures with it.
    pub errnos: BTreeMap<u32, u64>,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist_log2_ns: Vec<u64>,
    /// Calls still in flight when the window closed (counted, timed to the end).
    #[serde(default)]
    pub in_flight: u64,
    /// On the row of `tid` 0: how many exited threads of the process are
    /// summed in it (collect/exited.rs); absent (0) on a thread's own row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub aggregated_threads: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Kind of a stack frame.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    Native,
    Kernel,
    /// A CPython frame: `function` is the qualified name, `file`/`line` the source position.
    Python,
}

/// The current Python stack of one thread (what `infertrace dump` prints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadDump {
    /// Kernel thread id (0 when it could not be determined, before 3.11).
    pub tid: u32,
    pub thread_name: Option<String>,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

/// One resolved frame.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled function name; `[unknown]` (with `module`) when unresolved.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub kind: FrameKind,
    /// The binary or library the address fell in (basename), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// Why a thread was off CPU: the syscall it blocked in, classified
/// (docs/wall-time.md has the table).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum OffCpuReason {
    Io,
    Lock,
    Poll,
    Sleep,
    Other,
    /// Waiting to take a CPython GIL.
    Gil,
    /// Blocked on memory: a page fault's page-in, reclaim, compaction,
    /// memory.high throttling (`OffCpuTimes::memory` has the causes).
    Memory,
}

impl OffCpuReason {
    /// The reason a kernel record's code (`tracer_common::sched::REASON_*`) stands for.
    pub fn from_code(code: u32) -> Self {
        use tracer_common::sched::{is_memory_reason, REASON_GIL, REASON_IO, REASON_LOCK, REASON_POLL, REASON_SLEEP};
        match code {
            REASON_IO => Self::Io,
            REASON_LOCK => Self::Lock,
            REASON_POLL => Self::Poll,
            REASON_SLEEP => Self::Sleep,
            REASON_GIL => Self::Gil,
            c if is_memory_reason(c) => Self::Memory,
            _ => Self::Other,
        }
    }

    /// Its name in reports and labels (as serialized: `io`, `lock`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Io => "io",
            Self::Lock => "lock",
            Self::Poll => "poll",
            Self::Sleep => "sleep",
            Self::Other => "other",
            Self::Gil => "gil",
            Self::Memory => "memory",
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum StackKind {
    /// CPU samples (`samples` counts them).
    Cpu,
    /// Off-CPU time (`weight_ns`).
    OffCpu,
    /// Waiting for a CPython GIL (`weight_ns`).
    Gil,
    /// Syscalls slower than `--slow-syscall` (`samples` = calls, `weight_ns` = their time).
    Syscall,
}

/// An aggregated stack: CPU samples or off-CPU time of one thread.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StackRecord {
    pub kind: StackKind,
    pub reason: Option<OffCpuReason>,
    pub pid: u32,
    pub tid: u32,
    pub samples: u64,
    pub weight_ns: u64,
    /// The syscall (kind `syscall` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// Leaf first: kernel frames, then native frames, then Python frames.
    pub frames: Vec<Frame>,
}

/// Off-CPU time of a thread, by reason.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OffCpuTimes {
    pub io_ns: u64,
    pub lock_ns: u64,
    pub poll_ns: u64,
    pub sleep_ns: u64,
    pub other_ns: u64,
    /// Waiting to take a CPython GIL (not counted in `lock_ns`).
    #[serde(default)]
    pub gil_ns: u64,
    /// Blocked on memory (not counted in the others): the sum of `memory`.
    #[serde(default)]
    pub memory_ns: u64,
    /// `memory_ns` by cause.
    #[serde(default, skip_serializing_if = "MemoryWaits::is_zero")]
    pub memory: MemoryWaits,
}

impl OffCpuTimes {
    pub fn total(&self) -> u64 {
        [self.io_ns, self.lock_ns, self.poll_ns, self.sleep_ns, self.other_ns, self.gil_ns, self.memory_ns].into_iter().fold(0, u64::saturating_add)
    }
}

/// Off-CPU time blocked on memory, by cause (docs/memory.md).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryWaits {
    /// In a page fault outside any syscall: a page-in from a file or swap,
    /// or the memory-map lock the fault takes.
    pub page_fault_ns: u64,
    /// In direct reclaim: the machine's, or a memory cgroup's at its limit.
    pub reclaim_ns: u64,
    /// In compaction (making room for a huge page or a large allocation).
    pub compaction_ns: u64,
    /// Throttled above a memory cgroup's `memory.high`.
    pub throttle_ns: u64,
}

impl MemoryWaits {
    pub fn total(&self) -> u64 {
        [self.page_fault_ns, self.reclaim_ns, self.compaction_ns, self.throttle_ns].into_iter().fold(0, u64::saturating_add)
    }

    pub fn is_zero(&self) -> bool {
        self.total() == 0
    }

    /// Adds `other`'s waits.
    pub fn add(&mut self, other: &MemoryWaits) {
        self.page_fault_ns = self.page_fault_ns.saturating_add(other.page_fault_ns);
        self.reclaim_ns = self.reclaim_ns.saturating_add(other.reclaim_ns);
        self.compaction_ns = self.compaction_ns.saturating_add(other.compaction_ns);
        self.throttle_ns = self.throttle_ns.saturating_add(other.throttle_ns);
    }
}

/// Where one thread's wall time went inside the window; or, with
/// `aggregated_threads` > 0 (tid 0), the sum over exited threads of the
/// process that did not keep rows of their own.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ThreadTimes {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Time the thread existed inside the window.
    pub wall_ns: u64,
    pub on_cpu_ns: u64,
    /// The part of `on_cpu_ns` spent inside syscalls.
    pub syscall_ns: u64,
    pub off_cpu: OffCpuTimes,
    pub runqueue_ns: u64,
    /// Exited threads summed in this row (tid 0); absent (0) on a thread's own row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub aggregated_threads: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel_release: String,
    /// Architecture whose syscall numbers the recording holds (`x86_64`, `aarch64`).
    pub arch: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recording {
    pub format_version: u32,
    pub tool_version: String,
    pub host: HostInfo,
    /// Wall-clock start of the window, Unix ms.
    pub started_unix_ms: u64,
    /// Window length (CLOCK_MONOTONIC).
    pub duration_ns: u64,
    /// The command line infertrace ran with.
    pub argv: Vec<String>,
    pub targets: Vec<Target>,
    pub syscalls: Vec<ThreadSyscall>,
    /// Wall-time breakdown per thread (empty when scheduler tracing was off).
    #[serde(default)]
    pub threads: Vec<ThreadTimes>,
    /// CPU-sample and off-CPU stacks, symbolized.
    #[serde(default)]
    pub stacks: Vec<StackRecord>,
    /// Run-queue latency histogram per process (log2 ns buckets).
    #[serde(default)]
    pub runqueue_hist: BTreeMap<u32, Vec<u64>>,
    /// CPU sampling frequency (Hz); 0 when sampling was off.
    #[serde(default)]
    pub sample_hz: u64,
    /// CUDA runtime activity and findings (None: no CUDA runtime probed).
    #[serde(default)]
    pub cuda: Option<cuda::CudaReport>,
    /// Events the kernel side could not keep, by cause.
    pub lost: BTreeMap<String, u64>,
    /// Things the user should know about this recording (degraded features...).
    pub notes: Vec<String>,
    /// How the tracer worked: when each library was probed, interpreter
    /// internals (stack depth cuts, code objects read from kernel copies).
    /// In the text report with `--verbose`; absent from older recordings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// Set on a checkpoint: the recording ends there because the tracer had
    /// not finished when it was written. Absent from a finished recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
    /// Timestamped events (`record --timeline`); absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<timeline::Timeline>,
    /// What tracing cost: probe hits, the estimated time added to each
    /// target, the tracer's own CPU and memory (`crate::families::overhead`); absent
    /// from recordings made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer_overhead: Option<overhead::TracerOverhead>,
    /// asyncio event loops (`record --async`), when any was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asyncio: Option<asyncio::AsyncioReport>,
    /// Resident memory per process (the memory family; absent with
    /// `--no-memory` and in older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<memory::MemoryReport>,
    /// GIL waits by the thread that held the GIL (docs/python.md#gil-holders);
    /// empty without GIL waits and in older recordings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gil_holders: Vec<GilHold>,
}

/// GIL waits of one thread while one holder held the GIL, doing one thing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GilHold {
    pub pid: u32,
    /// The waiting thread.
    pub tid: u32,
    /// The thread that held the GIL (0: not known: its thread state was
    /// not published yet, or the interpreter is not readable).
    pub holder_tid: u32,
    /// What the holder was doing when the wait began: `running` (on CPU),
    /// `runnable` (waiting for a CPU), `blocked` (off CPU), `unknown`.
    pub holder_state: String,
    /// The syscall it was blocked in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// Its stack: native frames (when blocked: the stack it blocked with)
    /// and Python frames, leaf first.
    pub frames: Vec<Frame>,
    pub wait_ns: u64,
    /// Waits that began while it held the GIL.
    pub waits: u64,
}

/// Why a recording ends before its window did.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CutReason {
    /// A periodic checkpoint (`record --checkpoint-every`): the tracer was
    /// killed, crashed, or is still running; what came after is missing.
    Checkpoint,
}

/// Where and why a recording was cut: it holds the window up to
/// `duration_ns`, taken at `at_unix_ms`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cut {
    pub reason: CutReason,
    /// When the checkpoint was taken (Unix ms).
    pub at_unix_ms: u64,
}

impl Recording {
    /// Stacks in their canonical order: CPU samples by count, then off-CPU
    /// and GIL stacks by time, then slow syscalls by time.
    pub fn sort_stacks(&mut self) {
        self.stacks.sort_by_key(|s| (s.kind == StackKind::Syscall, std::cmp::Reverse((s.samples, s.weight_ns))));
    }

    /// Gives the stacks of exited threads folded into their process's
    /// summed row (`aggregated_threads`, tid 0) to that row, merging the
    /// records that become identical: every stack's tid then names a row
    /// of `threads`.
    pub fn attribute_folded_stacks(&mut self) {
        let folded: HashSet<u32> = self.threads.iter().filter(|t| t.aggregated_threads > 0).map(|t| t.pid).collect();
        if folded.is_empty() {
            return;
        }
        let own: HashSet<(u32, u32)> = self.threads.iter().filter(|t| t.aggregated_threads == 0).map(|t| (t.pid, t.tid)).collect();
        type Key = (StackKind, Option<OffCpuReason>, u32, Option<String>, Vec<Frame>);
        let mut merged: HashMap<Key, usize> = HashMap::new();
        let mut out: Vec<StackRecord> = Vec::with_capacity(self.stacks.len());
        for mut s in std::mem::take(&mut self.stacks) {
            if !folded.contains(&s.pid) || own.contains(&(s.pid, s.tid)) {
                out.push(s);
                continue;
            }
            s.tid = 0;
            let key = (s.kind, s.reason, s.pid, s.syscall.clone(), s.frames.clone());
            match merged.get(&key) {
                Some(&i) => {
                    out[i].samples = out[i].samples.saturating_add(s.samples);
                    out[i].weight_ns = out[i].weight_ns.saturating_add(s.weight_ns);
                }
                None => {
                    merged.insert(key, out.len());
                    out.push(s);
                }
            }
        }
        self.stacks = out;
    }

    pub fn lost_events(&self) -> u64 {
        self.lost.values().fold(0, |a, b| a.saturating_add(*b))
    }

    pub fn write_to(&self, file: File, path: &Path) -> Result<(), RecordingError> {
        let werr = |source| RecordingError::Write { path: path.to_owned(), source };
        let mut out = BufWriter::new(file);
        out.write_all(MAGIC).map_err(werr)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes()).map_err(werr)?;
        out.write_all(&ENCODING_GZIP_JSON.to_le_bytes()).map_err(werr)?;
        let mut gz = GzEncoder::new(out, Compression::default());
        serde_json::to_writer(&mut gz, self).map_err(|e| werr(io::Error::other(e)))?;
        let mut out = gz.finish().map_err(werr)?;
        out.flush().map_err(werr)?;
        // Only a regular file can be synced (a device such as /dev/null refuses).
        let file = out.get_ref();
        if file.metadata().map_err(werr)?.is_file() {
            file.sync_all().map_err(werr)?;
        }
        Ok(())
    }

    /// Reads a recording within the default [`ReadLimits`].
    pub fn read(path: &Path) -> Result<Recording, RecordingError> {
        Self::read_limited(path, ReadLimits::default())
    }

    /// Reads a recording, inflating at most `limits.max_inflated` bytes.
    pub fn read_limited(path: &Path, limits: ReadLimits) -> Result<Recording, RecordingError> {
        let open = |source| RecordingError::Open { path: path.to_owned(), source };
        let file = File::open(path).map_err(open)?;
        if file.metadata().map_err(open)?.is_dir() {
            return Err(RecordingError::IsDirectory { path: path.to_owned() });
        }
        Self::from_reader(file, path, limits)
    }

    /// Reads a recording from `input` (`path` names it in errors). The
    /// JSON is parsed as it inflates, within `limits` (see
    /// [`limits`]): whatever the input, this returns a recording or an
    /// error, in time and memory bounded by the limit.
    pub fn from_reader(input: impl Read, path: &Path, limits: ReadLimits) -> Result<Recording, RecordingError> {
        let err_path = || path.to_owned();
        let mut input = BufReader::new(input);
        let mut header = [0u8; 16];
        let n = read_up_to(&mut input, &mut header).map_err(|source| RecordingError::Open { path: err_path(), source })?;
        if n == 0 {
            return Err(RecordingError::Empty { path: err_path() });
        }
        if header[..n.min(8)] != MAGIC[..n.min(8)] {
            return Err(RecordingError::BadMagic { path: err_path() });
        }
        if n < header.len() {
            return Err(RecordingError::Corrupt { path: err_path(), detail: format!("cut short in its header ({n} of 16 bytes)") });
        }
        let word = |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (version, encoding) = (word(8), word(12));
        if version > FORMAT_VERSION {
            return Err(RecordingError::TooNew { path: err_path(), found: version });
        }
        if encoding != ENCODING_GZIP_JSON {
            return Err(RecordingError::BadEncoding { path: err_path(), found: encoding });
        }
        // The parser reads byte by byte: buffer the inflated side too.
        let (input, compressed) = limits::Counted::new(input, header.len() as u64);
        let mut guard = Guard::new(GzDecoder::new(input), limits, Some(compressed));
        let parsed = serde_json::from_reader(BufReader::with_capacity(64 << 10, &mut guard));
        match (parsed, guard.hit()) {
            (Ok(rec), _) => Ok(rec),
            (Err(_), Some(LimitHit::Inflated { limit })) => Err(RecordingError::TooLarge { path: err_path(), limit }),
            (Err(_), Some(LimitHit::Ratio { inflated, compressed })) => Err(RecordingError::Bomb {
                path: err_path(),
                ratio: limits.max_ratio.unwrap_or_default(),
                inflated,
                compressed,
            }),
            (Err(_), Some(LimitHit::String { at })) => Err(RecordingError::Corrupt {
                path: err_path(),
                detail: format!("a string longer than {} at inflated byte {at} (no recording holds one)", fmt_size(limits::MAX_STRING)),
            }),
            (Err(_), Some(LimitHit::BareRun { at })) => Err(RecordingError::Corrupt {
                path: err_path(),
                detail: format!(
                    "{} of whitespace or digits at inflated byte {at} (no recording holds them)",
                    fmt_size(limits::MAX_BARE_RUN)
                ),
            }),
            (Err(e), None) => Err(RecordingError::Corrupt { path: err_path(), detail: e.to_string() }),
        }
    }
}

/// Fills `buf` as far as `input` goes; the number of bytes read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Recording {
        let mut errnos = BTreeMap::new();
        errnos.insert(2, 3);
        Recording {
            format_version: FORMAT_VERSION,
            tool_version: "test".into(),
            host: HostInfo { hostname: "h".into(), kernel_release: "6.18".into(), arch: "x86_64".into() },
            started_unix_ms: 1,
            duration_ns: 1_000_000_000,
            argv: vec!["infertrace".into()],
            targets: vec![Target {
                pid: 10,
                ppid: Some(1),
                comm: "demo".into(),
                exe: Some("/bin/demo".into()),
                cmdline: vec!["demo".into()],
                origin: Origin::Launched,
                exit_code: Some(0),
            }],
            syscalls: vec![ThreadSyscall {
                pid: 10,
                tid: 10,
                nr: 257,
                count: 5,
                errors: 3,
                errnos,
                total_ns: 5000,
                max_ns: 2000,
                hist_log2_ns: vec![0; 40],
                in_flight: 0,
                aggregated_threads: 0,
            }],
            threads: vec![],
            stacks: vec![],
            runqueue_hist: BTreeMap::new(),
            sample_hz: 0,
            cuda: None,
            lost: BTreeMap::new(),
            notes: vec![],
            details: vec![],
            cut: None,
            timeline: None,
            tracer_overhead: None,
            asyncio: None,
            memory: None,
            gil_holders: Vec::new(),
        }
    }

    #[test]
    fn stacks_of_folded_threads_go_to_the_summed_row() {
        let mut rec = sample();
        let row = |tid: u32, aggregated_threads: u64| ThreadTimes { pid: 10, tid, aggregated_threads, ..Default::default() };
        rec.threads = vec![row(10, 0), row(0, 2)];
        let frame = Frame { function: "f".into(), file: None, line: None, kind: FrameKind::Native, module: None };
        let stack = |tid: u32, ns: u64| StackRecord {
            kind: StackKind::OffCpu,
            reason: Some(OffCpuReason::Io),
            pid: 10,
            tid,
            samples: 0,
            weight_ns: ns,
            syscall: None,
            frames: vec![frame.clone()],
        };
        // Two exited threads (11, 12) with the same stack, and the main thread's own.
        rec.stacks = vec![stack(11, 5), stack(10, 7), stack(12, 3)];
        rec.attribute_folded_stacks();
        let got: Vec<(u32, u64)> = rec.stacks.iter().map(|s| (s.tid, s.weight_ns)).collect();
        assert_eq!(got, [(0, 8), (10, 7)]);
    }

    #[test]
    fn roundtrip() {
        let dir = std::env::temp_dir().join(format!("itr-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.itr");
        let rec = sample();
        rec.write_to(File::create(&path).unwrap(), &path).unwrap();
        let back = Recording::read(&path).unwrap();
        assert_eq!(back.syscalls[0].errnos.get(&2), Some(&3));
        assert_eq!(back.targets[0].origin, Origin::Launched);

        std::fs::write(&path, b"not a recording at all").unwrap();
        assert!(matches!(Recording::read(&path), Err(RecordingError::BadMagic { .. })));
        let mut future = MAGIC.to_vec();
        future.extend_from_slice(&99u32.to_le_bytes());
        future.extend_from_slice(&1u32.to_le_bytes());
        std::fs::write(&path, &future).unwrap();
        assert!(matches!(Recording::read(&path), Err(RecordingError::TooNew { found: 99, .. })));

        // What a user may give by mistake, each said as what it is.
        let e = Recording::read(&dir).unwrap_err();
        assert!(matches!(e, RecordingError::IsDirectory { .. }) && e.to_string().contains("is a directory"), "{e}");
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(Recording::read(&path), Err(RecordingError::Empty { .. })));
        std::fs::write(&path, &MAGIC[..5]).unwrap();
        let e = Recording::read(&path).unwrap_err();
        assert!(matches!(e, RecordingError::Corrupt { .. }) && e.to_string().contains("header (5 of 16 bytes)"), "{e}");

        // The inflated-size limit, and the hint that raises it.
        rec.write_to(File::create(&path).unwrap(), &path).unwrap();
        let e = Recording::read_limited(&path, ReadLimits::plain(100)).unwrap_err();
        assert!(matches!(e, RecordingError::TooLarge { limit: 100, .. }), "{e}");
        assert!(e.to_string().contains("inflates to more than 100 B") && e.hint().contains("--max-inflated 4GiB"), "{e}: {}", e.hint());
        assert!(Recording::read_limited(&path, ReadLimits::plain(100_000)).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
