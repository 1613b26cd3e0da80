//! `infertrace record`: one tracing window from attach to detach.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    Btf, Ebpf, EbpfLoader,
};
use tracer_common::{python::PY_MAX_DEPTH, target_flags};

use crate::{
    btf_offsets::BtfOffsets,
    clock,
    cuda::CudaTracer,
    nvml,
    sched::{SchedAccounting, SchedOptions},
    pystacks::PythonTargets,
    stacks::StackResolver,
    symbolize::Symbolizer,
    probe::{self, ProbeError},
    process::{self, Lifecycle, ProcessFollower},
    procfs,
    recording::{HostInfo, Origin, Recording, Target, FORMAT_VERSION},
    syscalls::{self, SyscallAccounting},
    targets::{self, Launched, TargetError},
    tracefs,
};

pub const DEFAULT_BTF: &str = "/sys/kernel/btf/vmlinux";

/// How often the Python thread maps are refreshed and starting interpreters
/// retried (docs/python.md).
const PYTHON_REFRESH: Duration = Duration::from_millis(25);

const TRUNCATED_COUNTER: &str = tracer_common::counters::NAMES[tracer_common::counters::PY_STACKS_TRUNCATED as usize];

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("nothing to trace")]
    NoTarget,
    #[error("tracing needs root or CAP_BPF+CAP_PERFMON (this process has neither)")]
    NotPermitted,
    #[error("kernel BTF not found at {0}")]
    NoBtf(PathBuf),
    #[error("cannot parse kernel BTF at {path}: {detail}")]
    BadBtf { path: PathBuf, detail: String },
    #[error("cannot write the recording to {path}: {source}")]
    Output { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("loading the eBPF object failed: {0}")]
    Load(String),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("unsupported architecture {0}")]
    Arch(&'static str),
    #[error(transparent)]
    Recording(#[from] crate::recording::RecordingError),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
}

impl RecordError {
    pub fn hint(&self) -> &str {
        match self {
            Self::NoTarget => "give -p PID (repeatable) and/or a command after `--`",
            Self::NotPermitted => "run as root (sudo), or grant CAP_BPF and CAP_PERFMON; see `infertrace doctor`",
            Self::NoBtf(_) | Self::BadBtf { .. } => {
                "use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or point INFERTRACE_BTF at a BTF file for this kernel"
            }
            Self::Output { .. } => "choose a writable path with -o FILE",
            Self::Target(e) => e.hint(),
            Self::Load(_) | Self::Probe(_) => "run `infertrace doctor` to check the kernel's eBPF support",
            Self::Arch(_) => "infertrace supports x86_64 and aarch64",
            Self::Recording(_) => "check free space and permissions of the output directory",
            Self::Signals(_) => "retry",
        }
    }
}

pub struct RecordOptions {
    pub pids: Vec<u32>,
    pub sched: SchedOptions,
    /// Syscalls at least this slow get stacks (None: off).
    pub slow_syscall: Option<Duration>,
    /// Attribute time to Python stacks in CPython processes.
    pub python: bool,
    /// Probe the CUDA runtime (libcudart) in the targets.
    pub cuda: bool,
    /// Also probe the CUDA driver API (libcuda) when `cuda` is on.
    pub cuda_driver: bool,
    /// NVML GPU samples per second while `cuda` is on (crate::nvml, 1-10).
    pub gpu_sample_hz: u32,
    pub command: Vec<String>,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
    pub quiet: bool,
}

/// Why the window closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
    TargetsExited,
}

pub struct Outcome {
    pub recording: Recording,
    pub path: PathBuf,
    pub reason: StopReason,
}

const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_PERFMON: u64 = 1 << 38;
const CAP_BPF: u64 = 1 << 39;

/// Root or CAP_BPF+CAP_PERFMON (CAP_SYS_ADMIN implies both on older kernels).
pub fn has_tracing_privileges() -> bool {
    let caps = procfs::own_effective_caps().unwrap_or(0);
    caps & CAP_SYS_ADMIN != 0 || (caps & CAP_BPF != 0 && caps & CAP_PERFMON != 0)
}

pub fn btf_path() -> PathBuf {
    std::env::var_os("INFERTRACE_BTF").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_BTF))
}

pub fn load_btf() -> Result<Btf, RecordError> {
    let path = btf_path();
    if !path.exists() {
        return Err(RecordError::NoBtf(path));
    }
    Btf::parse_file(&path, aya::Endianness::default())
        .map_err(|e| RecordError::BadBtf { path, detail: e.to_string() })
}

fn default_output() -> PathBuf {
    PathBuf::from(format!("infertrace-{}.itr", clock::local_timestamp()))
}

/// Creates the output file up front, so a bad path fails before any probe.
fn open_output(path: &Path) -> Result<File, RecordError> {
    let err = |source| RecordError::Output { path: path.to_owned(), source };
    if path.is_dir() {
        return Err(err(std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory")));
    }
    File::create(path).map_err(err)
}

struct TargetState {
    target: Target,
    alive: bool,
}

impl TargetState {
    fn observe(pid: u32, origin: Origin) -> Self {
        let info = procfs::process_info(pid);
        TargetState {
            target: Target {
                pid,
                ppid: info.ppid,
                comm: info.comm.unwrap_or_default(),
                exe: info.exe,
                cmdline: info.cmdline,
                origin,
                exit_code: None,
            },
            alive: true,
        }
    }

    /// Re-reads what exec changed (comm, exe, cmdline), keeping old values
    /// when the process is already gone.
    fn refresh(&mut self) {
        let info = procfs::process_info(self.target.pid);
        if let Some(c) = info.comm {
            self.target.comm = c;
        }
        if info.exe.is_some() {
            self.target.exe = info.exe;
        }
        if !info.cmdline.is_empty() {
            self.target.cmdline = info.cmdline;
        }
    }
}

fn load_object(btf: &Btf, tracefs: Option<&Path>, opts: &RecordOptions) -> Result<Ebpf, RecordError> {
    let sched = &opts.sched;
    let slow_ns = opts.slow_syscall.map(|d| d.as_nanos() as u64).unwrap_or(0);
    let arch = crate::system::arch_constants().ok_or(RecordError::Arch(std::env::consts::ARCH))?;
    let (nr_clone, nr_fork, nr_vfork, nr_clone3) = arch.nr_clone_family;
    let (pid_off, flags_off) = match tracefs {
        Some(t) => (
            tracefs::field_offset(t, "task", "task_newtask", "pid").unwrap_or(8),
            tracefs::field_offset(t, "task", "task_newtask", "clone_flags").unwrap_or(32),
        ),
        None => (8, 32),
    };
    let btf_file = btf_path();
    let offsets = BtfOffsets::load(&btf_file).map_err(|e| RecordError::BadBtf { path: btf_file.clone(), detail: e.to_string() })?;
    let task_off = |m: &str| {
        offsets
            .member_offset("task_struct", m)
            .map(u64::from)
            .map_err(|e| RecordError::BadBtf { path: btf_file.clone(), detail: e.to_string() })
    };
    let (task_pid, task_tgid) = (task_off("pid")?, task_off("tgid")?);
    // Optional: without it, missed switch-ins are not repaired.
    let task_exec: u64 = match (offsets.member_offset("task_struct", "se"), offsets.member_offset("sched_entity", "sum_exec_runtime")) {
        (Ok(se), Ok(sum)) => u64::from(se) + u64::from(sum),
        _ => 0,
    };
    let offcpu_stacks = (sched.enabled && sched.offcpu_stacks) as u32;
    let mut loader = EbpfLoader::new();
    loader
        .btf(Some(btf))
        .override_global("TASK_PID_OFFSET", &task_pid, true)
        .override_global("TASK_TGID_OFFSET", &task_tgid, true)
        .override_global("TASK_EXEC_OFFSET", &task_exec, true)
        .override_global("OFFCPU_STACKS_ENABLED", &offcpu_stacks, true)
        .override_global("NR_EXIT", &arch.nr_exit, true)
        .override_global("NR_EXIT_GROUP", &arch.nr_exit_group, true)
        .override_global("NR_FUTEX", &arch.nr_futex, true)
        .override_global("PT_REGS_ARG0_OFFSET", &arch.regs_arg0_offset, true)
        .override_global("CUDA_REGS_SP_OFFSET", &arch.regs_sp_offset, true)
        .override_global("CUDA_REGS_LR_OFFSET", &arch.regs_lr_offset, true)
        .override_global("SLOW_SYSCALL_NS", &slow_ns, true)
        .override_global("NR_CLONE", &nr_clone, true)
        .override_global("NR_FORK", &nr_fork, true)
        .override_global("NR_VFORK", &nr_vfork, true)
        .override_global("NR_CLONE3", &nr_clone3, true)
        .override_global("PT_REGS_NR_OFFSET", &arch.regs_nr_offset, true)
        .override_global("NEWTASK_PID_OFFSET", &pid_off, true)
        .override_global("NEWTASK_FLAGS_OFFSET", &flags_off, true);
    loader.load(probe::object_bytes()).map_err(|e| RecordError::Load(e.to_string()))
}

/// Runs one recording window. Probes are attached to file descriptors owned
/// by this process: whatever ends it (return, panic, SIGKILL), the kernel
/// detaches them.
pub async fn record(opts: RecordOptions, argv: Vec<String>) -> Result<Outcome, RecordError> {
    if opts.pids.is_empty() && opts.command.is_empty() {
        return Err(RecordError::NoTarget);
    }
    for &pid in &opts.pids {
        targets::validate_pid(pid)?;
    }
    if !has_tracing_privileges() {
        return Err(RecordError::NotPermitted);
    }
    let btf = load_btf()?;
    let out_path = opts.output.clone().unwrap_or_else(default_output);
    let out_file = open_output(&out_path)?;
    let result = record_inner(&opts, argv, &btf).await;
    match result {
        Ok((recording, reason)) => {
            recording.write_to(out_file, &out_path)?;
            Ok(Outcome { recording, path: out_path, reason })
        }
        Err(e) => {
            drop(out_file);
            let _ = std::fs::remove_file(&out_path);
            Err(e)
        }
    }
}

async fn record_inner(opts: &RecordOptions, argv: Vec<String>, btf: &Btf) -> Result<(Recording, StopReason), RecordError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).map_err(RecordError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RecordError::Signals)?;

    let mut notes = Vec::new();
    let tracefs_path = match tracefs::ensure_mounted() {
        Ok((p, mounted)) => {
            if mounted {
                notes.push(format!("mounted tracefs at {}", p.display()));
            }
            Some(p)
        }
        Err(e) => {
            notes.push(e.to_string());
            None
        }
    };
    let mut launched = if opts.command.is_empty() { None } else { Some(Launched::spawn(&opts.command)?) };

    let mut ebpf = load_object(btf, tracefs_path.as_deref(), opts)?;
    let mut symbolizer = Symbolizer::new();
    let mut python = PythonTargets::default();
    let mut cuda = CudaTracer::new();
    cuda.set_driver(opts.cuda_driver);
    let window_start = clock::monotonic_ns();
    set_window_start(&mut ebpf, window_start)?;
    // NVML in a thread of its own: loading it can take seconds.
    let gpu_sampler = opts.cuda.then(|| nvml::Sampler::start(nvml::SamplerOptions::new(opts.gpu_sample_hz, window_start)));
    let mut states: BTreeMap<u32, TargetState> = BTreeMap::new();
    for &pid in &opts.pids {
        process::add_target(&mut ebpf, pid, target_flags::EXPLICIT)?;
        states.insert(pid, TargetState::observe(pid, Origin::Attached));
        symbolizer.observe_process(pid);
        if opts.python {
            python.examine(&mut ebpf, pid, false)?;
        }
        if opts.cuda {
            notes.extend(cuda.scan(&mut ebpf, pid)?);
        }
        if opts.sched.enabled {
            SchedAccounting::seed_process(&mut ebpf, pid, window_start)?;
        }
    }
    if let Some(l) = &launched {
        process::add_target(&mut ebpf, l.pid, target_flags::LAUNCHED)?;
    }
    let mut follower = ProcessFollower::attach(&mut ebpf, btf, tracefs_path.as_deref())?;
    if let Some(r) = &follower.disabled_reason {
        notes.push(r.clone());
    }
    let mut sched = SchedAccounting::attach(&mut ebpf, btf, opts.sched)?;
    let mut accounting = SyscallAccounting::attach(&mut ebpf, btf)?;
    let started_unix_ms = clock::unix_ms();
    let t0 = Instant::now();
    if let Some(l) = launched.as_mut() {
        l.release()?;
        // What we exec'd is known; /proc may still show the pre-exec fork.
        let mut st = TargetState::observe(l.pid, Origin::Launched);
        st.target.exe = Some(l.path.display().to_string());
        st.target.cmdline = l.argv.clone();
        st.target.comm = l.path.file_name().map(|n| n.to_string_lossy().chars().take(15).collect()).unwrap_or_default();
        states.insert(l.pid, st);
        symbolizer.observe_process(l.pid);
    }

    let status = StatusLine::new(opts.quiet);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut py_tick = tokio::time::interval(PYTHON_REFRESH);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticks: u64 = 0;
    // (pid, tick): processes whose mappings to snapshot again.
    let mut reobserve: Vec<(u32, u64)> = Vec::new();
    let reason = loop {
        tokio::select! {
            _ = sigint.recv() => break StopReason::Signal,
            _ = sigterm.recv() => break StopReason::Signal,
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() => break StopReason::Duration,
            // New Python threads get their thread state into the kernel map
            // quickly: until then their samples carry native frames only.
            _ = py_tick.tick(), if opts.python => python.refresh_all(&mut ebpf)?,
            _ = tick.tick() => {
                ticks += 1;
                let events = follower.poll();
                if opts.python {
                    python_lifecycle(&mut ebpf, &mut python, &events, ticks.is_multiple_of(3))?;
                }
                if opts.cuda {
                    for ev in &events {
                        if let Lifecycle::Forked { pid, .. } | Lifecycle::Execed { pid, .. } = ev {
                            notes.extend(cuda.scan(&mut ebpf, *pid)?);
                        }
                    }
                    // Also re-scans the known targets whose maps changed
                    // (PyTorch loads CUDA lazily, with dlopen).
                    cuda.poll(&mut ebpf)?;
                }
                // Snapshot the mappings of new images again once the
                // dynamic loader has mapped their libraries.
                for ev in &events {
                    if let Lifecycle::Forked { pid, .. } | Lifecycle::Execed { pid, .. } = ev {
                        reobserve.push((*pid, ticks + 2));
                    }
                }
                apply_lifecycle(&mut states, events, &mut symbolizer);
                reobserve.retain(|&(pid, due)| {
                    if due > ticks {
                        return true;
                    }
                    symbolizer.observe_process(pid);
                    false
                });
                if let Some(l) = launched.as_mut() {
                    if let Some(code) = l.reap(false) {
                        if let Some(s) = states.get_mut(&l.pid) { s.target.exit_code = Some(code); }
                    }
                }
                let alive = sweep_targets(&mut ebpf, &mut states)?;
                if ticks.is_multiple_of(10) {
                    accounting.drain(&mut ebpf, true)?;
                    sched.drain(&mut ebpf)?;
                    // Libraries loaded since (dlopen): keep the snapshots current.
                    for st in states.values().filter(|s| s.alive) {
                        symbolizer.observe_process(st.target.pid);
                    }
                }
                status.show(t0.elapsed(), alive, accounting.total_calls());
                if alive == 0 {
                    break StopReason::TargetsExited;
                }
            }
        }
    };
    let window_end = clock::monotonic_ns();
    let gpu_sampling = gpu_sampler.map(|s| s.finish(window_end));
    status.clear();
    apply_lifecycle(&mut states, follower.poll(), &mut symbolizer);
    let live_pids: Vec<u32> = states.values().filter(|s| s.alive && procfs::is_alive(s.target.pid)).map(|s| s.target.pid).collect();
    let attached: Vec<u32> = states.values().filter(|s| s.target.origin == Origin::Attached).map(|s| s.target.pid).collect();
    let syscalls = accounting.finish(&mut ebpf, (window_start, window_end), &live_pids, &attached)?;
    let all_pids: Vec<u32> = states.keys().copied().collect();
    python.resolve_new(&mut ebpf)?;
    let mut resolver = StackResolver::load(&mut ebpf, &mut symbolizer, &mut python)?;
    let sched = sched.finish(&mut ebpf, window_end, &all_pids, &syscalls, &mut resolver)?;
    let mut stacks = sched.stacks;
    stacks.extend(syscalls::slow_syscall_stacks(&mut ebpf, std::env::consts::ARCH, &all_pids, &mut resolver)?);
    let mut cuda_report = if cuda.active() {
        Some(cuda.finish(&mut ebpf, &mut resolver, window_end.saturating_sub(window_start))?)
    } else {
        None
    };
    if let Some(g) = gpu_sampling {
        g.merge_into(&mut cuda_report, &mut notes, window_end.saturating_sub(window_start));
    }
    drop(resolver);
    python.finish_notes();
    notes.append(&mut python.notes);
    for (pid, version) in python.versions() {
        notes.push(format!("pid {pid}: CPython {version}, Python stacks attributed"));
    }
    if let Some(l) = launched.as_mut() {
        if let Some(code) = l.reap(false) {
            if let Some(s) = states.get_mut(&l.pid) {
                s.target.exit_code = Some(code);
            }
        }
    }
    // Processes seen only through their syscalls (a fork event lost).
    for s in &syscalls {
        states.entry(s.pid).or_insert_with(|| TargetState::observe(s.pid, Origin::Followed));
    }
    let mut lost: BTreeMap<String, u64> = process::lost_counters(&mut ebpf)?.into_iter().collect();
    // A stack cut at the depth limit is kept (its leaf frames are there):
    // reported, but not a lost event.
    if let Some(n) = lost.remove(TRUNCATED_COUNTER) {
        notes.push(format!("{n} Python stacks were deeper than {PY_MAX_DEPTH} frames and were cut at their root end"));
    }
    drop(ebpf); // detaches everything still attached
    let recording = Recording {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host_info(),
        started_unix_ms,
        duration_ns: window_end.saturating_sub(window_start),
        argv,
        targets: states.into_values().map(|s| s.target).collect(),
        syscalls,
        threads: sched.threads,
        stacks,
        runqueue_hist: sched.runqueue_hist,
        sample_hz: sched.sample_hz,
        cuda: cuda_report,
        lost,
        notes,
    };
    Ok((recording, reason))
}

fn apply_lifecycle(states: &mut BTreeMap<u32, TargetState>, events: Vec<Lifecycle>, symbolizer: &mut Symbolizer) {
    for ev in events {
        match ev {
            Lifecycle::Forked { pid, parent, comm } => {
                symbolizer.observe_process(pid);
                let st = states.entry(pid).or_insert_with(|| TargetState::observe(pid, Origin::Followed));
                st.target.ppid = Some(parent);
                if st.target.comm.is_empty() {
                    st.target.comm = comm;
                }
            }
            Lifecycle::Execed { pid, comm } => {
                let st = states.entry(pid).or_insert_with(|| TargetState::observe(pid, Origin::Followed));
                st.target.comm = comm;
                if st.target.origin == Origin::Followed {
                    // What fork copied from the parent is stale after exec.
                    st.target.exe = None;
                    st.target.cmdline.clear();
                }
                st.refresh();
                symbolizer.observe_process(pid);
            }
            Lifecycle::Exited { pid } => {
                if let Some(st) = states.get_mut(&pid) {
                    st.refresh();
                }
            }
        }
    }
}

/// Adds targets the kernel followed but whose events we missed, marks the
/// dead, and removes them from the kernel set (so a reused pid is not
/// traced). Returns how many are alive.
fn sweep_targets(ebpf: &mut Ebpf, states: &mut BTreeMap<u32, TargetState>) -> Result<usize, RecordError> {
    for pid in process::kernel_targets(ebpf)? {
        states.entry(pid).or_insert_with(|| TargetState::observe(pid, Origin::Followed));
    }
    let mut alive = 0;
    for st in states.values_mut().filter(|s| s.alive) {
        if procfs::is_alive(st.target.pid) {
            alive += 1;
        } else {
            st.alive = false;
            process::remove_target(ebpf, st.target.pid)?;
        }
    }
    Ok(alive)
}

/// Python processes: examine new and exec'd ones; resolve new stacks every
/// `resolve` tick (the thread maps are refreshed every `PYTHON_REFRESH`).
fn python_lifecycle(ebpf: &mut Ebpf, python: &mut PythonTargets, events: &[Lifecycle], resolve: bool) -> Result<(), RecordError> {
    for ev in events {
        match ev {
            Lifecycle::Forked { pid, .. } => python.examine(ebpf, *pid, false)?,
            Lifecycle::Execed { pid, .. } => python.examine(ebpf, *pid, true)?,
            Lifecycle::Exited { pid } => python.exited(ebpf, *pid)?,
        }
    }
    if resolve {
        python.resolve_new(ebpf)?;
    }
    Ok(())
}

fn set_window_start(ebpf: &mut Ebpf, start: u64) -> Result<(), RecordError> {
    let map = ebpf.map_mut("WINDOW").ok_or(ProbeError::MissingMap("WINDOW"))?;
    let mut arr: Array<&mut MapData, u64> = Array::try_from(map).map_err(|e| ProbeError::map("WINDOW", e))?;
    arr.set(0, start, 0).map_err(|e| ProbeError::map("WINDOW", e))?;
    Ok(())
}

fn host_info() -> HostInfo {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).unwrap_or_default();
    HostInfo {
        hostname: read("/proc/sys/kernel/hostname"),
        kernel_release: read("/proc/sys/kernel/osrelease"),
        arch: std::env::consts::ARCH.to_owned(),
    }
}

/// The one-line status on stderr: rewritten in place on a terminal, a line
/// every 5 s otherwise, nothing with `-q`.
struct StatusLine {
    enabled: bool,
    tty: bool,
    last: std::cell::Cell<Option<Instant>>,
}

impl StatusLine {
    fn new(quiet: bool) -> Self {
        Self { enabled: !quiet, tty: std::io::stderr().is_terminal(), last: std::cell::Cell::new(None) }
    }

    fn show(&self, elapsed: Duration, alive: usize, syscalls: u64) {
        if !self.enabled {
            return;
        }
        let every = if self.tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
        if self.last.get().is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last.set(Some(Instant::now()));
        let line = format!(
            "infertrace: recording {:.1}s, {} target{} alive, {} syscalls",
            elapsed.as_secs_f64(),
            alive,
            if alive == 1 { "" } else { "s" },
            syscalls
        );
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
        let _ = err.flush();
    }

    fn clear(&self) {
        if self.enabled && self.tty && self.last.get().is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}
