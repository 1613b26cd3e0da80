//! The text report (`--format text`), assembled from one module per
//! section, in this order: a header line; the bottleneck verdict
//! (`report::verdict`, when there is scheduler data); the CUDA section ([`cuda`]:
//! findings first, then copies, the GPUs sampled by NVML ([`nvml`]), syncs,
//! memory calls and launches); per process a `strace -c -S time` style
//! table, then latency histograms of the top syscalls ([`syscalls`]); the
//! wall-time accounting ([`walltime`]) with the top Python functions
//! ([`python`]) and run-queue delay; then totals, lost events and notes.
//! [`view`] decides how much of it a rendering shows: by default the
//! busiest processes and the top rows (a short run fits on two screens),
//! with `--verbose` everything, the recording's details included.

pub mod asyncio;
pub mod cuda;
pub mod memory;
pub mod nvml;
pub mod overhead;
pub mod python;
pub mod syscalls;
pub mod view;
pub mod walltime;

use std::fmt::Write as _;

use super::{
    fmt::{fmt_duration, printable, printable_text, saturating_sum},
    rows::{syscall_rows, totals, SyscallRow},
};
use crate::{
    recording::{CutReason, Recording},
    system::local_time,
};

/// The compact text report (the default).
pub fn render(rec: &Recording) -> String {
    render_with(rec, false)
}

/// The text report, everything shown when `verbose`.
pub fn render_with(rec: &Recording, verbose: bool) -> String {
    let mut out = String::new();
    let rows = syscall_rows(rec);
    let verdict = (!rec.threads.is_empty()).then(|| super::verdict::verdict(rec));
    let view = match (&verdict, verbose) {
        (_, true) => view::View::verbose(),
        (Some(v), false) => view::View::compact(rec, &rows, &v.groups.iter().map(|g| g.pids.clone()).collect::<Vec<_>>())
            .quieten(v.processes.iter().chain(&v.groups).flat_map(|p| p.parked.iter().chain(&p.helpers)).flat_map(|l| l.tids.iter().copied())),
        (None, false) => view::View::compact(rec, &rows, &[]),
    };
    let all_rows: Vec<&SyscallRow> = rows.values().flatten().collect();
    let grand = totals(all_rows.iter().copied());
    let _ = writeln!(
        out,
        "infertrace {}: {} process{} traced for {}, {} syscalls, {} lost events",
        printable(&rec.tool_version),
        rec.targets.len(),
        if rec.targets.len() == 1 { "" } else { "es" },
        fmt_duration(rec.duration_ns),
        grand.count,
        rec.lost_events()
    );
    if let Some(cut) = &rec.cut {
        let why = match cut.reason {
            CutReason::Checkpoint => "the tracer did not finish (killed, crashed, or still running)",
        };
        let _ = writeln!(
            out,
            "CUT: this recording ends at the tracer's last checkpoint, taken {} ({} into the window): {why}; what came after is missing",
            local_time::local_time(cut.at_unix_ms),
            fmt_duration(rec.duration_ns)
        );
    }
    // The answer first: the bottleneck verdict (docs/verdict.md).
    if let Some(v) = &verdict {
        super::verdict::render_text_above(v, &mut out, view.limits.verdict_min_share);
    }
    if let Some(t) = &rec.timeline {
        out.push_str(&crate::report::timeline_summary::TimelineSummary::of(t).line());
    }
    if let Some(c) = &rec.cuda {
        // Findings first: they name the bottleneck and the call site.
        cuda::render(&mut out, c, &view);
    }
    if let Some(a) = &rec.asyncio {
        asyncio::render(&mut out, a);
    }
    if let Some(m) = &rec.memory {
        memory::render(&mut out, rec, m, &view);
    }
    syscalls::render_tables(&mut out, rec, &rows, &view);
    if view.verbose {
        syscalls::render_latency(&mut out, rec, &rows);
    }
    // Wall-time accounting needs the scheduler's per-thread times.
    if !rec.threads.is_empty() {
        walltime::render(&mut out, rec, &view);
        python::render(&mut out, rec, &view);
        if view.verbose {
            walltime::render_runqueue(&mut out, rec);
        }
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
    if let Some(o) = &rec.tracer_overhead {
        overhead::render(&mut out, o, view.limits.overhead_rows);
    }
    if rec.lost_events() == 0 {
        out.push_str("lost events: 0\n");
    } else {
        let detail: Vec<String> = rec.lost.iter().map(|(k, v)| format!("{}={v}", printable(k))).collect();
        let _ = writeln!(out, "lost events: {} ({}) -- counts above are incomplete", rec.lost_events(), detail.join(", "));
    }
    for n in rec.notes.iter().take(view.limits.notes) {
        let _ = writeln!(out, "note: {}", printable(n));
    }
    if view.verbose {
        for n in &rec.details {
            let _ = writeln!(out, "detail: {}", printable(n));
        }
    } else {
        compact_footer(&mut out, rec, &view);
    }
    // Names are escaped where they are printed; this catches any other
    // string of the recording (a file anyone can write).
    printable_text(out)
}

/// What the compact view left out, and how to see it.
fn compact_footer(out: &mut String, rec: &Recording, view: &view::View) {
    let mut left: Vec<String> = Vec::new();
    let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    if view.left_out() > 0 {
        left.push(format!("the sections of {}", plural(view.left_out(), "more process", "more processes")));
    }
    let notes = rec.notes.len().saturating_sub(view.limits.notes);
    if notes > 0 {
        left.push(plural(notes, "note", "notes"));
    }
    let details = rec.details.len() + rec.cuda.as_ref().map_or(0, |c| c.notes.iter().filter(|n| cuda::is_inventory(n)).count());
    if details > 0 {
        left.push(plural(details, "detail (what was probed when, interpreter internals)", "details (what was probed when, interpreter internals)"));
    }
    if !rec.syscalls.is_empty() {
        left.push("latency histograms".into());
    }
    if !rec.runqueue_hist.is_empty() {
        left.push("run-queue delay histograms".into());
    }
    left.push("the rows past the top of each table".into());
    let _ = writeln!(
        out,
        "(compact report: left out {}; `--verbose` shows everything, `--format json` has it all)",
        left.join(", ")
    );
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
        assert!(!s.contains("CUT"));
    }

    #[test]
    fn a_checkpoint_says_it_is_cut() {
        let mut rec = crate::recording::tests::sample();
        rec.cut = Some(crate::recording::Cut { reason: crate::recording::CutReason::Checkpoint, at_unix_ms: 1_700_000_000_000 });
        let s = super::render(&rec);
        let line = s.lines().nth(1).unwrap_or_default();
        assert!(line.starts_with("CUT: this recording ends at the tracer's last checkpoint, taken 20"), "{s}");
        assert!(line.contains("the tracer did not finish"), "{line}");
    }

    /// Every name, path and argument of a crafted recording reaches the
    /// text escaped: no control character but the line breaks, no line
    /// forged by a name.
    #[test]
    fn hostile_names_are_escaped() {
        use crate::recording::{Frame, FrameKind, StackKind, StackRecord, ThreadTimes};
        const EVIL: &str = "\x1b]0;PWNED\x07\x1b[2J\u{9b}2J\nlost events: 0\r\x7f";
        let mut rec = crate::recording::tests::sample();
        rec.tool_version = EVIL.into();
        rec.targets[0].comm = EVIL.into();
        rec.targets[0].cmdline = vec![EVIL.into(), "--flag".into()];
        rec.threads = vec![ThreadTimes {
            pid: 10,
            tid: 11,
            comm: EVIL.into(),
            wall_ns: 100,
            on_cpu_ns: 50,
            syscall_ns: 0,
            off_cpu: Default::default(),
            runqueue_ns: 0,
            aggregated_threads: 0,
        }];
        let frame = |kind| Frame { function: EVIL.into(), file: Some(format!("/srv/{EVIL}.py")), line: Some(3), kind, module: Some(EVIL.into()) };
        rec.stacks = vec![StackRecord {
            kind: StackKind::Cpu,
            reason: None,
            pid: 10,
            tid: 11,
            samples: 5,
            weight_ns: 0,
            syscall: None,
            frames: vec![frame(FrameKind::Native), frame(FrameKind::Python)],
        }];
        rec.sample_hz = 99;
        rec.lost.insert(EVIL.into(), 1);
        rec.notes = vec![EVIL.into()];
        let s = super::render(&rec);
        let bad: Vec<char> = s.chars().filter(|&c| c != '\n' && (c.is_control() || c == '\u{202e}')).collect();
        assert!(bad.is_empty(), "raw control characters {bad:?} in:\n{s}");
        assert!(!s.lines().any(|l| l.starts_with("lost events: 0")), "a name forged a line:\n{s}");
        let shown = "\\x1b]0;PWNED\\x07\\x1b[2J\\u{9b}2J\\nlost events: 0\\r\\x7f";
        for needle in [format!("(pid 10 ({shown})"), format!("{shown} --flag"), format!("tid 11 {shown}"), format!("note: {shown}")] {
            assert!(s.contains(needle.trim_start_matches('(')), "{needle:?} not in:\n{s}");
        }
    }
}
