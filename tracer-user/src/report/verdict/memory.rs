//! The verdict's memory classes (docs/verdict.md#memory): beside the time
//! bottleneck, `memory_growth` names a process whose resident memory grew
//! steadily over the window, with the line that owns most of that growth.

use serde::{Deserialize, Serialize};

use crate::recording::{
    attribution::SiteRef,
    memory::{slope, MemPoint, ProcessMemory},
};

/// A growth is steady when the window is at least this long...
pub const MIN_WINDOW_NS: u64 = 5_000_000_000;
/// ...the slope at least this (bytes/s)...
pub const MIN_SLOPE: f64 = 256.0 * 1024.0;
/// ...the process grew at least this much over the series...
pub const MIN_GROWTH: u64 = 16 << 20;
/// ...and a line fits the series this well (R², 0 to 1).
pub const MIN_FIT: f64 = 0.8;

/// `memory_growth` of one process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemoryVerdict {
    /// `memory_growth`.
    pub class: String,
    /// The least-squares slope of the resident size over the growth
    /// phase (up to its highest point), bytes per second.
    pub growth_bytes_per_s: f64,
    /// How well a line fits the series (R²).
    pub fit: f64,
    /// From the first point of the series to its highest, bytes.
    pub grown_bytes: u64,
    /// The line with the most growth not released, and that net growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_net_bytes: Option<u64>,
    pub advice: String,
}

const ADVICE: &str = "resident memory grows steadily: something keeps what it allocates (a cache without a bound, a list or dict that only grows, tensors kept for logging); the line named holds the growth; bound the cache, drop references, or take a heap snapshot there (tracemalloc, memray)";

/// R² of the least-squares line of `rss` over time.
fn fit(series: &[MemPoint], slope: f64) -> f64 {
    let n = series.len() as f64;
    if series.len() < 3 {
        return 0.0;
    }
    let mean_t = series.iter().map(|p| p.t_ns as f64 / 1e9).sum::<f64>() / n;
    let mean_r = series.iter().map(|p| p.rss as f64).sum::<f64>() / n;
    let (mut ss_res, mut ss_tot) = (0.0, 0.0);
    for p in series {
        let predicted = mean_r + slope * (p.t_ns as f64 / 1e9 - mean_t);
        ss_res += (p.rss as f64 - predicted).powi(2);
        ss_tot += (p.rss as f64 - mean_r).powi(2);
    }
    if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 }
}

/// `memory_growth` for `p`, when its growth is steady (the thresholds
/// above). Judged on the growth phase: the series up to its highest point
/// (a script's teardown frees everything as it exits), which must be at
/// least half the series' span.
pub fn memory_growth(p: &ProcessMemory) -> Option<MemoryVerdict> {
    let first = p.series.first()?;
    let last = p.series.last()?;
    let top = p.series.iter().enumerate().max_by_key(|(i, q)| (q.rss, *i)).map(|(i, _)| i)?;
    let phase = &p.series[..=top];
    let span = phase[top].t_ns.saturating_sub(first.t_ns);
    let grown = phase[top].rss.saturating_sub(first.rss);
    if span < MIN_WINDOW_NS || span.saturating_mul(2) < last.t_ns.saturating_sub(first.t_ns) || grown < MIN_GROWTH {
        return None;
    }
    let growth = slope(phase);
    let fit = fit(phase, growth);
    if growth < MIN_SLOPE || fit < MIN_FIT {
        return None;
    }
    let top = p.lines.iter().map(|l| (l, l.grown_bytes.saturating_sub(l.released_bytes))).filter(|(_, net)| *net > 0).max_by_key(|(_, net)| *net);
    Some(MemoryVerdict {
        class: "memory_growth".into(),
        growth_bytes_per_s: growth,
        fit,
        grown_bytes: grown,
        site: top.map(|(l, _)| l.site.clone()),
        site_net_bytes: top.map(|(_, net)| net),
        advice: ADVICE.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::memory::GrowthLine;

    fn process(step: u64, jitter: u64) -> ProcessMemory {
        let series: Vec<MemPoint> =
            (0..100).map(|i| MemPoint { t_ns: i * 100_000_000, rss: (100 << 20) + i * step + if i % 2 == 0 { jitter } else { 0 }, ..Default::default() }).collect();
        let site = |line| SiteRef { function: "handle".into(), file: Some("/srv/app.py".into()), line: Some(line), kind: "python".into(), module: None, user_code: true };
        ProcessMemory {
            pid: 1,
            growth_bytes_per_s: slope(&series),
            series,
            peak_rss: 0,
            vm_hwm: None,
            lines: vec![
                GrowthLine { site: site(10), beneath: None, grown_bytes: 900 << 20, released_bytes: 0, samples: 1800 },
                GrowthLine { site: site(20), beneath: None, grown_bytes: 950 << 20, released_bytes: 940 << 20, samples: 3800 },
            ],
        }
    }

    #[test]
    fn a_steady_growth_is_named_at_the_line_that_keeps_it() {
        let v = memory_growth(&process(1 << 20, 0)).expect("steady growth");
        assert_eq!(v.site.as_ref().and_then(|s| s.line), Some(10));
        assert!((v.growth_bytes_per_s - 10.0 * (1 << 20) as f64).abs() < 1.0, "{}", v.growth_bytes_per_s);
        assert!(v.fit > 0.99);
        // Flat, or noise without a trend: none.
        assert!(memory_growth(&process(0, 0)).is_none());
        assert!(memory_growth(&process(0, 64 << 20)).is_none());
    }
}
