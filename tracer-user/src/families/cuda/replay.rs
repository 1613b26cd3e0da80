//! Replays the per-call events of the kernel (`CudaEvent`, in call order per
//! thread) into what the detector needs and the aggregates cannot give:
//! whether a copy's host side was pinned (ranges from `cudaHostAlloc`,
//! `cudaMallocHost`, `cudaHostRegister`), which copies were followed by a
//! sync on the same thread and stream, copy sizes and contents per site,
//! device allocations never freed, and the return codes.

use std::collections::{BTreeMap, HashMap};

use tracer_common::cuda::{api, CudaEvent, CudaName, KIND_DEFAULT, KIND_DTOD, KIND_DTOH, KIND_HTOD, KIND_HTOH};

use super::graph_state::GraphState;

/// Where a call came from, as the kernel keys it (without the thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawSite {
    pub pid: u32,
    pub user_stack: i32,
    pub py_stack: u64,
    pub caller: u64,
}

impl RawSite {
    pub fn of(e: &CudaEvent) -> Self {
        RawSite { pid: e.pid, user_stack: e.user_stack, py_stack: e.py_stack, caller: e.caller }
    }
}

/// Distinct values tracked per site before the rest is lumped together.
const MAX_DISTINCT: usize = 64;

/// Copies from one site in one direction (the direction inferred for
/// `cudaMemcpyDefault` where the pointers are known).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyObs {
    pub count: u64,
    pub bytes: u64,
    pub ns: u64,
    pub errors: u64,
    pub max_bytes: u64,
    /// Copies through a stream-taking API.
    pub async_count: u64,
    /// Host side inside a pinned range / not inside one (H2D, D2H, H2H).
    pub pinned: u64,
    pub pageable: u64,
    pub pageable_bytes: u64,
    pub pageable_ns: u64,
    /// Async copies followed, as the thread's next CUDA call, by a sync of
    /// their stream (or of the device), and the time of those syncs.
    pub sync_pairs: u64,
    pub sync_pair_ns: u64,
    /// Synchronous copies (`cudaMemcpy`, `cudaMemcpy2D`): each waits for
    /// the copy to finish.
    pub sync_copies: u64,
    /// (content fingerprint, size) -> copies; H2D only.
    pub contents: HashMap<(u64, u64), u64>,
    pub sizes: HashMap<u64, u64>,
}

impl CopyObs {
    pub fn merge(&mut self, o: &CopyObs) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.ns += o.ns;
        self.errors += o.errors;
        self.max_bytes = self.max_bytes.max(o.max_bytes);
        self.async_count += o.async_count;
        self.pinned += o.pinned;
        self.pageable += o.pageable;
        self.pageable_bytes += o.pageable_bytes;
        self.pageable_ns += o.pageable_ns;
        self.sync_pairs += o.sync_pairs;
        self.sync_pair_ns += o.sync_pair_ns;
        self.sync_copies += o.sync_copies;
        for (k, v) in &o.contents {
            bump(&mut self.contents, *k, *v);
        }
        for (k, v) in &o.sizes {
            bump(&mut self.sizes, *k, *v);
        }
    }

    /// Raises the counted figures (counts, bytes, times, pairs) to at
    /// least `k`'s: the kernel's aggregates of the same copies, exact when
    /// per-call events were lost.
    pub fn at_least(&mut self, k: &CopyObs) {
        self.count = self.count.max(k.count);
        self.bytes = self.bytes.max(k.bytes);
        self.ns = self.ns.max(k.ns);
        self.errors = self.errors.max(k.errors);
        self.async_count = self.async_count.max(k.async_count);
        self.sync_pairs = self.sync_pairs.max(k.sync_pairs);
        self.sync_pair_ns = self.sync_pair_ns.max(k.sync_pair_ns);
        self.sync_copies = self.sync_copies.max(k.sync_copies);
    }

    /// The most frequent (fingerprint, size) and how often it was copied.
    pub fn top_content(&self) -> Option<((u64, u64), u64)> {
        self.contents.iter().map(|(k, v)| (*k, *v)).max_by_key(|(k, v)| (*v, std::cmp::Reverse(*k)))
    }
}

fn bump<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u64>, k: K, n: u64) {
    if let Some(v) = m.get_mut(&k) {
        *v += n;
    } else if m.len() < MAX_DISTINCT {
        m.insert(k, n);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncObs {
    pub count: u64,
    pub ns: u64,
    /// Syncs that directly followed an async copy on their stream.
    pub after_copy: u64,
    /// Of `ns`, the waits on NCCL collectives (the kernel's aggregates
    /// only): not copy time.
    pub collective_ns: u64,
}

impl SyncObs {
    pub fn merge(&mut self, o: &SyncObs) {
        self.count += o.count;
        self.ns += o.ns;
        self.after_copy += o.after_copy;
        self.collective_ns += o.collective_ns;
    }

    /// [`CopyObs::at_least`] for syncs.
    pub fn at_least(&mut self, k: &SyncObs) {
        self.count = self.count.max(k.count);
        self.ns = self.ns.max(k.ns);
        self.after_copy = self.after_copy.max(k.after_copy);
        self.collective_ns = self.collective_ns.max(k.collective_ns);
    }
}

/// Device allocations (`cudaMalloc`) from one site.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocObs {
    pub allocs: u64,
    pub bytes: u64,
    pub freed: u64,
    /// Still allocated at the end of the window.
    pub live: u64,
    pub live_bytes: u64,
    /// Of `live`, how many were allocated in the second half of the window.
    pub live_late: u64,
    /// Bytes the site held at once, at most (its allocations less its
    /// frees, in call order); `held_now` is the running value.
    pub peak_held_bytes: u64,
    pub held_now: u64,
}

impl AllocObs {
    /// One allocation of `bytes` held from now on.
    fn grow(&mut self, bytes: u64) {
        self.bytes += bytes;
        self.held_now += bytes;
        self.peak_held_bytes = self.peak_held_bytes.max(self.held_now);
    }

    pub fn merge(&mut self, o: &AllocObs) {
        self.allocs += o.allocs;
        self.bytes += o.bytes;
        self.freed += o.freed;
        self.live += o.live;
        self.live_bytes += o.live_bytes;
        self.live_late += o.live_late;
        // Raw sites of one line peaking at different times: at most the sum.
        self.peak_held_bytes += o.peak_held_bytes;
        self.held_now += o.held_now;
    }
}

/// NCCL calls of one API on one communicator from one site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollObs {
    pub count: u64,
    pub bytes: u64,
    pub ns: u64,
    pub errors: u64,
}

impl CollObs {
    pub fn merge(&mut self, o: &CollObs) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.ns += o.ns;
        self.errors += o.errors;
    }
}

#[derive(Clone, Copy, Debug)]
struct LiveAlloc {
    size: u64,
    site: RawSite,
    at_ns: u64,
}

#[derive(Clone, Copy, Debug)]
struct LastCopy {
    key: (RawSite, u32),
    stream: u64,
}

/// The device memory series keep one point per this many ns (100 ms) at
/// first...
pub const SERIES_STEP_NS: u64 = 100_000_000;
/// ...and at most this many points: past it, every other point goes and
/// the step doubles (an agent's process keeps its whole life in a bounded
/// series, coarser as it ages).
pub const SERIES_MAX: usize = 4096;

/// A process's device memory over time: (ns, bytes) as it changed, the
/// last value of each step.
#[derive(Clone, Debug, Default)]
pub struct Series {
    step_ns: u64,
    pub points: Vec<(u64, u64)>,
}

impl Series {
    fn point(&mut self, t: u64, v: u64) {
        let step = self.step_ns.max(SERIES_STEP_NS);
        match self.points.last_mut() {
            Some(last) if last.0 / step == t / step => *last = (t, v),
            _ => self.points.push((t, v)),
        }
        if self.points.len() > SERIES_MAX {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 0
            });
            self.step_ns = step * 2;
        }
    }
}

/// What the events said, by raw site.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub copies: HashMap<(RawSite, u32), CopyObs>,
    pub syncs: HashMap<(RawSite, u32), SyncObs>,
    pub allocs: HashMap<RawSite, AllocObs>,
    /// (site, api, kind as passed) -> return code -> calls.
    pub return_codes: HashMap<(RawSite, u32, u32), BTreeMap<i32, u64>>,
    /// Copies per (site, api, kind as passed) whose host side was pinned / pageable.
    pub host_memory: HashMap<(RawSite, u32, u32), (u64, u64)>,
    pub events: u64,
    /// Stream captures and instantiations: what names graphs.
    pub graphs: GraphState<RawSite>,
    /// pid -> start -> end of pinned host ranges.
    pinned: HashMap<u32, BTreeMap<u64, u64>>,
    /// pid -> device pointer -> allocation.
    device: HashMap<u32, BTreeMap<u64, LiveAlloc>>,
    /// pid -> `cuMemCreate` handle -> its physical memory (not an address:
    /// kept apart from `device`, which tells copy directions).
    physical: HashMap<u32, BTreeMap<u64, LiveAlloc>>,
    last_copy: HashMap<u32, LastCopy>,
    /// (pid, event) -> the async copy the event was recorded behind (the
    /// kernel's `CUDA_EVENT_COPY`).
    event_copy: HashMap<(u32, u64), (RawSite, u32)>,
    /// (pid, kernel handle) -> its name as the lookup passed it
    /// (`cuModuleGetFunction`, `cuLibraryGetKernel`; `CUDA_NAMES`).
    names: HashMap<(u32, u64), String>,
    /// NCCL calls by (site, API, communicator).
    pub collectives: HashMap<(RawSite, u32, u64), CollObs>,
    /// pid -> device memory its allocation calls hold now, and at most.
    pub held: HashMap<u32, (u64, u64)>,
    /// Tensors: the blocks PyTorch's caching allocator handed out
    /// (`pytorch:malloc`) and not taken back (`pytorch:free`), by the line
    /// that asked; `allocated`: pid -> bytes in tensors now, and at most.
    /// (`held` is what the allocator reserved from the device.)
    pub tensors: HashMap<RawSite, AllocObs>,
    pub allocated: HashMap<u32, (u64, u64)>,
    tensor_live: HashMap<u32, BTreeMap<u64, LiveAlloc>>,
    /// pid -> (time, bytes) of `held` and of `allocated` as they changed,
    /// at most one point per [`SERIES_STEP_NS`] (the last value of each
    /// step): what `gpu_memory_growth` fits its line to.
    pub held_series: HashMap<u32, Series>,
    pub allocated_series: HashMap<u32, Series>,
    /// (pid, `CUfunction`) -> the `CUkernel` it was got from
    /// (`cuKernelGetFunction`): named by the kernel's name.
    kernel_of: HashMap<(u32, u64), u64>,
}

fn in_ranges<V>(m: Option<&BTreeMap<u64, V>>, addr: u64, end_of: impl Fn(u64, &V) -> u64) -> bool {
    let Some(m) = m else { return false };
    match m.range(..=addr).next_back() {
        Some((start, v)) => addr < end_of(*start, v),
        None => false,
    }
}

impl Replay {
    fn is_pinned(&self, pid: u32, addr: u64) -> bool {
        addr != 0 && in_ranges(self.pinned.get(&pid), addr, |_, end| *end)
    }

    fn is_device(&self, pid: u32, addr: u64) -> bool {
        addr != 0 && in_ranges(self.device.get(&pid), addr, |start, a| start + a.size.max(1))
    }

    /// The direction of a copy: as passed, or for `cudaMemcpyDefault`
    /// inferred from the device allocations seen (Default when unknown).
    pub fn effective_kind(&self, pid: u32, kind: u32, dst: u64, src: u64) -> u32 {
        if kind != KIND_DEFAULT {
            return kind;
        }
        match (self.is_device(pid, src), self.is_device(pid, dst)) {
            (true, true) => KIND_DTOD,
            (false, true) => KIND_HTOD,
            (true, false) => KIND_DTOH,
            (false, false) => KIND_DEFAULT,
        }
    }

    pub fn apply(&mut self, e: &CudaEvent) {
        self.events += 1;
        let site = RawSite::of(e);
        *self.return_codes.entry((site, e.api, e.kind)).or_default().entry(e.rc).or_default() += 1;
        if api::is_copy(e.api) {
            self.copy(site, e);
        } else if api::is_sync(e.api) {
            self.sync(site, e);
        } else if api::is_graph_setup(e.api) {
            self.graphs.apply(site, e);
        } else if api::is_event_record(e.api) {
            self.record_event(e);
        } else if api::is_collective(e.api) {
            let one = CollObs { count: 1, bytes: e.bytes, ns: e.dur_ns, errors: (e.rc != 0) as u64 };
            self.collectives.entry((site, e.api, e.dst)).or_default().merge(&one);
        } else if api::is_torch_allocator(e.api) {
            self.tensor(site, e);
        } else if e.api == api::CU_KERNEL_GET_FUNCTION {
            if e.rc == 0 && e.dst != 0 {
                self.kernel_of.insert((e.pid, e.dst), e.src);
            }
        } else {
            self.memory(site, e);
        }
    }

    /// A kernel handle's name (`CUDA_NAMES`); names cut at the kernel's
    /// `NAME_BYTES` keep their start.
    pub fn add_name(&mut self, n: &CudaName) {
        let len = (n.len as usize).min(n.name.len());
        if len == 0 {
            return;
        }
        let bytes = &n.name[..len];
        let bytes = bytes.split(|b| *b == 0).next().unwrap_or(bytes);
        if bytes.is_empty() {
            return;
        }
        self.names.insert((n.pid, n.handle), String::from_utf8_lossy(bytes).into_owned());
    }

    /// The name of driver kernel handle `handle` (a `CUfunction`, or a
    /// `CUkernel` used as one) of process `pid`, as looked up (mangled).
    pub fn kernel_name(&self, pid: u32, handle: u64) -> Option<&str> {
        if let Some(n) = self.names.get(&(pid, handle)) {
            return Some(n);
        }
        let kernel = self.kernel_of.get(&(pid, handle))?;
        self.names.get(&(pid, *kernel)).map(String::as_str)
    }

    fn copy(&mut self, site: RawSite, e: &CudaEvent) {
        let kind = self.effective_kind(e.pid, e.kind, e.dst, e.src);
        let host = match kind {
            KIND_HTOD | KIND_HTOH => Some(e.src),
            KIND_DTOH => Some(e.dst),
            _ => None,
        };
        let pinned = host.map(|h| self.is_pinned(e.pid, h));
        if let Some(p) = pinned {
            let hm = self.host_memory.entry((site, e.api, e.kind)).or_default();
            if p {
                hm.0 += 1;
            } else {
                hm.1 += 1;
            }
        }
        let o = self.copies.entry((site, kind)).or_default();
        o.count += 1;
        o.bytes += e.bytes;
        o.ns += e.dur_ns;
        o.errors += (e.rc != 0) as u64;
        o.max_bytes = o.max_bytes.max(e.bytes);
        match pinned {
            Some(true) => o.pinned += 1,
            Some(false) => {
                o.pageable += 1;
                o.pageable_bytes += e.bytes;
                o.pageable_ns += e.dur_ns;
            }
            None => {}
        }
        bump(&mut o.sizes, e.bytes, 1);
        if kind == KIND_HTOD && e.fingerprint != 0 {
            bump(&mut o.contents, (e.fingerprint, e.bytes), 1);
        }
        if api::is_async_copy(e.api) {
            o.async_count += 1;
            self.last_copy.insert(e.tid, LastCopy { key: (site, kind), stream: e.stream });
        } else {
            o.sync_copies += 1;
            self.last_copy.remove(&e.tid);
        }
    }

    /// `cudaEventRecord(event, stream)` (`dst` the event): the thread's
    /// pending async copy on that stream passes to the event, as in the
    /// kernel (`record_event`).
    fn record_event(&mut self, e: &CudaEvent) {
        if e.rc != 0 {
            return;
        }
        match self.last_copy.get(&e.tid) {
            Some(last) if last.stream == e.stream => {
                self.event_copy.insert((e.pid, e.dst), last.key);
                self.last_copy.remove(&e.tid);
            }
            _ => {
                self.event_copy.remove(&(e.pid, e.dst));
            }
        }
    }

    fn sync(&mut self, site: RawSite, e: &CudaEvent) {
        let s = self.syncs.entry((site, e.api)).or_default();
        s.count += 1;
        s.ns += e.dur_ns;
        // An event synchronize (`stream` is the event) waits for the copy
        // the event was recorded behind.
        let by_event = if api::canonical(e.api) == api::EVENT_SYNC { self.event_copy.remove(&(e.pid, e.stream)) } else { None };
        let last = self.last_copy.remove(&e.tid);
        let covered = by_event.or_else(|| {
            let last = last?;
            let covers = match api::canonical(e.api) {
                api::DEVICE_SYNC => true,
                api::STREAM_SYNC | api::STREAM_SYNC_PTSZ => e.stream == last.stream,
                _ => false,
            };
            covers.then_some(last.key)
        });
        if let Some(key) = covered {
            s.after_copy += 1;
            if let Some(o) = self.copies.get_mut(&key) {
                o.sync_pairs += 1;
                o.sync_pair_ns += e.dur_ns;
            }
        }
    }

    /// An allocation from `site` (`e.dst`: the pointer, or for
    /// `cuMemCreate` the handle: `physical`), live until its free.
    fn allocated(&mut self, site: RawSite, e: &CudaEvent, physical: bool) {
        let a = self.allocs.entry(site).or_default();
        a.allocs += 1;
        if e.rc == 0 && e.dst != 0 {
            a.grow(e.bytes);
            let h = self.held.entry(e.pid).or_default();
            h.0 += e.bytes;
            h.1 = h.1.max(h.0);
            self.held_series.entry(e.pid).or_default().point(e.start_ns, h.0);
            let live = if physical { &mut self.physical } else { &mut self.device };
            live.entry(e.pid).or_default().insert(e.dst, LiveAlloc { size: e.bytes, site, at_ns: e.start_ns });
        }
    }

    /// The free (release, for a `physical` handle) of `e.dst`.
    fn freed(&mut self, e: &CudaEvent, physical: bool) {
        let live = if physical { &mut self.physical } else { &mut self.device };
        if let Some(a) = live.get_mut(&e.pid).and_then(|m| m.remove(&e.dst)) {
            let o = self.allocs.entry(a.site).or_default();
            o.freed += 1;
            o.held_now = o.held_now.saturating_sub(a.size);
            let h = self.held.entry(e.pid).or_default();
            h.0 = h.0.saturating_sub(a.size);
            self.held_series.entry(e.pid).or_default().point(e.start_ns, h.0);
        }
    }

    /// A tensor's block handed out (`pytorch:malloc`: `dst` the pointer,
    /// `bytes` its size) or taken back (`pytorch:free`).
    fn tensor(&mut self, site: RawSite, e: &CudaEvent) {
        let h = self.allocated.entry(e.pid).or_default();
        if e.api == api::TORCH_MALLOC {
            let a = self.tensors.entry(site).or_default();
            a.allocs += 1;
            a.grow(e.bytes);
            h.0 += e.bytes;
            h.1 = h.1.max(h.0);
            let old = self.tensor_live.entry(e.pid).or_default().insert(e.dst, LiveAlloc { size: e.bytes, site, at_ns: e.start_ns });
            // A block handed out again unseen freed (its free's event lost).
            if let Some(o) = old {
                let prev = self.tensors.entry(o.site).or_default();
                prev.held_now = prev.held_now.saturating_sub(o.size);
                let h = self.allocated.entry(e.pid).or_default();
                h.0 = h.0.saturating_sub(o.size);
            }
        } else if let Some(a) = self.tensor_live.get_mut(&e.pid).and_then(|m| m.remove(&e.dst)) {
            let o = self.tensors.entry(a.site).or_default();
            o.freed += 1;
            o.held_now = o.held_now.saturating_sub(a.size);
            h.0 = h.0.saturating_sub(a.size);
        }
        let now = self.allocated.get(&e.pid).map_or(0, |h| h.0);
        self.allocated_series.entry(e.pid).or_default().point(e.start_ns, now);
    }

    fn memory(&mut self, site: RawSite, e: &CudaEvent) {
        match (e.api, api::canonical(e.api)) {
            (api::CU_MEM_CREATE, _) => self.allocated(site, e, true),
            (api::CU_MEM_RELEASE, _) if e.rc == 0 => self.freed(e, true),
            (_, api::MALLOC) => self.allocated(site, e, false),
            (_, api::FREE) if e.rc == 0 => self.freed(e, false),
            (_, api::HOST_ALLOC | api::MALLOC_HOST | api::HOST_REGISTER) if e.rc == 0 && e.dst != 0 && e.bytes != 0 => {
                self.pinned.entry(e.pid).or_default().insert(e.dst, e.dst.saturating_add(e.bytes));
            }
            (_, api::FREE_HOST | api::HOST_UNREGISTER) if e.rc == 0 => {
                if let Some(m) = self.pinned.get_mut(&e.pid) {
                    m.remove(&e.dst);
                }
            }
            _ => {}
        }
    }

    /// Adds the allocations still live to their sites' `AllocObs`
    /// (`mid_ns`: the middle of the window). Call once, at the end.
    pub fn close(&mut self, mid_ns: u64) {
        let physical = self.physical.values().flat_map(|m| m.values());
        for a in self.device.values().flat_map(|m| m.values()).chain(physical) {
            let o = self.allocs.entry(a.site).or_default();
            o.live += 1;
            o.live_bytes += a.size;
            o.live_late += (a.at_ns >= mid_ns) as u64;
        }
        self.device.clear();
        self.physical.clear();
        for a in self.tensor_live.values().flat_map(|m| m.values()) {
            let o = self.tensors.entry(a.site).or_default();
            o.live += 1;
            o.live_bytes += a.size;
            o.live_late += (a.at_ns >= mid_ns) as u64;
        }
        self.tensor_live.clear();
    }

    /// Processes that exited and were reported: everything kept of them
    /// goes (the agent's memory stays flat under process churn).
    pub fn forget_pids(&mut self, pids: &std::collections::HashSet<u32>) {
        let gone = |pid: &u32| pids.contains(pid);
        self.copies.retain(|(s, _), _| !gone(&s.pid));
        self.syncs.retain(|(s, _), _| !gone(&s.pid));
        self.allocs.retain(|s, _| !gone(&s.pid));
        self.tensors.retain(|s, _| !gone(&s.pid));
        self.return_codes.retain(|(s, _, _), _| !gone(&s.pid));
        self.host_memory.retain(|(s, _, _), _| !gone(&s.pid));
        self.collectives.retain(|(s, _, _), _| !gone(&s.pid));
        for m in [&mut self.held, &mut self.allocated] {
            m.retain(|p, _| !gone(p));
        }
        for m in [&mut self.held_series, &mut self.allocated_series] {
            m.retain(|p, _| !gone(p));
        }
        for m in [&mut self.device, &mut self.physical, &mut self.tensor_live] {
            m.retain(|p, _| !gone(p));
        }
        self.pinned.retain(|p, _| !gone(p));
        self.event_copy.retain(|(p, _), _| !gone(p));
        self.names.retain(|(p, _), _| !gone(p));
        self.kernel_of.retain(|(p, _), _| !gone(p));
    }

    /// Threads that exited: their pending copy (for copy/sync pairs) is
    /// dropped.
    pub fn forget_threads(&mut self, tids: &[u32]) {
        for t in tids {
            self.last_copy.remove(t);
        }
        self.graphs.forget_threads(tids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::cuda::KIND_NONE;

    fn ev(api: u32, kind: u32, bytes: u64, dst: u64, src: u64, stream: u64, py: u64) -> CudaEvent {
        CudaEvent { pid: 1, tid: 1, api, kind, bytes, dst, src, stream, py_stack: py, dur_ns: 10, ..Default::default() }
    }

    #[test]
    fn pinned_ranges_and_pairs() {
        let mut r = Replay::default();
        r.apply(&ev(api::HOST_ALLOC, KIND_NONE, 4096, 0x1000, 0, 0, 9));
        // Pinned source, then a sync on the same stream.
        r.apply(&ev(api::MEMCPY_ASYNC, KIND_HTOD, 100, 0xd000, 0x1800, 7, 1));
        r.apply(&ev(api::STREAM_SYNC, KIND_NONE, 0, 0, 0, 7, 2));
        // Pageable source (just past the range), sync on another stream.
        r.apply(&ev(api::MEMCPY_ASYNC, KIND_HTOD, 100, 0xd000, 0x2000, 7, 1));
        r.apply(&ev(api::STREAM_SYNC, KIND_NONE, 0, 0, 0, 8, 2));
        let site = RawSite { pid: 1, py_stack: 1, ..Default::default() };
        let o = &r.copies[&(site, KIND_HTOD)];
        assert_eq!((o.count, o.pinned, o.pageable, o.sync_pairs), (2, 1, 1, 1));
        let s = &r.syncs[&(RawSite { pid: 1, py_stack: 2, ..Default::default() }, api::STREAM_SYNC)];
        assert_eq!((s.count, s.after_copy), (2, 1));
        // Freed: no longer pinned.
        r.apply(&ev(api::FREE_HOST, KIND_NONE, 0, 0x1000, 0, 0, 9));
        r.apply(&ev(api::MEMCPY, KIND_HTOD, 100, 0xd000, 0x1800, 0, 1));
        assert_eq!(r.copies[&(site, KIND_HTOD)].pageable, 2);
        assert_eq!(r.host_memory[&(site, api::MEMCPY_ASYNC, KIND_HTOD)], (1, 1));
    }

    /// torch's `x.to("cpu", non_blocking=True)` + `event.record()` +
    /// `event.synchronize()`, and vLLM's (the sync later, other calls in
    /// between): the event's synchronize waits for the copy.
    #[test]
    fn event_sync_covers_the_copy_recorded_behind() {
        let mut r = Replay::default();
        let site = RawSite { pid: 1, py_stack: 1, ..Default::default() };
        for _ in 0..3 {
            r.apply(&ev(api::MEMCPY_ASYNC, KIND_DTOH, 4, 0x1000, 0xd000, 7, 1));
            r.apply(&ev(api::EVENT_RECORD, KIND_NONE, 0, 0xe0, 0, 7, 2));
            r.apply(&ev(api::MALLOC, KIND_NONE, 64, 0x2000, 0, 0, 5));
            r.apply(&ev(api::EVENT_SYNC, KIND_NONE, 0, 0, 0, 0xe0, 3));
        }
        // Recorded on another stream: covers nothing; a second sync of the
        // same event waits for nothing more.
        r.apply(&ev(api::MEMCPY_ASYNC, KIND_DTOH, 4, 0x1000, 0xd000, 7, 1));
        r.apply(&ev(api::CU_EVENT_RECORD, KIND_NONE, 0, 0xe0, 0, 8, 2));
        r.apply(&ev(api::EVENT_SYNC, KIND_NONE, 0, 0, 0, 0xe0, 3));
        r.apply(&ev(api::EVENT_SYNC, KIND_NONE, 0, 0, 0, 0xe0, 3));
        let o = &r.copies[&(site, KIND_DTOH)];
        assert_eq!((o.count, o.sync_pairs), (4, 3));
        let s = &r.syncs[&(RawSite { pid: 1, py_stack: 3, ..Default::default() }, api::EVENT_SYNC)];
        assert_eq!((s.count, s.after_copy), (5, 3));
    }

    /// Pool allocations pair with their frees; `cuMemCreate` handles
    /// with `cuMemRelease`: both halves seen, the rest left live.
    #[test]
    fn pool_and_vmm_allocations_are_tracked() {
        let mut r = Replay::default();
        r.apply(&ev(api::MALLOC_FROM_POOL_ASYNC, KIND_NONE, 4096, 0x7000_0000, 0, 9, 1));
        r.apply(&ev(api::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, KIND_NONE, 4096, 0x7000_1000, 0, 9, 1));
        r.apply(&ev(api::FREE_ASYNC, KIND_NONE, 0, 0x7000_0000, 0, 9, 2));
        for h in 1..=3u64 {
            r.apply(&ev(api::CU_MEM_CREATE, KIND_NONE, 2 << 20, h, 0, 0, 3));
        }
        r.apply(&ev(api::CU_MEM_RELEASE, KIND_NONE, 0, 2, 0, 0, 4));
        r.apply(&ev(api::CU_MEM_RELEASE, KIND_NONE, 0, 99, 0, 0, 4));
        // A handle is not an address: copies' directions ignore it.
        assert_eq!(r.effective_kind(1, KIND_DEFAULT, 0x5000, 1), KIND_DEFAULT);
        r.close(0);
        let pool = &r.allocs[&RawSite { pid: 1, py_stack: 1, ..Default::default() }];
        assert_eq!((pool.allocs, pool.freed, pool.live), (2, 1, 1));
        let vmm = &r.allocs[&RawSite { pid: 1, py_stack: 3, ..Default::default() }];
        assert_eq!((vmm.allocs, vmm.freed, vmm.live, vmm.live_bytes), (3, 1, 2, 4 << 20));
    }

    #[test]
    fn tensors_are_held_by_the_line_that_asked() {
        let mut r = Replay::default();
        // Line 1 keeps 2 of 3 tensors of 1 MiB; line 2 takes one of 4 MiB
        // and frees it (at line 3: still line 2's).
        for p in 0..3u64 {
            r.apply(&ev(api::TORCH_MALLOC, KIND_NONE, 1 << 20, 0x7000_0000 + (p << 20), 0, 0, 1));
        }
        r.apply(&ev(api::TORCH_FREE, KIND_NONE, 0, 0x7010_0000, 0, 0, 1));
        r.apply(&ev(api::TORCH_MALLOC, KIND_NONE, 4 << 20, 0x7100_0000, 0, 0, 2));
        r.apply(&ev(api::TORCH_FREE, KIND_NONE, 0, 0x7100_0000, 0, 0, 3));
        // A free of a block never seen handed out changes nothing.
        r.apply(&ev(api::TORCH_FREE, KIND_NONE, 0, 0x7200_0000, 0, 0, 3));
        assert_eq!(r.allocated[&1], (2 << 20, 6 << 20));
        r.close(0);
        let one = &r.tensors[&RawSite { pid: 1, py_stack: 1, ..Default::default() }];
        assert_eq!((one.allocs, one.freed, one.live, one.live_bytes, one.peak_held_bytes), (3, 1, 2, 2 << 20, 3 << 20));
        let two = &r.tensors[&RawSite { pid: 1, py_stack: 2, ..Default::default() }];
        assert_eq!((two.allocs, two.freed, two.live, two.peak_held_bytes), (1, 1, 0, 4 << 20));
        // Tensors are not the allocator's device memory (its segments).
        assert!(r.allocs.is_empty() && r.held.is_empty());
    }

    #[test]
    fn a_series_stays_bounded_and_spans_the_whole_life() {
        let mut s = Series::default();
        for i in 0..20_000u64 {
            s.point(i * SERIES_STEP_NS, i);
        }
        assert!(s.points.len() <= SERIES_MAX, "{}", s.points.len());
        assert!(s.points.first().is_some_and(|p| p.0 < 10 * SERIES_STEP_NS), "{:?}", s.points.first());
        assert_eq!(s.points.last(), Some(&(19_999 * SERIES_STEP_NS, 19_999)));
        // Within a step, the last value stands for it.
        let mut t = Series::default();
        t.point(1, 5);
        t.point(2, 7);
        assert_eq!(t.points, [(2, 7)]);
    }

    #[test]
    fn driver_kernels_are_named_by_their_lookup() {
        let mut r = Replay::default();
        let name = |pid: u32, handle: u64, s: &str| {
            let mut n = CudaName { pid, len: s.len() as u32 + 1, handle, name: [0; tracer_common::cuda::NAME_BYTES] };
            n.name[..s.len()].copy_from_slice(s.as_bytes());
            n
        };
        r.add_name(&name(1, 0xf1, "triton_poi_fused_add_0"));
        r.add_name(&name(1, 0xa1, "_Z6kernelPfi"));
        let mut e = ev(api::CU_KERNEL_GET_FUNCTION, KIND_NONE, 0, 0xf2, 0xa1, 0, 1);
        r.apply(&e);
        assert_eq!(r.kernel_name(1, 0xf1), Some("triton_poi_fused_add_0"));
        assert_eq!(r.kernel_name(1, 0xf2), Some("_Z6kernelPfi"), "a CUfunction got from a named CUkernel");
        assert_eq!(r.kernel_name(1, 0xa1), Some("_Z6kernelPfi"), "a CUkernel launched as a CUfunction");
        assert_eq!(r.kernel_name(2, 0xf1), None, "handles are per process");
        e.rc = 500;
        e.dst = 0xf3;
        r.apply(&e);
        assert_eq!(r.kernel_name(1, 0xf3), None);
        // An unreadable name (len 0) names nothing.
        r.add_name(&CudaName { pid: 1, len: 0, handle: 0xf4, name: [0; tracer_common::cuda::NAME_BYTES] });
        assert_eq!(r.kernel_name(1, 0xf4), None);
    }

    /// The kernel's exact figures raise the replay's (events lost), never
    /// lower them (the replay's own, e.g. Default copies given a direction).
    #[test]
    fn kernel_figures_are_a_floor() {
        let mut seen = CopyObs { count: 3, bytes: 300, ns: 30, async_count: 3, sync_pairs: 2, pinned: 3, ..Default::default() };
        let kernel = CopyObs { count: 10, bytes: 1000, ns: 20, async_count: 10, sync_pairs: 9, sync_pair_ns: 90, ..Default::default() };
        seen.at_least(&kernel);
        assert_eq!((seen.count, seen.bytes, seen.ns, seen.async_count, seen.sync_pairs, seen.sync_pair_ns), (10, 1000, 30, 10, 9, 90));
        assert_eq!(seen.pinned, 3, "what only the events tell stays");
        let mut s = SyncObs { count: 5, ns: 50, after_copy: 5, collective_ns: 0 };
        s.at_least(&SyncObs { count: 9, ns: 40, after_copy: 9, collective_ns: 0 });
        assert_eq!((s.count, s.ns, s.after_copy), (9, 50, 9));
    }

    #[test]
    fn default_kind_and_leaks() {
        let mut r = Replay::default();
        let mut m = ev(api::MALLOC, KIND_NONE, 1 << 20, 0x7000_0000, 0, 0, 5);
        r.apply(&m);
        m.dst = 0x7100_0000;
        m.start_ns = 100;
        r.apply(&m);
        assert_eq!(r.effective_kind(1, KIND_DEFAULT, 0x7000_0010, 0x5000), KIND_HTOD);
        assert_eq!(r.effective_kind(1, KIND_DEFAULT, 0x5000, 0x7100_0000), KIND_DTOH);
        assert_eq!(r.effective_kind(1, KIND_DEFAULT, 0x5000, 0x6000), KIND_DEFAULT);
        r.apply(&ev(api::FREE, KIND_NONE, 0, 0x7000_0000, 0, 0, 6));
        r.close(50);
        let a = &r.allocs[&RawSite { pid: 1, py_stack: 5, ..Default::default() }];
        assert_eq!((a.allocs, a.freed, a.live, a.live_bytes, a.live_late), (2, 1, 1, 1 << 20, 1));
    }
}
