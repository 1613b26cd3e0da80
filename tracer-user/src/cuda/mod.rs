//! CUDA runtime tracing, collector side.
//!
//! [`CudaTracer::scan`] looks for libcudart in a target's mappings
//! ([`discovery`]) and puts uprobes on every file once (shared by all the
//! processes that map it; the kernel filters on the target set);
//! [`CudaTracer::poll`] re-scans the targets it knows (PyTorch loads CUDA
//! lazily, with dlopen) and replays the per-call events ([`replay`]);
//! [`CudaTracer::finish`] reads the kernel's aggregates, resolves call
//! sites to the leaf Python frame (else the first native frame outside
//! libcudart) and runs the detector ([`findings`]).

pub mod discovery;
pub mod findings;
pub mod render;
pub mod replay;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use tracer_common::cuda::{api, CudaEvent, CudaKey, CudaStats, LaunchKey};

pub use findings::Thresholds;
use findings::SiteSummary;
use replay::{RawSite, Replay};

pub use crate::recording::cuda::{api_name, kind_name, CudaCall, CudaLaunch, CudaLibrary, CudaReport, Finding, GpuSample, Site};

use crate::{
    probe::{self, ProbeError},
    recording::{Frame, FrameKind},
    stacks::StackResolver,
    symbolize::{Symbolizer, UNKNOWN},
};

/// Polls (~250 ms each) between moves of dead threads' entries out of the kernel.
const RETIRE_EVERY_POLLS: u64 = 40;

const PROGRAMS: [&str; 8] = [
    "cuda_copy_enter",
    "cuda_copy2d_enter",
    "cuda_drv_copy_enter",
    "cuda_peer_copy_enter",
    "cuda_generic_enter",
    "cuda_launch",
    "cuda_launch_ex",
    "cuda_return",
];

fn entry_program(id: u32) -> &'static str {
    if api::is_peer_copy(id) {
        return "cuda_peer_copy_enter";
    }
    if api::is_driver(id) && api::is_copy(id) {
        return "cuda_drv_copy_enter";
    }
    if id == api::CU_LAUNCH_EX || id == api::CU_LAUNCH_EX_PTSZ {
        return "cuda_launch_ex";
    }
    match api::canonical(id) {
        api::MEMCPY | api::MEMCPY_PTDS | api::MEMCPY_ASYNC | api::MEMCPY_ASYNC_PTSZ => "cuda_copy_enter",
        api::MEMCPY2D | api::MEMCPY2D_PTDS | api::MEMCPY2D_ASYNC | api::MEMCPY2D_ASYNC_PTSZ => "cuda_copy2d_enter",
        api::LAUNCH | api::LAUNCH_PTSZ => "cuda_launch",
        _ => "cuda_generic_enter",
    }
}

struct Attached {
    path: String,
    functions: Vec<&'static str>,
    pids: BTreeSet<u32>,
}

#[derive(Default)]
struct ProcState {
    /// Hash of the last maps text examined.
    maps_hash: u64,
    /// Maps at least one probed file.
    uses_cuda: bool,
    alive: bool,
}

pub struct CudaTracer {
    thresholds: Thresholds,
    /// None: not loaded yet; Some(false): loading failed (noted).
    loaded: Option<bool>,
    events: Option<RingBuf<MapData>>,
    /// (st_dev, st_ino) -> what was attached there.
    attached: HashMap<(u64, u64), Attached>,
    /// (maps device, inode) -> identity of a probed file, or None (not a
    /// CUDA runtime, or could not be opened).
    examined: HashMap<(String, u64), Option<(u64, u64)>>,
    procs: BTreeMap<u32, ProcState>,
    replay: Replay,
    symbolizer: Symbolizer,
    kernel_names: HashMap<(u32, u64), String>,
    notes: Vec<String>,
    started_ns: u64,
    polls: u64,
    /// Aggregates of threads that exited, moved out of the kernel maps
    /// (keys are per thread; `tid` is 0 here).
    retired_stats: HashMap<CudaKey, CudaStats>,
    retired_launches: HashMap<LaunchKey, u64>,
    /// Probe libcuda (the driver API) too.
    driver: bool,
}

impl Default for CudaTracer {
    fn default() -> Self {
        Self::new()
    }
}

fn hash_text(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

impl CudaTracer {
    pub fn new() -> Self {
        Self::with_thresholds(Thresholds::default())
    }

    pub fn with_thresholds(thresholds: Thresholds) -> Self {
        CudaTracer {
            thresholds,
            loaded: None,
            events: None,
            attached: HashMap::new(),
            examined: HashMap::new(),
            procs: BTreeMap::new(),
            replay: Replay::default(),
            symbolizer: Symbolizer::new(),
            kernel_names: HashMap::new(),
            notes: Vec::new(),
            started_ns: crate::clock::monotonic_ns(),
            polls: 0,
            retired_stats: HashMap::new(),
            retired_launches: HashMap::new(),
            driver: true,
        }
    }

    /// Whether to probe the driver API (libcuda) as well as the runtime.
    pub fn set_driver(&mut self, on: bool) {
        self.driver = on;
    }

    /// Whether some CUDA runtime was probed.
    pub fn active(&self) -> bool {
        !self.attached.is_empty()
    }

    /// Scan a target's maps; attach probes to any libcudart not yet
    /// attached. Returns notes (one-line messages). The target is re-scanned
    /// by every [`poll`](Self::poll) until it exits.
    pub fn scan(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<Vec<String>, ProbeError> {
        let mut notes = Vec::new();
        let st = self.procs.entry(pid).or_insert_with(|| ProcState { alive: true, ..Default::default() });
        if !st.alive {
            st.alive = true;
            st.maps_hash = 0;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            st.alive = false;
            return Ok(notes);
        };
        let h = hash_text(&text);
        if h == st.maps_hash {
            return Ok(notes);
        }
        st.maps_hash = h;
        let maps = discovery::parse_maps(&text);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().trim_end_matches(" (deleted)").to_owned());
        let mut uses = false;
        // Code ranges of the probed runtime ([0]) and driver ([1]) libraries.
        let mut text: [Option<(u64, u64)>; 2] = [None, None];
        let driver = self.driver;
        for cand in discovery::candidates(&maps, exe.as_deref())
            .into_iter()
            .filter(|c| driver || !discovery::is_driver_name(c.line.basename()))
        {
            let key = (cand.line.dev.clone(), cand.line.inode);
            let identity = match self.examined.get(&key) {
                Some(known) => *known,
                None => {
                    let id = self.examine(ebpf, pid, &cand, &mut notes)?;
                    self.examined.insert(key, id);
                    id
                }
            };
            if let Some(id) = identity {
                if let Some(a) = self.attached.get_mut(&id) {
                    a.pids.insert(pid);
                    uses = true;
                    // Where its code is in this process: a driver launch
                    // returning into it is a probed call's own.
                    // (For a runtime linked into the executable that is the
                    // whole program's code: a driver launch the program
                    // itself makes is then taken for the runtime's.)
                    let slot = if a.functions.iter().any(|f| api::is_driver_name(f)) { 1 } else { 0 };
                    if let Some(r) = discovery::text_range(&maps, &cand.line) {
                        text[slot] = Some(r);
                    }
                }
            }
        }
        if text.iter().any(Option::is_some) {
            let flat = [
                text[0].map_or(0, |r| r.0),
                text[0].map_or(0, |r| r.1),
                text[1].map_or(0, |r| r.0),
                text[1].map_or(0, |r| r.1),
            ];
            let mut map: BpfHashMap<_, u32, [u64; 4]> = probe::hash_map(ebpf, "CUDA_TEXT")?;
            if let Err(e) = map.insert(pid, flat, 0) {
                notes.push(format!("pid {pid}: driver launches made inside runtime calls may be counted twice: {e}"));
            }
        }
        if uses {
            // Kernel names and native sites are symbolized in this process.
            self.symbolizer.observe_process(pid);
            if let Some(st) = self.procs.get_mut(&pid) {
                st.uses_cuda = true;
            }
        }
        Ok(notes)
    }

    /// Opens a candidate file and probes it when it holds a CUDA runtime;
    /// returns its identity when probed (now or before).
    fn examine(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        cand: &discovery::Candidate,
        notes: &mut Vec<String>,
    ) -> Result<Option<(u64, u64)>, ProbeError> {
        let shown = &cand.line.path;
        let opened = match discovery::open_mapped(pid, &cand.line) {
            Ok(o) => o,
            Err(e) => {
                if !cand.is_exe {
                    notes.push(format!("pid {pid}: cannot open {shown} to probe CUDA: {e}"));
                }
                return Ok(None);
            }
        };
        if self.attached.contains_key(&opened.identity) {
            return Ok(Some(opened.identity));
        }
        let symbols = match discovery::cuda_symbols(&opened.file) {
            Ok(s) => s,
            Err(e) => {
                if !cand.is_exe {
                    notes.push(format!("pid {pid}: {shown}: not a readable ELF file ({e}); CUDA not traced"));
                }
                return Ok(None);
            }
        };
        if cand.is_exe && !discovery::is_runtime(&symbols) {
            return Ok(None);
        }
        if symbols.is_empty() {
            notes.push(format!("pid {pid}: {shown} exports none of the CUDA runtime functions traced"));
            return Ok(None);
        }
        if !self.ensure_loaded(ebpf, notes)? {
            return Ok(None);
        }
        let (functions, errors) = attach_file(ebpf, &opened.attach_path, &symbols)?;
        for e in errors {
            notes.push(format!("pid {pid}: {shown}: {e}"));
        }
        if functions.is_empty() {
            return Ok(None);
        }
        let driver = functions.iter().any(|f| api::is_driver_name(f));
        notes.push(format!(
            "pid {pid}: CUDA {} {shown}{}: {} functions probed",
            if driver { "driver" } else { "runtime" },
            if cand.is_exe { " (linked statically)" } else { "" },
            functions.len()
        ));
        self.attached.insert(
            opened.identity,
            Attached { path: shown.clone(), functions, pids: BTreeSet::from([pid]) },
        );
        Ok(Some(opened.identity))
    }

    fn ensure_loaded(&mut self, ebpf: &mut Ebpf, notes: &mut Vec<String>) -> Result<bool, ProbeError> {
        if let Some(ok) = self.loaded {
            return Ok(ok);
        }
        for name in PROGRAMS {
            let prog: &mut UProbe = probe::program(ebpf, name)?;
            if let Err(e) = prog.load() {
                notes.push(format!("CUDA probes disabled: loading {name} failed: {}", ProbeError::load(name, e)));
                self.loaded = Some(false);
                return Ok(false);
            }
        }
        if self.events.is_none() {
            let map = ebpf.take_map("CUDA_EVENTS").ok_or(ProbeError::MissingMap("CUDA_EVENTS"))?;
            self.events = Some(RingBuf::try_from(map).map_err(|e| ProbeError::map("CUDA_EVENTS", e))?);
        }
        self.loaded = Some(true);
        Ok(true)
    }

    /// Drain events (if any) and re-scan the targets' maps for libraries
    /// loaded since — called every ~250 ms.
    pub fn poll(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        self.polls += 1;
        let pids: Vec<u32> = self.procs.iter().filter(|(_, s)| s.alive).map(|(p, _)| *p).collect();
        for pid in pids {
            let mut notes = self.scan(ebpf, pid)?;
            self.notes.append(&mut notes);
        }
        self.drain();
        if self.polls.is_multiple_of(4) {
            self.name_kernels(ebpf)?;
        }
        if self.polls.is_multiple_of(RETIRE_EVERY_POLLS) {
            self.retire_dead_threads(ebpf)?;
        }
        Ok(())
    }

    /// Moves the kernel entries of threads that no longer exist into
    /// userspace, so that services that churn threads do not fill the
    /// per-thread maps.
    fn retire_dead_threads(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        if self.attached.is_empty() {
            return Ok(());
        }
        let gone = |tid: u32| !std::path::Path::new(&format!("/proc/{tid}")).exists();
        {
            let mut map: BpfHashMap<_, CudaKey, CudaStats> = probe::hash_map(ebpf, "CUDA_STATS")?;
            let dead: Vec<(CudaKey, CudaStats)> = map.iter().filter_map(Result::ok).filter(|(k, _)| gone(k.tid)).collect();
            for (k, v) in dead {
                let _ = map.remove(&k);
                let r = self.retired_stats.entry(CudaKey { tid: 0, ..k }).or_default();
                r.count += v.count;
                r.bytes += v.bytes;
                r.total_ns += v.total_ns;
                r.errors += v.errors;
            }
        }
        {
            let mut map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, "CUDA_LAUNCHES")?;
            let dead: Vec<(LaunchKey, u64)> = map.iter().filter_map(Result::ok).filter(|(k, _)| gone(k.tid)).collect();
            for (k, n) in dead {
                let _ = map.remove(&k);
                *self.retired_launches.entry(LaunchKey { tid: 0, ..k }).or_default() += n;
            }
        }
        let mut map: BpfHashMap<_, u32, tracer_common::cuda::CudaInflight> = probe::hash_map(ebpf, "CUDA_INFLIGHT")?;
        let dead: Vec<u32> = map.keys().filter_map(Result::ok).filter(|t| gone(*t)).collect();
        for t in &dead {
            let _ = map.remove(t);
        }
        let mut text: BpfHashMap<_, u32, [u64; 4]> = probe::hash_map(ebpf, "CUDA_TEXT")?;
        let gone_pids: Vec<u32> = text.keys().filter_map(Result::ok).filter(|p| gone(*p)).collect();
        for p in &gone_pids {
            let _ = text.remove(p);
        }
        self.replay.forget_threads(&dead);
        Ok(())
    }

    fn drain(&mut self) {
        let Some(rb) = self.events.as_mut() else { return };
        while let Some(item) = rb.next() {
            if item.len() < std::mem::size_of::<CudaEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole CudaEvent; read_unaligned copes with alignment.
            let ev: CudaEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            self.replay.apply(&ev);
        }
    }

    /// Names the launched kernels of live processes not named yet.
    fn name_kernels(&mut self, ebpf: &mut Ebpf) -> Result<(), ProbeError> {
        if self.attached.is_empty() {
            return Ok(());
        }
        let map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, "CUDA_LAUNCHES")?;
        let mut wanted: Vec<(u32, u64)> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !api::is_driver(k.api))
            .map(|k| (k.pid, k.func))
            .filter(|k| !self.kernel_names.contains_key(k))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        for (pid, func) in wanted {
            let name = self.symbolize_function(pid, func);
            self.kernel_names.insert((pid, func), name);
        }
        Ok(())
    }

    fn symbolize_function(&mut self, pid: u32, addr: u64) -> String {
        let frames = self.symbolizer.user_frames(pid, &[addr]);
        match frames.last() {
            Some(f) if f.function != UNKNOWN => f.function.clone(),
            _ => format!("{addr:#x}"),
        }
    }

    /// At the end: read the kernel aggregates, resolve sites through
    /// `resolver`, run the detector. `window_ns`: the window's length.
    pub fn finish(
        mut self,
        ebpf: &mut Ebpf,
        resolver: &mut StackResolver<'_>,
        window_ns: u64,
    ) -> Result<CudaReport, ProbeError> {
        self.drain();
        let mut report = CudaReport { window_ns, ..Default::default() };
        if self.attached.is_empty() {
            return Ok(report);
        }
        self.name_kernels(ebpf)?;
        self.replay.close(self.started_ns + window_ns / 2);
        let stats: Vec<(CudaKey, CudaStats)> = {
            let map: BpfHashMap<_, CudaKey, CudaStats> = probe::hash_map(ebpf, "CUDA_STATS")?;
            map.iter().filter_map(Result::ok).chain(self.retired_stats.drain()).collect()
        };
        let launches: Vec<(LaunchKey, u64)> = {
            let map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(ebpf, "CUDA_LAUNCHES")?;
            map.iter().filter_map(Result::ok).chain(self.retired_launches.drain()).collect()
        };
        let mut sites = SiteCache { sites: HashMap::new() };

        // Calls, by (pid, api, kind, site).
        let mut calls: BTreeMap<(u32, u32, u32, Site), CudaCall> = BTreeMap::new();
        let mut raw_of_call: HashMap<(u32, u32, u32, Site), BTreeSet<RawSite>> = HashMap::new();
        for (k, v) in &stats {
            let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: k.caller };
            let site = sites.resolve(raw, resolver, &mut self.symbolizer);
            let key = (k.pid, k.api, k.kind, site.clone());
            let c = calls.entry(key.clone()).or_insert_with(|| CudaCall {
                pid: k.pid,
                api: api_name(k.api),
                kind: kind_name(k.kind).map(str::to_owned),
                count: 0,
                bytes: 0,
                total_ns: 0,
                errors: 0,
                site,
                return_codes: BTreeMap::new(),
                pinned: None,
                pageable: None,
            });
            c.count += v.count;
            c.bytes += v.bytes;
            c.total_ns += v.total_ns;
            c.errors += v.errors;
            raw_of_call.entry(key).or_default().insert(raw);
        }
        for (key, raws) in &raw_of_call {
            let c = calls.get_mut(key).expect("call key");
            for raw in raws {
                if let Some(codes) = self.replay.return_codes.get(&(*raw, key.1, key.2)) {
                    for (rc, n) in codes {
                        *c.return_codes.entry(*rc).or_default() += n;
                    }
                }
                if let Some((p, q)) = self.replay.host_memory.get(&(*raw, key.1, key.2)) {
                    *c.pinned.get_or_insert(0) += p;
                    *c.pageable.get_or_insert(0) += q;
                }
            }
        }
        report.calls = calls.into_values().collect();
        report.calls.sort_by(|a, b| {
            b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)).then(a.api.cmp(&b.api)).then(a.site.cmp(&b.site))
        });

        // Launches, by (pid, kernel, site, api).
        let mut by_kernel: BTreeMap<(u32, String, Site, u32), u64> = BTreeMap::new();
        for (k, n) in &launches {
            let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: 0 };
            let site = sites.resolve(raw, resolver, &mut self.symbolizer);
            let name = if api::is_driver(k.api) {
                // A driver launch passes a CUfunction handle, not code.
                format!("CUfunction {:#x}", k.func)
            } else {
                match self.kernel_names.get(&(k.pid, k.func)) {
                    Some(n) => n.clone(),
                    None => self.symbolize_function(k.pid, k.func),
                }
            };
            *by_kernel.entry((k.pid, name, site, k.api)).or_default() += n;
        }
        report.launches = by_kernel
            .into_iter()
            .map(|((pid, kernel, site, a), count)| CudaLaunch { pid, kernel, count, site, api: api_name(a) })
            .collect();
        report.launches.sort_by(|a, b| b.count.cmp(&a.count).then(a.kernel.cmp(&b.kernel)));

        // The detector, per resolved site.
        let mut summaries: BTreeMap<(u32, Site), SiteSummary> = BTreeMap::new();
        let replay = std::mem::take(&mut self.replay);
        let mut summary = |raw: RawSite, sites: &mut SiteCache, sym: &mut Symbolizer| {
            let site = sites.resolve(raw, resolver, sym);
            (raw.pid, site)
        };
        for ((raw, kind), obs) in &replay.copies {
            let key = summary(*raw, &mut sites, &mut self.symbolizer);
            let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
            s.copies.entry(*kind).or_default().merge(obs);
        }
        for ((raw, _), obs) in &replay.syncs {
            let key = summary(*raw, &mut sites, &mut self.symbolizer);
            let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
            s.syncs.merge(obs);
        }
        for (raw, obs) in &replay.allocs {
            let key = summary(*raw, &mut sites, &mut self.symbolizer);
            let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
            s.allocs.merge(obs);
        }
        let summaries: Vec<SiteSummary> = summaries.into_values().collect();
        report.findings = findings::detect(&summaries, window_ns, &self.thresholds);

        let mut libs: Vec<&Attached> = self.attached.values().collect();
        libs.sort_by(|a, b| a.path.cmp(&b.path));
        report.libraries = libs
            .into_iter()
            .map(|a| CudaLibrary {
                path: a.path.clone(),
                functions: a.functions.iter().map(|f| (*f).to_owned()).collect(),
                pids: a.pids.iter().copied().collect(),
            })
            .collect();
        report.notes = std::mem::take(&mut self.notes);
        if replay.events == 0 && report.calls.iter().any(|c| c.count > 0) {
            report.notes.push("no per-call CUDA events arrived: pinned memory and copy/sync sequences are unknown".into());
        }
        Ok(report)
    }
}

/// Attaches the entry (and, but for launches, return) probe to every
/// function found. Returns the functions probed and the failures.
fn attach_file(
    ebpf: &mut Ebpf,
    path: &std::path::Path,
    symbols: &[(u32, u64)],
) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for &(id, offset) in symbols {
        let name = api::NAMES[id as usize];
        let mut progs = vec![entry_program(id)];
        if !api::is_launch(id) {
            progs.push("cuda_return");
        }
        let mut ok = true;
        for prog_name in progs {
            let prog: &mut UProbe = probe::program(ebpf, prog_name)?;
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(id as u64) };
            if let Err(e) = prog.attach(point, path, UProbeScope::AllProcesses) {
                errors.push(format!("probing {name} failed: {e}"));
                ok = false;
                break;
            }
        }
        if ok {
            done.push(name);
        }
    }
    Ok((done, errors))
}

fn is_cudart_module(f: &Frame) -> bool {
    f.module.as_deref().is_some_and(discovery::is_cudart_name)
}

struct SiteCache {
    sites: HashMap<RawSite, Site>,
}

impl SiteCache {
    fn resolve(&mut self, raw: RawSite, resolver: &mut StackResolver<'_>, sym: &mut Symbolizer) -> Site {
        if let Some(s) = self.sites.get(&raw) {
            return s.clone();
        }
        let frames = resolver.frames(raw.pid, raw.user_stack, -1, raw.py_stack);
        let site = match frames.iter().find(|f| f.kind == FrameKind::Python) {
            Some(f) => Site::of_frame(f),
            None => {
                // The caller's return address, looked up inside the call instruction.
                let caller = if raw.caller > 1 { sym.user_frames(raw.pid, &[raw.caller - 1]) } else { Vec::new() };
                let usable = |f: &&Frame| f.kind == FrameKind::Native && f.function != UNKNOWN && !is_cudart_module(f);
                match caller.iter().find(usable).or_else(|| frames.iter().find(usable)) {
                    Some(f) => Site::of_frame(f),
                    None => Site::unknown(),
                }
            }
        };
        self.sites.insert(raw, site.clone());
        site
    }
}
