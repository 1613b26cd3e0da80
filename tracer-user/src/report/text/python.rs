//! The Python section of the text report: the top Python functions (self
//! time at each stack's Python leaf, with its hottest line) ranked by
//! on-CPU samples, by GIL wait, and by off-CPU time per reason.

use std::{collections::BTreeMap, fmt::Write as _};

use super::view::View;
use crate::{
    recording::{Frame, FrameKind, OffCpuReason, Recording, StackKind, StackRecord},
    report::{
        fmt::{fmt_duration, fmt_share, printable},
        rows::stack_weight,
    },
};

/// The Python function a stack's time belongs to: its Python leaf.
fn python_leaf(s: &StackRecord) -> Option<&Frame> {
    s.frames.iter().find(|f| f.kind == FrameKind::Python)
}

/// Lines shown per function.
const TOP_LINES: usize = 3;

/// `handle (svc.py:10)` for a function whose time is at one line, else
/// `handle (svc.py) at lines 10 45%, 14 30%, 8 15%` (its hottest lines,
/// each with its share of the function's time): the function's time is
/// not all at its hottest line.
fn label(function: &str, file: &str, total: u64, lines: BTreeMap<u32, u64>) -> String {
    let mut lines: Vec<(u32, u64)> = lines.into_iter().collect();
    lines.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    match lines.as_slice() {
        [] => format!("{} ({})", printable(function), printable(file)),
        [(l, _)] => format!("{} ({}:{l})", printable(function), printable(file)),
        _ => {
            let shown: Vec<String> = lines.iter().take(TOP_LINES).map(|(l, w)| format!("{l} {}", fmt_share(*w, total).trim())).collect();
            let more = if lines.len() > TOP_LINES { format!(", {} more", lines.len() - TOP_LINES) } else { String::new() };
            format!("{} ({}) at lines {}{more}", printable(function), printable(file), shown.join(", "))
        }
    }
}

/// One ranking: its title, its stacks' kind, their total weight, and the
/// functions (label, weight), heaviest first.
type Ranking = (&'static str, StackKind, u64, Vec<(String, u64)>);

/// Top Python functions (self time at the Python leaf) by on-CPU samples,
/// GIL wait and off-CPU time per reason, of the processes `view` shows
/// (the largest rankings of waits first where it shows only some).
pub fn render(out: &mut String, rec: &Recording, view: &View) {
    let rankings: [(&'static str, StackKind, Option<OffCpuReason>); 7] = [
        ("on-CPU", StackKind::Cpu, None),
        ("GIL wait", StackKind::Gil, Some(OffCpuReason::Gil)),
        ("off-CPU io", StackKind::OffCpu, Some(OffCpuReason::Io)),
        ("off-CPU lock", StackKind::OffCpu, Some(OffCpuReason::Lock)),
        ("off-CPU poll", StackKind::OffCpu, Some(OffCpuReason::Poll)),
        ("off-CPU sleep", StackKind::OffCpu, Some(OffCpuReason::Sleep)),
        ("off-CPU other", StackKind::OffCpu, Some(OffCpuReason::Other)),
    ];
    let mut sections: Vec<Ranking> = Vec::new();
    for (title, kind, reason) in rankings {
        // (function, file) -> (weight, weight per line)
        let mut by_fn: BTreeMap<(String, String), (u64, BTreeMap<u32, u64>)> = BTreeMap::new();
        let mut total = 0u64;
        for s in rec.stacks.iter().filter(|s| s.kind == kind && (kind == StackKind::Cpu || s.reason == reason) && view.counted_as(s.pid).is_some() && !view.is_quiet(s.pid, s.tid)) {
            total = total.saturating_add(stack_weight(s));
            if let Some(f) = python_leaf(s) {
                let file = f.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
                let e = by_fn.entry((f.function.clone(), file.to_owned())).or_default();
                e.0 = e.0.saturating_add(stack_weight(s));
                let l = e.1.entry(f.line.unwrap_or(0)).or_default();
                *l = l.saturating_add(stack_weight(s));
            }
        }
        if by_fn.is_empty() {
            continue;
        }
        let mut ranked: Vec<(String, u64)> = by_fn
            .into_iter()
            .map(|((function, file), (w, lines))| (label(&function, &file, w, lines), w))
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        sections.push((title, kind, total, ranked));
    }
    // On-CPU first, then the waits (the largest where only some are shown).
    let mut waits = sections.split_off(usize::from(sections.first().is_some_and(|s| s.1 == StackKind::Cpu)));
    super::view::keep_largest(&mut waits, view.limits.wait_rankings, |s| s.2);
    sections.extend(waits);
    for (title, kind, total, ranked) in sections {
        let _ = writeln!(out, "\n== top Python functions by {title}");
        let more = ranked.len().saturating_sub(view.limits.functions);
        for (name, w) in ranked.into_iter().take(view.limits.functions) {
            let amount = if kind == StackKind::Cpu { format!("{w} samples") } else { fmt_duration(w) };
            let _ = writeln!(out, "{}  {amount:>12}  {name}", fmt_share(w, total));
        }
        if more > 0 && !view.verbose {
            let _ = writeln!(out, "  ... {more} more functions");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_labelled_with_its_lines_not_only_the_hottest() {
        assert_eq!(label("handle", "svc.py", 10, BTreeMap::from([(10, 10)])), "handle (svc.py:10)");
        let l = label("handle", "svc.py", 100, BTreeMap::from([(10, 45), (14, 30), (8, 15), (12, 10)]));
        assert!(l.starts_with("handle (svc.py) at lines 10 45"), "{l}");
        assert!(l.contains(", 14 30") && l.contains(", 8 15") && l.ends_with(", 1 more"), "{l}");
    }
}
