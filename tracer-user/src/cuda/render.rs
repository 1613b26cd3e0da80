//! The CUDA part of the text report: findings first, then copies and
//! syncs by site, memory calls, and launches by kernel and site.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    findings::{fmt_bytes, fmt_ns},
    CudaCall, CudaReport, GpuSample, Site,
};

/// Rows shown per table before "... N more".
const MAX_ROWS: usize = 20;

/// Names of the `cudaError_t` values a tracer is likely to see.
pub fn error_name(rc: i32) -> &'static str {
    match rc {
        0 => "cudaSuccess",
        1 => "cudaErrorInvalidValue",
        2 => "cudaErrorMemoryAllocation",
        3 => "cudaErrorInitializationError",
        4 => "cudaErrorCudartUnloading",
        35 => "cudaErrorInsufficientDriver",
        46 => "cudaErrorDevicesUnavailable",
        100 => "cudaErrorNoDevice",
        101 => "cudaErrorInvalidDevice",
        400 => "cudaErrorInvalidResourceHandle",
        600 => "cudaErrorNotReady",
        700 => "cudaErrorIllegalAddress",
        712 => "cudaErrorHostMemoryAlreadyRegistered",
        713 => "cudaErrorHostMemoryNotRegistered",
        719 => "cudaErrorLaunchFailure",
        999 => "cudaErrorUnknown",
        _ => "",
    }
}

fn short_site(s: &Site) -> String {
    let file = s.file.as_deref().map(|f| f.rsplit('/').next().unwrap_or(f));
    match (file, s.line) {
        (Some(f), Some(l)) => format!("{} ({f}:{l})", s.function),
        (Some(f), None) => format!("{} ({f})", s.function),
        _ => s.function.clone(),
    }
}

fn share(ns: u64, window_ns: u64) -> String {
    if window_ns == 0 {
        "-".into()
    } else {
        format!("{:.1}%", ns as f64 * 100.0 / window_ns as f64)
    }
}

fn gbps(bytes: u64, ns: u64) -> String {
    if ns == 0 || bytes == 0 {
        "-".into()
    } else {
        format!("{:.2}", bytes as f64 / ns as f64)
    }
}

fn more(out: &mut String, total: usize) {
    if total > MAX_ROWS {
        let _ = writeln!(out, "  ... {} more", total - MAX_ROWS);
    }
}

pub fn render_text(out: &mut String, cuda: &CudaReport) {
    let traced = !(cuda.libraries.is_empty() && cuda.calls.is_empty() && cuda.launches.is_empty());
    if !traced && cuda.gpu_samples.is_empty() {
        return;
    }
    let w = cuda.window_ns;
    if traced {
        let _ = writeln!(out, "\n== CUDA runtime");
    } else {
        let _ = writeln!(out, "\n== GPU utilization (no CUDA runtime probed in the targets)");
    }
    for l in &cuda.libraries {
        let pids: Vec<String> = l.pids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "probed {} ({} functions), mapped by pid {}", l.path, l.functions.len(), pids.join(", "));
    }

    if traced {
        let _ = writeln!(out, "\nfindings: {}", if cuda.findings.is_empty() { "none".to_owned() } else { cuda.findings.len().to_string() });
    }
    for f in &cuda.findings {
        let _ = writeln!(out, "  [{}] {} at {} (pid {})", f.severity, f.kind, f.site.display(), f.pid);
        let _ = writeln!(
            out,
            "      {}; {} times, {}, {}",
            f.message,
            f.count,
            fmt_bytes(f.bytes),
            fmt_ns(f.time_ns)
        );
        let _ = writeln!(out, "      advice: {}", f.advice);
    }

    let copies: Vec<&CudaCall> = cuda.calls.iter().filter(|c| c.kind.is_some()).collect();
    if !copies.is_empty() {
        let _ = writeln!(out, "\ncopies by site:");
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>7} {:>10} {:>6} {:>7}  {:<26} {:<7} {:<13} SITE",
            "CALLS", "BYTES", "GB/S", "TIME", "%WALL", "ERRORS", "API", "KIND", "HOST PIN/PAGE"
        );
        for c in copies.iter().take(MAX_ROWS) {
            let host = match (c.pinned, c.pageable) {
                (Some(p), Some(q)) => format!("{p}/{q}"),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>7} {:>10} {:>6} {:>7}  {:<26} {:<7} {:<13} {}",
                c.count,
                fmt_bytes(c.bytes),
                if c.errors == c.count { "-".into() } else { gbps(c.bytes, c.total_ns) },
                fmt_ns(c.total_ns),
                share(c.total_ns, w),
                c.errors,
                c.api,
                c.kind.as_deref().unwrap_or("-"),
                host,
                short_site(&c.site)
            );
        }
        more(out, copies.len());
    }
    if !cuda.gpu_samples.is_empty() {
        render_gpus(out, cuda, traced);
    }

    let syncs: Vec<&CudaCall> = cuda.calls.iter().filter(|c| c.api.contains("Synchronize")).collect();
    if !syncs.is_empty() {
        let _ = writeln!(out, "\nsyncs by site:");
        let _ = writeln!(out, "  {:>8} {:>10} {:>10} {:>6} {:>7}  {:<28} SITE", "CALLS", "TIME", "AVG", "%WALL", "ERRORS", "API");
        for c in syncs.iter().take(MAX_ROWS) {
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>6} {:>7}  {:<28} {}",
                c.count,
                fmt_ns(c.total_ns),
                fmt_ns(c.total_ns / c.count.max(1)),
                share(c.total_ns, w),
                c.errors,
                c.api,
                short_site(&c.site)
            );
        }
        more(out, syncs.len());
    }

    let memory: Vec<&CudaCall> =
        cuda.calls.iter().filter(|c| c.kind.is_none() && !c.api.contains("Synchronize")).collect();
    if !memory.is_empty() {
        let _ = writeln!(out, "\nmemory calls by site:");
        let _ = writeln!(out, "  {:>8} {:>10} {:>10} {:>7}  {:<20} SITE", "CALLS", "BYTES", "TIME", "ERRORS", "API");
        for c in memory.iter().take(MAX_ROWS) {
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>7}  {:<20} {}",
                c.count,
                fmt_bytes(c.bytes),
                fmt_ns(c.total_ns),
                c.errors,
                c.api,
                short_site(&c.site)
            );
        }
        more(out, memory.len());
    }

    if !cuda.launches.is_empty() {
        let total: u64 = cuda.launches.iter().map(|l| l.count).sum();
        let _ = writeln!(out, "\nkernel launches by kernel and site ({total} in all):");
        let _ = writeln!(out, "  {:>8}  {:<48} SITE", "CALLS", "KERNEL");
        for l in cuda.launches.iter().take(MAX_ROWS) {
            let _ = writeln!(out, "  {:>8}  {:<48} {}", l.count, l.kernel, short_site(&l.site));
        }
        more(out, cuda.launches.len());
    }

    let mut codes: BTreeMap<i32, u64> = BTreeMap::new();
    for c in &cuda.calls {
        for (rc, n) in c.return_codes.iter().filter(|(rc, _)| **rc != 0) {
            *codes.entry(*rc).or_default() += n;
        }
    }
    if !codes.is_empty() {
        let list: Vec<String> = codes.iter().map(|(rc, n)| format!("{n} x {rc} {}", error_name(*rc))).collect();
        let _ = writeln!(out, "\nfailed calls: {}", list.join(", "));
    }
    for n in &cuda.notes {
        let _ = writeln!(out, "note: {n}");
    }
}

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

/// Bytes per second in decimal units (like GB/s elsewhere in the report).
pub fn fmt_rate(bytes_per_s: f64) -> String {
    const UNITS: [&str; 4] = ["kB/s", "MB/s", "GB/s", "TB/s"];
    if !bytes_per_s.is_finite() || bytes_per_s < 1000.0 {
        return format!("{:.0} B/s", bytes_per_s.max(0.0));
    }
    let mut v = bytes_per_s / 1000.0;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// (bytes, ns) of the copies of `kind` the tracer saw, failed calls left out.
fn copy_totals(cuda: &CudaReport, kind: &str) -> (u64, u64) {
    cuda.calls
        .iter()
        .filter(|c| c.kind.as_deref() == Some(kind) && c.errors < c.count)
        .fold((0, 0), |(b, t), c| (b + c.bytes, t + c.total_ns))
}

/// The NVML section: per GPU utilization, memory and PCIe throughput, the
/// utilization over the window, and the host<->device copies traced in the
/// same window beside PCIe throughput.
fn render_gpus(out: &mut String, cuda: &CudaReport, traced: bool) {
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
            g.name.as_deref().unwrap_or("-")
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
        failed += cuda.calls.iter().filter(|c| c.kind.as_deref() == Some(kind) && c.errors >= c.count).map(|c| c.count).sum::<u64>();
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
mod tests {
    use super::*;
    use crate::cuda::{CudaLaunch, Finding};

    #[test]
    fn renders_findings_first() {
        let site = Site { function: "step".into(), file: Some("/srv/app/model.py".into()), line: Some(42) };
        let report = CudaReport {
            calls: vec![CudaCall {
                pid: 7,
                api: "cudaMemcpyAsync".into(),
                kind: Some("HtoD".into()),
                count: 100,
                bytes: 409_600,
                total_ns: 2_000_000,
                errors: 0,
                site: site.clone(),
                return_codes: BTreeMap::from([(0, 100)]),
                pinned: Some(0),
                pageable: Some(100),
            }],
            launches: vec![CudaLaunch { pid: 7, kernel: "k".into(), count: 5, site: site.clone(), api: "cudaLaunchKernel".into() }],
            findings: vec![Finding {
                kind: "small_htod_copies".into(),
                severity: "medium".into(),
                pid: 7,
                site,
                count: 100,
                bytes: 409_600,
                time_ns: 2_000_000,
                message: "m".into(),
                advice: "a".into(),
            }],
            window_ns: 100_000_000,
            ..Default::default()
        };
        let mut s = String::new();
        render_text(&mut s, &report);
        let f = s.find("small_htod_copies at step (/srv/app/model.py:42)").expect(&s);
        let c = s.find("copies by site").expect(&s);
        assert!(f < c, "{s}");
        assert!(s.contains("0.20") && s.contains("2.0%") && s.contains("0/100") && s.contains("step (model.py:42)"), "{s}");
        assert!(s.contains("kernel launches by kernel and site (5 in all)"), "{s}");
        let mut empty = String::new();
        render_text(&mut empty, &CudaReport::default());
        assert!(empty.is_empty());
    }

    fn gpu(ts_ns: u64, gpu: u32, util: f64, used: u64, pcie: Option<(u64, u64)>) -> GpuSample {
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
    fn rates() {
        assert_eq!(fmt_rate(0.0), "0 B/s");
        assert_eq!(fmt_rate(999.0), "999 B/s");
        assert_eq!(fmt_rate(1_024_000.0), "1.02 MB/s");
        assert_eq!(fmt_rate(2_048_000.0), "2.05 MB/s");
        assert_eq!(fmt_rate(12_500.0), "12.50 kB/s");
        assert_eq!(fmt_rate(3.1e9), "3.10 GB/s");
        assert_eq!(fmt_rate(f64::NAN), "0 B/s");
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

    #[test]
    fn renders_gpus_beside_copies() {
        let site = Site { function: "step".into(), file: Some("m.py".into()), line: Some(3) };
        let copy = |kind: &str, bytes: u64, ns: u64| CudaCall {
            pid: 7,
            api: "cudaMemcpyAsync".into(),
            kind: Some(kind.into()),
            count: 10,
            bytes,
            total_ns: ns,
            errors: 0,
            site: site.clone(),
            return_codes: BTreeMap::new(),
            pinned: None,
            pageable: None,
        };
        let mut samples = vec![gpu(10, 0, 37.0, 1 << 30, Some((1_024_000, 2_048_000))), gpu(20, 1, 81.0, 3 << 30, None)];
        samples[0].name = Some("nvmlsim GPU 0 (fake)".into());
        let report = CudaReport {
            calls: vec![copy("HtoD", 2_000_000_000, 1_000_000_000), copy("DtoH", 1000, 1000)],
            gpu_samples: samples.clone(),
            window_ns: 2_000_000_000,
            notes: vec!["NVML: 2 GPUs sampled at 5 Hz (2 samples)".into()],
            ..Default::default()
        };
        let mut s = String::new();
        render_text(&mut s, &report);
        assert!(s.contains("== CUDA runtime"), "{s}");
        let g = s.find("GPUs (NVML; whole devices, every process on them; 2 samples in 2.00 s)").expect(&s);
        assert!(s.find("copies by site").expect(&s) < g, "{s}");
        assert!(s.contains("37 / 37 / 37") && s.contains("1.0 GiB (1.0 GiB) / 16.0 GiB") && s.contains("nvmlsim GPU 0 (fake)"), "{s}");
        assert!(s.contains("1.02 MB/s") && s.contains("2.05 MB/s"), "{s}");
        assert!(s.contains("util% over the window (1 slice of 2.00 s)"), "{s}");
        assert!(
            s.contains("host->device: 1.9 GiB copied by the targets in 1.00 s (2.00 GB/s while copying, 1.00 GB/s over the window); PCIe RX avg, all GPUs: 2.05 MB/s"),
            "{s}"
        );
        assert!(s.contains("device->host: 1000 B copied"), "{s}");
        assert!(s.contains("note: NVML: 2 GPUs sampled"), "{s}");

        // Samples without any CUDA runtime probed: the GPU part alone.
        let only = CudaReport { gpu_samples: samples, window_ns: 1_000_000_000, ..Default::default() };
        let mut s = String::new();
        render_text(&mut s, &only);
        assert!(s.starts_with("\n== GPU utilization (no CUDA runtime probed in the targets)"), "{s}");
        assert!(!s.contains("findings") && !s.contains("copied by the targets") && !s.contains("no host<->device copies"), "{s}");
        assert!(s.contains("81 / 81 / 81"), "{s}");
        // Copies that all failed moved nothing: said so.
        let mut failed = report.clone();
        for c in &mut failed.calls {
            c.errors = c.count;
        }
        let mut s = String::new();
        render_text(&mut s, &failed);
        assert!(s.contains("host<->device copies traced in the targets: 20, all failed (no data moved)"), "{s}");
        for line in s.lines().filter(|l| l.trim_start().starts_with('0') || l.trim_start().starts_with('1')) {
            assert!(line.len() < 160, "line too long: {line:?}");
        }
    }
}
