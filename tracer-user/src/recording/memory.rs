//! Resident memory per traced process (`record`'s memory family,
//! `crate::families::memory`): the series, the peak, the growth rate and
//! the lines that grew it (schema 1.x addition; docs/memory.md).

use serde::{Deserialize, Serialize};

use super::attribution::SiteRef;

/// The memory part of a recording.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryReport {
    /// Growth (or release) between two stack samples of a process, bytes.
    pub growth_sample_bytes: u64,
    /// One per traced process seen, largest peak first.
    pub processes: Vec<ProcessMemory>,
}

/// One point of a process's resident memory (bytes).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemPoint {
    /// From the start of the window.
    pub t_ns: u64,
    /// anon + file + shmem.
    pub rss: u64,
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
    pub swap: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessMemory {
    pub pid: u32,
    /// Points: when the resident size moved by 1 MiB, or 100 ms after the
    /// last point when it changed at all; the first and last read from
    /// `/proc/PID/status` at the start and the end (while it lived).
    pub series: Vec<MemPoint>,
    /// The highest resident size seen in the window (the kernel's counters
    /// at each change; at least the points').
    pub peak_rss: u64,
    /// The kernel's own high-water mark (`VmHWM`, over the process's whole
    /// life) at the end of the window, when the process still lived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_hwm: Option<u64>,
    /// Least-squares slope of `rss` over the series, bytes per second.
    pub growth_bytes_per_s: f64,
    /// Resident growth and release by line, most growth first.
    pub lines: Vec<GrowthLine>,
    /// The smallest memory limit of the process's cgroup and those above
    /// it, when it has one (read when the process appeared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<MemoryLimit>,
    /// Set when the OOM killer chose the process (`oom/mark_victim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<OomKilled>,
    /// The stacks the growth samples were taken at (what `report
    /// --profile memory` draws), most growth first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<GrowthStack>,
    /// `kmem/rss_stat` events the process caused in the window: the runs of
    /// the memory family's program it paid for (`tracer_overhead`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rss_stat_events: u64,
}

/// A cgroup memory limit: v1 `memory.limit_in_bytes`, v2 `memory.max`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// The file that sets it.
    pub file: String,
}

/// The OOM killer's choice of this process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OomKilled {
    /// From the start of the window.
    pub t_ns: u64,
    /// Its resident memory then, as the OOM killer saw it.
    pub rss: u64,
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
}

/// Growth attributed to one line: the stack samples taken there, each
/// standing for the bytes the process grew (or shrank) since the last.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GrowthLine {
    pub site: SiteRef,
    /// The innermost Python frame beneath the user line, when different.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beneath: Option<SiteRef>,
    pub grown_bytes: u64,
    pub released_bytes: u64,
    pub samples: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Growth and release sampled at one stack of a process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GrowthStack {
    pub grown_bytes: u64,
    pub released_bytes: u64,
    pub samples: u64,
    /// Leaf first, as `stacks[].frames`.
    pub frames: Vec<super::Frame>,
}

impl MemPoint {
    /// A point from the kernel's `MM_*` counters (file, anon, swap, shmem).
    pub fn of_counters(t_ns: u64, cur: [u64; tracer_common::memory::MEMBERS]) -> MemPoint {
        use tracer_common::memory::{MEMBER_ANON, MEMBER_FILE, MEMBER_SHMEM, MEMBER_SWAP};
        let (anon, file, shmem) = (cur[MEMBER_ANON], cur[MEMBER_FILE], cur[MEMBER_SHMEM]);
        MemPoint { t_ns, rss: anon + file + shmem, anon, file, shmem, swap: cur[MEMBER_SWAP] }
    }
}

/// Least-squares slope of `rss` over `t_ns`, bytes per second (0 with
/// fewer than two distinct times).
pub fn slope(series: &[MemPoint]) -> f64 {
    linear_fit(series).0
}

/// The least-squares line of `rss` over `t_ns`: its slope (bytes per
/// second) and how well it fits (R², 0 to 1; 0 when undefined).
pub fn linear_fit(series: &[MemPoint]) -> (f64, f64) {
    if series.len() < 2 {
        return (0.0, 0.0);
    }
    let n = series.len() as f64;
    let t = |p: &MemPoint| p.t_ns as f64 / 1e9;
    let mean_t = series.iter().map(t).sum::<f64>() / n;
    let mean_r = series.iter().map(|p| p.rss as f64).sum::<f64>() / n;
    let (mut num, mut den, mut ss_tot) = (0.0, 0.0, 0.0);
    for p in series {
        let (dt, dr) = (t(p) - mean_t, p.rss as f64 - mean_r);
        num += dt * dr;
        den += dt * dt;
        ss_tot += dr * dr;
    }
    if den <= 0.0 {
        return (0.0, 0.0);
    }
    let slope = num / den;
    let ss_res: f64 = series.iter().map(|p| (p.rss as f64 - mean_r - slope * (t(p) - mean_t)).powi(2)).sum();
    (slope, if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 })
}

/// A growth is steady (`memory_growth`, `gpu_memory_growth`) when its phase
/// lasts at least this...
pub const MIN_WINDOW_NS: u64 = 5_000_000_000;
/// ...the slope is at least this (bytes/s)...
pub const MIN_SLOPE: f64 = 256.0 * 1024.0;
/// ...it grew at least this much over the series...
pub const MIN_GROWTH: u64 = 16 << 20;
/// ...and a line fits the series this well (R², 0 to 1).
pub const MIN_FIT: f64 = 0.8;

/// A steady growth of `series` (the thresholds above): its slope (bytes/s),
/// fit (R²) and bytes grown, judged on the growth phase: the series up to
/// its highest point (a script's teardown frees everything as it exits),
/// which must be at least half the series' span.
pub fn steady_growth(series: &[MemPoint]) -> Option<(f64, f64, u64)> {
    let first = series.first()?;
    let last = series.last()?;
    let top = series.iter().enumerate().max_by_key(|(i, q)| (q.rss, *i)).map(|(i, _)| i)?;
    let phase = &series[..=top];
    let span = phase[top].t_ns.saturating_sub(first.t_ns);
    let grown = phase[top].rss.saturating_sub(first.rss);
    if span < MIN_WINDOW_NS || span.saturating_mul(2) < last.t_ns.saturating_sub(first.t_ns) || grown < MIN_GROWTH {
        return None;
    }
    let (growth, fit) = linear_fit(phase);
    (growth >= MIN_SLOPE && fit >= MIN_FIT).then_some((growth, fit, grown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_steady_growth() {
        let s: Vec<MemPoint> = (0..10).map(|i| MemPoint { t_ns: i * 100_000_000, rss: 1000 + i * 50, ..Default::default() }).collect();
        assert!((slope(&s) - 500.0).abs() < 1e-6, "{}", slope(&s));
        assert_eq!(slope(&s[..1]), 0.0);
    }

    #[test]
    fn a_point_from_the_counters() {
        let p = MemPoint::of_counters(5, [10, 20, 7, 3]);
        assert_eq!((p.rss, p.anon, p.file, p.shmem, p.swap), (33, 20, 10, 3, 7));
    }
}
