//! The text report (`--format text`), assembled from one module per
//! section, in this order: a header line; the CUDA section ([`cuda`]:
//! findings first, then copies, the GPUs sampled by NVML ([`nvml`]), syncs,
//! memory calls and launches); per process a `strace -c -S time` style
//! table, then latency histograms of the top syscalls ([`syscalls`]); the
//! wall-time accounting ([`walltime`]) with the top Python functions
//! ([`python`]) and run-queue delay; then totals, lost events and notes.

pub mod cuda;
pub mod nvml;
pub mod python;
pub mod syscalls;
pub mod walltime;

use std::fmt::Write as _;

use super::{
    fmt::{fmt_duration, saturating_sum},
    rows::{syscall_rows, totals, SyscallRow},
};
use crate::recording::Recording;

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
    if let Some(c) = &rec.cuda {
        // Findings first: they name the bottleneck and the call site.
        cuda::render(&mut out, c);
    }
    syscalls::render_tables(&mut out, rec, &rows);
    syscalls::render_latency(&mut out, rec, &rows);
    // Wall-time accounting needs the scheduler's per-thread times.
    if !rec.threads.is_empty() {
        walltime::render(&mut out, rec);
        python::render(&mut out, rec);
        walltime::render_runqueue(&mut out, rec);
    }
    let _ = writeln!(out, "\n== totals");
    let _ = writeln!(
        out,
        "{} syscalls ({} errors), {:.6} s in syscalls, window {}",
        grand.count,
        grand.errors,
        grand.total_ns as f64 / 1e9,
        fmt_duration(rec.duration_ns)
    );
    let in_flight = saturating_sum(all_rows.iter().map(|r| r.in_flight));
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
}
