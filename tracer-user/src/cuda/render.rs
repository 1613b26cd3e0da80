//! The CUDA part of the text report: findings first, then copies and
//! syncs by site, memory calls, and launches by kernel and site.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    findings::{fmt_bytes, fmt_ns},
    CudaCall, CudaReport, Site,
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
    if cuda.libraries.is_empty() && cuda.calls.is_empty() && cuda.launches.is_empty() {
        return;
    }
    let w = cuda.window_ns;
    let _ = writeln!(out, "\n== CUDA runtime");
    for l in &cuda.libraries {
        let pids: Vec<String> = l.pids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "probed {} ({} functions), mapped by pid {}", l.path, l.functions.len(), pids.join(", "));
    }

    let _ = writeln!(out, "\nfindings: {}", if cuda.findings.is_empty() { "none".to_owned() } else { cuda.findings.len().to_string() });
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
    if !cuda.gpu_samples.is_empty() {
        let _ = writeln!(out, "\nGPU samples: {}", cuda.gpu_samples.len());
    }
    for n in &cuda.notes {
        let _ = writeln!(out, "note: {n}");
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
}
