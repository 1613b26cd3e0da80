//! The Python section of the text report: the top Python functions (self
//! time at each stack's Python leaf, with its hottest line) ranked by
//! on-CPU samples, by GIL wait, and by off-CPU time per reason.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    recording::{Frame, FrameKind, OffCpuReason, Recording, StackKind, StackRecord},
    report::{
        fmt::{fmt_duration, fmt_share, printable},
        rows::stack_weight,
    },
};

/// How many Python functions each ranking shows.
const TOP_FUNCTIONS: usize = 10;

/// The Python function a stack's time belongs to: its Python leaf.
fn python_leaf(s: &StackRecord) -> Option<&Frame> {
    s.frames.iter().find(|f| f.kind == FrameKind::Python)
}

/// Top Python functions (self time at the Python leaf) by on-CPU samples,
/// GIL wait and off-CPU time per reason.
pub fn render(out: &mut String, rec: &Recording) {
    let rankings: [(&str, StackKind, Option<OffCpuReason>); 7] = [
        ("on-CPU", StackKind::Cpu, None),
        ("GIL wait", StackKind::Gil, Some(OffCpuReason::Gil)),
        ("off-CPU io", StackKind::OffCpu, Some(OffCpuReason::Io)),
        ("off-CPU lock", StackKind::OffCpu, Some(OffCpuReason::Lock)),
        ("off-CPU poll", StackKind::OffCpu, Some(OffCpuReason::Poll)),
        ("off-CPU sleep", StackKind::OffCpu, Some(OffCpuReason::Sleep)),
        ("off-CPU other", StackKind::OffCpu, Some(OffCpuReason::Other)),
    ];
    for (title, kind, reason) in rankings {
        // (function, file) -> (weight, weight per line)
        let mut by_fn: BTreeMap<(String, String), (u64, BTreeMap<u32, u64>)> = BTreeMap::new();
        let mut total = 0u64;
        for s in rec.stacks.iter().filter(|s| s.kind == kind && (kind == StackKind::Cpu || s.reason == reason)) {
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
            .map(|((function, file), (w, lines))| {
                let hot = lines.iter().max_by_key(|(_, w)| **w).map(|(l, _)| *l).unwrap_or(0);
                (format!("{} ({}:{hot})", printable(&function), printable(&file)), w)
            })
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let _ = writeln!(out, "\n== top Python functions by {title}");
        for (name, w) in ranked.into_iter().take(TOP_FUNCTIONS) {
            let amount = if kind == StackKind::Cpu { format!("{w} samples") } else { fmt_duration(w) };
            let _ = writeln!(out, "{}  {amount:>12}  {name}", fmt_share(w, total));
        }
    }
}
