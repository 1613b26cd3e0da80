//! The CUDA section of the text report: the libraries probed, the
//! detector's findings first, then copies by site, the GPUs sampled by
//! NVML (section [`super::nvml`]), syncs by site, memory calls by site,
//! kernel launches by kernel and site, and failed calls by error code.

use std::{collections::BTreeMap, fmt::Write as _};

use super::nvml;
use crate::{
    recording::cuda::{CallClass, CudaCall, CudaReport, Site},
    report::{
        findings::{cuda_advice, cuda_message},
        fmt::{fmt_bytes, fmt_ns, gbps, printable, saturating_sum},
    },
};

/// Rows shown per table before "... N more".
const MAX_ROWS: usize = 20;

pub use crate::recording::cuda::error_name;
use crate::recording::cuda::nccl_error_name;

fn short_site(s: &Site) -> String {
    let file = s.file.as_deref().map(|f| printable(f.rsplit('/').next().unwrap_or(f)));
    let function = printable(&s.function);
    match (file, s.line) {
        (Some(f), Some(l)) => format!("{function} ({f}:{l})"),
        (Some(f), None) => format!("{function} ({f})"),
        _ => function.into_owned(),
    }
}

fn share(ns: u64, window_ns: u64) -> String {
    if window_ns == 0 {
        "-".into()
    } else {
        format!("{:.1}%", ns as f64 * 100.0 / window_ns as f64)
    }
}

fn more(out: &mut String, total: usize) {
    if total > MAX_ROWS {
        let _ = writeln!(out, "  ... {} more", total - MAX_ROWS);
    }
}

/// Under a table of calls: what lost events and lost calls leave out of
/// it. `per_call`: the table has columns from the per-call events.
fn incomplete(out: &mut String, cuda: &CudaReport, rows: &[&CudaCall], per_call: &str) {
    let events = saturating_sum(rows.iter().map(|c| c.events_lost));
    if events > 0 && !per_call.is_empty() {
        let _ = writeln!(
            out,
            "  incomplete: {events} of these calls lost their per-call event (cuda_events_lost): {per_call} miss them; the other columns are exact"
        );
    }
    if cuda.calls_lost > 0 {
        let _ = writeln!(out, "  incomplete: {} calls or launches were not counted at all (cuda_lost)", cuda.calls_lost);
    }
}

/// The whole CUDA section; nothing when no CUDA runtime was probed and no
/// GPU was sampled.
pub fn render(out: &mut String, cuda: &CudaReport, view: &super::view::View) {
    let traced = !(cuda.libraries.is_empty() && cuda.calls.is_empty() && cuda.launches.is_empty());
    if !traced && cuda.gpu_samples.is_empty() {
        return;
    }
    if traced {
        let _ = writeln!(out, "\n== CUDA runtime");
    } else {
        let _ = writeln!(out, "\n== GPU utilization (no CUDA runtime probed in the targets)");
    }
    if view.verbose || cuda.libraries.len() < 2 {
        for l in &cuda.libraries {
            let pids: Vec<String> = l.pids.iter().map(u32::to_string).collect();
            let _ = writeln!(out, "probed {} ({} functions), mapped by pid {}", printable(&l.path), l.functions.len(), pids.join(", "));
        }
    } else {
        // Compact: one line (`--verbose` has each library's path and pids).
        let names: Vec<String> =
            cuda.libraries.iter().map(|l| format!("{} ({})", printable(l.path.rsplit('/').next().unwrap_or(&l.path)), l.functions.len())).collect();
        let pids: std::collections::BTreeSet<u32> = cuda.libraries.iter().flat_map(|l| l.pids.iter().copied()).collect();
        let _ = writeln!(out, "probed {} libraries (functions): {}; mapped by {} process{}", names.len(), names.join(", "), pids.len(), if pids.len() == 1 { "" } else { "es" });
    }

    findings_section(out, cuda, traced);
    copies_section(out, cuda);
    if !cuda.gpu_samples.is_empty() {
        nvml::render(out, cuda, traced);
    }
    syncs_and_memory_sections(out, cuda);
    launches_and_failures(out, cuda);
    for n in cuda.notes.iter().filter(|n| view.verbose || !is_inventory(n)) {
        let _ = writeln!(out, "note: {}", printable(n));
    }
}

/// Whether a CUDA note only says what was probed, with nothing missed (a
/// detail: the `probed ...` lines above say as much; shown with
/// `--verbose`). The notes of late probes that missed calls, of failures
/// and of libraries not traced are not.
pub fn is_inventory(note: &str) -> bool {
    let probed = note.contains(" functions probed") && !note.contains("earlier calls missed");
    let allocator = note.contains("USDT pytorch:malloc") && note.contains(" probed");
    probed || allocator || note.contains("carries its own CUDA runtime, stripped")
}

/// The findings, each with its words (`report::findings`) and advice.
fn findings_section(out: &mut String, cuda: &CudaReport, traced: bool) {
    if traced {
        let n = if cuda.findings.is_empty() { "none".to_owned() } else { cuda.findings.len().to_string() };
        if cuda.events_lost > 0 {
            let _ = writeln!(
                out,
                "\nfindings: {n} (incomplete: {} per-call CUDA events lost (cuda_events_lost); a site that lost them may lack a finding)",
                cuda.events_lost
            );
        } else {
            let _ = writeln!(out, "\nfindings: {n}");
        }
    }
    for f in &cuda.findings {
        let _ = writeln!(out, "  [{}] {} at {} (pid {})", printable(&f.severity), printable(&f.kind), printable(&f.site.display()), f.pid);
        let _ = writeln!(
            out,
            "      {}; {} times, {}, {}",
            printable(&cuda_message(f)),
            f.count,
            fmt_bytes(f.bytes),
            fmt_ns(f.time_ns)
        );
        if f.events_lost > 0 {
            let _ = writeln!(
                out,
                "      incomplete: {} calls {} lost their per-call event (cuda_events_lost): counts, times and copy/sync pairs are exact (kernel aggregates); host memory, sizes, contents and allocations miss them",
                f.events_lost,
                if f.events_lost_process_wide() { "in this process" } else { "at this site" }
            );
        }
        let _ = writeln!(out, "      advice: {}", printable(cuda_advice(f)));
    }
}

/// Copies by site: count, bytes, bandwidth, time, pinned or pageable host memory.
fn copies_section(out: &mut String, cuda: &CudaReport) {
    let w = cuda.window_ns;
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
                printable(&c.api),
                printable(c.kind.as_deref().unwrap_or("-")),
                host,
                short_site(&c.site)
            );
        }
        more(out, copies.len());
        incomplete(out, cuda, &copies, "HOST PIN/PAGE and the failed-call codes");
    }
}

/// Syncs by site, then the other memory calls by site.
fn syncs_and_memory_sections(out: &mut String, cuda: &CudaReport) {
    let w = cuda.window_ns;
    let syncs: Vec<&CudaCall> = cuda.calls.iter().filter(|c| c.class() == CallClass::Sync).collect();
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
                printable(&c.api),
                short_site(&c.site)
            );
        }
        more(out, syncs.len());
        incomplete(out, cuda, &syncs, "the failed-call codes");
    }

    events_section(out, cuda);

    let memory: Vec<&CudaCall> =
        cuda.calls.iter().filter(|c| c.kind.is_none() && !matches!(c.class(), CallClass::Sync | CallClass::Collective) && !c.is_event_or_query()).collect();
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
                printable(&c.api),
                short_site(&c.site)
            );
        }
        more(out, memory.len());
        incomplete(out, cuda, &memory, "the failed-call codes and the leak finding");
    }
    device_memory_section(out, cuda);
}

/// Device memory held by line: what each process's allocation calls held
/// at the end and at most; for PyTorch, its tensors by line too.
fn device_memory_section(out: &mut String, cuda: &CudaReport) {
    for d in cuda.device_memory.iter() {
        if d.peak_held_bytes > 0 {
            let _ = writeln!(
                out,
                "\nGPU memory held by line, pid {} (allocation calls less frees): {} at the end, peak {}",
                d.pid,
                fmt_bytes(d.held_bytes),
                fmt_bytes(d.peak_held_bytes)
            );
            held_lines(out, &d.lines);
        }
        if let (Some(now), Some(peak)) = (d.allocated_bytes, d.peak_allocated_bytes) {
            let _ = writeln!(
                out,
                "\nGPU memory in tensors by line, pid {} (PyTorch's caching allocator): {} allocated at the end (peak {}), {} reserved from the device",
                d.pid,
                fmt_bytes(now),
                fmt_bytes(peak),
                fmt_bytes(d.held_bytes)
            );
            held_lines(out, &d.tensor_lines);
        }
    }
}

fn held_lines(out: &mut String, lines: &[crate::recording::cuda::DeviceMemoryLine]) {
    let _ = writeln!(out, "  {:>10} {:>10} {:>8} {:>8}  SITE", "HELD", "PEAK", "ALLOCS", "FREES");
    for l in lines.iter().take(MAX_ROWS) {
        let _ = writeln!(
            out,
            "  {:>10} {:>10} {:>8} {:>8}  {}",
            fmt_bytes(l.held_bytes),
            fmt_bytes(l.peak_held_bytes),
            l.allocs,
            l.frees,
            short_site(&l.site)
        );
    }
    more(out, lines.len());
}

/// Event records, waits on events and queries by site: the queries'
/// not-ready answers (polls), the waits polling ended and their time.
fn events_section(out: &mut String, cuda: &CudaReport) {
    let rows: Vec<&CudaCall> = cuda.calls.iter().filter(|c| c.is_event_or_query()).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nevents and queries by site:");
    let _ = writeln!(out, "  {:>8} {:>10} {:>10} {:>7} {:>10} {:>7}  {:<30} SITE", "CALLS", "TIME", "NOT READY", "WAITS", "SPUN", "ERRORS", "API");
    let dash = || "-".to_owned();
    for c in rows.iter().take(MAX_ROWS) {
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>7} {:>10} {:>7}  {:<30} {}",
            c.count,
            fmt_ns(c.total_ns),
            c.not_ready.map_or_else(dash, |n| n.to_string()),
            c.poll_waits.map_or_else(dash, |n| n.to_string()),
            c.poll_ns.map_or_else(dash, fmt_ns),
            c.errors,
            printable(&c.api),
            short_site(&c.site)
        );
    }
    more(out, rows.len());
    incomplete(out, cuda, &rows, "the failed-call codes");
}

/// Kernel launches by kernel and site, then the failed calls by code.
fn launches_and_failures(out: &mut String, cuda: &CudaReport) {
    if !cuda.launches.is_empty() {
        let total = saturating_sum(cuda.launches.iter().map(|l| l.count));
        let estimated = cuda.launches.iter().any(|l| l.estimated);
        let tilde = if estimated { "~" } else { "" };
        let _ = writeln!(out, "\nkernel launches by kernel and site ({tilde}{total} in all):");
        if let Some(s) = cuda.launch_sampling.as_ref() {
            let _ = writeln!(out, "  {}", launch_sampling_line(s));
        }
        let _ = writeln!(out, "  {:>8} {:>9}  {:<48} SITE", "CALLS", "PER S", "KERNEL");
        let secs = cuda.window_ns as f64 / 1e9;
        for l in cuda.launches.iter().take(MAX_ROWS) {
            let count = if l.estimated { format!("~{}", l.count) } else { l.count.to_string() };
            let rate = if secs > 0.0 { format!("{:.0}", l.count as f64 / secs) } else { "-".to_owned() };
            let _ = writeln!(out, "  {:>8} {:>9}  {:<48} {}", count, rate, printable(&l.kernel), short_site(&l.site));
        }
        more(out, cuda.launches.len());
        incomplete(out, cuda, &[], "");
    }

    graphs_section(out, cuda);
    collectives_section(out, cuda);

    // By (NCCL or CUDA, code): NCCL's codes are not CUDA's.
    let mut codes: BTreeMap<(bool, i32), u64> = BTreeMap::new();
    for c in &cuda.calls {
        // A query's "not ready" is an answer, not a failure.
        let answer = |rc: i32| rc == 0 || (rc == tracer_common::cuda::api::NOT_READY && c.not_ready.is_some());
        for (rc, n) in c.return_codes.iter().filter(|(rc, _)| !answer(**rc)) {
            let total = codes.entry((c.api.starts_with("nccl"), *rc)).or_default();
            *total = total.saturating_add(*n);
        }
    }
    if !codes.is_empty() {
        let list: Vec<String> = codes
            .iter()
            .map(|((nccl, rc), n)| format!("{n} x {rc} {}", if *nccl { nccl_error_name(*rc) } else { error_name(*rc) }))
            .collect();
        let _ = writeln!(out, "\nfailed calls: {}", list.join(", "));
    }
}

/// NCCL calls by API, communicator and site, with the host waits that
/// covered them; then the syncs that waited for collectives.
fn collectives_section(out: &mut String, cuda: &CudaReport) {
    if !cuda.collectives.is_empty() {
        let _ = writeln!(out, "\nNCCL calls by communicator and site (WAITED: host syncs that waited for them):");
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>7} {:>10}  {:<20} {:<16} SITE",
            "CALLS", "BYTES", "TIME", "ERRORS", "WAITED", "API", "COMM"
        );
        for c in cuda.collectives.iter().take(MAX_ROWS) {
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>7} {:>10}  {:<20} {:<16} {}",
                c.count,
                fmt_bytes(c.bytes),
                fmt_ns(c.total_ns),
                c.errors,
                c.host_wait_ns.map_or_else(|| "-".to_owned(), fmt_ns),
                printable(&c.api),
                printable(&c.comm),
                short_site(&c.site)
            );
        }
        more(out, cuda.collectives.len());
    }
    let waits: Vec<&CudaCall> =
        cuda.calls.iter().filter(|c| c.class() != CallClass::Collective && c.collective_waits.unwrap_or(0) > 0).collect();
    if waits.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nHost waits on NCCL collectives by site (syncs and polling that covered a queued collective):");
    let _ = writeln!(out, "  {:>8} {:>10} {:>10}  {:<28} SITE", "WAITS", "WAITED", "SYNC TIME", "API");
    for c in waits.iter().take(MAX_ROWS) {
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10}  {:<28} {}",
            c.collective_waits.unwrap_or(0),
            fmt_ns(c.collective_wait_ns.unwrap_or(0)),
            fmt_ns(c.poll_ns.unwrap_or(c.total_ns)),
            printable(&c.api),
            short_site(&c.site)
        );
    }
    more(out, waits.len());
}

/// Graph launches by graph and site, and the captures by site.
fn graphs_section(out: &mut String, cuda: &CudaReport) {
    if !cuda.graph_launches.is_empty() {
        let total = saturating_sum(cuda.graph_launches.iter().map(|l| l.count));
        let _ = writeln!(out, "\nCUDA graph launches by graph and site ({total} in all):");
        let _ = writeln!(out, "  {:>8}  {:<48} SITE", "CALLS", "GRAPH");
        for l in cuda.graph_launches.iter().take(MAX_ROWS) {
            let _ = writeln!(out, "  {:>8}  {:<48} {}", l.count, printable(&l.graph), short_site(&l.site));
        }
        more(out, cuda.graph_launches.len());
    }
    if !cuda.graph_captures.is_empty() {
        let _ = writeln!(out, "\nCUDA graph captures by site (launches and copies recorded, not run):");
        let _ = writeln!(out, "  {:>8} {:>8} {:>8} {:>10}  SITE", "CAPTURES", "KERNELS", "COPIES", "TIME");
        for c in cuda.graph_captures.iter().take(MAX_ROWS) {
            let _ = writeln!(out, "  {:>8} {:>8} {:>8} {:>10}  {}", c.captures, c.kernels, c.copies, fmt_ns(c.capture_ns), short_site(&c.site));
        }
        more(out, cuda.graph_captures.len());
    }
}

/// What `--max-overhead` did to the launch counts, in one line.
fn launch_sampling_line(s: &crate::recording::cuda::LaunchSampling) -> String {
    let share = if s.span_ns > 0 { 100.0 * s.probed_ns as f64 / s.span_ns as f64 } else { 100.0 };
    let mut line = if s.estimated {
        format!(
            "ESTIMATES (--max-overhead {}%): launches counted {share:.1}% of the time in {} slices ({} seen; \
             probes {:.0}% of a thread's time while on, {:.1} us per launch), extrapolated per thread at its \
             untraced rate (~ marks them)",
            s.budget_percent,
            s.slices,
            s.sampled_launches,
            100.0 * s.probe_share,
            s.per_launch_ns / 1000.0
        )
    } else {
        format!("exact (--max-overhead {}%): the launch probes stayed within the budget, on all the time", s.budget_percent)
    };
    for e in &s.errors {
        line.push_str(&format!("; {}", printable(e)));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::cuda::{CudaLaunch, Finding};
    use crate::report::text::nvml::tests::gpu;

    #[test]
    fn renders_findings_first() {
        let site = Site { function: "step".into(), file: Some("/srv/app/model.py".into()), line: Some(42) };
        let report = CudaReport {
            calls: vec![CudaCall {
                pid: 7,
                api: "cudaMemcpyAsync".into(),
                kind: Some("HtoD".into()),
                class: None,
                count: 100,
                bytes: 409_600,
                total_ns: 2_000_000,
                errors: 0,
                site: site.clone(),
                return_codes: BTreeMap::from([(0, 100)]),
                pinned: Some(0),
                pageable: Some(100),
                events_lost: 0,
                not_ready: None,
                poll_waits: None,
                poll_ns: None,
                collective_waits: None,
                collective_wait_ns: None,
            }],
            launches: vec![CudaLaunch { pid: 7, kernel: "k".into(), count: 5, site: site.clone(), api: "cudaLaunchKernel".into(), estimated: false, sampled: None }],
            findings: vec![Finding {
                kind: "small_htod_copies".into(),
                severity: "medium".into(),
                pid: 7,
                site,
                count: 100,
                bytes: 409_600,
                time_ns: 2_000_000,
                message: Some("m".into()),
                advice: Some("a".into()),
                ..Default::default()
            }],
            window_ns: 100_000_000,
            ..Default::default()
        };
        let mut s = String::new();
        render(&mut s, &report, &crate::report::text::view::View::verbose());
        let f = s.find("small_htod_copies at step (/srv/app/model.py:42)").expect(&s);
        let c = s.find("copies by site").expect(&s);
        assert!(f < c, "{s}");
        assert!(s.contains("0.20") && s.contains("2.0%") && s.contains("0/100") && s.contains("step (model.py:42)"), "{s}");
        assert!(s.contains("kernel launches by kernel and site (5 in all)"), "{s}");
        let mut empty = String::new();
        render(&mut empty, &CudaReport::default(), &crate::report::text::view::View::verbose());
        assert!(empty.is_empty());
    }

    #[test]
    fn renders_gpus_beside_copies() {
        let site = Site { function: "step".into(), file: Some("m.py".into()), line: Some(3) };
        let copy = |kind: &str, bytes: u64, ns: u64| CudaCall {
            pid: 7,
            api: "cudaMemcpyAsync".into(),
            kind: Some(kind.into()),
            class: None,
            count: 10,
            bytes,
            total_ns: ns,
            errors: 0,
            site: site.clone(),
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
        render(&mut s, &report, &crate::report::text::view::View::verbose());
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
        render(&mut s, &only, &crate::report::text::view::View::verbose());
        assert!(s.starts_with("\n== GPU utilization (no CUDA runtime probed in the targets)"), "{s}");
        assert!(!s.contains("findings") && !s.contains("copied by the targets") && !s.contains("no host<->device copies"), "{s}");
        assert!(s.contains("81 / 81 / 81"), "{s}");
        // Copies that all failed moved nothing: said so.
        let mut failed = report.clone();
        for c in &mut failed.calls {
            c.errors = c.count;
        }
        let mut s = String::new();
        render(&mut s, &failed, &crate::report::text::view::View::verbose());
        assert!(s.contains("host<->device copies traced in the targets: 20, all failed (no data moved)"), "{s}");
        for line in s.lines().filter(|l| l.trim_start().starts_with('0') || l.trim_start().starts_with('1')) {
            assert!(line.len() < 160, "line too long: {line:?}");
        }
    }
}
