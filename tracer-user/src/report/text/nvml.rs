//! The GPU (NVML) tables of the text report, shown within the CUDA
//! section: per GPU utilization, memory and PCIe throughput, utilization
//! over the window, and the host<->device copies traced in the same window
//! beside the GPUs' PCIe throughput. Also the summaries they are built from
//! ([`summarize_gpus`], [`util_buckets`], [`timeline_slices`]).

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    recording::cuda::{CudaReport, GpuSample},
    report::fmt::{fmt_bytes, fmt_ns, fmt_rate, gbps, printable, saturating_sum},
};

/// Most slices of the GPU utilization timeline.
const GPU_BUCKETS: usize = 10;

/// Slices of the utilization timeline: up to [`GPU_BUCKETS`], about two
/// samples of every GPU in each (no empty slices in short windows).
pub fn timeline_slices(sums: &[GpuSummary]) -> usize {
    let fewest = sums.iter().map(|g| g.samples).min().unwrap_or(0);
    (fewest / 2).clamp(1, GPU_BUCKETS)
}

/// What one GPU's samples say.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSummary {
    pub gpu: u32,
    pub name: Option<String>,
    pub samples: usize,
    pub util_min: f64,
    pub util_mean: f64,
    pub util_max: f64,
    pub mem_util_mean: f64,
    pub mem_used_mean: u64,
    pub mem_used_max: u64,
    pub mem_total: u64,
    /// Means over the samples that report PCIe throughput (None: none does).
    pub pcie_tx_mean: Option<f64>,
    pub pcie_rx_mean: Option<f64>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = v.fold((0u64, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| sum / n as f64)
}

/// One summary per GPU, by index.
pub fn summarize_gpus(samples: &[GpuSample]) -> Vec<GpuSummary> {
    let mut by_gpu: BTreeMap<u32, Vec<&GpuSample>> = BTreeMap::new();
    for s in samples {
        by_gpu.entry(s.gpu).or_default().push(s);
    }
    by_gpu
        .into_iter()
        .map(|(gpu, v)| {
            let util = || v.iter().map(|s| s.util_percent);
            GpuSummary {
                gpu,
                name: v.iter().find_map(|s| s.name.clone()),
                samples: v.len(),
                util_min: util().fold(f64::INFINITY, f64::min),
                util_mean: mean(util()).unwrap_or(0.0),
                util_max: util().fold(f64::NEG_INFINITY, f64::max),
                mem_util_mean: mean(v.iter().map(|s| s.mem_util_percent)).unwrap_or(0.0),
                mem_used_mean: mean(v.iter().map(|s| s.mem_used_bytes as f64)).unwrap_or(0.0) as u64,
                mem_used_max: v.iter().map(|s| s.mem_used_bytes).max().unwrap_or(0),
                mem_total: v.iter().map(|s| s.mem_total_bytes).max().unwrap_or(0),
                pcie_tx_mean: mean(v.iter().filter_map(|s| s.pcie_tx_bytes_per_s).map(|b| b as f64)),
                pcie_rx_mean: mean(v.iter().filter_map(|s| s.pcie_rx_bytes_per_s).map(|b| b as f64)),
            }
        })
        .collect()
}

/// Mean utilization of `gpu` in each of `n` equal slices of the window
/// (None: no sample there). A window of 0 spans the samples.
pub fn util_buckets(samples: &[GpuSample], gpu: u32, window_ns: u64, n: usize) -> Vec<Option<f64>> {
    if n == 0 {
        return Vec::new();
    }
    let span = if window_ns > 0 { window_ns } else { samples.iter().map(|s| s.ts_ns).max().unwrap_or(0) + 1 };
    let mut acc = vec![(0u64, 0.0f64); n];
    for s in samples.iter().filter(|s| s.gpu == gpu) {
        let i = ((u128::from(s.ts_ns) * n as u128 / u128::from(span)) as usize).min(n - 1);
        acc[i].0 += 1;
        acc[i].1 += s.util_percent;
    }
    acc.into_iter().map(|(c, sum)| (c > 0).then(|| sum / c as f64)).collect()
}

/// (bytes, ns) of the copies of `kind` the tracer saw, failed calls left out.
fn copy_totals(cuda: &CudaReport, kind: &str) -> (u64, u64) {
    cuda.calls
        .iter()
        .filter(|c| c.kind.as_deref() == Some(kind) && c.errors < c.count)
        .fold((0u64, 0u64), |(b, t), c| (b.saturating_add(c.bytes), t.saturating_add(c.total_ns)))
}

/// The NVML section: per GPU utilization, memory and PCIe throughput, the
/// utilization over the window, and the host<->device copies traced in the
/// same window beside PCIe throughput.
pub fn render(out: &mut String, cuda: &CudaReport, traced: bool) {
    let sums = summarize_gpus(&cuda.gpu_samples);
    let w = cuda.window_ns;
    let _ = writeln!(out, "\nGPUs (NVML; whole devices, every process on them; {} samples in {}):", cuda.gpu_samples.len(), fmt_ns(w));
    let _ = writeln!(
        out,
        "  {:>3} {:>7} {:>18} {:>5}  {:<30} {:>12} {:>12}  NAME",
        "GPU", "SAMPLES", "UTIL% MIN/AVG/MAX", "MEM%", "MEM USED AVG (MAX) / TOTAL", "PCIe TX AVG", "PCIe RX AVG"
    );
    let rate = |r: Option<f64>| r.map(fmt_rate).unwrap_or_else(|| "-".into());
    for g in &sums {
        let mem = format!("{} ({}) / {}", fmt_bytes(g.mem_used_mean), fmt_bytes(g.mem_used_max), fmt_bytes(g.mem_total));
        let _ = writeln!(
            out,
            "  {:>3} {:>7} {:>18} {:>5.0}  {:<30} {:>12} {:>12}  {}",
            g.gpu,
            g.samples,
            format!("{:.0} / {:.0} / {:.0}", g.util_min, g.util_mean, g.util_max),
            g.mem_util_mean,
            mem,
            rate(g.pcie_tx_mean),
            rate(g.pcie_rx_mean),
            printable(g.name.as_deref().unwrap_or("-"))
        );
    }
    let n = timeline_slices(&sums);
    let _ = writeln!(out, "  util% over the window ({n} slice{} of {}):", if n == 1 { "" } else { "s" }, fmt_ns(w / n as u64));
    for g in &sums {
        let cells: Vec<String> = util_buckets(&cuda.gpu_samples, g.gpu, w, n)
            .into_iter()
            .map(|b| b.map(|u| format!("{u:>3.0}")).unwrap_or_else(|| "  -".into()))
            .collect();
        let _ = writeln!(out, "  {:>3}  {}", g.gpu, cells.join(" "));
    }
    // Per-time copy data is not kept: the window's totals, beside the GPUs' PCIe means.
    let all = |f: fn(&GpuSummary) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = sums.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    let (mut any_copy, mut failed) = (false, 0u64);
    for (kind, label, pcie, link) in [
        ("HtoD", "host->device", all(|g| g.pcie_rx_mean), "PCIe RX"),
        ("DtoH", "device->host", all(|g| g.pcie_tx_mean), "PCIe TX"),
    ] {
        let (bytes, ns) = copy_totals(cuda, kind);
        failed = failed.saturating_add(saturating_sum(
            cuda.calls.iter().filter(|c| c.kind.as_deref() == Some(kind) && c.errors >= c.count).map(|c| c.count),
        ));
        if bytes == 0 {
            continue;
        }
        any_copy = true;
        let over_window = if w > 0 { fmt_rate(bytes as f64 * 1e9 / w as f64) } else { "-".into() };
        let _ = writeln!(
            out,
            "  {label}: {} copied by the targets in {} ({} GB/s while copying, {over_window} over the window); {link} avg, all GPUs: {}",
            fmt_bytes(bytes),
            fmt_ns(ns),
            gbps(bytes, ns),
            rate(pcie)
        );
    }
    if traced && !any_copy {
        if failed > 0 {
            let _ = writeln!(out, "  host<->device copies traced in the targets: {failed}, all failed (no data moved)");
        } else {
            let _ = writeln!(out, "  no host<->device copies traced in the targets");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn gpu(ts_ns: u64, gpu: u32, util: f64, used: u64, pcie: Option<(u64, u64)>) -> GpuSample {
        GpuSample {
            ts_ns,
            gpu,
            util_percent: util,
            mem_used_bytes: used,
            mem_util_percent: util / 2.0,
            mem_total_bytes: 16 << 30,
            pcie_tx_bytes_per_s: pcie.map(|p| p.0),
            pcie_rx_bytes_per_s: pcie.map(|p| p.1),
            name: None,
            uuid: None,
        }
    }

    #[test]
    fn gpu_summaries() {
        let mut s = vec![
            gpu(0, 0, 10.0, 1 << 30, Some((1000, 2000))),
            gpu(0, 1, 80.0, 3 << 30, None),
            gpu(100, 0, 30.0, 3 << 30, Some((3000, 4000))),
            gpu(200, 0, 20.0, 2 << 30, None),
        ];
        s[0].name = Some("A".into());
        let v = summarize_gpus(&s);
        assert_eq!(v.len(), 2);
        let a = &v[0];
        assert_eq!((a.gpu, a.name.as_deref(), a.samples), (0, Some("A"), 3));
        assert_eq!((a.util_min, a.util_mean, a.util_max), (10.0, 20.0, 30.0));
        assert_eq!((a.mem_used_mean, a.mem_used_max, a.mem_total), (2 << 30, 3 << 30, 16 << 30));
        assert_eq!(a.mem_util_mean, 10.0);
        // PCIe means over the samples that report it.
        assert_eq!((a.pcie_tx_mean, a.pcie_rx_mean), (Some(2000.0), Some(3000.0)));
        let b = &v[1];
        assert_eq!((b.gpu, b.name.as_deref(), b.samples, b.util_mean), (1, None, 1, 80.0));
        assert_eq!((b.pcie_tx_mean, b.pcie_rx_mean), (None, None));
    }

    #[test]
    fn utilization_buckets() {
        let s = vec![
            gpu(0, 0, 10.0, 0, None),
            gpu(50, 0, 30.0, 0, None),
            gpu(100, 1, 99.0, 0, None),
            gpu(250, 0, 50.0, 0, None),
            // At the window's end: the last bucket.
            gpu(400, 0, 70.0, 0, None),
        ];
        assert_eq!(util_buckets(&s, 0, 400, 4), vec![Some(20.0), None, Some(50.0), Some(70.0)]);
        assert_eq!(util_buckets(&s, 1, 400, 4), vec![None, Some(99.0), None, None]);
        assert_eq!(util_buckets(&s, 7, 400, 2), vec![None, None]);
        // No window length: the samples' span.
        assert_eq!(util_buckets(&s, 0, 0, 2), vec![Some(20.0), Some(60.0)]);
        assert!(util_buckets(&s, 0, 400, 0).is_empty());
    }

    #[test]
    fn slices_hold_samples() {
        let with = |n: usize| GpuSummary {
            gpu: 0,
            name: None,
            samples: n,
            util_min: 0.0,
            util_mean: 0.0,
            util_max: 0.0,
            mem_util_mean: 0.0,
            mem_used_mean: 0,
            mem_used_max: 0,
            mem_total: 0,
            pcie_tx_mean: None,
            pcie_rx_mean: None,
        };
        assert_eq!(timeline_slices(&[]), 1);
        assert_eq!(timeline_slices(&[with(1)]), 1);
        assert_eq!(timeline_slices(&[with(7), with(12)]), 3);
        assert_eq!(timeline_slices(&[with(300), with(299)]), 10);
    }
}
