//! The tracer's own cost (`tracer_overhead`): one line per target, one for
//! the tracer process and the calibrated per-hit costs.

use std::fmt::Write as _;

use crate::{
    recording::overhead::TracerOverhead,
    report::fmt::{fmt_bytes, fmt_duration, printable},
};

/// The tracer's cost: the `shown` targets with the most estimated added
/// time one per line, the rest summed.
pub fn render(out: &mut String, o: &TracerOverhead, shown: usize) {
    let mut targets: Vec<_> = o.targets.iter().collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.estimated_added_ns));
    let rest = targets.split_off(targets.len().min(shown));
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
        "tracer overhead: infertrace itself {} CPU ({} user, {} system), {} peak memory; per hit: uprobe {}, uretprobe {}, syscall tracepoints {} ({})",
        fmt_duration(o.tracer.cpu_user_ns.saturating_add(o.tracer.cpu_system_ns)),
        fmt_duration(o.tracer.cpu_user_ns),
        fmt_duration(o.tracer.cpu_system_ns),
        fmt_bytes(o.tracer.peak_rss_bytes),
        fmt_duration(c.uprobe_ns as u64),
        fmt_duration(c.uretprobe_ns as u64),
        fmt_duration(c.syscall_tracepoints_ns as u64),
        if c.cached { "calibrated here on this boot, kept" } else { "calibrated here" },
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::recording::overhead::{TargetOverhead, TracerOverhead};

    #[test]
    fn one_line_per_target_then_the_rest_summed() {
        let target = |pid: u32, added: u64| TargetOverhead {
            pid,
            comm: "w\x1b".into(),
            hits: BTreeMap::from([("syscalls".to_owned(), 2 * added)]),
            added_ns: BTreeMap::from([("syscalls".to_owned(), added)]),
            estimated_added_ns: added,
            wall_ns: 1_000_000,
            share_percent: added as f64 / 1e4,
            uretprobe_syscalls: if pid == 7 { 3 } else { 0 },
            uretprobe_syscall_ns: if pid == 7 { 1500 } else { 0 },
        };
        let o = TracerOverhead { targets: (1..=7).map(|p| target(p, u64::from(p) * 1000)).collect(), ..Default::default() };
        let mut out = String::new();
        super::render(&mut out, &o, 5);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7, "{out}");
        // The largest first, with its uretprobe syscalls said to be tracer time.
        assert!(lines[0].starts_with("tracer overhead: pid 7 (w\\x1b): ~7.0 us added, 0.70% of its 1.00 ms (syscalls 14000 hits 7.0 us); 3 uretprobe syscalls (1.5 us) are tracer time"), "{out}");
        assert_eq!(lines[5], "tracer overhead: 2 more processes: ~3.0 us added", "{out}");
        assert!(lines[6].starts_with("tracer overhead: infertrace itself"), "{out}");
    }
}
