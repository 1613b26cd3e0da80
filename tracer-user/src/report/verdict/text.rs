//! The verdict as text: a few lines per process, the first thing the text
//! report shows. No terminal assumption (plain lines, names escaped), so
//! `top` can draw it too.

use std::fmt::Write as _;

use super::{Bottleneck, ClassShare, ProcessVerdict, Verdict};
use crate::report::fmt::{fmt_duration, printable};

/// Classes below this share are left out of the one-line class list.
const LIST_MIN_SHARE: f64 = 0.01;

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// `at consume (app.py:20) <- Condition.wait (threading.py:327)`.
fn at(b: &Bottleneck) -> String {
    match &b.site {
        Some(s) => {
            let mut t = format!(" at {}", printable(&s.site.short()));
            if let Some(under) = &s.beneath {
                let _ = write!(t, " <- {}", printable(&under.short()));
            }
            if s.site.kind == "python" && !s.site.user_code {
                t.push_str(" (no user-code frame)");
            }
            t
        }
        None => String::new(),
    }
}

/// `native compute 99.7% [libonnxruntime.so]`: a class, its share, and
/// for native compute the libraries it ran in.
fn named(class: super::Class, share: f64, classes: &[ClassShare]) -> String {
    let libs: Vec<String> = classes
        .iter()
        .find(|c| c.class == class)
        .map(|c| c.libraries.iter().take(2).map(|l| printable(&l.library).into_owned()).collect())
        .unwrap_or_default();
    if libs.is_empty() {
        format!("{} {}", class.label(), pct(share))
    } else {
        format!("{} {} [{}]", class.label(), pct(share), libs.join(", "))
    }
}

/// `GPU synchronisation 62.3%` or `too close to call: A 48.0% / B 46.5%`.
fn headline(b: &Bottleneck, classes: &[ClassShare]) -> String {
    if b.too_close_with.is_empty() {
        return named(b.class, b.share, classes);
    }
    let mut parts = vec![named(b.class, b.share, classes)];
    for c in &b.too_close_with {
        if let Some(s) = classes.iter().find(|s| s.class == *c) {
            parts.push(named(*c, s.share, classes));
        }
    }
    format!("too close to call: {}", parts.join(" / "))
}

fn class_list(classes: &[ClassShare]) -> String {
    classes
        .iter()
        .filter(|c| c.share >= LIST_MIN_SHARE)
        .map(|c| named(c.class, c.share, classes))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `pid 4242 python3 app.py` or, for a group of worker processes,
/// `pids 4250, 4251 (2 worker processes of pid 4242) python3 app.py`.
pub(crate) fn who(p: &ProcessVerdict) -> String {
    let cmd = if p.cmdline.is_empty() { p.comm.clone() } else { p.cmdline.join(" ") };
    if p.pids.len() < 2 {
        return format!("pid {} {}", p.pid, printable(&cmd));
    }
    let mut named: Vec<String> = p.pids.iter().take(6).map(u32::to_string).collect();
    if p.pids.len() > 6 {
        named.push("...".to_owned());
    }
    let parent = p.ppid.map(|pp| format!(" of pid {pp}")).unwrap_or_default();
    format!("pids {} ({} worker processes{parent}) {}", named.join(", "), p.pids.len(), printable(&cmd))
}

/// ` for DataLoader workers 5753, 5754`, or `; GIL held by thread 12
/// in a native call ...`.
fn waits_for(b: &Bottleneck) -> String {
    if let Some(p) = &b.producers {
        return format!(" for {}", p.who());
    }
    match b.gil_holders.first() {
        Some(h) => format!("; GIL held by thread {} {}", h.holder_tid, h.what()),
        None => String::new(),
    }
}

pub(crate) fn render_process(p: &ProcessVerdict, out: &mut String) {
    let Some(b) = &p.bottleneck else {
        let _ = writeln!(out, "{}: no thread time recorded", who(p));
        return;
    };
    let _ = writeln!(
        out,
        "{}: bottleneck {}{}{} (of {} thread time)",
        who(p),
        headline(b, &p.classes),
        at(b),
        waits_for(b),
        fmt_duration(p.wall_ns)
    );
    if let Some(pr) = &b.producers {
        let at = pr.site.as_ref().map(|s| format!(" at {}", printable(&s.site.short()))).unwrap_or_default();
        let _ = writeln!(
            out,
            "  producers: {}, which are {}{at}: {} {} of their thread time, busy {}, run queue {}",
            pr.who(),
            pr.bound(),
            pr.bound_by.label(),
            pct(pr.bound_share),
            pct(pr.busy_share),
            pct(pr.starved_share)
        );
    }
    let busy: Vec<String> = p.threads.iter().filter(|t| t.pool.as_ref().is_some_and(|x| x.busy_waiting)).map(|t| t.tid.to_string()).collect();
    if !busy.is_empty() {
        let _ = writeln!(out, "  busy-waiting native worker pool: thread{} {} spin{} while the Python threads feeding {} idle", if busy.len() == 1 { "" } else { "s" }, busy.join(", "), if busy.len() == 1 { "s" } else { "" }, if busy.len() == 1 { "it are" } else { "them are" });
    }
    let _ = writeln!(out, "  advice: {}", b.advice);
    for h in &b.gil_holders {
        let at = h.site.as_ref().map(|s| format!(" at {}", printable(&s.short()))).unwrap_or_default();
        let _ = writeln!(out, "  GIL held by thread {} {}: {} of the GIL waits, {}{at}", h.holder_tid, printable(&h.holder_comm), pct(h.share), h.what());
    }
    for f in &b.findings {
        let what = if f.kind.starts_with("gil_") { "finding" } else { "CUDA finding" };
        let _ = writeln!(out, "  {what} {} ({}) at {}: {}", printable(&f.kind), printable(&f.severity), printable(&f.site), printable(&f.advice));
    }
    let _ = writeln!(out, "  classes: {}", class_list(&p.classes));
    for m in &p.memory {
        memory_line(m, out);
    }
    if let Some(k) = &p.parked {
        left_out(out, k, "parked native", "no Python frame", super::parked::PARKED_MAX_BUSY_SHARE, "");
    }
    if let Some(k) = &p.helpers {
        left_out(out, k, "helper", "no user-code frame", super::parked::HELPER_MAX_BUSY_SHARE, ": queue feeders, library helpers");
    }
    if p.threads.len() > 1 || p.threads.first().is_some_and(|t| t.tid != p.pid) {
        for t in &p.threads {
            let Some(tb) = &t.bottleneck else { continue };
            let pool = t.pool.as_ref().map(pool_note).unwrap_or_default();
            let _ = writeln!(out, "  thread {} {}: {}{}{}{pool}", t.tid, printable(&t.comm), headline(tb, &t.classes), at(tb), waits_for(tb));
        }
    }
}

/// `left out: 2 helper threads (1.9 s thread time; no user-code frame, busy under 20% of its life...)`.
fn left_out(out: &mut String, k: &super::parked::Parked, what: &str, rule: &str, max_busy: f64, examples: &str) {
    let _ = writeln!(
        out,
        "  left out: {} {what} thread{} ({} thread time; {rule}, busy under {:.0}% of its life{examples})",
        k.threads,
        if k.threads == 1 { "" } else { "s" },
        fmt_duration(k.wall_ns),
        max_busy * 100.0
    );
}

/// One memory class of a process, and its advice.
fn memory_line(m: &super::memory::MemoryVerdict, out: &mut String) {
    use crate::report::fmt::fmt_bytes;
    let at = m.site.as_ref().map(|s| format!(" at {}", printable(&s.short()))).unwrap_or_default();
    let limit = match (m.limit_bytes, &m.limit_file) {
        (Some(b), Some(f)) => format!(", limit {} ({})", fmt_bytes(b), printable(f)),
        _ => String::new(),
    };
    let what = match m.class.as_str() {
        "oom_killed" => format!(
            "OOM-KILLED {} into the window, resident {}{limit}; grown most{at}",
            fmt_duration(m.at_ns.unwrap_or(0)),
            fmt_bytes(m.rss_bytes.unwrap_or(0))
        ),
        "near_memory_limit" => format!("near its memory limit: peak {}{limit}; grown most{at}", fmt_bytes(m.rss_bytes.unwrap_or(0))),
        _ => format!(
            "memory growth: resident memory grew {} ({}/s, steady: R² {:.2}){at}",
            fmt_bytes(m.grown_bytes.unwrap_or(0)),
            fmt_bytes(m.growth_bytes_per_s.unwrap_or(0.0).max(0.0) as u64),
            m.fit.unwrap_or(0.0)
        ),
    };
    let _ = writeln!(out, "  {what}");
    let _ = writeln!(out, "  memory advice: {}", printable(&m.advice));
}

/// `; native worker pool, busy-waiting (runnable 99.7% of its life, ...)`.
fn pool_note(p: &super::pools::PoolThread) -> String {
    let how = if p.busy_waiting { "busy-waiting" } else { "not busy-waiting" };
    format!(
        "; native worker pool, {how} (runnable {} of its life, {} of samples spinning, feeders idle {}; charged by {})",
        pct(p.runnable_share),
        pct(p.spin_sample_share),
        pct(p.feeder_idle_share),
        printable(&p.charged_by)
    )
}

/// Appends the verdict: `== verdict`, then per process its bottleneck,
/// advice, linked CUDA findings, class shares and threads (of the
/// processes with at least [`super::PROCESS_MIN_SHARE`] of the first's
/// thread time).
pub fn render_text(v: &Verdict, out: &mut String) {
    render_text_above(v, out, super::PROCESS_MIN_SHARE);
}

/// [`render_text`] of the processes with at least `min_share` of the
/// first's thread time (the compact text report's is higher).
pub fn render_text_above(v: &Verdict, out: &mut String, min_share: f64) {
    let _ = writeln!(out, "\n== verdict (docs/verdict.md)");
    for p in rows(v, min_share) {
        match p {
            Row::Shown(p) => render_process(p, out),
            Row::Small(n) => {
                let _ = writeln!(
                    out,
                    "({n} more process{} with under {}% of the thread time of the first: in the JSON report)",
                    if n == 1 { "" } else { "es" },
                    min_share * 100.0
                );
            }
        }
    }
    for n in &v.notes {
        let _ = writeln!(out, "verdict note: {}", printable(n));
    }
}

/// The processes the verdict shows at `min_share` (worker groups after
/// their parent), and how many smaller ones it leaves out.
pub(crate) fn shown(v: &Verdict, min_share: f64) -> (Vec<&ProcessVerdict>, usize) {
    let mut out = Vec::new();
    let mut small = 0;
    for r in rows(v, min_share) {
        match r {
            Row::Shown(p) => out.push(p),
            Row::Small(n) => small += n,
        }
    }
    (out, small)
}

enum Row<'a> {
    Shown(&'a ProcessVerdict),
    /// How many rows were too small to show.
    Small(usize),
}

/// The rows of the text verdict: processes, with worker groups shown
/// instead of their members, each group right after its parent; rows
/// under `min_share` of the first counted, not shown.
fn rows(v: &Verdict, min_share: f64) -> Vec<Row<'_>> {
    let grouped: std::collections::BTreeSet<u32> = v.groups.iter().flat_map(|g| g.pids.iter().copied()).collect();
    let mut all: Vec<&ProcessVerdict> = v.processes.iter().filter(|p| !grouped.contains(&p.pid)).chain(v.groups.iter()).collect();
    all.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then(a.pid.cmp(&b.pid)));
    let top = all.first().map(|p| p.wall_ns).unwrap_or(0);
    let shown = |p: &ProcessVerdict| p.wall_ns as f64 >= top as f64 * min_share;
    // Groups follow their parent when it is shown.
    let parents: std::collections::BTreeSet<u32> = all.iter().filter(|p| p.pids.len() < 2 && shown(p)).map(|p| p.pid).collect();
    let follows = |g: &ProcessVerdict| g.pids.len() >= 2 && shown(g) && g.ppid.is_some_and(|pp| parents.contains(&pp));
    let mut out = Vec::new();
    let mut small = 0;
    for p in all.iter().copied().filter(|p| !follows(p)) {
        if !shown(p) {
            small += 1;
            continue;
        }
        out.push(Row::Shown(p));
        for g in all.iter().copied().filter(|g| follows(g) && g.ppid == Some(p.pid)) {
            out.push(Row::Shown(g));
        }
    }
    if small > 0 {
        out.push(Row::Small(small));
    }
    out
}
