//! The CUDA collector's lifecycle: when a target appears or execs, it
//! probes every libcudart/libcuda the target could load
//! ([`search`](super::search): its LD_LIBRARY_PATH, its interpreter's
//! site-packages, the loader cache...) before it loads one, and those it
//! has mapped ([`discovery`](super::discovery)); uprobes go on every file
//! once (shared by all the processes that map it; the kernel filters on the
//! target set). A library loaded later from elsewhere (dlopen of a path) is
//! found when the kernel reports the target's new executable mapping
//! ([`TargetEvent::Mapped`], delivered at once: the session wakes on the
//! process follower's ring buffer), then its maps are scanned again; without
//! those events (`TargetSet::mappings_followed` false), every 100 ms. Each poll replays the per-call
//! events ([`replay`](super::replay); a thread of their own drains them
//! every 10 ms, [`drain`](super::drain)) and, every 4 s, moves the entries of
//! threads that exited out of the kernel maps.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap as BpfHashMap, RingBuf},
    Ebpf,
};
use tracer_common::cuda::{api, CudaKey, CudaStats, CudaText, LaunchKey, TEXT_RANGES};

use super::{
    discovery,
    drain::EventDrain,
    driver_gate::DriverGate,
    slicer::LaunchSlicer,
    findings::Thresholds,
    programs,
    search::{self, TargetFacts},
};
use crate::{
    engine::{Part, Collector, Cx, Handle, TargetEvent, Topic},
    os::probe::{self, ProbeError},
    os::clock,
    os::procfs::{self, open_in_root},
    recording::{Origin, Recording},
    os::symbolize::{Symbolizer, UNKNOWN},
};

/// Notes what could not be probed in `pid` (`what`: the library, or the
/// CUDA driver's per-process probes); a process that exited meanwhile
/// (every attach then fails with ESRCH) gets one line, not one per function.
fn note_attach_errors(cx: &mut Cx<'_>, pid: u32, what: &str, errors: Vec<String>) {
    if errors.is_empty() {
        return;
    }
    if !procfs::is_alive(pid) {
        let n = errors.len();
        cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {what}: exited before it could be probed ({n} probes not attached)"));
        return;
    }
    for e in errors {
        cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {what}: {e}"));
    }
}

/// Polls (100 ms each) between moves of dead threads' entries out of the kernel.
const RETIRE_EVERY_POLLS: u64 = 40;
/// Polls between namings of the kernels launched.
const NAME_KERNELS_EVERY_POLLS: u64 = 4;

pub(super) struct Attached {
    pub path: String,
    pub functions: Vec<&'static str>,
    /// The targets seen mapping it (empty for a file probed up front that
    /// no target has mapped yet, or whose user exited before its maps were
    /// read).
    pub pids: BTreeSet<u32>,
}

#[derive(Default)]
struct ProcState {
    /// Hash of the last maps text examined.
    maps_hash: u64,
    /// Maps at least one probed file.
    uses_cuda: bool,
    alive: bool,
}

/// The options the CUDA family reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaOptions {
    /// Probe the driver API too (`--no-cuda-driver` turns it off).
    pub driver: bool,
    /// `--max-overhead`: launches probed in slices sized to this budget.
    pub max_overhead: Option<f64>,
    /// `--timeline-limit` with `--timeline`: per-call events kept.
    pub timeline_limit: Option<u64>,
    /// `-q`: no progress line while probes are released.
    pub quiet: bool,
}

#[derive(Default)]
pub struct CudaCollector {
    /// What the options ask of this family.
    opts: CudaOptions,
    pub(super) thresholds: Thresholds,
    /// None: not loaded yet; Some(false): loading failed (noted).
    loaded: Option<bool>,
    /// The programs and every probe attached (None until loaded, and
    /// after the window closed).
    probes: Option<programs::CudaProbes>,
    /// The per-call events and their replay (None until loaded).
    pub(super) events: Option<EventDrain>,
    /// (st_dev, st_ino) -> what was attached there.
    pub(super) attached: HashMap<(u64, u64), Attached>,
    /// (maps device, inode) -> identity of a probed file, or None (not a
    /// CUDA runtime, or could not be opened).
    examined: HashMap<(String, u64), Option<(u64, u64)>>,
    /// Identities of the files [`search`](super::search) found that are
    /// not CUDA libraries (or could not be probed): not opened again.
    not_cuda: HashSet<(u64, u64)>,
    /// Hashes of the (root identity, facts) already searched: forks and
    /// shims that share them are not searched twice. Bounded (a process
    /// per environment, as the agent sees, would grow it for good): past
    /// [`SEARCHED_MAX`] it starts over, which costs a search again.
    searched: HashSet<u64>,
    procs: BTreeMap<u32, ProcState>,
    pub(super) kernel_names: HashMap<(u32, u64), String>,
    polls: u64,
    /// Aggregates of threads that exited, moved out of the kernel maps
    /// (keys are per thread; `tid` is 0 here).
    pub(super) retired_stats: HashMap<CudaKey, CudaStats>,
    pub(super) retired_launches: HashMap<LaunchKey, u64>,
    /// The window closed: the programs are unloaded, nothing is scanned.
    detached: bool,
    /// Driver libraries probed per process and function, their probes
    /// taken off where only the runtime reaches them.
    pub(super) gate: DriverGate,
    /// `--max-overhead`: the launch probes, attached in time slices.
    pub(super) slicer: Option<LaunchSlicer>,
    /// `CUDA_USDT_SPECS` entries in use (USDT probe sites attached).
    usdt_specs: u32,
    /// The programs being loaded on a thread of their own (the verifier
    /// takes ~0.5 s here), started when a running target first needs them.
    loading: Option<std::thread::JoinHandle<Option<HashMap<&'static str, std::os::fd::OwnedFd>>>>,
    /// Targets whose libraries wait for those programs: scanned and
    /// searched again once they are loaded.
    deferred: BTreeSet<u32>,
    /// Load in the foreground (a launched command is held meanwhile).
    hold: bool,
}

/// At most this many searches remembered ([`CudaCollector::searched`]).
const SEARCHED_MAX: usize = 4096;

fn hash_text(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Writes the code ranges of `pid`'s probed runtime ([0]) and driver ([1])
/// to `CUDA_TEXT` (a driver launch returning into the runtime's is nested).
fn publish_text(cx: &mut Cx<'_>, pid: u32, text: &[(u64, u64)]) -> Result<(), ProbeError> {
    let mut flat: CudaText = [0; 2 * TEXT_RANGES];
    for (i, (start, end)) in text.iter().take(TEXT_RANGES).enumerate() {
        flat[2 * i] = *start;
        flat[2 * i + 1] = *end;
    }
    if text.len() > TEXT_RANGES {
        cx.sink.note_on(
            Topic::Gpu,
            format!("pid {pid}: {} probed CUDA libraries, more than the {TEXT_RANGES} whose code is told apart: driver launches from the others' runtimes may be counted twice", text.len()),
        );
    }
    let mut map: BpfHashMap<_, u32, CudaText> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::CUDA_TEXT)?;
    if let Err(e) = map.insert(pid, flat, 0) {
        cx.sink.note_on(Topic::Gpu, format!("pid {pid}: driver launches made inside runtime calls may be counted twice: {e}"));
    }
    Ok(())
}

impl CudaCollector {
    /// Whether some CUDA library was probed.
    pub fn active(&self) -> bool {
        !self.attached.is_empty()
    }

    /// Whether there is something to report: a target mapped a probed
    /// library, or calls were counted (a target that exited before its
    /// maps were read, on a library probed up front).
    fn used(&self, ebpf: &mut Ebpf) -> Result<bool, ProbeError> {
        let events = self.events.as_ref().map_or(0, |d| d.with(|r| r.events));
        if self.attached.values().any(|a| !a.pids.is_empty()) || events > 0 || !self.retired_stats.is_empty() {
            return Ok(true);
        }
        if self.attached.is_empty() {
            return Ok(false);
        }
        let stats: BpfHashMap<_, CudaKey, CudaStats> = probe::hash_map(ebpf, tracer_common::maps::CUDA_STATS)?;
        if stats.keys().next().is_some() {
            return Ok(true);
        }
        let launches: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, tracer_common::maps::CUDA_LAUNCHES)?;
        Ok(launches.keys().next().is_some())
    }

    /// Probes, before the target loads one, every CUDA library it could
    /// load ([`search::candidates`]), unless this (root, facts) was
    /// searched already.
    fn search(&mut self, cx: &mut Cx<'_>, pid: u32, facts: TargetFacts) -> Result<(), ProbeError> {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let Ok(root_meta) = std::fs::metadata(&root) else { return Ok(()) };
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (root_meta.dev(), root_meta.ino(), &facts).hash(&mut h);
            h.finish()
        };
        if self.searched.len() >= SEARCHED_MAX {
            self.searched.clear();
        }
        if !self.searched.insert(key) {
            return Ok(());
        }
        let mapped: HashSet<u64> = procfs::maps(pid).unwrap_or_default().iter().map(|m| m.inode).collect();
        let driver = self.opts.driver;
        search::candidates(&root, &facts, driver, |found| self.probe_found(cx, pid, &root, &found, &mapped))?;
        // Programs still loading: this search runs again once they are.
        if self.deferred.contains(&pid) {
            self.searched.remove(&key);
        }
        Ok(())
    }

    /// Opens a file [`search`](super::search) found (inside the target's
    /// root) and probes it when it is a CUDA library not probed yet. The
    /// uprobes are attached through `/proc/self/fd/N` of the opened file:
    /// the kernel probes exactly the inode checked, whatever the target
    /// does to its paths meanwhile.
    /// `mapped`: the inodes the target maps (a file among them was loaded
    /// before it could be probed; the note says so).
    fn probe_found(
        &mut self,
        cx: &mut Cx<'_>,
        pid: u32,
        root: &Path,
        found: &search::Found,
        mapped: &HashSet<u64>,
    ) -> Result<(), ProbeError> {
        let Ok(file) = open_in_root(root, Path::new(&found.path)) else { return Ok(()) };
        let Ok(meta) = file.metadata() else { return Ok(()) };
        let identity = (meta.dev(), meta.ino());
        if !meta.is_file() || self.attached.contains_key(&identity) || self.not_cuda.contains(&identity) {
            return Ok(());
        }
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        if discovery::is_torch_allocator_name(Path::new(&found.path).file_name().and_then(|n| n.to_str()).unwrap_or("")) {
            let when = if mapped.contains(&identity.1) { ", once it was loaded (earlier calls missed)" } else { ", before it was loaded" };
            let when = format!("{when} (in {})", found.source.describe());
            if !self.attach_torch(cx, pid, identity, &file, &by_fd, &found.path, BTreeSet::new(), &when)? && !self.deferred.contains(&pid) {
                self.not_cuda.insert(identity);
            }
            return Ok(());
        }
        let symbols = match discovery::cuda_symbols(&file, &found.path) {
            Ok(s) if !s.is_empty() => s,
            _ => {
                self.not_cuda.insert(identity);
                return Ok(());
            }
        };
        if !self.ready(cx, pid)? {
            return Ok(());
        }
        let (functions, errors) = self.attach_file_for(cx, pid, identity, &file, &by_fd, &found.path, &symbols)?;
        let shown = &found.path;
        note_attach_errors(cx, pid, shown, errors);
        if functions.is_empty() {
            self.not_cuda.insert(identity);
            return Ok(());
        }
        let driver = functions.iter().any(|f| api::is_driver_name(f));
        let when = if mapped.contains(&identity.1) {
            "probed once it was loaded (earlier calls missed)"
        } else {
            "probed before it was loaded"
        };
        cx.sink.note_on(Topic::Gpu, format!(
            "pid {pid}: CUDA {} {shown} (in {}): {} functions {when}",
            if driver { "driver" } else { "runtime" },
            found.source.describe(),
            functions.len()
        ));
        self.attached.insert(identity, Attached { path: shown.clone(), functions, pids: BTreeSet::new() });
        Ok(())
    }

    /// Scan a target's maps; attach probes to any libcudart not yet
    /// attached, and (when its executable, environment or libpython
    /// changed) to those it could load ([`search`](Self::search)).
    /// `mapped_at`: the kernel's time of the executable mapping that made
    /// this scan, if one did (the note of a library probed now says how
    /// long after it was mapped).
    fn scan(&mut self, cx: &mut Cx<'_>, pid: u32, mapped_at: Option<u64>) -> Result<(), ProbeError> {
        let st = self.procs.entry(pid).or_insert_with(|| ProcState { alive: true, ..Default::default() });
        if !st.alive {
            st.alive = true;
            st.maps_hash = 0;
        }
        let Ok(text) = procfs::maps_text(pid) else {
            st.alive = false;
            return Ok(());
        };
        let h = hash_text(&text);
        if h == st.maps_hash {
            return Ok(());
        }
        st.maps_hash = h;
        let maps = procfs::maps_as_seen_by(pid, discovery::parse_maps(&text));
        let libpython = maps.iter().find(|m| m.basename().starts_with("libpython")).map(|m| m.path().to_owned());
        let exe = procfs::exe(pid).map(|p| p.trim_end_matches(" (deleted)").to_owned());
        let mut uses = false;
        // Code ranges of the probed runtimes and driver.
        let mut text: Vec<(u64, u64)> = Vec::new();
        let driver = self.opts.driver;
        let mut cands: Vec<discovery::Candidate> = discovery::candidates(&maps, exe.as_deref())
            .into_iter()
            .filter(|c| driver || !discovery::is_driver_name(c.line.basename()))
            .collect();
        // Runtimes first, each one's code range in `CUDA_TEXT` before the
        // next file is probed: the driver's launch probe, attached for this
        // process when its file is examined, then never takes a runtime
        // launch's nested driver launch for a direct one (a double count,
        // and a "direct call" that kept the driver gate from acting).
        cands.sort_by_key(|c| discovery::is_driver_name(c.line.basename()));
        for cand in cands {
            let key = cand.line.file_key();
            let identity = match self.examined.get(&key) {
                Some(known) => *known,
                None => {
                    let id = self.examine(cx, pid, &cand, mapped_at)?;
                    if self.deferred.contains(&pid) {
                        // Examined again once the programs are loaded.
                        if let Some(st) = self.procs.get_mut(&pid) {
                            st.maps_hash = 0;
                        }
                        continue;
                    }
                    self.examined.insert(key, id);
                    id
                }
            };
            let Some(a) = identity.and_then(|id| self.attached.get_mut(&id)) else { continue };
            a.pids.insert(pid);
            uses = true;
            // Where its code is in this process: a driver launch
            // returning into it is a probed call's own.
            // (For a runtime linked into the executable that is the
            // whole program's code: a driver launch the program
            // itself makes is then taken for the runtime's.)
            if let Some(r) = discovery::text_range(&maps, &cand.line).filter(|r| !text.contains(r)) {
                text.push(r);
                publish_text(cx, pid, &text)?;
            }
        }
        // Then what it could load later (after the mapped files, so that
        // their code ranges are known before any driver probe of its own).
        self.search(cx, pid, TargetFacts::read(pid, libpython))?;
        if uses {
            // Its own probes on the driver libraries probed per process.
            if let Some(probes) = self.probes.as_ref() {
                let errors = self.gate.attach_all(probes, pid, self.slicer.as_ref());
                note_attach_errors(cx, pid, "CUDA driver", errors);
            }
            // Kernel names and native sites are symbolized in this process.
            cx.stacks.symbolizer.reobserve_process(pid);
            if let Some(st) = self.procs.get_mut(&pid) {
                st.uses_cuda = true;
            }
        }
        Ok(())
    }

    /// Opens a candidate file and probes it when it holds a CUDA runtime;
    /// returns its identity when probed (now or before).
    fn examine(
        &mut self,
        cx: &mut Cx<'_>,
        pid: u32,
        cand: &discovery::Candidate,
        mapped_at: Option<u64>,
    ) -> Result<Option<(u64, u64)>, ProbeError> {
        let shown = cand.line.path().to_owned();
        let (opened, attach_path) = match discovery::open_mapped(pid, &cand.line) {
            Ok(o) => o,
            Err(e) => {
                if !cand.linked_in {
                    cx.sink.note_on(Topic::Gpu, format!("pid {pid}: cannot open {shown} to probe CUDA: {e}"));
                }
                return Ok(None);
            }
        };
        if self.attached.contains_key(&opened.identity) {
            return Ok(Some(opened.identity));
        }
        if discovery::is_torch_allocator_name(cand.line.basename()) {
            let probed = self.attach_torch(cx, pid, opened.identity, &opened.file, &attach_path, &shown, BTreeSet::from([pid]), "")?;
            return Ok(probed.then_some(opened.identity));
        }
        // A runtime or NCCL linked in statically (CuPy, JAX, PyTorch), told
        // by the names in its symbol tables before they are looked up.
        let (mut runtime_in, mut nccl_in) = (false, false);
        if cand.linked_in {
            (runtime_in, nccl_in) = discovery::linked_in(&opened.file);
            if !runtime_in && !nccl_in {
                if discovery::is_stripped_runtime_carrier(cand.line.basename()) {
                    cx.sink.note_on(Topic::Gpu, format!(
                        "pid {pid}: {shown} carries its own CUDA runtime, stripped (no names to probe): its work is seen only as the driver calls it makes (its kernels as driver launches; none with --no-cuda-driver)"
                    ));
                }
                return Ok(None);
            }
        }
        let mut symbols = match discovery::cuda_symbols(&opened.file, &shown) {
            Ok(s) => s,
            Err(e) => {
                if !cand.linked_in {
                    cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {shown}: not a readable ELF file ({e}); CUDA not traced"));
                }
                return Ok(None);
            }
        };
        if cand.linked_in {
            // Its runtime's and NCCL's functions only: a static runtime
            // reaches the driver through libcuda.
            runtime_in &= discovery::is_runtime(&symbols);
            symbols.retain(|(id, _)| if api::is_nccl(*id) { nccl_in } else { runtime_in && !api::is_driver(*id) });
            if symbols.is_empty() {
                return Ok(None);
            }
        }
        if symbols.is_empty() {
            cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {shown} exports none of the CUDA runtime functions traced"));
            return Ok(None);
        }
        if !self.ready(cx, pid)? {
            return Ok(None);
        }
        let attach_start = clock::monotonic_ns();
        let (functions, errors) =
            self.attach_file_for(cx, pid, opened.identity, &opened.file, &attach_path, &shown, &symbols)?;
        let attach_ms = clock::monotonic_ns().saturating_sub(attach_start) as f64 / 1e6;
        note_attach_errors(cx, pid, &shown, errors);
        if functions.is_empty() {
            return Ok(None);
        }
        let driver = functions.iter().any(|f| api::is_driver_name(f));
        // How long its code ran unprobed: calls made in that window are
        // missed (docs/cuda.md, "Libraries loaded later").
        let late = mapped_at.map_or(String::new(), |t| {
            let ms = clock::monotonic_ns().saturating_sub(t) as f64 / 1e6;
            format!(" {ms:.1} ms after it was mapped (attaching took {attach_ms:.1} ms)")
        });
        cx.sink.note_on(Topic::Gpu, format!(
            "pid {pid}: CUDA {} {shown}{}: {} functions probed{late}",
            if driver {
                "driver"
            } else if functions.iter().all(|f| f.starts_with("nccl")) {
                "NCCL"
            } else {
                "runtime"
            },
            if cand.linked_in { " (linked statically)" } else { "" },
            functions.len()
        ));
        self.attached.insert(
            opened.identity,
            Attached { path: shown.clone(), functions, pids: BTreeSet::from([pid]) },
        );
        Ok(Some(opened.identity))
    }

    /// PyTorch's caching allocator (`libc10_cuda.so`): its USDT probes
    /// `pytorch:malloc` and `pytorch:free`, attached with their semaphores
    /// (the kernel raises them: torch then computes the arguments), in
    /// every process. `pids`: those that map it; `when`: for the note.
    /// Whether it was probed.
    #[allow(clippy::too_many_arguments)]
    fn attach_torch(
        &mut self,
        cx: &mut Cx<'_>,
        pid: u32,
        identity: (u64, u64),
        file: &std::fs::File,
        attach_path: &Path,
        shown: &str,
        pids: BTreeSet<u32>,
        when: &str,
    ) -> Result<bool, ProbeError> {
        let (sites, skipped) = match discovery::torch_usdt_sites(file, shown) {
            Ok(s) => s,
            Err(e) => {
                cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {shown}: not a readable ELF file ({e}); PyTorch's allocator not traced"));
                return Ok(false);
            }
        };
        note_attach_errors(cx, pid, shown, skipped);
        if sites.is_empty() {
            cx.sink.note_on(Topic::Gpu, format!(
                "pid {pid}: {shown} has no usable USDT probes pytorch:malloc/pytorch:free (a build without them): tensors are not tracked, only the allocator's cudaMalloc segments"
            ));
            return Ok(false);
        }
        if !self.ready(cx, pid)? {
            return Ok(false);
        }
        let Some(probes) = self.probes.as_mut() else { return Ok(false) };
        if let Err(e) = probes.attach_usdt(&mut cx.kernel.ebpf, attach_path, &sites, self.usdt_specs) {
            cx.sink.note_on(Topic::Gpu, format!("pid {pid}: {shown}: PyTorch's allocator probes not attached ({e}): tensors are not tracked"));
            return Ok(false);
        }
        self.usdt_specs += sites.len() as u32;
        let count = |id: u32| sites.iter().filter(|s| s.spec.api == id).count();
        let (mallocs, frees) = (count(api::TORCH_MALLOC), count(api::TORCH_FREE));
        cx.sink.note_on(Topic::Gpu, format!(
            "pid {pid}: PyTorch caching allocator {shown}: USDT pytorch:malloc ({mallocs} sites) and pytorch:free ({frees} sites) probed{when}"
        ));
        let functions = [(api::TORCH_MALLOC, mallocs), (api::TORCH_FREE, frees)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(id, _)| api::NAMES[id as usize])
            .collect();
        self.attached.insert(identity, Attached { path: shown.to_owned(), functions, pids });
        Ok(true)
    }

    /// Attaches the probes of one file found for `pid`: a driver library,
    /// where probes can be per process, in `pid` only ([`DriverGate`]),
    /// anything else in every process.
    #[allow(clippy::too_many_arguments)]
    fn attach_file_for(
        &mut self,
        cx: &mut Cx<'_>,
        pid: u32,
        identity: (u64, u64),
        file: &std::fs::File,
        path: &Path,
        shown: &str,
        symbols: &[(u32, u64)],
    ) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
        let driver = !symbols.is_empty() && symbols.iter().all(|&(id, _)| api::is_driver(id));
        if let Some(probes) = self.probes.as_ref().filter(|p| driver && p.per_process()) {
            if let Ok(kept) = file.try_clone() {
                self.gate.register(identity, kept, shown, symbols);
                return Ok(self.gate.attach(probes, pid, identity, self.slicer.as_ref()));
            }
        }
        self.attach_file(cx, path, symbols)
    }

    /// Attaches the probes of one file (the programs are loaded).
    fn attach_file(
        &mut self,
        cx: &mut Cx<'_>,
        path: &Path,
        symbols: &[(u32, u64)],
    ) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
        let Some(probes) = self.probes.as_mut() else { return Ok((Vec::new(), Vec::new())) };
        let Some(slicer) = self.slicer.as_ref() else { return probes.attach_file(&mut cx.kernel.ebpf, path, symbols) };
        // `--max-overhead`: the launch functions are the slicer's.
        type Symbols = Vec<(u32, u64)>;
        let (launches, rest): (Symbols, Symbols) = symbols.iter().partition(|(id, _)| api::is_launch(*id));
        let (mut done, mut errors) = probes.attach_file(&mut cx.kernel.ebpf, path, &rest)?;
        if !launches.is_empty() {
            let shown = path.display().to_string();
            let added = std::fs::File::open(path)
                .map_err(|e| format!("opening {shown} to sample its launches: {e}"))
                .and_then(|f| probes.slice_targets(&f, &shown, &launches, None))
                .and_then(|ts| ts.into_iter().try_for_each(|t| slicer.add(t)));
            match added {
                Ok(()) => done.extend(launches.iter().map(|(id, _)| api::NAMES[*id as usize])),
                Err(e) => errors.push(e),
            }
        }
        Ok((done, errors))
    }

    /// `--max-overhead`: starts the slicer of the launch probes (multi-uprobe links only).
    fn start_slicer(&mut self, cx: &mut Cx<'_>, budget: f64) {
        let Some(probes) = self.probes.as_ref() else { return };
        let progs: Result<Vec<OwnedFd>, String> = ["cuda_launch", "cuda_launch_ex"]
            .iter()
            .map(|name| {
                probes
                    .program_fd(name)
                    .ok_or_else(|| "sampling them needs multi-uprobe links, Linux 6.6+".to_owned())?
                    .try_clone_to_owned()
                    .map_err(|e| format!("duplicating {name}: {e}"))
            })
            .collect();
        let started = progs.and_then(|p| {
            LaunchSlicer::start(budget, cx.calibration.uprobe_ns, p, &cx.kernel.map_fds).map_err(|e| e.to_string())
        });
        match started {
            Ok(s) => self.slicer = Some(s),
            Err(e) => cx.sink.note_on(Topic::Gpu, format!("--max-overhead: CUDA launches are probed all the time ({e})")),
        }
    }

    /// Whether the programs are loaded, for target `pid`'s probes. A
    /// running target does not wait the ~0.5 s they take through the
    /// verifier: they load on a thread of their own (multi-uprobe links),
    /// `pid` is deferred (false), and [`poll`](Collector::poll) scans and
    /// searches it again once they are in. Meanwhile the session goes on
    /// (the Python collector sets up a new interpreter's stack walk: a short
    /// program exec'd by a shell was otherwise gone before it could be).
    fn ready(&mut self, cx: &mut Cx<'_>, pid: u32) -> Result<bool, ProbeError> {
        if self.loaded.is_some() || self.hold || !crate::os::uprobe_multi::supported() {
            return self.ensure_loaded(cx);
        }
        if self.loading.as_ref().is_some_and(|h| h.is_finished()) {
            return self.ensure_loaded(cx);
        }
        if self.loading.is_none() {
            let maps = cx.kernel.map_fds.try_clone();
            let btf = cx.kernel.btf.btf.clone();
            let names: Vec<&'static str> = programs::TABLE.programs.iter().map(|p| p.name).collect();
            let spawned = maps.and_then(|maps| {
                std::thread::Builder::new()
                    .name("infertrace-cuda-load".into())
                    .spawn(move || crate::os::uprobe_multi::load_programs(&names, &maps, &btf).ok())
            });
            match spawned {
                Ok(h) => self.loading = Some(h),
                Err(_) => return self.ensure_loaded(cx),
            }
        }
        self.deferred.insert(pid);
        Ok(false)
    }

    /// Loads the programs (or takes them from the thread loading them) and
    /// starts the event drain, once; whether they are loaded.
    fn ensure_loaded(&mut self, cx: &mut Cx<'_>) -> Result<bool, ProbeError> {
        if let Some(ok) = self.loaded {
            return Ok(ok);
        }
        let kernel = &mut *cx.kernel;
        // From the loading thread, when it succeeded; else loaded here
        // (multi-uprobe links again, or aya's perf-event uprobes).
        let background = self.loading.take().and_then(|h| h.join().ok().flatten());
        let loaded = match background {
            Some(programs) => Ok((programs::CudaProbes::Multi { programs, links: Vec::new() }, None)),
            None => programs::CudaProbes::load(&mut kernel.ebpf, &kernel.btf.btf, &kernel.map_fds),
        };
        match loaded {
            Ok((probes, note)) => {
                if let Some(n) = note {
                    cx.sink.note_on(Topic::Gpu, n);
                }
                self.probes = Some(probes);
                if let Some(budget) = self.opts.max_overhead {
                    self.start_slicer(cx, budget);
                }
            }
            Err(e) => {
                cx.sink.note_on(Topic::Gpu, format!("CUDA probes disabled: {e}"));
                self.loaded = Some(false);
                return Ok(false);
            }
        }
        if self.events.is_none() {
            let map = cx.kernel.ebpf.take_map(tracer_common::maps::CUDA_EVENTS).ok_or(ProbeError::MissingMap(tracer_common::maps::CUDA_EVENTS))?;
            let ring = RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_EVENTS, e))?;
            let map = cx.kernel.ebpf.take_map(tracer_common::maps::CUDA_NAMES).ok_or(ProbeError::MissingMap(tracer_common::maps::CUDA_NAMES))?;
            let names = RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::CUDA_NAMES, e))?;
            self.events = Some(EventDrain::start(ring, names).map_err(|e| ProbeError::Io("starting the CUDA event thread", e))?);
            if let (Some(ev), Some(limit)) = (&self.events, self.opts.timeline_limit) {
                ev.keep_timeline(limit);
            }
        }
        self.loaded = Some(true);
        Ok(true)
    }

    /// Moves the kernel entries of threads that no longer exist into
    /// userspace, so that services that churn threads do not fill the
    /// per-thread maps.
    fn retire_dead_threads(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        if self.attached.is_empty() {
            return Ok(());
        }
        let gone = |tid: u32| !procfs::exists(tid);
        {
            let mut map: BpfHashMap<_, CudaKey, CudaStats> = probe::hash_map(ebpf, tracer_common::maps::CUDA_STATS)?;
            let dead: Vec<(CudaKey, CudaStats)> = map.iter().filter_map(Result::ok).filter(|(k, _)| gone(k.tid)).collect();
            for (k, v) in dead {
                let _ = map.remove(&k);
                self.retired_stats.entry(CudaKey { tid: 0, ..k }).or_default().merge(&v);
            }
        }
        {
            let mut map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, tracer_common::maps::CUDA_LAUNCHES)?;
            let dead: Vec<(LaunchKey, u64)> = map.iter().filter_map(Result::ok).filter(|(k, _)| gone(k.tid)).collect();
            for (k, n) in dead {
                let _ = map.remove(&k);
                // Sampled launches keep their thread: its estimate is its own.
                let tid = if self.slicer.is_some() { k.tid } else { 0 };
                *self.retired_launches.entry(LaunchKey { tid, ..k }).or_default() += n;
            }
        }
        let mut map: BpfHashMap<_, u32, tracer_common::cuda::CudaInflight> = probe::hash_map(ebpf, tracer_common::maps::CUDA_INFLIGHT)?;
        let dead: Vec<u32> = map.keys().filter_map(Result::ok).filter(|t| gone(*t)).collect();
        for t in &dead {
            let _ = map.remove(t);
        }
        let mut capture: BpfHashMap<_, u32, tracer_common::cuda::CudaCapture> = probe::hash_map(ebpf, tracer_common::maps::CUDA_CAPTURE)?;
        let ended: Vec<u32> = capture.keys().filter_map(Result::ok).filter(|t| gone(*t)).collect();
        for t in &ended {
            let _ = capture.remove(t);
        }
        let mut text: BpfHashMap<_, u32, CudaText> = probe::hash_map(ebpf, tracer_common::maps::CUDA_TEXT)?;
        let gone_pids: Vec<u32> = text.keys().filter_map(Result::ok).filter(|p| gone(*p)).collect();
        for p in &gone_pids {
            let _ = text.remove(p);
        }
        let mut route: BpfHashMap<_, u64, [u64; 2]> = probe::hash_map(ebpf, tracer_common::maps::CUDA_DRV_ROUTE)?;
        let gone_keys: Vec<u64> = route.keys().filter_map(Result::ok).filter(|k| gone((k >> 32) as u32)).collect();
        for k in &gone_keys {
            let _ = route.remove(k);
        }
        let mut event_copy: BpfHashMap<_, tracer_common::cuda::EventKey, CudaKey> =
            probe::hash_map(ebpf, tracer_common::maps::CUDA_EVENT_COPY)?;
        let gone_events: Vec<tracer_common::cuda::EventKey> = event_copy.keys().filter_map(Result::ok).filter(|k| gone(k.pid)).collect();
        for k in &gone_events {
            let _ = event_copy.remove(k);
        }
        let mut pending: BpfHashMap<_, tracer_common::cuda::EventKey, tracer_common::cuda::CollPending> =
            probe::hash_map(ebpf, tracer_common::maps::CUDA_COLL_PENDING)?;
        let gone_pending: Vec<tracer_common::cuda::EventKey> = pending.keys().filter_map(Result::ok).filter(|k| gone(k.pid)).collect();
        for k in &gone_pending {
            let _ = pending.remove(k);
        }
        let mut epochs: BpfHashMap<_, u32, tracer_common::cuda::CollPending> = probe::hash_map(ebpf, tracer_common::maps::CUDA_COLL_EPOCH)?;
        let gone_epochs: Vec<u32> = epochs.keys().filter_map(Result::ok).filter(|p| gone(*p)).collect();
        for p in &gone_epochs {
            let _ = epochs.remove(p);
        }
        if let Some(ev) = &self.events {
            ev.with(|r| r.forget_threads(&dead));
        }
        Ok(())
    }

    /// Applies the events in the ring now (the drain thread does too).
    pub(super) fn drain(&mut self) {
        if let Some(ev) = &self.events {
            ev.with(|_| ());
        }
    }

    /// Names the launched kernels of live processes not named yet.
    pub(super) fn name_kernels(&mut self, ebpf: &mut Ebpf, symbolizer: &mut Symbolizer) -> Result<(), ProbeError> {
        if self.attached.is_empty() {
            return Ok(());
        }
        let map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, tracer_common::maps::CUDA_LAUNCHES)?;
        let mut wanted: Vec<(u32, u64)> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !api::is_driver(k.api) && !api::is_graph_launch(k.api))
            .map(|k| (k.pid, k.func))
            .filter(|k| !self.kernel_names.contains_key(k))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        for (pid, func) in wanted {
            let name = symbolize_function(symbolizer, pid, func);
            self.kernel_names.insert((pid, func), name);
        }
        Ok(())
    }

}

impl CudaCollector {
    pub fn new(opts: CudaOptions) -> Self {
        CudaCollector { opts, ..Default::default() }
    }
}

impl Collector for CudaCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Targets, Handle::Stacks, Handle::Calibration]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Cuda, Part::Timeline]
    }

    /// Drops what is kept per process: its state, its kernels' names, the
    /// aggregates of its exited threads, its driver probes (their links
    /// closed) and its place in the probed files' users.
    fn forget(&mut self, _cx: &mut Cx<'_>, pids: &HashSet<u32>) {
        self.procs.retain(|pid, _| !pids.contains(pid));
        self.kernel_names.retain(|(pid, _), _| !pids.contains(pid));
        self.retired_stats.retain(|k, _| !pids.contains(&k.pid));
        self.retired_launches.retain(|k, _| !pids.contains(&k.pid));
        for a in self.attached.values_mut() {
            a.pids.retain(|pid| !pids.contains(pid));
        }
        self.gate.forget(pids);
        if let Some(e) = &self.events {
            e.with(|r| r.forget_pids(pids));
        }
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    /// The uprobe programs are loaded when a first CUDA library is found
    /// (loading them at the start would cost every recording tens of ms,
    /// and their release after a SIGKILL was seen to take seconds under
    /// load); a launched command's libraries are searched before it is
    /// released, so that load does not race with it.
    fn attach(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        match ev {
            // A launched command, held before its exec, is scanned at its
            // exec; what it will load is searched now, from what it will
            // exec (the command, with our environment and directory): no
            // race with its start.
            TargetEvent::Appeared { pid, origin: Origin::Launched } => {
                let Some(l) = cx.targets.launched.as_ref() else { return Ok(()) };
                let facts = TargetFacts {
                    exe: std::fs::canonicalize(&l.path).ok().and_then(|p| p.to_str().map(str::to_owned)),
                    argv0: l.argv.first().cloned(),
                    libpython: None,
                    environ: search::searched_vars(std::env::vars().collect()),
                    cwd: std::env::current_dir().ok().and_then(|p| p.to_str().map(str::to_owned)),
                };
                // Held until this returns: the programs load here.
                self.hold = true;
                let r = self.search(cx, *pid, facts);
                self.hold = false;
                r
            }
            TargetEvent::Exited { .. } => Ok(()),
            TargetEvent::Appeared { pid, .. } | TargetEvent::Forked { pid, .. } | TargetEvent::Execed { pid, .. } => {
                self.scan(cx, *pid, None)
            }
            TargetEvent::Mapped { pid, ts_ns } => self.scan(cx, *pid, Some(*ts_ns)),
        }
    }

    /// Replays the events, names kernels, retires threads; without the
    /// kernel's mapping events, re-scans the known targets whose maps
    /// changed (libraries loaded with dlopen).
    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.polls += 1;
        // The programs loaded on their thread: the targets that waited for
        // them are scanned and searched again.
        if self.loading.as_ref().is_some_and(|h| h.is_finished()) && !self.detached {
            self.ensure_loaded(cx)?;
            for pid in std::mem::take(&mut self.deferred) {
                if let Some(st) = self.procs.get_mut(&pid) {
                    st.maps_hash = 0;
                }
                self.scan(cx, pid, None)?;
            }
        }
        if !cx.targets.mappings_followed && !self.detached {
            let pids: Vec<u32> = self.procs.iter().filter(|(_, s)| s.alive).map(|(p, _)| *p).collect();
            for pid in pids {
                self.scan(cx, pid, None)?;
            }
        }
        self.drain();
        if let Some(probes) = self.probes.as_ref().filter(|_| !self.detached) {
            self.gate.poll(probes, cx)?;
        }
        if self.polls.is_multiple_of(NAME_KERNELS_EVERY_POLLS) {
            self.name_kernels(&mut cx.kernel.ebpf, &mut cx.stacks.symbolizer)?;
        }
        if self.polls.is_multiple_of(RETIRE_EVERY_POLLS) {
            self.retire_dead_threads(&mut cx.kernel.ebpf)?;
        }
        Ok(())
    }

    /// Releases every probe and unloads the programs, so that the final
    /// drain and the aggregates read after it agree: a process traced with
    /// `-p` goes on calling CUDA after the window. A call in flight at this
    /// moment is in neither. The probes are released from several threads
    /// at once (progress on stderr past a second, unless `-q`); this
    /// returns when all are gone.
    fn detach(&mut self, cx: &mut Cx<'_>) {
        if std::mem::replace(&mut self.detached, true) {
            return;
        }
        // Programs still loading: waited for, then closed with the rest.
        if let Some(h) = self.loading.take() {
            drop(h.join());
            if !self.deferred.is_empty() {
                cx.sink.note_on(Topic::Gpu, format!(
                    "the window closed while the CUDA probes were still loading (through the verifier): CUDA calls of pid(s) {}, if any, were not traced",
                    self.deferred.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        let Some(mut probes) = self.probes.take() else { return };
        probes.adopt(self.gate.take_links());
        if let Some(slicer) = self.slicer.as_mut() {
            probes.adopt(slicer.finish());
        }
        let (_, errors) = probes.release(&mut cx.kernel.ebpf, self.opts.quiet);
        for e in errors {
            cx.sink.note_on(Topic::Gpu, e);
        }
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        if let Some(ev) = self.events.as_ref() {
            ev.report(cx.sink);
        }
        if self.used(&mut cx.kernel.ebpf)? {
            rec.cuda = Some(self.report(cx)?);
            if self.opts.timeline_limit.is_some() {
                self.timeline_calls(cx, rec)?;
            }
        }
        Ok(())
    }
}

/// The function at `addr` in `pid`, or the address in hex.
pub(super) fn symbolize_function(symbolizer: &mut Symbolizer, pid: u32, addr: u64) -> String {
    let frames = symbolizer.user_frames(pid, &[addr]);
    match frames.last() {
        Some(f) if f.function != UNKNOWN => f.function.clone(),
        _ => format!("{addr:#x}"),
    }
}
