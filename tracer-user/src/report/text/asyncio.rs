//! The text report's asyncio section (`record --async`): per event loop
//! its busy/idle split and lag, the lines that ran on it, its tasks
//! (CPython 3.14+), and the findings (blocked loop, executor).

use std::fmt::Write as _;

use crate::{
    recording::asyncio::{AsyncFinding, AsyncLine, AsyncioReport, EventLoop},
    report::{
        findings::{async_advice, async_doing},
        fmt::{fmt_duration, printable},
    },
};

/// Lines and tasks shown per loop.
const TOP: usize = 8;

fn at(l: &AsyncLine) -> String {
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    match (&l.file, l.line) {
        (Some(f), Some(n)) => format!("{} ({}:{n})", printable(&l.function), printable(&base(f))),
        (Some(f), None) => format!("{} ({})", printable(&l.function), printable(&base(f))),
        _ => printable(&l.function).into_owned(),
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn finding(out: &mut String, f: &AsyncFinding, threshold_ns: u64) {
    let what = match f.kind.as_str() {
        "blocked_event_loop" => format!(
            "BLOCKED EVENT LOOP: {} step{} over {} at {}: {} (total {}, longest {})",
            f.count,
            if f.count == 1 { "" } else { "s" },
            fmt_duration(threshold_ns),
            at(&f.at),
            printable(&async_doing(f)),
            fmt_duration(f.total_ns),
            fmt_duration(f.max_ns)
        ),
        "executor_serialized" => format!("WORK SERIALIZED BEHIND AN EXECUTOR: at {}: {}", at(&f.at), printable(&async_doing(f))),
        other => format!("{}: at {}", printable(other), at(&f.at)),
    };
    let _ = writeln!(out, "  {what}");
    let _ = writeln!(out, "    advice: {}", printable(async_advice(f)));
}

fn one_loop(out: &mut String, l: &EventLoop, r: &AsyncioReport) {
    let name = l.thread_name.as_deref().map(|n| format!(" ({})", printable(n))).unwrap_or_default();
    let _ = writeln!(out, "\n== asyncio event loop: pid {} thread {}{name}", l.pid, l.tid);
    let _ = writeln!(
        out,
        "wall {}, {} iterations: busy {} ({:.1}%: on CPU {}, run queue {}, blocked in syscalls {}), idle {} ({:.1}%)",
        fmt_duration(l.wall_ns),
        l.iterations,
        fmt_duration(l.busy_ns),
        pct(l.busy_ns, l.wall_ns),
        fmt_duration(l.busy_on_cpu_ns),
        fmt_duration(l.busy_runqueue_ns),
        fmt_duration(l.busy_blocked_ns),
        fmt_duration(l.idle_ns),
        pct(l.idle_ns, l.wall_ns),
    );
    let _ = writeln!(
        out,
        "lag (how long ready work waits for the loop): mean {}, p99 {}, max {}",
        fmt_duration(l.lag_mean_ns),
        fmt_duration(l.lag_p99_ns),
        fmt_duration(l.lag_max_ns)
    );
    for f in r.findings.iter().filter(|f| f.pid == l.pid && f.tid == l.tid) {
        finding(out, f, r.blocked_threshold_ns);
    }
    if l.long_steps_unsampled > 0 {
        let _ = writeln!(
            out,
            "  {} step{} over {} not sampled (before the loop was found): line unknown",
            l.long_steps_unsampled,
            if l.long_steps_unsampled == 1 { "" } else { "s" },
            fmt_duration(r.blocked_threshold_ns)
        );
    }
    if !l.lines.is_empty() {
        let _ = writeln!(out, "busy time by line (from {} stack samples):", l.lines.iter().map(|x| x.samples).sum::<u64>());
        for x in l.lines.iter().take(TOP) {
            let beneath = x.beneath.as_ref().map(|b| format!("  <- {}", at(b))).unwrap_or_default();
            let _ = writeln!(out, "  {:>10} {:5.1}%  {}{beneath}", fmt_duration(x.ns), pct(x.ns, l.busy_ns), at(&x.at));
        }
    }
    if l.tasks.is_empty() {
        if let Some(why) = &l.tasks_unavailable {
            let _ = writeln!(out, "tasks: {}", printable(why));
        }
        return;
    }
    let _ = writeln!(out, "tasks ({}): wall = running + awaiting + ready", l.tasks.len());
    for t in l.tasks.iter().take(TOP) {
        let _ = writeln!(
            out,
            "  {} {}: wall {}, running {}, awaiting {}, ready {}",
            printable(&t.name),
            t.coroutine.as_deref().map(printable).unwrap_or_default(),
            fmt_duration(t.wall_ns),
            fmt_duration(t.running_ns),
            fmt_duration(t.awaiting_ns),
            fmt_duration(t.ready_ns)
        );
        for a in t.awaiting.iter().take(3) {
            let _ = writeln!(out, "      awaiting {:>10} at {} ({})", fmt_duration(a.ns), at(&a.at), a.awaits.name());
        }
    }
    // Awaiting time of all tasks by line.
    let mut by_line: Vec<(String, &'static str, u64)> = Vec::new();
    for t in &l.tasks {
        for a in &t.awaiting {
            let k = at(&a.at);
            match by_line.iter_mut().find(|x| x.0 == k && x.1 == a.awaits.name()) {
                Some(x) => x.2 += a.ns,
                None => by_line.push((k, a.awaits.name(), a.ns)),
            }
        }
    }
    by_line.sort_by_key(|b| std::cmp::Reverse(b.2));
    if !by_line.is_empty() {
        let _ = writeln!(out, "task time awaiting, by await line:");
        for (k, kind, ns) in by_line.iter().take(TOP) {
            let _ = writeln!(out, "  {:>10}  {k} ({kind})", fmt_duration(*ns));
        }
    }
}

pub fn render(out: &mut String, r: &AsyncioReport) {
    for l in &r.loops {
        one_loop(out, l, r);
    }
}
