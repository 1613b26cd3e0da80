//! The tracer's own cost (`tracer_overhead`): one line per target, one for
//! the tracer process and the calibrated per-hit costs.

use std::fmt::Write as _;

use crate::{
    recording::overhead::TracerOverhead,
    report::fmt::{fmt_bytes, fmt_duration, printable},
};

/// Targets shown one per line, by estimated added time; the rest summed.
const SHOWN: usize = 5;

pub fn render(out: &mut String, o: &TracerOverhead) {
    let mut targets: Vec<_> = o.targets.iter().collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.estimated_added_ns));
    let rest = targets.split_off(targets.len().min(SHOWN));
    for t in targets {
        let parts: Vec<String> = t
            .hits
            .iter()
            .map(|(family, hits)| {
                format!("{family} {hits} hits {}", fmt_duration(t.added_ns.get(family).copied().unwrap_or(0)))
            })
            .collect();
        let uret = if t.uretprobe_syscalls > 0 {
            format!(
                "; {} uretprobe syscalls ({}) are tracer time, not in its table",
                t.uretprobe_syscalls,
                fmt_duration(t.uretprobe_syscall_ns)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "tracer overhead: pid {} ({}): ~{} added, {:.2}% of its {} ({}){uret}",
            t.pid,
            printable(&t.comm),
            fmt_duration(t.estimated_added_ns),
            t.share_percent,
            fmt_duration(t.wall_ns),
            if parts.is_empty() { "no probe hits".to_string() } else { parts.join(", ") },
        );
    }
    if !rest.is_empty() {
        let _ = writeln!(
            out,
            "tracer overhead: {} more processes: ~{} added",
            rest.len(),
            fmt_duration(rest.iter().map(|t| t.estimated_added_ns).fold(0, u64::saturating_add))
        );
    }
    let c = &o.calibration;
    let _ = writeln!(
        out,
        "tracer overhead: infertrace itself {} CPU ({} user, {} system), {} peak memory; per hit: uprobe {}, uretprobe {}, syscall tracepoints {} (calibrated here)",
        fmt_duration(o.tracer.cpu_user_ns.saturating_add(o.tracer.cpu_system_ns)),
        fmt_duration(o.tracer.cpu_user_ns),
        fmt_duration(o.tracer.cpu_system_ns),
        fmt_bytes(o.tracer.peak_rss_bytes),
        fmt_duration(c.uprobe_ns as u64),
        fmt_duration(c.uretprobe_ns as u64),
        fmt_duration(c.syscall_tracepoints_ns as u64),
    );
}
