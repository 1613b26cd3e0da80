//! `/metrics`: the agent's counters in the Prometheus/OpenMetrics text
//! format, through the `prometheus-client` crate. They are live: the
//! agent's loop publishes the cumulative counts at least every
//! `PUBLISH_EVERY` (5 s) whatever `--window` is (`Engine::counts`, a
//! snapshot without stacks, and at each window's cut), and each counter
//! grows by what its cumulative value rose since (`Metrics::publish`), so
//! they only grow, for as long as the agent runs. The text is rendered
//! once per publish; a scrape copies it. Labels per target: `pid`,
//! `comm`, `container_id`, `pod_uid`, `container_name` (empty where the
//! cgroup path names none). Cardinality is bounded: the series of a target
//! that exited are removed at the second window cut after its exit was
//! seen, once its last values have been scraped twice (or, with no
//! scraper, `FORGET_AFTER` passed), and at
//! most `MAX_TARGETS` targets have series of their own (the rest are summed
//! under `pid="other"`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
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
    /// Resident memory, page faults, memory waits.
    memory: super::memory_metrics::MemoryMetrics,
    /// The label sets each pid has series under (removed when it is gone).
    series: HashMap<u32, (TargetLabels, Vec<String>, Vec<String>)>,
    /// Windows since each dead pid was last seen alive, since when, and
    /// the scrape count then.
    gone_for: HashMap<u32, (u32, std::time::Instant, u64)>,
    /// `/metrics` requests served (as of the last window cut).
    scrapes: u64,
    /// High-water marks of the cumulative values published: syscalls by
    /// (pid, nr) (calls, errors, ns); wall time by pid and category; lost
    /// events by cause; the last CUDA section and when it was taken.
    hw_syscalls: HashMap<(u32, u32), (u64, u64, u64)>,
    hw_wall: HashMap<u32, [u64; CATEGORIES.len()]>,
    hw_lost: BTreeMap<String, u64>,
    last_cuda: Option<crate::recording::cuda::CudaReport>,
    last_ns: u64,
}

fn other_labels() -> TargetLabels {
    TargetLabels { pid: "other".into(), comm: "other".into(), container_id: String::new(), pod_uid: String::new(), container_name: String::new() }
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
            memory: Default::default(),
            series: HashMap::new(),
            gone_for: HashMap::new(),
            scrapes: 0,
            hw_syscalls: HashMap::new(),
            hw_wall: HashMap::new(),
            hw_lost: BTreeMap::new(),
            last_cuda: None,
            last_ns: 0,
        };
        registry.register("syscalls", "Syscalls made by a target, by name (exact, counted in the kernel)", m.syscalls.clone());
        registry.register("syscall_errors", "Syscalls that returned an error, by name", m.syscall_errors.clone());
        registry.register("syscall_seconds", "Time inside syscalls, by name", m.syscall_seconds.clone());
        registry.register(
            "wall_seconds",
            "Thread wall time by category: on_cpu, syscall (the on-CPU part in syscalls), io, lock, poll, sleep, gil, other, runqueue, memory (page faults, reclaim, compaction, throttling)",
            m.wall_seconds.clone(),
        );
        registry.register("lost_events", "Events the kernel side could not keep, by cause", m.lost.clone());
        registry.register("windows", "Windows cut since the agent started", m.windows.clone());
        registry.register("targets", "Processes traced now", m.targets.clone());
        registry.register("agent_cpu_seconds", "CPU time of the agent itself (user + system)", m.agent_cpu.clone());
        registry.register("agent_resident_memory_bytes", "Resident memory of the agent itself", m.agent_rss.clone());
        m.cuda.register(&mut registry);
        m.memory.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Brings the counters up to the cumulative snapshot `cur` (a counts
    /// snapshot every few seconds, or a window's): each counter grows by
    /// what its key's cumulative value rose since the last publish (a key
    /// whose value went down, like a row of threads folded meanwhile, adds
    /// nothing until it is back above its high-water mark), so counters
    /// only grow and equal the cumulative values. Keys of processes the
    /// engine forgot leave the high-water marks with them.
    pub fn publish(&mut self, cur: &Recording, info: &BTreeMap<u32, TargetInfo>, alive: usize) {
        self.targets.set(alive as i64);
        let arch = cur.host.arch.clone();
        let comms: HashMap<u32, &str> = cur.targets.iter().map(|t| (t.pid, t.comm.as_str())).collect();
        let mut own: HashSet<u32> = self.series.keys().copied().collect();
        let mut labels_of = |pid: u32| -> TargetLabels {
            if !own.contains(&pid) && own.len() >= MAX_TARGETS {
                return other_labels();
            }
            own.insert(pid);
            let i = info.get(&pid);
            let comm = i.map(|i| i.comm.clone()).or_else(|| comms.get(&pid).map(|c| (*c).to_owned()));
            TargetLabels {
                pid: pid.to_string(),
                comm: comm.unwrap_or_default(),
                container_id: i.and_then(|i| i.container.container_id.clone()).unwrap_or_default(),
                pod_uid: i.and_then(|i| i.container.pod_uid.clone()).unwrap_or_default(),
                container_name: i.and_then(|i| i.container.container_name.clone()).unwrap_or_default(),
            }
        };
        let series = &mut self.series;
        let mut record = |pid: u32, labels: &TargetLabels, syscall: Option<&str>, category: Option<&str>| {
            let e = series.entry(pid).or_insert_with(|| (labels.clone(), Vec::new(), Vec::new()));
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
        let totals = super::windows::syscall_totals(cur);
        let mut hw = HashMap::with_capacity(totals.len());
        for (key, (calls, errors, ns)) in totals {
            let old = self.hw_syscalls.get(&key).copied().unwrap_or_default();
            hw.insert(key, (calls.max(old.0), errors.max(old.1), ns.max(old.2)));
            let (dc, de, dn) = (calls.saturating_sub(old.0), errors.saturating_sub(old.1), ns.saturating_sub(old.2));
            if dc == 0 && de == 0 && dn == 0 {
                continue;
            }
            let (pid, nr) = key;
            let target = labels_of(pid);
            let name = crate::system::syscall_name(&arch, nr);
            let l = SyscallLabels { target: target.clone(), syscall: name.clone() };
            self.syscalls.get_or_create(&l).inc_by(dc);
            self.syscall_errors.get_or_create(&l).inc_by(de);
            self.syscall_seconds.get_or_create(&l).inc_by(dn as f64 / 1e9);
            if target.pid != "other" {
                record(pid, &target, Some(&name), None);
            }
        }
        self.hw_syscalls = hw;
        let mut wall: HashMap<u32, [u64; CATEGORIES.len()]> = HashMap::new();
        for t in &cur.threads {
            let o = &t.off_cpu;
            let w = wall.entry(t.pid).or_default();
            for (slot, v) in w.iter_mut().zip([
                t.on_cpu_ns, t.syscall_ns, o.io_ns, o.lock_ns, o.poll_ns, o.sleep_ns, o.gil_ns, o.other_ns, t.runqueue_ns, o.memory_ns,
            ]) {
                *slot += v;
            }
        }
        let mut hw = HashMap::with_capacity(wall.len());
        for (pid, w) in wall {
            let old = self.hw_wall.get(&pid).copied().unwrap_or_default();
            let mut d = [0u64; CATEGORIES.len()];
            let mut top = [0u64; CATEGORIES.len()];
            for i in 0..CATEGORIES.len() {
                d[i] = w[i].saturating_sub(old[i]);
                top[i] = w[i].max(old[i]);
            }
            hw.insert(pid, top);
            if d.iter().all(|v| *v == 0) {
                continue;
            }
            let target = labels_of(pid);
            for (cat, v) in CATEGORIES.iter().zip(d) {
                let l = CategoryLabels { target: target.clone(), category: (*cat).to_owned() };
                self.wall_seconds.get_or_create(&l).inc_by(v as f64 / 1e9);
                if target.pid != "other" {
                    record(pid, &target, None, Some(cat));
                }
            }
        }
        self.hw_wall = hw;
        if let Some(c) = &cur.cuda {
            // Calls whose site reads differently from the last publish are
            // not counted again: `cuda_delta` cuts rows to the sums over sites.
            let d = super::cuda_delta::cuda_delta(c, self.last_cuda.as_ref(), self.last_ns);
            self.cuda.add_window(&d, &mut labels_of);
        }
        self.last_cuda = cur.cuda.clone();
        let live: Vec<u32> = info.iter().filter(|(_, i)| i.alive).map(|(pid, _)| *pid).collect();
        self.memory.publish(cur, &live, &mut labels_of);
        self.last_ns = cur.duration_ns;
        for (cause, n) in &cur.lost {
            let old = self.hw_lost.get(cause).copied().unwrap_or(0);
            if *n > old {
                self.lost.get_or_create(&CauseLabels { cause: cause.clone() }).inc_by(*n - old);
                self.hw_lost.insert(cause.clone(), *n);
            }
        }
        self.refresh_self();
    }

    /// A window was cut: counted, and the series of targets gone long
    /// enough are removed; `scrapes` is how many `/metrics` requests were
    /// served so far.
    pub fn window_cut(&mut self, info: &BTreeMap<u32, TargetInfo>, scrapes: u64) {
        self.windows.inc();
        self.scrapes = scrapes;
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
            self.memory.forget(pid);
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

    /// Reads the agent's own CPU time and memory (at each publish).
    fn refresh_self(&mut self) {
        if let Some((cpu_s, rss)) = self_usage() {
            if cpu_s > self.last_cpu_s {
                self.agent_cpu.inc_by(cpu_s - self.last_cpu_s);
                self.last_cpu_s = cpu_s;
            }
            self.agent_rss.set(rss as i64);
        }
    }

    /// The exposition text (rendered once per publish: a scrape copies it).
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

pub const CATEGORIES: [&str; 10] = ["on_cpu", "syscall", "io", "lock", "poll", "sleep", "gil", "other", "runqueue", "memory"];

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

    fn cumulative(rows: &[(u32, u32, u64)]) -> Recording {
        let mut r = crate::recording::tests::sample();
        r.syscalls = rows
            .iter()
            .map(|&(pid, tid, count)| crate::recording::ThreadSyscall {
                pid,
                tid,
                nr: 39,
                count,
                errors: 0,
                errnos: BTreeMap::new(),
                total_ns: count * 10,
                max_ns: 10,
                hist_log2_ns: vec![count],
                in_flight: 0,
                aggregated_threads: u64::from(tid == 0),
            })
            .collect();
        r.threads.clear();
        r.cuda = None;
        r.lost.clear();
        r
    }

    /// The value of pid 10's syscall counter in the exposition text.
    fn counter(m: &Metrics) -> Option<f64> {
        m.encode()
            .lines()
            .find(|l| l.starts_with("infertrace_syscalls_total{") && l.contains("pid=\"10\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn counters_follow_the_cumulative_values_and_never_go_down() {
        let info = BTreeMap::new();
        let mut m = Metrics::new();
        m.publish(&cumulative(&[]), &info, 0);
        assert_eq!(counter(&m), None);
        m.publish(&cumulative(&[(10, 11, 5)]), &info, 1);
        assert_eq!(counter(&m), Some(5.0));
        m.publish(&cumulative(&[(10, 11, 9), (10, 12, 1)]), &info, 1);
        assert_eq!(counter(&m), Some(10.0));
        // A row that went down (a call counted in flight, a folded row
        // read between two maps) adds nothing until it is back above.
        m.publish(&cumulative(&[(10, 0, 8)]), &info, 1);
        assert_eq!(counter(&m), Some(10.0));
        m.publish(&cumulative(&[(10, 0, 13)]), &info, 1);
        assert_eq!(counter(&m), Some(13.0));
        // Forgotten by the engine: its marks go, its series stay (until
        // `forget_gone` removes them) and do not move.
        m.publish(&cumulative(&[]), &info, 0);
        assert_eq!(counter(&m), Some(13.0));
        assert!(m.hw_syscalls.is_empty());
        assert!(m.encode().contains("infertrace_targets 0"));
    }

    #[test]
    fn cuda_calls_count_once_when_their_site_reads_differently() {
        use crate::recording::cuda::{CudaCall, CudaReport, Site};
        let call = |count: u64, function: &str| CudaCall {
            pid: 10,
            api: "cudaStreamSynchronize".into(),
            kind: None,
            class: None,
            count,
            bytes: 0,
            total_ns: count * 1000,
            errors: 0,
            site: Site { function: function.into(), file: None, line: None },
            return_codes: BTreeMap::new(),
            pinned: None,
            pageable: None,
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        };
        let with = |calls: Vec<CudaCall>| {
            let mut r = cumulative(&[]);
            r.cuda = Some(CudaReport { calls, ..Default::default() });
            r
        };
        let value = |m: &Metrics| {
            m.encode()
                .lines()
                .find(|l| l.starts_with("infertrace_cuda_calls_total{") && l.contains("pid=\"10\""))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        let info = BTreeMap::new();
        let mut m = Metrics::new();
        // A full snapshot (site resolved), then a counts-only one (not yet),
        // then full again: 318 calls in all, never 636.
        m.publish(&with(vec![call(300, "step")]), &info, 1);
        m.publish(&with(vec![call(310, "[unknown]")]), &info, 1);
        m.publish(&with(vec![call(200, "step"), call(118, "hold")]), &info, 1);
        assert_eq!(value(&m), Some(318.0));
    }

    #[test]
    fn reads_its_own_usage() {
        let (cpu, rss) = self_usage().unwrap();
        assert!(cpu >= 0.0);
        assert!(rss > 1 << 20, "{rss}");
    }
}
