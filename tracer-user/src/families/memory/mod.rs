//! Resident memory, user side: the kernel's `rss_stat` program
//! (tracer-ebpf/src/memory.rs) sends a point of each target's series when
//! its resident size moved by 1 MiB or 100 ms passed with a change, keeps
//! its counters and peak (`MEM_STATE`), and counts the bytes each stack
//! grew or released (`MEM_GROWTH`, a stack sampled every
//! `GROWTH_SAMPLE_BYTES`). Here: the series (with a first and last point
//! read from `/proc/PID/status`), the peak, the slope and the lines.

pub mod status;

use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, RingBuf};
use tracer_common::memory::{GrowthKey, GrowthStats, MemSample, MemState, OomKill, GROWTH_SAMPLE_BYTES};

use crate::{
    engine::{
        programs::Links, ring::Records, Collector, Cx, FamilyTable, GlobalSpec, GlobalValue, Handle, Part, ProgramKind, ProgramSpec, TargetEvent,
    },
    os::probe::{self, ProbeError},
    recording::{
        attribution,
        memory::{slope, GrowthLine, GrowthStack, MemPoint, MemoryLimit, MemoryReport, OomKilled, ProcessMemory},
        Origin, Recording,
    },
};

const RSS_STAT: ProgramSpec = ProgramSpec { name: "mem_rss_stat", kind: ProgramKind::TracePoint { category: "kmem", name: "rss_stat" } };
const OOM_VICTIM: ProgramSpec = ProgramSpec { name: "mem_oom_victim", kind: ProgramKind::TracePoint { category: "oom", name: "mark_victim" } };

pub static TABLE: FamilyTable = FamilyTable {
    family: "memory",
    programs: &[RSS_STAT, OOM_VICTIM],
    globals: &[
        GlobalSpec { name: "RSS_MM_ID_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("kmem", "rss_stat", "mm_id", 8))) },
        GlobalSpec { name: "RSS_CURR_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("kmem", "rss_stat", "curr", 12))) },
        GlobalSpec { name: "RSS_MEMBER_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("kmem", "rss_stat", "member", 16))) },
        GlobalSpec { name: "RSS_SIZE_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("kmem", "rss_stat", "size", 24))) },
        GlobalSpec { name: "MEM_GROWTH_SAMPLE_BYTES", value: |_| Ok(GlobalValue::U64(GROWTH_SAMPLE_BYTES)) },
        GlobalSpec { name: "OOM_PID_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("oom", "mark_victim", "pid", 8))) },
        GlobalSpec { name: "OOM_ANON_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("oom", "mark_victim", "anon_rss", 24))) },
        GlobalSpec { name: "OOM_FILE_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("oom", "mark_victim", "file_rss", 32))) },
        GlobalSpec { name: "OOM_SHMEM_OFFSET", value: |i| Ok(GlobalValue::U32(i.tracepoint_field("oom", "mark_victim", "shmem_rss", 40))) },
    ],
};

/// The most points a process's series keeps (some 7 minutes of a process
/// that changes all the time; then thinned, see `push`).
pub const SERIES_MAX: usize = 4096;

/// The memory family's collector.
#[derive(Default)]
pub struct MemoryCollector {
    links: Links,
    samples: Option<Records<MemSample>>,
    /// Per process: its series so far (absolute CLOCK_MONOTONIC ns).
    series: BTreeMap<u32, Vec<(u64, MemPoint)>>,
    /// Per process: the highest resident size its points showed.
    peak: HashMap<u32, u64>,
    /// Per process: its cgroup's memory limit, read when it appeared.
    limits: HashMap<u32, MemoryLimit>,
    /// Per process gone from the kernel map: its `rss_stat` events.
    events: HashMap<u32, u64>,
    attached: bool,
}

impl MemoryCollector {
    /// Adds a point read from `/proc/PID/status` now (a first one), and
    /// notes the process's cgroup memory limit.
    fn read_point(&mut self, pid: u32) {
        if let Some((bytes, file)) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok().and_then(|t| crate::engine::memory::limit_of(&t)) {
            self.limits.insert(pid, MemoryLimit { bytes, file: file.display().to_string() });
        }
        let Some(s) = status::read(pid) else { return };
        let now = crate::os::clock::monotonic_ns();
        self.push(pid, now, s.point);
    }

    fn push(&mut self, pid: u32, ts: u64, p: MemPoint) {
        let peak = self.peak.entry(pid).or_default();
        *peak = (*peak).max(p.rss);
        let s = self.series.entry(pid).or_default();
        s.push((ts, p));
        // Bounded (the agent follows a process for its life): past
        // SERIES_MAX points, every other one goes (the first and the last
        // stay); the peak is kept apart.
        if s.len() > SERIES_MAX {
            let last = s.len() - 1;
            let mut i = 0;
            s.retain(|_| {
                let keep = i % 2 == 0 || i == last;
                i += 1;
                keep
            });
        }
    }

    fn drain(&mut self) {
        let mut got = Vec::new();
        if let Some(r) = self.samples.as_mut() {
            r.drain(|s| got.push(s));
        }
        for s in got {
            let peak = self.peak.entry(s.pid).or_default();
            *peak = (*peak).max(s.peak);
            self.push(s.pid, s.ts_ns, MemPoint::of_counters(0, s.cur));
        }
    }
}

/// Removes the entries of `pids` from the pid-keyed map `name`.
fn forget_pids_in<V: aya::Pod>(ebpf: &mut aya::Ebpf, name: &'static str, pids: &std::collections::HashSet<u32>) {
    let Ok(mut m) = probe::hash_map::<u32, V>(ebpf, name) else { return };
    let gone: Vec<u32> = m.keys().filter_map(Result::ok).filter(|p| pids.contains(p)).collect();
    for p in &gone {
        let _ = m.remove(p);
    }
}

impl Collector for MemoryCollector {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Targets, Handle::Stacks, Handle::Window]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Memory]
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        if cx.kernel.tracefs.is_none() {
            cx.sink.note("tracefs unavailable: no resident-memory series (kmem/rss_stat)");
            return Ok(());
        }
        // A kernel without one of the tracepoints loses that part, not the recording.
        if let Err(e) = self.links.attach(&mut cx.kernel, &RSS_STAT) {
            cx.sink.note(format!("no resident-memory series: attaching kmem/rss_stat failed: {e}"));
            return Ok(());
        }
        if let Err(e) = self.links.attach(&mut cx.kernel, &OOM_VICTIM) {
            cx.sink.note(format!("OOM kills are not reported: attaching oom/mark_victim failed: {e}"));
        }
        let map = cx.kernel.ebpf.take_map(tracer_common::maps::MEM_SAMPLES).ok_or(ProbeError::MissingMap(tracer_common::maps::MEM_SAMPLES))?;
        self.samples = Some(Records::new(RingBuf::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::MEM_SAMPLES, e))?, "memory_short_records"));
        self.attached = true;
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        match ev {
            // Its counters leave the kernel map (bounded: a churning
            // service would fill it); its peak stays here.
            TargetEvent::Exited { pid } if self.attached => {
                let mut state: BpfHashMap<_, u32, MemState> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::MEM_STATE)?;
                if let Ok(st) = state.get(pid, 0) {
                    let peak = self.peak.entry(*pid).or_default();
                    *peak = (*peak).max(st.peak);
                    *self.events.entry(*pid).or_default() += st.events;
                    let _ = state.remove(pid);
                }
            }
            // A launched process is held before its exec: its memory then
            // is ours; its first point comes at the exec.
            TargetEvent::Appeared { origin: Origin::Launched, .. } => {}
            TargetEvent::Appeared { pid, .. } | TargetEvent::Forked { pid, .. } | TargetEvent::Execed { pid, .. } if self.attached => {
                self.read_point(*pid);
            }
            _ => {}
        }
        Ok(())
    }

    fn poll(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.drain();
        Ok(())
    }

    /// Processes gone and reported (the agent): their series, peaks and
    /// limits here, and their entries of the kernel maps (growth stacks, OOM
    /// kills, counters), which would fill under process churn.
    fn forget(&mut self, cx: &mut Cx<'_>, pids: &std::collections::HashSet<u32>) {
        self.series.retain(|p, _| !pids.contains(p));
        self.peak.retain(|p, _| !pids.contains(p));
        self.limits.retain(|p, _| !pids.contains(p));
        self.events.retain(|p, _| !pids.contains(p));
        if !self.attached {
            return;
        }
        if let Ok(mut m) = probe::hash_map::<GrowthKey, GrowthStats>(&mut cx.kernel.ebpf, tracer_common::maps::MEM_GROWTH) {
            let gone: Vec<GrowthKey> = m.keys().filter_map(Result::ok).filter(|k| pids.contains(&k.pid)).collect();
            for k in &gone {
                let _ = m.remove(k);
            }
        }
        forget_pids_in::<OomKill>(&mut cx.kernel.ebpf, tracer_common::maps::MEM_OOM, pids);
        forget_pids_in::<MemState>(&mut cx.kernel.ebpf, tracer_common::maps::MEM_STATE, pids);
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        if !self.attached {
            return Ok(());
        }
        self.drain();
        let window_start = cx.window.start;
        let live = cx.targets.live_pids();
        let mut series = self.series.clone();
        // `VmHWM` only from the end of the window: read earlier, it would
        // miss the growth since.
        let mut hwm: HashMap<u32, u64> = HashMap::new();
        for pid in &live {
            if let Some(s) = status::read(*pid) {
                hwm.insert(*pid, s.hwm);
                series.entry(*pid).or_default().push((crate::os::clock::monotonic_ns(), s.point));
            }
        }
        let mut peaks = self.peak.clone();
        let mut events = self.events.clone();
        {
            let state: BpfHashMap<_, u32, MemState> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::MEM_STATE)?;
            for (pid, st) in state.iter().filter_map(Result::ok) {
                let p = peaks.entry(pid).or_default();
                *p = (*p).max(st.peak);
                *events.entry(pid).or_default() += st.events;
            }
        }
        let growth: Vec<(GrowthKey, GrowthStats)> = {
            let map: BpfHashMap<_, GrowthKey, GrowthStats> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::MEM_GROWTH)?;
            map.iter().filter_map(Result::ok).collect()
        };
        let ooms: Vec<(u32, OomKill)> = {
            let map: BpfHashMap<_, u32, OomKill> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::MEM_OOM)?;
            map.iter().filter_map(Result::ok).collect()
        };
        let mut oom_of: HashMap<u32, OomKilled> = HashMap::new();
        for (pid, k) in ooms {
            let (anon, file, shmem) = (k.anon_kb << 10, k.file_kb << 10, k.shmem_kb << 10);
            oom_of.insert(pid, OomKilled { t_ns: k.ts_ns.saturating_sub(window_start), rss: anon + file + shmem, anon, file, shmem });
            series.entry(pid).or_default();
        }
        let mut lines: HashMap<u32, BTreeMap<String, GrowthLine>> = HashMap::new();
        let mut stacks: HashMap<u32, Vec<GrowthStack>> = HashMap::new();
        for (k, v) in growth {
            let frames = cx.frames(k.pid, k.user_stack, tracer_common::sched::NO_STACK, k.py_stack)?;
            let charged = attribution::charge(&frames);
            if !frames.is_empty() {
                stacks.entry(k.pid).or_default().push(GrowthStack { grown_bytes: v.grown, released_bytes: v.released, samples: v.samples, frames });
            }
            let Some(charged) = charged else { continue };
            let e = lines.entry(k.pid).or_default().entry(charged.site.key()).or_insert_with(|| GrowthLine {
                site: charged.site.clone(),
                beneath: charged.beneath.clone(),
                grown_bytes: 0,
                released_bytes: 0,
                samples: 0,
            });
            e.grown_bytes += v.grown;
            e.released_bytes += v.released;
            e.samples += v.samples;
        }
        let mut processes: Vec<ProcessMemory> = series
            .into_iter()
            .map(|(pid, mut pts)| {
                pts.sort_by_key(|(t, _)| *t);
                let series: Vec<MemPoint> = pts.into_iter().map(|(t, p)| MemPoint { t_ns: t.saturating_sub(window_start), ..p }).collect();
                let peak_rss = peaks.get(&pid).copied().unwrap_or(0).max(series.iter().map(|p| p.rss).max().unwrap_or(0));
                let mut lines: Vec<GrowthLine> = lines.remove(&pid).map(|m| m.into_values().collect()).unwrap_or_default();
                lines.sort_by(|a, b| b.grown_bytes.cmp(&a.grown_bytes).then(b.released_bytes.cmp(&a.released_bytes)).then(a.site.cmp(&b.site)));
                ProcessMemory {
                    pid,
                    growth_bytes_per_s: slope(&series),
                    series,
                    peak_rss,
                    vm_hwm: hwm.get(&pid).copied(),
                    lines,
                    memory_limit: self.limits.get(&pid).cloned(),
                    oom_killed: oom_of.remove(&pid),
                    rss_stat_events: events.get(&pid).copied().unwrap_or(0),
                    stacks: {
                        let mut s = stacks.remove(&pid).unwrap_or_default();
                        s.sort_by(|a, b| b.grown_bytes.cmp(&a.grown_bytes).then(b.released_bytes.cmp(&a.released_bytes)));
                        s
                    },
                }
            })
            .collect();
        processes.sort_by(|a, b| b.peak_rss.cmp(&a.peak_rss).then(a.pid.cmp(&b.pid)));
        rec.memory = Some(MemoryReport { growth_sample_bytes: GROWTH_SAMPLE_BYTES, processes });
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        self.drain();
        self.links.detach(&mut cx.kernel.ebpf);
    }
}
