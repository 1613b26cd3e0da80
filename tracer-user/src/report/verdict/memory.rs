//! The verdict's memory classes (docs/verdict.md#memory), beside the time
//! bottleneck: `oom_killed` (the OOM killer chose the process),
//! `near_memory_limit` (its peak came within 10% of its cgroup's limit),
//! `memory_growth` (its resident memory grew steadily, with the line that
//! owns most of that growth).

use serde::{Deserialize, Serialize};

use crate::recording::{
    attribution::SiteRef,
    memory::{steady_growth, ProcessMemory},
};

/// One memory class of one process; the fields a class does not use are
/// absent.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryVerdict {
    /// `oom_killed`, `near_memory_limit` or `memory_growth`.
    pub class: String,
    /// `memory_growth`: the least-squares slope of the resident size over
    /// the growth phase (up to its highest point), bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_bytes_per_s: Option<f64>,
    /// `memory_growth`: how well a line fits the series (R²).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<f64>,
    /// `memory_growth`: from the first point of the series to its highest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_bytes: Option<u64>,
    /// `oom_killed`: when (from the window's start) and the resident size
    /// the OOM killer saw; `near_memory_limit`: the peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// `oom_killed`, `near_memory_limit`: the cgroup limit and its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_file: Option<String>,
    /// The line with the most growth not released, and that net growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_net_bytes: Option<u64>,
    pub advice: String,
}

/// A peak within this share of the cgroup limit is `near_memory_limit`.
pub const NEAR_LIMIT_SHARE: f64 = 0.9;

const OOM_ADVICE: &str = "the kernel's OOM killer ended this process (exit signal 9): it outgrew its memory limit; the line named grew it most: bound what it keeps, process the data in chunks, or raise the limit (the cgroup's memory.max / memory.limit_in_bytes, the container's memory limit)";
const NEAR_ADVICE: &str = "the peak came within 10% of the cgroup's memory limit: the next larger input gets the process OOM-killed; bound what the line named keeps or raise the limit";

/// The line with the most growth not released.
fn top_line(p: &ProcessMemory) -> Option<(&SiteRef, u64)> {
    p.lines.iter().map(|l| (&l.site, l.grown_bytes.saturating_sub(l.released_bytes))).filter(|(_, net)| *net > 0).max_by_key(|(_, net)| *net)
}

/// Every memory class of `p`: `oom_killed` or `near_memory_limit` first,
/// then `memory_growth`.
pub fn memory_verdicts(p: &ProcessMemory) -> Vec<MemoryVerdict> {
    let mut out = Vec::new();
    let top = top_line(p);
    let limit = p.memory_limit.as_ref();
    if let Some(k) = &p.oom_killed {
        out.push(MemoryVerdict {
            class: "oom_killed".into(),
            at_ns: Some(k.t_ns),
            rss_bytes: Some(k.rss),
            limit_bytes: limit.map(|l| l.bytes),
            limit_file: limit.map(|l| l.file.clone()),
            site: top.map(|(s, _)| s.clone()),
            site_net_bytes: top.map(|(_, n)| n),
            advice: OOM_ADVICE.into(),
            ..Default::default()
        });
    } else if let Some(l) = limit.filter(|l| p.peak_rss as f64 >= l.bytes as f64 * NEAR_LIMIT_SHARE) {
        out.push(MemoryVerdict {
            class: "near_memory_limit".into(),
            rss_bytes: Some(p.peak_rss),
            limit_bytes: Some(l.bytes),
            limit_file: Some(l.file.clone()),
            site: top.map(|(s, _)| s.clone()),
            site_net_bytes: top.map(|(_, n)| n),
            advice: NEAR_ADVICE.into(),
            ..Default::default()
        });
    }
    out.extend(memory_growth(p));
    out
}

const GROWTH_ADVICE: &str = "resident memory grows steadily: something keeps what it allocates (a cache without a bound, a list or dict that only grows, tensors kept for logging); the line named holds the growth; bound the cache, drop references, or take a heap snapshot there (tracemalloc, memray)";

/// `memory_growth` for `p`, when its resident size grew steadily
/// ([`steady_growth`]).
pub fn memory_growth(p: &ProcessMemory) -> Option<MemoryVerdict> {
    let (growth, fit, grown) = steady_growth(&p.series)?;
    let top = top_line(p);
    Some(MemoryVerdict {
        class: "memory_growth".into(),
        growth_bytes_per_s: Some(growth),
        fit: Some(fit),
        grown_bytes: Some(grown),
        site: top.map(|(s, _)| s.clone()),
        site_net_bytes: top.map(|(_, n)| n),
        advice: GROWTH_ADVICE.into(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::memory::{slope, GrowthLine, MemPoint};

    fn process(step: u64, jitter: u64) -> ProcessMemory {
        let series: Vec<MemPoint> =
            (0..100).map(|i| MemPoint { t_ns: i * 100_000_000, rss: (100 << 20) + i * step + if i % 2 == 0 { jitter } else { 0 }, ..Default::default() }).collect();
        let site = |line| SiteRef { function: "handle".into(), file: Some("/srv/app.py".into()), line: Some(line), kind: "python".into(), module: None, user_code: true };
        ProcessMemory {
            pid: 1,
            growth_bytes_per_s: slope(&series),
            series,
            lines: vec![
                GrowthLine { site: site(10), beneath: None, grown_bytes: 900 << 20, released_bytes: 0, samples: 1800 },
                GrowthLine { site: site(20), beneath: None, grown_bytes: 950 << 20, released_bytes: 940 << 20, samples: 3800 },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_steady_growth_is_named_at_the_line_that_keeps_it() {
        let v = memory_growth(&process(1 << 20, 0)).expect("steady growth");
        assert_eq!(v.site.as_ref().and_then(|s| s.line), Some(10));
        assert!((v.growth_bytes_per_s.unwrap() - 10.0 * (1 << 20) as f64).abs() < 1.0, "{v:?}");
        assert!(v.fit.unwrap() > 0.99);
        // Flat, or noise without a trend: none.
        assert!(memory_growth(&process(0, 0)).is_none());
        assert!(memory_growth(&process(0, 64 << 20)).is_none());
    }

    #[test]
    fn oom_kill_and_a_near_limit() {
        let mut p = process(0, 0);
        p.peak_rss = 95 << 20;
        p.memory_limit = Some(crate::recording::memory::MemoryLimit { bytes: 100 << 20, file: "/sys/fs/cgroup/x/memory.max".into() });
        let classes = |p: &ProcessMemory| memory_verdicts(p).into_iter().map(|v| v.class).collect::<Vec<_>>();
        assert_eq!(classes(&p), ["near_memory_limit"]);
        p.oom_killed = Some(crate::recording::memory::OomKilled { t_ns: 5, rss: 99 << 20, ..Default::default() });
        let v = memory_verdicts(&p);
        assert_eq!((v[0].class.as_str(), v[0].limit_bytes, v[0].site.as_ref().and_then(|s| s.line)), ("oom_killed", Some(100 << 20), Some(10)));
        p.oom_killed = None;
        p.peak_rss = 50 << 20;
        assert!(classes(&p).is_empty());
    }
}
