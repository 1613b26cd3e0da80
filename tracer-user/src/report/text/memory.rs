//! The text report's resident-memory section (the memory family): per
//! process its start, end, peak and growth, its resident memory by kind at
//! the end, and the lines that grew or released it.

use std::fmt::Write as _;

use super::view::View;
use crate::{
    recording::{
        memory::{MemoryReport, ProcessMemory},
        Recording,
    },
    report::fmt::{fmt_bytes, fmt_duration, printable},
};

/// A process is shown when its peak is at least this share of the largest.
const MIN_PEAK_SHARE: f64 = 0.05;
/// Resident memory per process (of those `view` shows), with its top lines
/// of growth each.
pub fn render(out: &mut String, rec: &Recording, m: &MemoryReport, view: &View) {
    let max_lines = view.limits.memory_lines;
    let largest = m.processes.iter().map(|p| p.peak_rss).max().unwrap_or(0);
    let mut shown: Vec<&ProcessMemory> =
        m.processes.iter().filter(|p| p.peak_rss as f64 >= largest as f64 * MIN_PEAK_SHARE && view.shows(p.pid)).collect();
    shown.sort_by(|a, b| b.peak_rss.cmp(&a.peak_rss).then(a.pid.cmp(&b.pid)));
    shown.truncate(view.limits.memory_processes);
    if shown.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n== resident memory (kmem/rss_stat; a stack sampled per {} grown or released)",
        fmt_bytes(m.growth_sample_bytes)
    );
    for p in &shown {
        process(out, rec, p, max_lines);
    }
    let rest = m.processes.len() - shown.len();
    if rest > 0 {
        let _ = writeln!(out, "({rest} more process{} with smaller peaks or less thread time: `--format json` has them)", if rest == 1 { "" } else { "es" });
    }
}

fn process(out: &mut String, rec: &Recording, p: &ProcessMemory, max_lines: usize) {
    let comm = rec.targets.iter().find(|t| t.pid == p.pid).map(|t| printable(&t.comm).into_owned()).unwrap_or_default();
    let (Some(first), Some(last)) = (p.series.first(), p.series.last()) else { return };
    let hwm = p.vm_hwm.map(|h| format!(" (VmHWM {})", fmt_bytes(h))).unwrap_or_default();
    let change = if last.rss >= first.rss { format!("+{}", fmt_bytes(last.rss - first.rss)) } else { format!("-{}", fmt_bytes(first.rss - last.rss)) };
    let _ = writeln!(
        out,
        "pid {} {comm}: start {}, end {}, peak {}{hwm}; {change} over {} (slope {}/s, {} points)",
        p.pid,
        fmt_bytes(first.rss),
        fmt_bytes(last.rss),
        fmt_bytes(p.peak_rss),
        fmt_duration(last.t_ns.saturating_sub(first.t_ns)),
        signed_bytes(p.growth_bytes_per_s),
        p.series.len()
    );
    let _ = writeln!(
        out,
        "  at the end: anon {}, file {}, shmem {}, swap {}",
        fmt_bytes(last.anon),
        fmt_bytes(last.file),
        fmt_bytes(last.shmem),
        fmt_bytes(last.swap)
    );
    let mut w = crate::recording::MemoryWaits::default();
    for t in rec.threads.iter().filter(|t| t.pid == p.pid) {
        w.add(&t.off_cpu.memory);
    }
    if !w.is_zero() {
        let parts: Vec<String> = [("page faults", w.page_fault_ns), ("reclaim", w.reclaim_ns), ("compaction", w.compaction_ns), ("memory.high throttling", w.throttle_ns)]
            .into_iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|(what, ns)| format!("{what} {}", fmt_duration(ns)))
            .collect();
        let _ = writeln!(out, "  waited on memory (off CPU, all threads): {} ({})", fmt_duration(w.total()), parts.join(", "));
    }
    if let Some(l) = &p.memory_limit {
        let _ = writeln!(out, "  cgroup memory limit: {} ({}), peak at {:.0}% of it", fmt_bytes(l.bytes), printable(&l.file), 100.0 * p.peak_rss as f64 / l.bytes.max(1) as f64);
    }
    if let Some(k) = &p.oom_killed {
        let _ = writeln!(
            out,
            "  OOM-KILLED {} into the window: resident {} (anon {}, file {}, shmem {})",
            fmt_duration(k.t_ns),
            fmt_bytes(k.rss),
            fmt_bytes(k.anon),
            fmt_bytes(k.file),
            fmt_bytes(k.shmem)
        );
    }
    if p.lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "  resident growth by line:");
    let _ = writeln!(out, "  {:>11} {:>11} {:>8}  LINE", "GROWN", "RELEASED", "SAMPLES");
    let mut lines: Vec<_> = p.lines.iter().collect();
    lines.sort_by_key(|l| std::cmp::Reverse(l.grown_bytes.max(l.released_bytes)));
    for l in lines.iter().take(max_lines) {
        let beneath = l.beneath.as_ref().map(|b| format!(" <- {}", printable(&b.short()))).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:>11} {:>11} {:>8}  {}{beneath}",
            fmt_bytes(l.grown_bytes),
            fmt_bytes(l.released_bytes),
            l.samples,
            printable(&l.site.short())
        );
    }
    if lines.len() > max_lines {
        let _ = writeln!(out, "  ({} more lines)", lines.len() - max_lines);
    }
}

/// `12.0 MiB` or `-3.0 MiB`.
fn signed_bytes(v: f64) -> String {
    let b = fmt_bytes(v.abs() as u64);
    if v < 0.0 { format!("-{b}") } else { b }
}
