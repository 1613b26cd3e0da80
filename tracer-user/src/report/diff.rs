//! `infertrace diff BEFORE AFTER`: the verify step. Per process (matched by
//! command line), per bottleneck class, per Python site (user line) and per
//! CUDA site: before, after and the change, wall-time normalised (thread
//! time per second of window) so that recordings of different lengths
//! compare; and the check behind `--fail-if-slower PCT --metric M`
//! (docs/verdict.md, "diff").

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    fmt::{fmt_duration, printable},
    verdict::{process_times, Class},
};
use crate::recording::Recording;

/// Rows per table in the text output (the JSON has them all).
const TEXT_ROWS: usize = 12;

/// One metric in both recordings.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// What `--metric` calls it: `total`, a class (`python_compute`), a
    /// Python site (`app.py:12`) or a CUDA site (`cuda:app.py:40`).
    pub metric: String,
    /// A longer name (the function, the CUDA APIs).
    pub label: String,
    /// Milliseconds of thread time per second of window (`total`: the
    /// window length in seconds).
    pub before: f64,
    pub after: f64,
    /// `(after - before) / before` in percent; null when `before` is 0.
    pub change_pct: Option<f64>,
}

impl Change {
    fn new(metric: String, label: String, before: f64, after: f64) -> Change {
        let change_pct = (before > 0.0).then(|| (after - before) / before * 100.0);
        Change { metric, label, before, after, change_pct }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessDiff {
    /// The command line of the process before (argv joined by spaces; comm when unknown).
    pub cmdline: String,
    pub before_pid: u32,
    pub after_pid: u32,
    pub classes: Vec<Change>,
    pub python_sites: Vec<Change>,
    pub cuda_sites: Vec<Change>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub before_duration_ns: u64,
    pub after_duration_ns: u64,
    /// The window length, in seconds.
    pub total: Change,
    pub processes: Vec<ProcessDiff>,
    /// Command lines found in one recording only.
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
}

/// Per-process figures of one recording, normalised to ms per second of window.
struct Side {
    pid: u32,
    thread_ns: u64,
    classes: BTreeMap<String, (String, f64)>,
    python: BTreeMap<String, (String, f64)>,
    cuda: BTreeMap<String, (String, f64)>,
}

fn per_s(ns: u64, window_ns: u64) -> f64 {
    if window_ns == 0 {
        0.0
    } else {
        ns as f64 / 1e6 / (window_ns as f64 / 1e9)
    }
}

/// Every process of the recording, with its command line and comm, most thread time first.
fn sides(rec: &Recording) -> Vec<(Vec<String>, String, Side)> {
    let w = rec.duration_ns;
    let mut out = Vec::new();
    let mut cuda: BTreeMap<u32, BTreeMap<String, (String, u64)>> = BTreeMap::new();
    for c in rec.cuda.iter().flat_map(|c| c.calls.iter()) {
        let file = c.site.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
        let key = match c.site.line {
            Some(l) => format!("cuda:{file}:{l}"),
            None => format!("cuda:{}", c.site.function),
        };
        let e = cuda.entry(c.pid).or_default().entry(key).or_insert_with(|| (String::new(), 0));
        if !e.0.split(", ").any(|a| a == c.api) {
            if !e.0.is_empty() {
                e.0.push_str(", ");
            }
            e.0.push_str(&c.api);
        }
        e.1 = e.1.saturating_add(c.total_ns);
    }
    for (pid, t) in process_times(rec) {
        let side = Side {
            pid,
            thread_ns: t.wall_ns,
            classes: t.classes.iter().map(|(c, ns)| (c.id().to_owned(), (c.label().to_owned(), per_s(*ns, w)))).collect(),
            python: t.sites.iter().map(|(k, (s, ns))| (k.clone(), (s.function.clone(), per_s(*ns, w)))).collect(),
            cuda: cuda.remove(&pid).unwrap_or_default().into_iter().map(|(k, (apis, ns))| (k, (apis, per_s(ns, w)))).collect(),
        };
        let target = rec.targets.iter().find(|t| t.pid == pid);
        let argv = target.map(|t| t.cmdline.clone()).unwrap_or_default();
        let comm = target.map(|t| t.comm.clone()).unwrap_or_default();
        out.push((argv, comm, side));
    }
    out.sort_by(|a, b| b.2.thread_ns.cmp(&a.2.thread_ns).then(a.2.pid.cmp(&b.2.pid)));
    out
}

fn changes(b: &BTreeMap<String, (String, f64)>, a: &BTreeMap<String, (String, f64)>) -> Vec<Change> {
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut v: Vec<Change> = keys
        .into_iter()
        .map(|k| {
            let (lb, vb) = b.get(k).cloned().unwrap_or_default();
            let (la, va) = a.get(k).cloned().unwrap_or_default();
            Change::new(k.clone(), if la.is_empty() { lb } else { la }, vb, va)
        })
        .collect();
    v.sort_by(|x, y| y.before.max(y.after).total_cmp(&x.before.max(x.after)).then(x.metric.cmp(&y.metric)));
    v
}

/// Compares two recordings.
pub fn diff(before: &Recording, after: &Recording) -> Diff {
    let secs = |ns: u64| ns as f64 / 1e9;
    let mut b = sides(before);
    let mut a = sides(after);
    let mut processes = Vec::new();
    // Matched by the whole command line, then by the program and its first
    // argument (the script: `python3 serve.py` with other options), then by comm.
    type Key = fn(&(Vec<String>, String, Side)) -> Option<String>;
    let keys: [Key; 3] = [
        |x| (!x.0.is_empty()).then(|| x.0.join(" ")),
        |x| (x.0.len() >= 2).then(|| x.0[..2].join(" ")),
        |x| (!x.1.is_empty()).then(|| x.1.clone()),
    ];
    for key in keys {
        let mut i = 0;
        while i < b.len() {
            let kb = key(&b[i]);
            match kb.and_then(|k| a.iter().position(|y| key(y).as_deref() == Some(k.as_str()))) {
                Some(j) => {
                    let (argv, comm, sb) = b.remove(i);
                    let (_, _, sa) = a.remove(j);
                    processes.push(ProcessDiff {
                        cmdline: if argv.is_empty() { comm } else { argv.join(" ") },
                        before_pid: sb.pid,
                        after_pid: sa.pid,
                        classes: changes(&sb.classes, &sa.classes),
                        python_sites: changes(&sb.python, &sa.python),
                        cuda_sites: changes(&sb.cuda, &sa.cuda),
                    });
                }
                None => i += 1,
            }
        }
    }
    let name = |x: &(Vec<String>, String, Side)| if x.0.is_empty() { format!("{} (pid {})", x.1, x.2.pid) } else { x.0.join(" ") };
    let only_before = b.iter().map(name).collect();
    let only_after = a.iter().map(name).collect();
    Diff {
        before_duration_ns: before.duration_ns,
        after_duration_ns: after.duration_ns,
        total: Change::new("total".into(), "window length (s)".into(), secs(before.duration_ns), secs(after.duration_ns)),
        processes,
        only_before,
        only_after,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("no metric `{0}` in either recording")]
    Unknown(String),
}

/// The value of `metric` in both recordings: `total` (the window), a class
/// (summed over the matched processes), a Python site `file.py:LINE` or a
/// CUDA site `cuda:file.py:LINE` (summed over the matched processes).
pub fn metric(d: &Diff, metric: &str) -> Result<Change, MetricError> {
    if metric == "total" {
        return Ok(d.total.clone());
    }
    let is_class = Class::from_id(metric).is_some();
    let mut found = false;
    let (mut b, mut a, mut label) = (0.0, 0.0, String::new());
    for p in &d.processes {
        let rows = if is_class {
            &p.classes
        } else if metric.starts_with("cuda:") {
            &p.cuda_sites
        } else {
            &p.python_sites
        };
        for r in rows.iter().filter(|r| r.metric == metric) {
            found = true;
            b += r.before;
            a += r.after;
            label.clone_from(&r.label);
        }
    }
    if !found && !is_class {
        return Err(MetricError::Unknown(metric.to_owned()));
    }
    Ok(Change::new(metric.to_owned(), label, b, a))
}

fn pct(c: &Change) -> String {
    match c.change_pct {
        Some(p) => format!("{p:+.1}%"),
        None if c.after > 0.0 => "new".to_owned(),
        None => "-".to_owned(),
    }
}

fn table(out: &mut String, title: &str, rows: &[Change]) {
    let rows: Vec<&Change> = rows.iter().filter(|r| r.before >= 0.05 || r.after >= 0.05).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "  {title:<40} {:>10} {:>10} {:>9}", "before", "after", "change");
    for r in rows.iter().take(TEXT_ROWS) {
        let name = if r.label.is_empty() || r.label == r.metric { r.metric.clone() } else { format!("{} {}", r.metric, r.label) };
        let name: String = printable(&name).chars().take(40).collect();
        let _ = writeln!(out, "  {name:<40} {:>10.1} {:>10.1} {:>9}", r.before, r.after, pct(r));
    }
    if rows.len() > TEXT_ROWS {
        let _ = writeln!(out, "  ({} more in --format json)", rows.len() - TEXT_ROWS);
    }
}

/// The diff as text.
pub fn render_text(d: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "infertrace diff: window {} -> {} ({}); figures are ms of thread time per second of window",
        fmt_duration(d.before_duration_ns),
        fmt_duration(d.after_duration_ns),
        pct(&d.total)
    );
    for p in &d.processes {
        let _ = writeln!(out, "\n== pid {} -> {}: {}", p.before_pid, p.after_pid, printable(&p.cmdline));
        table(&mut out, "class", &p.classes);
        table(&mut out, "Python site (user line)", &p.python_sites);
        table(&mut out, "CUDA site", &p.cuda_sites);
    }
    for c in &d.only_before {
        let _ = writeln!(out, "only before: {}", printable(c));
    }
    for c in &d.only_after {
        let _ = writeln!(out, "only after: {}", printable(c));
    }
    out
}

/// The diff as JSON.
pub fn render_json(d: &Diff) -> String {
    let mut s = serde_json::to_string_pretty(d).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    super::fmt::printable_json(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Frame, FrameKind, StackKind, StackRecord, ThreadTimes};

    fn rec(duration_ns: u64, a_samples: u64, b_samples: u64) -> Recording {
        let mut r = crate::recording::tests::sample();
        r.duration_ns = duration_ns;
        r.sample_hz = 99;
        let total = a_samples + b_samples;
        r.threads = vec![ThreadTimes { pid: 10, tid: 10, comm: "demo".into(), wall_ns: duration_ns, on_cpu_ns: total * 10_000_000, ..Default::default() }];
        r.threads[0].off_cpu.sleep_ns = duration_ns - total * 10_000_000;
        let py = |line| Frame { function: "work".into(), file: Some("/srv/app.py".into()), line: Some(line), kind: FrameKind::Python, module: None };
        let cpu = |line, samples| StackRecord { kind: StackKind::Cpu, reason: None, pid: 10, tid: 10, samples, weight_ns: 0, syscall: None, frames: vec![py(line)] };
        r.stacks = vec![cpu(1, a_samples), cpu(2, b_samples)];
        r
    }

    #[test]
    fn normalised_per_second_and_matched_by_cmdline() {
        // Twice as long, same rate at line 1, half the rate at line 2.
        let d = diff(&rec(1_000_000_000, 20, 40), &rec(2_000_000_000, 40, 40));
        assert_eq!(d.processes.len(), 1);
        let a = metric(&d, "app.py:1").unwrap();
        assert!((a.before - 200.0).abs() < 1e-6 && (a.after - 200.0).abs() < 1e-6, "{a:?}");
        assert!(a.change_pct.unwrap().abs() < 1e-9);
        let b = metric(&d, "app.py:2").unwrap();
        assert!((b.change_pct.unwrap() + 50.0).abs() < 1e-9, "{b:?}");
        let t = metric(&d, "total").unwrap();
        assert!((t.change_pct.unwrap() - 100.0).abs() < 1e-9);
        let c = metric(&d, "python_compute").unwrap();
        assert!((c.before - 600.0).abs() < 1e-6 && (c.after - 400.0).abs() < 1e-6, "{c:?}");
        assert!(matches!(metric(&d, "nope.py:3"), Err(MetricError::Unknown(_))));
        // A class absent from both is 0 -> 0, not an error.
        assert_eq!(metric(&d, "gil").unwrap().change_pct, None);
        let text = render_text(&d);
        assert!(text.contains("app.py:2 work"), "{text}");
        assert!(text.contains("-50.0%"), "{text}");
    }
}
