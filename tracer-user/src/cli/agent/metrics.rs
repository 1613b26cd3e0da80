//! `/metrics`: the agent's counters in the Prometheus/OpenMetrics text
//! format, through the `prometheus-client` crate. Every window adds its
//! differences (`windows::delta`) to the counters, so they only grow,
//! across windows, for as long as the agent runs. Labels per target: `pid`,
//! `comm`, `container_id`, `pod_uid`, `container_name` (empty where the
//! cgroup path names none). Cardinality is bounded: the series of a target
//! that exited are removed once it has been gone for two windows and its
//! last values have been scraped twice (or, with no scraper, `FORGET_AFTER`
//! passed), and at
//! most `MAX_TARGETS` targets have series of their own (the rest are summed
//! under `pid="other"`).

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::AtomicU64,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

pub use super::labels::TargetLabels;
use super::targets::TargetInfo;
use crate::recording::Recording;

/// How long the series of an exited target stay when nothing scrapes them (at least two windows).
pub const FORGET_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// At most this many targets have series of their own.
pub const MAX_TARGETS: usize = 200;


#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyscallLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    pub syscall: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: String,
}

type FCounter = Counter<f64, AtomicU64>;

pub struct Metrics {
    pub registry: Registry,
    syscalls: Family<SyscallLabels, Counter>,
    syscall_errors: Family<SyscallLabels, Counter>,
    syscall_seconds: Family<SyscallLabels, FCounter>,
    wall_seconds: Family<CategoryLabels, FCounter>,
    lost: Family<CauseLabels, Counter>,
    windows: Counter,
    targets: Gauge,
    agent_cpu: FCounter,
    agent_rss: Gauge,
    last_cpu_s: f64,
    /// CUDA calls, sync time, findings, GPU gauges.
    cuda: super::cuda_metrics::CudaMetrics,
    /// The label sets each pid has series under (removed when it is gone).
    series: HashMap<u32, (TargetLabels, Vec<String>, Vec<String>)>,
    /// Windows since each dead pid was last seen alive, since when, and
    /// the scrape count then.
    gone_for: HashMap<u32, (u32, std::time::Instant, u64)>,
    /// `/metrics` requests served.
    scrapes: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("infertrace");
        let m = Metrics {
            registry: Registry::default(),
            syscalls: Family::default(),
            syscall_errors: Family::default(),
            syscall_seconds: Family::default(),
            wall_seconds: Family::default(),
            lost: Family::default(),
            windows: Counter::default(),
            targets: Gauge::default(),
            agent_cpu: FCounter::default(),
            agent_rss: Gauge::default(),
            last_cpu_s: 0.0,
            cuda: Default::default(),
            series: HashMap::new(),
            gone_for: HashMap::new(),
            scrapes: 0,
        };
        registry.register("syscalls", "Syscalls made by a target, by name (exact, counted in the kernel)", m.syscalls.clone());
        registry.register("syscall_errors", "Syscalls that returned an error, by name", m.syscall_errors.clone());
        registry.register("syscall_seconds", "Time inside syscalls, by name", m.syscall_seconds.clone());
        registry.register(
            "wall_seconds",
            "Thread wall time by category: on_cpu, syscall (the on-CPU part in syscalls), io, lock, poll, sleep, gil, other, runqueue",
            m.wall_seconds.clone(),
        );
        registry.register("lost_events", "Events the kernel side could not keep, by cause", m.lost.clone());
        registry.register("windows", "Windows cut since the agent started", m.windows.clone());
        registry.register("targets", "Processes traced now", m.targets.clone());
        registry.register("agent_cpu_seconds", "CPU time of the agent itself (user + system)", m.agent_cpu.clone());
        registry.register("agent_resident_memory_bytes", "Resident memory of the agent itself", m.agent_rss.clone());
        m.cuda.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Adds one window's differences.
    pub fn add_window(&mut self, win: &Recording, info: &BTreeMap<u32, TargetInfo>, alive: usize) {
        self.windows.inc();
        self.targets.set(alive as i64);
        let arch = win.host.arch.clone();
        let mut own: Vec<u32> = self.series.keys().copied().collect();
        let labels_of = |pid: u32, own: &mut Vec<u32>| -> TargetLabels {
            let i = info.get(&pid);
            if !own.contains(&pid) && own.len() >= MAX_TARGETS {
                return TargetLabels {
                    pid: "other".into(),
                    comm: "other".into(),
                    container_id: String::new(),
                    pod_uid: String::new(),
                    container_name: String::new(),
                };
            }
            if !own.contains(&pid) {
                own.push(pid);
            }
            let comm = i.map(|i| i.comm.clone()).or_else(|| win.targets.iter().find(|t| t.pid == pid).map(|t| t.comm.clone()));
            TargetLabels {
                pid: pid.to_string(),
                comm: comm.unwrap_or_default(),
                container_id: i.and_then(|i| i.container.container_id.clone()).unwrap_or_default(),
                pod_uid: i.and_then(|i| i.container.pod_uid.clone()).unwrap_or_default(),
                container_name: i.and_then(|i| i.container.container_name.clone()).unwrap_or_default(),
            }
        };
        let mut record = |pid: u32, labels: &TargetLabels, syscall: Option<&str>, category: Option<&str>| {
            let e = self.series.entry(pid).or_insert_with(|| (labels.clone(), Vec::new(), Vec::new()));
            if let Some(s) = syscall {
                if !e.1.iter().any(|x| x == s) {
                    e.1.push(s.to_owned());
                }
            }
            if let Some(c) = category {
                if !e.2.iter().any(|x| x == c) {
                    e.2.push(c.to_owned());
                }
            }
        };
        for ((pid, nr), (calls, errors, ns)) in super::windows::syscall_totals(win) {
            let target = labels_of(pid, &mut own);
            let name = crate::system::syscall_name(&arch, nr);
            let l = SyscallLabels { target: target.clone(), syscall: name.clone() };
            self.syscalls.get_or_create(&l).inc_by(calls);
            self.syscall_errors.get_or_create(&l).inc_by(errors);
            self.syscall_seconds.get_or_create(&l).inc_by(ns as f64 / 1e9);
            if target.pid != "other" {
                record(pid, &target, Some(&name), None);
            }
        }
        let mut wall: BTreeMap<u32, [u64; 9]> = BTreeMap::new();
        for t in &win.threads {
            let o = &t.off_cpu;
            let w = wall.entry(t.pid).or_default();
            for (slot, v) in w.iter_mut().zip([
                t.on_cpu_ns, t.syscall_ns, o.io_ns, o.lock_ns, o.poll_ns, o.sleep_ns, o.gil_ns, o.other_ns, t.runqueue_ns,
            ]) {
                *slot += v;
            }
        }
        for (pid, w) in wall {
            let target = labels_of(pid, &mut own);
            for (cat, v) in CATEGORIES.iter().zip(w) {
                let l = CategoryLabels { target: target.clone(), category: (*cat).to_owned() };
                self.wall_seconds.get_or_create(&l).inc_by(v as f64 / 1e9);
                if target.pid != "other" {
                    record(pid, &target, None, Some(cat));
                }
            }
        }
        if let Some(c) = &win.cuda {
            let mut target = |pid: u32| labels_of(pid, &mut own);
            self.cuda.add_window(c, &mut target);
        }
        for (cause, n) in &win.lost {
            self.lost.get_or_create(&CauseLabels { cause: cause.clone() }).inc_by(*n);
        }
        self.forget_gone(info);
    }

    /// Removes the series of targets gone for two windows.
    fn forget_gone(&mut self, info: &BTreeMap<u32, TargetInfo>) {
        let pids: Vec<u32> = self.series.keys().copied().collect();
        for pid in pids {
            if info.get(&pid).is_some_and(|i| i.alive) {
                self.gone_for.remove(&pid);
                continue;
            }
            let scrapes = self.scrapes;
            let (n, since, scrapes_then) = self.gone_for.entry(pid).or_insert_with(|| (0, std::time::Instant::now(), scrapes));
            *n += 1;
            // Its last values were added in the window that found it gone:
            // kept until two scrapes have read them (one may fail), or
            // FORGET_AFTER without them.
            if *n < 2 || (scrapes < *scrapes_then + 2 && since.elapsed() < FORGET_AFTER) {
                continue;
            }
            self.gone_for.remove(&pid);
            self.cuda.forget(pid);
            if let Some((labels, syscalls, cats)) = self.series.remove(&pid) {
                for s in syscalls {
                    let l = SyscallLabels { target: labels.clone(), syscall: s };
                    self.syscalls.remove(&l);
                    self.syscall_errors.remove(&l);
                    self.syscall_seconds.remove(&l);
                }
                for c in cats {
                    self.wall_seconds.remove(&CategoryLabels { target: labels.clone(), category: c });
                }
            }
        }
    }

    /// Reads the agent's own CPU time and memory (at each scrape).
    pub fn refresh_self(&mut self) {
        self.scrapes += 1;
        if let Some((cpu_s, rss)) = self_usage() {
            if cpu_s > self.last_cpu_s {
                self.agent_cpu.inc_by(cpu_s - self.last_cpu_s);
                self.last_cpu_s = cpu_s;
            }
            self.agent_rss.set(rss as i64);
        }
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }

    /// The series count of live label sets (tests, and the bound).
    pub fn target_series(&self) -> usize {
        self.series.len()
    }
}

pub const CATEGORIES: [&str; 9] = ["on_cpu", "syscall", "io", "lock", "poll", "sleep", "gil", "other", "runqueue"];

/// (user+system CPU seconds, RSS bytes) of this process.
pub fn self_usage() -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the comm, from `state` (3rd field of the file) on.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(((utime + stime) / tck, rss_pages * page))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_usage() {
        let (cpu, rss) = self_usage().unwrap();
        assert!(cpu >= 0.0);
        assert!(rss > 1 << 20, "{rss}");
    }
}
