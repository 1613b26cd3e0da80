//! The recording's series as charts: GPU utilisation, memory and PCIe
//! bandwidth (NVML samples), resident memory per process (the memory
//! family), and with `--timeline` CUDA calls and copy bandwidth per
//! interval. Each chart is drawn here as inline SVG (it prints and needs no
//! script) from the same points the page embeds as data.

use maud::{html, Markup};
use serde::Serialize;

use crate::{
    recording::Recording,
    report::fmt::{fmt_bytes, fmt_duration, fmt_rate, printable},
};

/// A series with more points is thinned to every n-th point (said on the page).
const MAX_POINTS: usize = 4000;
/// Processes whose resident memory is charted (the largest peaks), and of
/// them how many are shown open (the rest collapsed).
const MAX_MEMORY_PROCESSES: usize = 8;
const OPEN_MEMORY_PROCESSES: usize = 2;
/// Buckets of the per-interval series made from timeline events.
const EVENT_BUCKETS: u64 = 200;

/// One chart's data.
#[derive(Serialize)]
pub struct Series {
    pub name: String,
    /// `percent`, `bytes`, `bytes/s`, `calls/s`.
    pub unit: &'static str,
    /// `[seconds since the window start, value]`.
    pub points: Vec<(f64, f64)>,
    /// Every n-th point of the source kept (1: all of them).
    pub thinned_every: usize,
    /// Shown collapsed (a smaller process's memory).
    #[serde(skip)]
    pub minor: bool,
}

fn series(name: String, unit: &'static str, mut points: Vec<(f64, f64)>) -> Series {
    let every = points.len().div_ceil(MAX_POINTS).max(1);
    if every > 1 {
        points = points.into_iter().step_by(every).collect();
    }
    Series { name, unit, points, thinned_every: every, minor: false }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Every series the recording holds, in page order.
pub fn all(rec: &Recording) -> Vec<Series> {
    let mut out = Vec::new();
    if let Some(c) = &rec.cuda {
        let mut gpus: Vec<u32> = c.gpu_samples.iter().map(|s| s.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        for g in gpus {
            let samples: Vec<_> = c.gpu_samples.iter().filter(|s| s.gpu == g).collect();
            out.push(series(format!("GPU {g} utilisation"), "percent", samples.iter().map(|s| (secs(s.ts_ns), s.util_percent)).collect()));
            out.push(series(format!("GPU {g} memory used"), "bytes", samples.iter().map(|s| (secs(s.ts_ns), s.mem_used_bytes as f64)).collect()));
            let rx: Vec<_> = samples.iter().filter_map(|s| s.pcie_rx_bytes_per_s.map(|v| (secs(s.ts_ns), v as f64))).collect();
            if !rx.is_empty() {
                out.push(series(format!("GPU {g} PCIe host to device"), "bytes/s", rx));
            }
            let tx: Vec<_> = samples.iter().filter_map(|s| s.pcie_tx_bytes_per_s.map(|v| (secs(s.ts_ns), v as f64))).collect();
            if !tx.is_empty() {
                out.push(series(format!("GPU {g} PCIe device to host"), "bytes/s", tx));
            }
        }
    }
    if let Some(t) = &rec.timeline {
        if !t.cuda.is_empty() && rec.duration_ns > 0 {
            let width = rec.duration_ns.div_ceil(EVENT_BUCKETS).max(1);
            let n = rec.duration_ns.div_ceil(width) as usize;
            let (mut calls, mut copied) = (vec![0u64; n], vec![0u64; n]);
            for e in &t.cuda {
                // Times are relative to the window start.
                let i = (e.begin_ns / width) as usize;
                let Some(slot) = calls.get_mut(i) else { continue };
                *slot += 1;
                if e.kind.is_some() {
                    copied[i] = copied[i].saturating_add(e.bytes);
                }
            }
            let per_s = |v: u64| v as f64 * 1e9 / width as f64;
            let at = |i: usize| secs(i as u64 * width);
            out.push(series("CUDA calls".into(), "calls/s", calls.iter().enumerate().map(|(i, v)| (at(i), per_s(*v))).collect()));
            if copied.iter().any(|b| *b > 0) {
                out.push(series("Copy bandwidth (CUDA copies)".into(), "bytes/s", copied.iter().enumerate().map(|(i, v)| (at(i), per_s(*v))).collect()));
            }
        }
    }
    if let Some(m) = &rec.memory {
        let mut procs: Vec<_> = m.processes.iter().filter(|p| !p.series.is_empty()).collect();
        procs.sort_by(|a, b| b.peak_rss.cmp(&a.peak_rss).then(a.pid.cmp(&b.pid)));
        for (i, p) in procs.into_iter().take(MAX_MEMORY_PROCESSES).enumerate() {
            let comm = rec.targets.iter().find(|t| t.pid == p.pid).map(|t| printable(&t.comm).into_owned()).unwrap_or_default();
            let mut s = series(format!("Resident memory, pid {} {comm}", p.pid), "bytes", p.series.iter().map(|s| (secs(s.t_ns), s.rss as f64)).collect());
            s.minor = i >= OPEN_MEMORY_PROCESSES;
            out.push(s);
        }
    }
    out
}

fn value(unit: &str, v: f64) -> String {
    match unit {
        "percent" => format!("{v:.0}%"),
        "bytes" => fmt_bytes(v.max(0.0) as u64),
        "bytes/s" => fmt_rate(v.max(0.0)),
        _ => format!("{v:.0}/s"),
    }
}

/// The chart of one series: a line over the window, its range labelled.
pub fn chart(s: &Series, window_ns: u64) -> Markup {
    const W: f64 = 640.0;
    const H: f64 = 140.0;
    let x_max = secs(window_ns).max(s.points.iter().map(|p| p.0).fold(0.0, f64::max)).max(1e-9);
    let y_max = if s.unit == "percent" { 100.0 } else { s.points.iter().map(|p| p.1).fold(0.0, f64::max) };
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let pts: Vec<String> = s.points.iter().map(|(x, y)| format!("{:.1},{:.1}", x / x_max * W, H - (y / y_max * H).clamp(0.0, H))).collect();
    let last = s.points.last().map(|p| value(s.unit, p.1)).unwrap_or_default();
    let peak = s.points.iter().map(|p| p.1).fold(0.0, f64::max);
    html! {
        figure.chart {
            figcaption {
                strong { (s.name) }
                " (peak " (value(s.unit, peak)) ", last " (last) ", " (s.points.len()) " points"
                @if s.thinned_every > 1 { ", every " (s.thinned_every) "th shown" }
                ")"
            }
            svg viewBox={ "-60 -10 " (W + 70.0) " " (H + 30.0) } role="img" aria-label=(s.name) {
                line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                line.axis x1="0" y1="0" x2="0" y2=(H) {}
                text.tick x="-4" y="4" text-anchor="end" { (value(s.unit, y_max)) }
                text.tick x="-4" y=(H) text-anchor="end" { (value(s.unit, 0.0)) }
                text.tick x="0" y=(H + 16.0) { "0 s" }
                text.tick x=(W) y=(H + 16.0) text-anchor="end" { (fmt_duration((x_max * 1e9) as u64)) }
                polyline.series points=(pts.join(" ")) {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{
        cuda::Site,
        timeline::{CudaCallEvent, Timeline},
    };

    #[test]
    fn timeline_cuda_calls_and_copies_per_interval() {
        let mut rec = crate::recording::tests::sample();
        rec.duration_ns = 2_000_000_000;
        let call = |api: &str, kind: Option<&str>, bytes, at: u64| CudaCallEvent {
            pid: 1,
            tid: 1,
            api: api.into(),
            kind: kind.map(Into::into),
            bytes,
            begin_ns: at,
            end_ns: at + 1000,
            rc: 0,
            site: Site::unknown(),
        };
        let mut t = Timeline { window_start_mono_ns: 5_000_000_000, ..Default::default() };
        // 10 ms intervals (2 s / 200): three calls in the first, one copy of 1 MB in the last.
        t.cuda = vec![call("cudaLaunchKernel", None, 0, 0), call("cudaLaunchKernel", None, 0, 5_000_000), call("cudaMemcpy", Some("HtoD"), 0, 9_000_000), call("cudaMemcpy", Some("HtoD"), 1_000_000, 1_995_000_000)];
        rec.timeline = Some(t);
        let all = all(&rec);
        let calls = all.iter().find(|s| s.name == "CUDA calls").unwrap();
        assert_eq!(calls.points.len(), 200);
        assert_eq!(calls.points[0], (0.0, 300.0), "3 calls in 10 ms");
        assert_eq!(calls.points[199].1, 100.0);
        let copies = all.iter().find(|s| s.name.starts_with("Copy bandwidth")).unwrap();
        assert_eq!(copies.points[199].1, 100_000_000.0, "1 MB in 10 ms");
        let total: f64 = calls.points.iter().map(|p| p.1 * 0.01).sum();
        assert!((total - 4.0).abs() < 1e-9, "every call counted once: {total}");
    }

    #[test]
    fn long_series_are_thinned_and_say_so() {
        let s = series("x".into(), "bytes", (0..10_000).map(|i| (i as f64, 1.0)).collect());
        assert_eq!((s.points.len(), s.thinned_every), (3334, 3));
    }
}
