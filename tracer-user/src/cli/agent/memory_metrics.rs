//! The memory part of `/metrics`, per target: resident bytes by kind and
//! the peak (gauges, from `/proc/PID/status` at each publish: `RssAnon`,
//! `RssFile`, `RssShmem`, `VmSwap`, `VmHWM`), page faults by kind
//! (counters, from `/proc/PID/stat`: the process's minor and major faults,
//! its exited threads' included), and the time its threads were blocked on
//! memory by cause (counters, the `memory` reason of the wall-time
//! partition). With the memory family (not `--no-memory`): resident growth
//! by line (counter, bytes grown per line; at most [`MAX_SITES`] lines per
//! target, the rest under `site="other"`) and OOM kills (counter). Targets
//! past the agent's bound (`pid="other"`) add to the counters only: a gauge
//! of many processes summed would mean nothing.

use std::{
    collections::{HashMap, HashSet},
    sync::atomic::AtomicU64,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::labels::TargetLabels;
use crate::recording::{MemoryWaits, Recording};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StallLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    /// `page_fault`, `reclaim`, `compaction`, `throttle`.
    pub cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SiteLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    /// `file.py:LINE function`, or `other` past [`MAX_SITES`].
    pub site: String,
}

/// Growth lines per target with series of their own.
pub const MAX_SITES: usize = 20;

type FCounter = Counter<f64, AtomicU64>;

const RESIDENT_KINDS: [&str; 4] = ["anon", "file", "shmem", "swap"];
const FAULT_KINDS: [&str; 2] = ["minor", "major"];
const CAUSES: [&str; 4] = ["page_fault", "reclaim", "compaction", "throttle"];

#[derive(Default)]
pub struct MemoryMetrics {
    resident: Family<KindLabels, Gauge>,
    peak: Family<TargetLabels, Gauge>,
    faults: Family<KindLabels, Counter>,
    stall_seconds: Family<StallLabels, FCounter>,
    growth: Family<SiteLabels, Counter>,
    oom_kills: Family<TargetLabels, Counter>,
    /// Per pid and line: the bytes grown counted so far; the lines with
    /// series of their own; the pids whose OOM kill was counted.
    hw_growth: HashMap<u32, HashMap<String, u64>>,
    sites: HashMap<u32, HashSet<String>>,
    oom_counted: HashSet<u32>,
    /// High-water marks of the cumulative values per pid: faults (minor,
    /// major), memory waits by cause (ns).
    hw_faults: HashMap<u32, [u64; 2]>,
    hw_stalls: HashMap<u32, [u64; 4]>,
    /// Per pid: the target labels its series are under.
    series: HashMap<u32, TargetLabels>,
}

fn waits_of(w: &MemoryWaits) -> [u64; 4] {
    [w.page_fault_ns, w.reclaim_ns, w.compaction_ns, w.throttle_ns]
}

impl MemoryMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("resident_bytes", "Resident memory of a target by kind (anon, file, shmem; swap: swapped out), at the last publish", self.resident.clone());
        r.register("resident_peak_bytes", "The target's resident high-water mark (VmHWM, over its life)", self.peak.clone());
        r.register("page_faults", "Page faults of a target by kind (minor, major: a page read from disk or swap)", self.faults.clone());
        r.register(
            "resident_growth_bytes",
            "Resident memory a target grew by the line that grew it (memory family; sampled every 512 KiB grown)",
            self.growth.clone(),
        );
        r.register("oom_kills", "Times the kernel's OOM killer chose a target (oom/mark_victim)", self.oom_kills.clone());
        r.register(
            "memory_stall_seconds",
            "Time the target's threads were blocked on memory, by cause (page_fault, reclaim, compaction, throttle)",
            self.stall_seconds.clone(),
        );
    }

    /// Brings the series up to the cumulative snapshot `cur`; `live`: the
    /// targets alive now (their `/proc` files are read).
    pub fn publish(&mut self, cur: &Recording, live: &[u32], labels: &mut dyn FnMut(u32) -> TargetLabels) {
        let mut waits: HashMap<u32, MemoryWaits> = HashMap::new();
        for t in &cur.threads {
            waits.entry(t.pid).or_default().add(&t.off_cpu.memory);
        }
        for (pid, w) in waits {
            let now = waits_of(&w);
            let mut old = self.hw_stalls.get(&pid).copied().unwrap_or_default();
            if now.iter().zip(old.iter()).all(|(n, o)| n <= o) {
                continue;
            }
            let target = self.labels(pid, labels);
            for (i, cause) in CAUSES.iter().enumerate() {
                let d = now[i].saturating_sub(old[i]);
                if d > 0 {
                    self.stall_seconds.get_or_create(&StallLabels { target: target.clone(), cause: (*cause).to_owned() }).inc_by(d as f64 / 1e9);
                }
                old[i] = old[i].max(now[i]);
            }
            self.hw_stalls.insert(pid, old);
        }
        if let Some(m) = &cur.memory {
            for p in &m.processes {
                self.growth_of(p, labels);
            }
        }
        for &pid in live {
            if let Some(now) = crate::os::procfs::page_faults(pid) {
                let old = self.hw_faults.get(&pid).copied().unwrap_or_default();
                if now.iter().zip(old.iter()).any(|(n, o)| n > o) {
                    let target = self.labels(pid, labels);
                    for (i, kind) in FAULT_KINDS.iter().enumerate() {
                        self.faults.get_or_create(&KindLabels { target: target.clone(), kind: (*kind).to_owned() }).inc_by(now[i].saturating_sub(old[i]));
                    }
                    self.hw_faults.insert(pid, [now[0].max(old[0]), now[1].max(old[1])]);
                }
            }
            let Some(s) = crate::families::memory::status::read(pid) else { continue };
            let target = self.labels(pid, labels);
            if target.pid == "other" {
                continue;
            }
            let p = s.point;
            for (kind, bytes) in RESIDENT_KINDS.iter().zip([p.anon, p.file, p.shmem, p.swap]) {
                self.resident.get_or_create(&KindLabels { target: target.clone(), kind: (*kind).to_owned() }).set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
            self.peak.get_or_create(&target).set(i64::try_from(s.hwm).unwrap_or(i64::MAX));
        }
    }

    /// Growth by line and the OOM kill of one process of the cumulative
    /// snapshot: the counters rise by what is new since the last publish.
    fn growth_of(&mut self, p: &crate::recording::memory::ProcessMemory, labels: &mut dyn FnMut(u32) -> TargetLabels) {
        if p.oom_killed.is_some() && self.oom_counted.insert(p.pid) {
            let target = self.labels(p.pid, labels);
            self.oom_kills.get_or_create(&target).inc();
        }
        for l in p.lines.iter().filter(|l| l.grown_bytes > 0) {
            let key = super::labels::site_label(&l.site.function, l.site.file.as_deref(), l.site.line);
            let seen = self.hw_growth.entry(p.pid).or_default().entry(key.clone()).or_default();
            let d = l.grown_bytes.saturating_sub(*seen);
            if d == 0 {
                continue;
            }
            *seen = l.grown_bytes;
            let target = self.labels(p.pid, labels);
            let own = self.sites.entry(p.pid).or_default();
            let site = if own.contains(&key) || own.len() < MAX_SITES {
                own.insert(key.clone());
                key
            } else {
                "other".to_owned()
            };
            self.growth.get_or_create(&SiteLabels { target, site }).inc_by(d);
        }
    }

    fn labels(&mut self, pid: u32, labels: &mut dyn FnMut(u32) -> TargetLabels) -> TargetLabels {
        if let Some(l) = self.series.get(&pid) {
            return l.clone();
        }
        let l = labels(pid);
        if l.pid != "other" {
            self.series.insert(pid, l.clone());
        }
        l
    }

    /// Removes the series of a target gone.
    pub fn forget(&mut self, pid: u32) {
        self.hw_faults.remove(&pid);
        self.hw_stalls.remove(&pid);
        self.hw_growth.remove(&pid);
        self.oom_counted.remove(&pid);
        let sites = self.sites.remove(&pid).unwrap_or_default();
        if let Some(target) = self.series.remove(&pid) {
            for site in sites.into_iter().chain(["other".to_owned()]) {
                self.growth.remove(&SiteLabels { target: target.clone(), site });
            }
            self.oom_kills.remove(&target);
            for kind in RESIDENT_KINDS {
                self.resident.remove(&KindLabels { target: target.clone(), kind: kind.to_owned() });
            }
            for kind in FAULT_KINDS {
                self.faults.remove(&KindLabels { target: target.clone(), kind: kind.to_owned() });
            }
            for cause in CAUSES {
                self.stall_seconds.remove(&StallLabels { target: target.clone(), cause: cause.to_owned() });
            }
            self.peak.remove(&target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pid: u32) -> TargetLabels {
        TargetLabels { pid: pid.to_string(), comm: "t".into(), container_id: String::new(), pod_uid: String::new(), container_name: String::new() }
    }

    #[test]
    fn counters_grow_by_the_rise_and_gauges_read_proc() {
        let me = std::process::id();
        let mut m = MemoryMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut rec = crate::recording::tests::sample();
        let mut t = crate::recording::ThreadTimes { pid: me, tid: me, ..Default::default() };
        t.off_cpu.memory = MemoryWaits { page_fault_ns: 2_000_000_000, reclaim_ns: 500_000_000, ..Default::default() };
        rec.threads = vec![t.clone()];
        m.publish(&rec, &[me], &mut labels);
        // A later snapshot with more: only the rise is added.
        rec.threads[0].off_cpu.memory.page_fault_ns = 3_000_000_000;
        m.publish(&rec, &[me], &mut labels);
        let l = |cause: &str| StallLabels { target: labels(me), cause: cause.into() };
        assert_eq!(m.stall_seconds.get_or_create(&l("page_fault")).get(), 3.0);
        assert_eq!(m.stall_seconds.get_or_create(&l("reclaim")).get(), 0.5);
        let anon = m.resident.get_or_create(&KindLabels { target: labels(me), kind: "anon".into() }).get();
        assert!(anon > 0, "resident anon of this process");
        assert!(m.faults.get_or_create(&KindLabels { target: labels(me), kind: "minor".into() }).get() > 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("resident_peak_bytes{") && text.contains("cause=\"reclaim\""), "{text}");
        m.forget(me);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(!text.contains(&format!("pid=\"{me}\"")), "{text}");
    }

    #[test]
    fn growth_by_line_rises_by_the_new_bytes_and_oom_kills_count_once() {
        use crate::recording::{
            attribution::SiteRef,
            memory::{GrowthLine, MemoryReport, OomKilled, ProcessMemory},
        };
        let mut m = MemoryMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let line = |n: u32, grown: u64| GrowthLine {
            site: SiteRef { function: "handle".into(), file: Some("/srv/app.py".into()), line: Some(n), kind: "python".into(), module: None, user_code: true },
            beneath: None,
            grown_bytes: grown,
            released_bytes: 0,
            samples: 1,
        };
        let mut rec = crate::recording::tests::sample();
        let mut p = ProcessMemory { pid: 77, lines: (0..MAX_SITES as u32 + 3).map(|n| line(n, 1 << 20)).collect(), ..Default::default() };
        rec.memory = Some(MemoryReport { growth_sample_bytes: 1 << 19, processes: vec![p.clone()] });
        m.publish(&rec, &[], &mut labels);
        p.lines[0].grown_bytes = 5 << 20;
        p.oom_killed = Some(OomKilled::default());
        rec.memory = Some(MemoryReport { growth_sample_bytes: 1 << 19, processes: vec![p] });
        m.publish(&rec, &[], &mut labels);
        m.publish(&rec, &[], &mut labels);
        let at = |site: &str| m.growth.get_or_create(&SiteLabels { target: labels(77), site: site.into() }).get();
        assert_eq!(at("app.py:0 handle"), 5 << 20);
        assert_eq!(at("other"), 3 << 20, "past {MAX_SITES} lines");
        assert_eq!(m.oom_kills.get_or_create(&labels(77)).get(), 1);
        m.forget(77);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(!text.contains("pid=\"77\""), "{text}");
    }
}
