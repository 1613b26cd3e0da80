//! The text report: per process, a `strace -c -S time` style table, latency
//! histograms of the top syscalls, then totals and anything lost.

use std::fmt::Write as _;

use super::{syscall_rows, totals, SyscallRow};
use crate::recording::{Origin, Recording};

/// How many syscalls per process get a latency histogram.
const HISTOGRAMS_PER_PROCESS: usize = 3;
const BAR_WIDTH: u64 = 40;

pub fn render(rec: &Recording) -> String {
    let mut out = String::new();
    let rows = syscall_rows(rec);
    let all_rows: Vec<&SyscallRow> = rows.values().flatten().collect();
    let grand = totals(all_rows.iter().copied());
    let _ = writeln!(
        out,
        "infertrace {}: {} process{} traced for {}, {} syscalls, {} lost events",
        rec.tool_version,
        rec.targets.len(),
        if rec.targets.len() == 1 { "" } else { "es" },
        fmt_duration(rec.duration_ns),
        grand.count,
        rec.lost_events()
    );
    if let Some(cuda) = &rec.cuda {
        // Findings first: they name the bottleneck and the call site.
        super::cuda::render_text(&mut out, cuda);
    }
    for t in super::targets(rec) {
        let origin = match t.origin {
            Origin::Attached => "attached",
            Origin::Launched => "launched",
            Origin::Followed => "followed",
        };
        let exit = t.exit_code.map(|c| format!(", exit code {c}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "\n== pid {} ({}) [{}{}] {}",
            t.pid,
            t.comm,
            origin,
            exit,
            if t.cmdline.is_empty() { t.exe.clone().unwrap_or_default() } else { t.cmdline.join(" ") }
        );
        match rows.get(&t.pid) {
            Some(r) => table(&mut out, r),
            None => out.push_str("(no syscalls in the window)\n"),
        }
    }
    for t in super::targets(rec) {
        let Some(r) = rows.get(&t.pid) else { continue };
        let top: Vec<&SyscallRow> = r.iter().filter(|r| r.total_ns > 0).take(HISTOGRAMS_PER_PROCESS).collect();
        if top.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n== latency, pid {} ({}): top {} syscalls by time", t.pid, t.comm, top.len());
        for row in top {
            histogram(&mut out, row);
        }
    }
    super::walltime::render(&mut out, rec);
    let _ = writeln!(out, "\n== totals");
    let _ = writeln!(
        out,
        "{} syscalls ({} errors), {:.6} s in syscalls, window {}",
        grand.count,
        grand.errors,
        grand.total_ns as f64 / 1e9,
        fmt_duration(rec.duration_ns)
    );
    let in_flight: u64 = all_rows.iter().map(|r| r.in_flight).sum();
    if in_flight > 0 {
        let _ = writeln!(out, "{in_flight} calls were still in flight when the window closed (counted, timed to its end)");
    }
    if rec.lost_events() == 0 {
        out.push_str("lost events: 0\n");
    } else {
        let detail: Vec<String> = rec.lost.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "lost events: {} ({}) -- counts above are incomplete", rec.lost_events(), detail.join(", "));
    }
    for n in &rec.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

fn table(out: &mut String, rows: &[SyscallRow]) {
    let tot = totals(rows);
    let rule = "------ ----------- ----------- --------- --------- ----------------";
    out.push_str("% time     seconds  usecs/call     calls    errors syscall\n");
    out.push_str(rule);
    out.push('\n');
    for r in rows {
        let pct = if tot.total_ns > 0 { r.total_ns as f64 * 100.0 / tot.total_ns as f64 } else { 0.0 };
        let per_call = r.total_ns.checked_div(r.count).unwrap_or(0) / 1000;
        let errors = if r.errors > 0 { r.errors.to_string() } else { String::new() };
        let _ = writeln!(
            out,
            "{:>6.2} {:>11.6} {:>11} {:>9} {:>9} {}",
            pct,
            r.total_ns as f64 / 1e9,
            per_call,
            r.count,
            errors,
            r.name
        );
    }
    out.push_str(rule);
    out.push('\n');
    let errors = if tot.errors > 0 { tot.errors.to_string() } else { String::new() };
    let per_call = tot.total_ns.checked_div(tot.count).unwrap_or(0) / 1000;
    let _ = writeln!(out, "{:>6.2} {:>11.6} {:>11} {:>9} {:>9} total", 100.0, tot.total_ns as f64 / 1e9, per_call, tot.count, errors);
    let failing: Vec<String> = rows
        .iter()
        .filter(|r| !r.errnos.is_empty())
        .map(|r| {
            let e: Vec<String> = r.errnos.iter().map(|(k, v)| format!("{k} x{v}")).collect();
            format!("{} ({})", r.name, e.join(", "))
        })
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(out, "errors: {}", failing.join("; "));
    }
}

fn histogram(out: &mut String, row: &SyscallRow) {
    let _ = writeln!(out, "{}: {} calls, avg {}, max {}", row.name, row.count, fmt_duration(row.total_ns / row.count.max(1)), fmt_duration(row.max_ns));
    histogram_rows(out, &row.hist_log2_ns);
}

/// bpftrace-style rows of a log2 ns histogram, from the first to the last
/// non-empty bucket.
pub fn histogram_rows(out: &mut String, hist: &[u64]) {
    let first = hist.iter().position(|&c| c > 0);
    let last = hist.iter().rposition(|&c| c > 0);
    let (Some(first), Some(last)) = (first, last) else { return };
    let peak = hist.iter().copied().max().unwrap_or(1).max(1);
    for (i, &c) in hist.iter().enumerate().take(last + 1).skip(first) {
        let lo = if i == 0 { 0 } else { 1u64 << i };
        let hi = 1u64 << (i + 1);
        let bar = "@".repeat(((c * BAR_WIDTH).div_ceil(peak)) as usize);
        let _ = writeln!(out, "  [{:>7}, {:>7}) {:>9} |{:<40}|", fmt_ns_short(lo), fmt_ns_short(hi), c, bar);
    }
}

/// `512ns`, `16us`, `8ms`, `2s` for power-of-two bucket edges.
fn fmt_ns_short(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}us", n / 1_000),
        n if n < 1_000_000_000 => format!("{}ms", n / 1_000_000),
        n => format!("{}s", n / 1_000_000_000),
    }
}

pub fn fmt_duration(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.1} us", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.2} ms", n as f64 / 1e6),
        n => format!("{:.3} s", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn strace_like_table() {
        let rec = crate::recording::tests::sample();
        let s = super::render(&rec);
        assert!(s.contains("% time     seconds  usecs/call     calls    errors syscall"), "{s}");
        assert!(s.contains("openat"));
        assert!(s.contains("ENOENT x3"));
        assert!(s.contains("lost events: 0"));
    }

    #[test]
    fn durations() {
        assert_eq!(super::fmt_duration(10_500_000), "10.50 ms");
        assert_eq!(super::fmt_ns_short(8_388_608), "8ms");
    }
}
