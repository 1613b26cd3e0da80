//! The CUDA part of a recording, built from what the collector has so far:
//! the kernel's aggregates by (pid, API, kind, site), launches by kernel,
//! call sites resolved to the leaf Python frame (else the first native frame
//! outside libcudart), and the detector's findings ([`findings`](super::findings)).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aya::maps::HashMap as BpfHashMap;
use tracer_common::{
    counters,
    cuda::{api, CudaKey, CudaStats, LaunchKey, KIND_DEFAULT},
};

use super::{
    collector::{symbolize_function, Attached, CudaCollector},
    discovery,
    findings::{self, SiteSummary},
    graphs, kernel_names, no_device,
    replay::{AllocObs, CollObs, RawSite, Replay},
};
use crate::{
    engine::{Cx, Topic},
    os::probe::{self, ProbeError},
    recording::{
        cuda::{api_name, kind_name, CallClass, CudaCall, CudaCollective, CudaLaunch, CudaLibrary, CudaReport, DeviceMemory, DeviceMemoryLine, Site},
        Frame, FrameKind, UNKNOWN,
    },
};

impl CudaCollector {
    /// The report so far: reads the kernel aggregates, resolves sites,
    /// runs the detector over a copy of the replayed events.
    pub(super) fn report(&mut self, cx: &mut Cx<'_>) -> Result<CudaReport, ProbeError> {
        let (start, end) = (cx.window.start, cx.window.now_or_end());
        let window_ns = end.saturating_sub(start);
        let mut report = CudaReport { window_ns, ..Default::default() };
        report.driver_probes_off = self.gate.records(end);
        if self.attached.is_empty() {
            return Ok(report);
        }
        self.name_kernels(&mut cx.kernel.ebpf, &mut cx.stacks.symbolizer)?;
        // The aggregates first, then the events: every call counted has
        // had its event submitted, so a call without one was lost (while
        // recording, calls that return in between are only in the events).
        let stats: Vec<(CudaKey, CudaStats)> = {
            let map: BpfHashMap<_, CudaKey, CudaStats> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::CUDA_STATS)?;
            map.iter().filter_map(Result::ok).chain(self.retired_stats.iter().map(|(k, v)| (*k, *v))).collect()
        };
        report.events_lost = probe::counter(&mut cx.kernel.ebpf, counters::CUDA_EVENTS_LOST)?;
        report.calls_lost = probe::counter(&mut cx.kernel.ebpf, counters::CUDA_LOST)?;
        // Allocations still live count as leaks; the replay goes on after a snapshot.
        let mut replay = self.events.as_ref().map(|e| e.with(|r| r.clone())).unwrap_or_default();
        replay.close(start + window_ns / 2);
        let launches: Vec<(LaunchKey, u64)> = {
            let map: BpfHashMap<_, LaunchKey, u64> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::CUDA_LAUNCHES)?;
            map.iter().filter_map(Result::ok).chain(self.retired_launches.iter().map(|(k, v)| (*k, *v))).collect()
        };
        let mut sites = SiteCache { sites: HashMap::new() };

        report.calls = calls(&stats, &replay, &mut sites, cx)?;
        for note in no_device::notes(&report.calls) {
            cx.sink.note_on(Topic::Gpu, note);
        }

        report.launches = self.launches(&launches, &replay, &mut sites, cx, end)?;
        let names_lost = probe::counter(&mut cx.kernel.ebpf, counters::CUDA_NAMES_LOST)?;
        if names_lost > 0 {
            cx.sink.note_on(
                Topic::Gpu,
                format!("{names_lost} kernel names lost (CUDA_NAMES ring full): launches of those kernels show their handle (CUfunction 0x...)"),
            );
        }
        {
            let mut resolve = |r: RawSite| sites.resolve(r, cx);
            report.graph_launches = graphs::graph_launches(&launches, &replay.graphs, &mut resolve)?;
            report.graph_captures = graphs::graph_captures(&replay.graphs, &mut resolve)?;
        }
        report.collectives = collectives(&replay, &report.calls, &mut sites, cx)?;
        if let Some(s) = &self.slicer {
            report.launch_sampling = Some(s.summary(end, launches.iter().map(|(_, n)| *n).sum()));
        }

        let summaries = site_summaries(&stats, &replay, &mut sites, cx)?;
        report.device_memory = device_memory(&summaries, &replay, start);
        report.findings = findings::detect(&summaries, window_ns, &self.thresholds);
        report.findings.extend(graphs::recaptured(&report.graph_captures, window_ns, &self.thresholds));
        report.findings.extend(findings::launch_bound(&report.launches, window_ns, &self.thresholds));
        report.findings.extend(report.device_memory.iter().filter_map(crate::recording::cuda::gpu_memory_growth));
        findings::rank(&mut report.findings);
        attribute_lost_events(&mut report);

        report.libraries = self.libraries(&stats, &launches);
        if replay.events == 0 && report.calls.iter().any(|c| c.count > 0) {
            cx.sink.note_on(Topic::Gpu, "no per-call CUDA events arrived: pinned memory and copy/sync sequences are unknown");
        }
        Ok(report)
    }

    /// Launches by (pid, kernel, site, API), counted (or estimated, when sliced).
    fn launches(&mut self, launches: &[(LaunchKey, u64)], replay: &Replay, sites: &mut SiteCache, cx: &mut Cx<'_>, end: u64) -> Result<Vec<CudaLaunch>, ProbeError> {
        let mut by_kernel: BTreeMap<(u32, String, Site, u32), (u64, f64)> = BTreeMap::new();
        for (k, n) in launches.iter().filter(|(k, _)| !api::is_graph_launch(k.api)) {
            let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: 0 };
            let site = sites.resolve(raw, cx)?;
            let name = if api::is_driver(k.api) {
                // A driver launch passes a CUfunction handle, not code:
                // named by the lookup that made it.
                kernel_names::driver_kernel(replay, k.pid, k.func)
            } else {
                match self.kernel_names.get(&(k.pid, k.func)) {
                    Some(n) => n.clone(),
                    None => symbolize_function(&mut cx.stacks.symbolizer, k.pid, k.func),
                }
            };
            let e = by_kernel.entry((k.pid, name, site, k.api)).or_default();
            e.0 += n;
            e.1 += self.slicer.as_ref().map_or(*n as f64, |s| s.estimate(k.tid, *n, end));
        }
        let estimated = self.slicer.as_ref().is_some_and(|s| s.estimating());
        let sampled = self.slicer.is_some();
        let mut out: Vec<CudaLaunch> = by_kernel
            .into_iter()
            .map(|((pid, kernel, site, a), (seen, est))| CudaLaunch {
                pid,
                kernel,
                count: if estimated { est.round() as u64 } else { seen },
                site,
                api: api_name(a),
                estimated,
                sampled: sampled.then_some(seen),
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.kernel.cmp(&b.kernel)));
        Ok(out)
    }

    /// The libraries some target used: mapped, or (probed up front, the
    /// user gone before its maps were read) one of whose functions was
    /// counted.
    fn libraries(&self, stats: &[(CudaKey, CudaStats)], launches: &[(LaunchKey, u64)]) -> Vec<CudaLibrary> {
        let counted: BTreeSet<String> =
            stats.iter().map(|(k, _)| api_name(k.api)).chain(launches.iter().map(|(k, _)| api_name(k.api))).collect();
        // A library no target was seen mapping (probed before it was
        // loaded, its process gone before its maps were read) is listed
        // when a function of it was counted that no mapped library has:
        // the calls were its. (Another libcudart probed ahead in
        // site-packages shares every name with the one a target maps.)
        let mapped: BTreeSet<&str> = self.attached.values().filter(|a| !a.pids.is_empty()).flat_map(|a| a.functions.iter().copied()).collect();
        let mut libs: Vec<&Attached> = self
            .attached
            .values()
            .filter(|a| !a.pids.is_empty() || a.functions.iter().any(|f| counted.contains(*f) && !mapped.contains(*f)))
            .collect();
        libs.sort_by(|a, b| a.path.cmp(&b.path));
        libs
            .into_iter()
            .map(|a| CudaLibrary {
                path: a.path.clone(),
                functions: a.functions.iter().map(|f| (*f).to_owned()).collect(),
                pids: a.pids.iter().copied().collect(),
            })
            .collect()
    }
}

/// Calls by (pid, API, kind, site), with their return codes and host
/// memory from the events, and the calls whose event was lost.
fn calls(stats: &[(CudaKey, CudaStats)], replay: &Replay, sites: &mut SiteCache, cx: &mut Cx<'_>) -> Result<Vec<CudaCall>, ProbeError> {
    let mut sums: BTreeMap<(u32, u32, u32, Site), CudaStats> = BTreeMap::new();
    let mut raw_of_call: HashMap<(u32, u32, u32, Site), BTreeSet<RawSite>> = HashMap::new();
    for (k, v) in stats {
        let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: k.caller };
        let site = sites.resolve(raw, cx)?;
        let key = (k.pid, k.api, k.kind, site);
        sums.entry(key.clone()).or_default().merge(v);
        raw_of_call.entry(key).or_default().insert(raw);
    }
    let mut calls: BTreeMap<(u32, u32, u32, Site), CudaCall> = sums
        .into_iter()
        .map(|(key, v)| {
            let c = CudaCall {
                pid: key.0,
                api: api_name(key.1),
                kind: kind_name(key.2).map(str::to_owned),
                class: Some(CallClass::of_api(key.1)),
                count: v.count,
                bytes: v.bytes,
                total_ns: v.total_ns,
                errors: v.errors,
                site: key.3.clone(),
                return_codes: BTreeMap::new(),
                pinned: None,
                pageable: None,
                events_lost: 0,
                not_ready: api::is_query(key.1).then_some(v.not_ready),
                poll_waits: api::is_query(key.1).then_some(v.poll_waits),
                poll_ns: api::is_query(key.1).then_some(v.poll_ns),
                collective_waits: waits_collectives(key.1).then_some(v.coll_waits),
                collective_wait_ns: waits_collectives(key.1).then_some(v.coll_wait_ns),
            };
            (key, c)
        })
        .collect();
    for (key, raws) in &raw_of_call {
        let c = calls.get_mut(key).expect("call key");

        let mut events = 0;
        for raw in raws {
            if let Some(codes) = replay.return_codes.get(&(*raw, key.1, key.2)) {
                for (rc, n) in codes {
                    *c.return_codes.entry(*rc).or_default() += n;
                    events += n;
                }
            }
            if let Some((p, q)) = replay.host_memory.get(&(*raw, key.1, key.2)) {
                *c.pinned.get_or_insert(0) += p;
                *c.pageable.get_or_insert(0) += q;
            }
        }
        if api::is_query(key.1) {
            // Only errors send an event: the rest are the kernel's counts.
            let not_ready = c.not_ready.unwrap_or(0);
            let ok = c.count.saturating_sub(c.errors).saturating_sub(not_ready);
            for (rc, n) in [(0, ok), (tracer_common::cuda::api::NOT_READY, not_ready)] {
                if n > 0 {
                    *c.return_codes.entry(rc).or_default() += n;
                }
            }
            c.events_lost = c.errors.saturating_sub(events);
        } else {
            c.events_lost = c.count.saturating_sub(events);
        }
    }
    let mut calls: Vec<CudaCall> = calls.into_values().collect();
    calls.sort_by(|a, b| {
        b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)).then(a.api.cmp(&b.api)).then(a.site.cmp(&b.site))
    });
    Ok(calls)
}

/// Calls whose rows carry collective waits: syncs, queries, collectives.
fn waits_collectives(a: u32) -> bool {
    api::is_sync(a) || api::is_query(a) || api::is_collective(a)
}

/// NCCL calls by (pid, API, communicator, site), from the events; most
/// bytes first. The host waits that covered them come from the kernel's
/// aggregates in `calls` (per site, not per communicator): given to a
/// site's row when it is the only one.
fn collectives(replay: &Replay, calls: &[CudaCall], sites: &mut SiteCache, cx: &mut Cx<'_>) -> Result<Vec<CudaCollective>, ProbeError> {
    let mut sums: BTreeMap<(u32, u32, u64, Site), CollObs> = BTreeMap::new();
    for ((raw, a, comm), obs) in &replay.collectives {
        let site = sites.resolve(*raw, cx)?;
        sums.entry((raw.pid, *a, *comm, site)).or_default().merge(obs);
    }
    let mut rows_at: HashMap<(u32, String, &Site), usize> = HashMap::new();
    let mut waits_at: HashMap<(u32, String, &Site), (u64, u64)> = HashMap::new();
    for c in calls.iter().filter(|c| c.class() == CallClass::Collective) {
        let w = waits_at.entry((c.pid, c.api.clone(), &c.site)).or_default();
        w.0 += c.collective_waits.unwrap_or(0);
        w.1 += c.collective_wait_ns.unwrap_or(0);
    }
    for (pid, a, _, site) in sums.keys() {
        *rows_at.entry((*pid, api_name(*a), site)).or_default() += 1;
    }
    let mut out: Vec<CudaCollective> = sums
        .iter()
        .map(|((pid, a, comm, site), o)| {
            let at = (*pid, api_name(*a), site);
            let waits = (rows_at.get(&at) == Some(&1)).then(|| waits_at.get(&at).copied().unwrap_or_default());
            CudaCollective {
                pid: *pid,
                api: api_name(*a),
                comm: format!("{comm:#x}"),
                count: o.count,
                bytes: o.bytes,
                total_ns: o.ns,
                errors: o.errors,
                site: site.clone(),
                host_waits: waits.map(|w| w.0),
                host_wait_ns: waits.map(|w| w.1),
            }
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)).then(a.api.cmp(&b.api)));
    Ok(out)
}

/// Device memory held per process and line, from the replay's allocations
/// (what allocation calls reserved from the device) and, where PyTorch's
/// allocator probes reported, its tensors.
fn device_memory(summaries: &[SiteSummary], replay: &Replay, start: u64) -> Vec<DeviceMemory> {
    let line = |s: &SiteSummary, a: &AllocObs| DeviceMemoryLine {
        site: s.site.clone(),
        allocs: a.allocs,
        frees: a.freed,
        held_bytes: a.live_bytes,
        peak_held_bytes: a.peak_held_bytes,
    };
    let mut by_pid: BTreeMap<u32, DeviceMemory> = BTreeMap::new();
    for s in summaries {
        let fresh = || DeviceMemory { pid: s.pid, ..Default::default() };
        if s.allocs.allocs > 0 {
            by_pid.entry(s.pid).or_insert_with(fresh).lines.push(line(s, &s.allocs));
        }
        if s.tensors.allocs > 0 {
            by_pid.entry(s.pid).or_insert_with(fresh).tensor_lines.push(line(s, &s.tensors));
        }
    }
    let order = |a: &DeviceMemoryLine, b: &DeviceMemoryLine| b.held_bytes.cmp(&a.held_bytes).then(b.peak_held_bytes.cmp(&a.peak_held_bytes)).then(a.site.cmp(&b.site));
    by_pid
        .into_values()
        .map(|mut d| {
            d.lines.sort_by(order);
            d.tensor_lines.sort_by(order);
            (d.held_bytes, d.peak_held_bytes) = replay.held.get(&d.pid).copied().unwrap_or_default();
            if let Some(&(now, peak)) = replay.allocated.get(&d.pid) {
                (d.allocated_bytes, d.peak_allocated_bytes) = (Some(now), Some(peak));
            }
            // From the window's start (the agent's windows: its part of
            // the process's life).
            let rel = |s: Option<&super::replay::Series>| -> Vec<[u64; 2]> {
                s.map_or(Vec::new(), |s| s.points.iter().filter(|p| p.0 >= start).map(|&(t, v)| [t - start, v]).collect())
            };
            d.held_series = rel(replay.held_series.get(&d.pid));
            d.allocated_series = rel(replay.allocated_series.get(&d.pid));
            d
        })
        .collect()
}

/// What the detector looks at, per resolved site: the events' replay,
/// raised to the kernel's exact aggregates where events were lost.
fn site_summaries(stats: &[(CudaKey, CudaStats)], replay: &Replay, sites: &mut SiteCache, cx: &mut Cx<'_>) -> Result<Vec<SiteSummary>, ProbeError> {
    let mut summaries: BTreeMap<(u32, Site), SiteSummary> = BTreeMap::new();
    let summary = |raw: RawSite, sites: &mut SiteCache, cx: &mut Cx<'_>| -> Result<(u32, Site), ProbeError> {
        Ok((raw.pid, sites.resolve(raw, cx)?))
    };
    for ((raw, kind), obs) in &replay.copies {
        let key = summary(*raw, sites, cx)?;
        let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        s.copies.entry(*kind).or_default().merge(obs);
    }
    for ((raw, _), obs) in &replay.syncs {
        let key = summary(*raw, sites, cx)?;
        let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        s.syncs.merge(obs);
    }
    for (raw, obs) in &replay.allocs {
        let key = summary(*raw, sites, cx)?;
        let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        s.allocs.merge(obs);
    }
    for (raw, obs) in &replay.tensors {
        let key = summary(*raw, sites, cx)?;
        let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        s.tensors.merge(obs);
    }
    // The kernel's aggregates (counts, bytes, times, copy->sync pairs)
    // are exact when events were lost: each such figure of the detector
    // is at least the kernel's. (Without loss the replay's are the same
    // or larger: it also gives `cudaMemcpyDefault` copies a direction.)
    let mut kernel: BTreeMap<(u32, Site), SiteSummary> = BTreeMap::new();
    for (k, v) in stats {
        if api::is_query(k.api) {
            // Only the kernel counts queries.
            let key = summary(RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: k.caller }, sites, cx)?;
            let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
            s.polls.queries += v.count;
            s.polls.not_ready += v.not_ready;
            s.polls.waits += v.poll_waits;
            s.polls.wait_ns += v.poll_ns;
            s.polls.errors += v.errors;
            continue;
        }
        let copy = api::is_copy(k.api) && k.kind != KIND_DEFAULT;
        if !copy && !api::is_sync(k.api) {
            continue;
        }
        let key = summary(RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: k.caller }, sites, cx)?;
        let s = kernel.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        if copy {
            let o = s.copies.entry(k.kind).or_default();
            o.count += v.count;
            o.bytes += v.bytes;
            o.ns += v.total_ns;
            o.errors += v.errors;
            if api::is_async_copy(k.api) {
                o.async_count += v.count;
                o.sync_pairs += v.sync_pairs;
                o.sync_pair_ns += v.sync_pair_ns;
            } else {
                o.sync_copies += v.count;
            }
        } else {
            s.syncs.count += v.count;
            s.syncs.ns += v.total_ns;
            s.syncs.after_copy += v.sync_pairs;
            s.syncs.collective_ns += v.coll_wait_ns;
        }
    }
    for (key, k) in kernel {
        let s = summaries.entry(key.clone()).or_insert_with(|| SiteSummary { pid: key.0, site: key.1, ..Default::default() });
        for (kind, ko) in k.copies {
            s.copies.entry(kind).or_default().at_least(&ko);
        }
        s.syncs.at_least(&k.syncs);
    }
    Ok(summaries.into_values().collect())
}

/// What the detector missed: the calls counted whose event was lost, at
/// each finding's site (in its whole process for `copy_time_share`, which
/// sums the process's sites).
fn attribute_lost_events(report: &mut CudaReport) {
    let mut lost_at: HashMap<(u32, &Site), u64> = HashMap::new();
    let mut lost_in: HashMap<u32, u64> = HashMap::new();
    for c in report.calls.iter().filter(|c| c.events_lost > 0) {
        *lost_at.entry((c.pid, &c.site)).or_default() += c.events_lost;
        *lost_in.entry(c.pid).or_default() += c.events_lost;
    }
    for f in &mut report.findings {
        let n = if f.events_lost_process_wide() { lost_in.get(&f.pid) } else { lost_at.get(&(f.pid, &f.site)) };
        f.events_lost = n.copied().unwrap_or(0);
    }
}

fn is_cudart_module(f: &Frame) -> bool {
    f.module.as_deref().is_some_and(discovery::is_cudart_name)
}

pub(super) struct SiteCache {
    pub(super) sites: HashMap<RawSite, Site>,
}

impl SiteCache {
    pub(super) fn resolve(&mut self, raw: RawSite, cx: &mut Cx<'_>) -> Result<Site, ProbeError> {
        if let Some(s) = self.sites.get(&raw) {
            return Ok(s.clone());
        }
        let frames = cx.frames(raw.pid, raw.user_stack, -1, raw.py_stack)?;
        let sym = &mut cx.stacks.symbolizer;
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
        Ok(site)
    }
}
