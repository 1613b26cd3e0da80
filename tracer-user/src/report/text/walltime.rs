//! The wall-time sections of the text report: per-process and per-thread
//! breakdowns of wall time (with a bar), the top on-CPU, GIL-wait, off-CPU
//! (per reason) and slow-syscall stacks ([`render`]), and the run-queue
//! delay histograms ([`render_runqueue`]). The text report shows them only
//! when the recording has per-thread times.

use std::{collections::BTreeMap, fmt::Write as _};

use super::view::View;
use crate::{
    recording::{Frame, FrameKind, OffCpuReason, Recording, StackKind, ThreadTimes},
    report::{
        fmt::{bar_cells, fmt_duration, fmt_share, histogram_rows, printable, saturating_sum},
        rows::stack_weight,
    },
};

const BAR: usize = 50;

/// One-letter legend used in the bars.
pub const LEGEND: &str = "# on-CPU  s syscall(on-CPU)  r run-queue  g GIL  i io  l lock  p poll  z sleep  m memory  o other";

/// The parts of a thread's wall time in bar order, each with its letter of
/// [`LEGEND`] (also `infertrace top`'s bars).
pub fn parts(t: &ThreadTimes) -> [(char, u64); 10] {
    [
        ('#', t.on_cpu_ns.saturating_sub(t.syscall_ns)),
        ('s', t.syscall_ns.min(t.on_cpu_ns)),
        ('r', t.runqueue_ns),
        ('g', t.off_cpu.gil_ns),
        ('i', t.off_cpu.io_ns),
        ('l', t.off_cpu.lock_ns),
        ('p', t.off_cpu.poll_ns),
        ('z', t.off_cpu.sleep_ns),
        ('m', t.off_cpu.memory_ns),
        ('o', t.off_cpu.other_ns),
    ]
}

/// How far the parts of a row may exceed its wall time before the row is
/// flagged (the accounting's documented tolerance, docs/wall-time.md).
const OVER_TOLERANCE: f64 = 0.02;

/// Whether the parts of `t` exceed its wall time beyond the tolerance (an
/// inconsistent or edited recording): its row is marked `!`.
fn exceeds_wall(t: &ThreadTimes) -> bool {
    // In u128: parts that each saturated at u64::MAX still add up past it.
    let parts: u128 = parts(t).iter().map(|(_, ns)| u128::from(*ns)).sum();
    let wall = u128::from(t.wall_ns);
    parts > wall && (parts - wall) as f64 > OVER_TOLERANCE * wall as f64
}

/// The cells of a bar `width` wide that each part of `t` fills, in
/// [`parts`] order: each part's cells come from the running total, so
/// rounding never adds up past the bar, and parts beyond the wall time are
/// cut off (also the HTML page's bars).
pub fn part_cells(t: &ThreadTimes, width: usize) -> [usize; 10] {
    let (mut total, mut drawn) = (0u64, 0usize);
    parts(t).map(|(_, ns)| {
        total = total.saturating_add(ns);
        let upto = bar_cells(total, t.wall_ns, width);
        let cells = upto.saturating_sub(drawn);
        drawn = drawn.max(upto);
        cells
    })
}

/// The parts of `t` as a bar of exactly [`BAR`] cells ([`part_cells`]).
fn bar(t: &ThreadTimes) -> String {
    let mut s = String::with_capacity(BAR);
    for ((c, _), n) in parts(t).iter().zip(part_cells(t, BAR)) {
        s.extend(std::iter::repeat_n(*c, n));
    }
    s.extend(std::iter::repeat_n(' ', BAR.saturating_sub(s.len())));
    s
}

fn sum(threads: &[&ThreadTimes]) -> ThreadTimes {
    let mut s = ThreadTimes::default();
    for t in threads {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut s.wall_ns, t.wall_ns);
        add(&mut s.on_cpu_ns, t.on_cpu_ns);
        add(&mut s.syscall_ns, t.syscall_ns);
        add(&mut s.runqueue_ns, t.runqueue_ns);
        add(&mut s.off_cpu.io_ns, t.off_cpu.io_ns);
        add(&mut s.off_cpu.lock_ns, t.off_cpu.lock_ns);
        add(&mut s.off_cpu.poll_ns, t.off_cpu.poll_ns);
        add(&mut s.off_cpu.sleep_ns, t.off_cpu.sleep_ns);
        add(&mut s.off_cpu.other_ns, t.off_cpu.other_ns);
        add(&mut s.off_cpu.gil_ns, t.off_cpu.gil_ns);
        add(&mut s.off_cpu.memory_ns, t.off_cpu.memory_ns);
        s.off_cpu.memory.add(&t.off_cpu.memory);
    }
    s
}

/// One row: wall time, bar, shares. Returns whether it was flagged.
fn line(out: &mut String, label: &str, t: &ThreadTimes) -> bool {
    let w = t.wall_ns;
    let over = exceeds_wall(t);
    let _ = writeln!(
        out,
        "{label:<24} {:>10} |{}|{} cpu {} (sys {}) rq {} gil {} io {} lock {} poll {} sleep {} mem {} other {}",
        fmt_duration(w),
        bar(t),
        if over { "!" } else { "" },
        fmt_share(t.on_cpu_ns, w),
        fmt_share(t.syscall_ns, w),
        fmt_share(t.runqueue_ns, w),
        fmt_share(t.off_cpu.gil_ns, w),
        fmt_share(t.off_cpu.io_ns, w),
        fmt_share(t.off_cpu.lock_ns, w),
        fmt_share(t.off_cpu.poll_ns, w),
        fmt_share(t.off_cpu.sleep_ns, w),
        fmt_share(t.off_cpu.memory_ns, w),
        fmt_share(t.off_cpu.other_ns, w),
    );
    over
}

/// Wall time per process and thread, then the top stacks of each kind
/// (of the processes and as many rows as `view` shows).
pub fn render(out: &mut String, rec: &Recording, view: &View) {
    let mut by_pid: BTreeMap<u32, Vec<&ThreadTimes>> = BTreeMap::new();
    for t in rec.threads.iter().filter(|t| view.shows(t.pid)) {
        by_pid.entry(t.pid).or_default().push(t);
    }
    let _ = writeln!(out, "\n== wall time per thread ({LEGEND})");
    let mut flagged = 0usize;
    for (pid, threads) in &by_pid {
        let comm = rec.targets.iter().find(|t| t.pid == *pid).map(|t| t.comm.as_str()).unwrap_or("?");
        flagged += usize::from(line(out, &format!("pid {pid} ({}) all", printable(comm)), &sum(threads)));
        // Compact: not the threads the verdict left out (parked, helpers);
        // the busiest (on CPU, run queue, GIL), in recorded order.
        let mut shown: Vec<&ThreadTimes> = threads.iter().copied().filter(|t| !view.is_quiet(t.pid, t.tid)).collect();
        super::view::keep_largest(&mut shown, view.limits.threads, |t| {
            t.on_cpu_ns.saturating_add(t.runqueue_ns).saturating_add(t.off_cpu.gil_ns)
        });
        for t in &shown {
            let label = if t.aggregated_threads > 0 {
                format!("  exited threads ({})", t.aggregated_threads)
            } else {
                format!("  tid {} {}", t.tid, printable(&t.comm))
            };
            flagged += usize::from(line(out, &label, t));
        }
        if threads.len() > shown.len() {
            let rest = saturating_sum(threads.iter().filter(|t| !shown.iter().any(|s| std::ptr::eq(*s, **t))).map(|t| t.wall_ns));
            let quiet = threads.iter().filter(|t| view.is_quiet(t.pid, t.tid)).count();
            let why = if quiet > 0 { format!("; {quiet} parked or helper threads the verdict left out") } else { String::new() };
            let _ = writeln!(out, "  ... {} more threads ({} thread time{why})", threads.len() - shown.len(), fmt_duration(rest));
        }
    }
    if flagged > 0 {
        let _ = writeln!(
            out,
            "! {flagged} row{} whose parts exceed the wall time (inconsistent recording): bars cut at the wall time, shares capped at 100%",
            if flagged == 1 { "" } else { "s" }
        );
    }
    stacks_section(out, rec, view, StackKind::Cpu, None);
    // The waits: GIL, off-CPU by reason, slow syscalls; the largest
    // sections first where the view shows only some.
    let mut waits: Vec<(StackKind, Option<OffCpuReason>, u64)> = [
        (StackKind::Gil, None),
        (StackKind::OffCpu, Some(OffCpuReason::Io)),
        (StackKind::OffCpu, Some(OffCpuReason::Lock)),
        (StackKind::OffCpu, Some(OffCpuReason::Poll)),
        (StackKind::OffCpu, Some(OffCpuReason::Sleep)),
        (StackKind::OffCpu, Some(OffCpuReason::Other)),
        (StackKind::Syscall, None),
    ]
    .into_iter()
    // Compact: no slow-syscall stacks (the off-CPU stacks hold their waits).
    .filter(|(k, _)| view.verbose || *k != StackKind::Syscall)
    .map(|(k, r)| (k, r, saturating_sum(merged(rec, view, k, r).iter().map(|s| s.1))))
    .filter(|w| w.2 > 0)
    .collect();
    super::view::keep_largest(&mut waits, view.limits.wait_sections, |w| w.2);
    for (kind, reason, _) in waits {
        stacks_section(out, rec, view, kind, reason);
    }
}

fn frame_text(f: &Frame) -> String {
    let mut s = printable(&f.function).into_owned();
    if f.function == "[unknown]" {
        if let Some(m) = &f.module {
            s = format!("[unknown in {}]", printable(m));
        }
    }
    if let (Some(file), Some(line)) = (&f.file, f.line) {
        let base = file.rsplit('/').next().unwrap_or(file);
        s.push_str(&format!(" ({}:{line})", printable(base)));
    }
    if f.kind == FrameKind::Kernel {
        s.push_str(" [k]");
    }
    if f.module.as_deref() == Some(crate::recording::JIT_PERF_MAP_MODULE) {
        s.push_str(" [jit: perf map]");
    }
    s
}

/// Stacks merged across threads of a process (same frames).
/// (pid, function names) -> (weight, frames of the first stack seen).
type MergedStacks<'a> = BTreeMap<(u32, Vec<String>), (u64, &'a [Frame])>;

fn merged<'a>(rec: &'a Recording, view: &View, kind: StackKind, reason: Option<OffCpuReason>) -> Vec<(u32, u64, &'a [Frame])> {
    let mut m: MergedStacks<'a> = BTreeMap::new();
    // GIL stacks carry `reason: gil` (older recordings none): the kind says it all.
    for s in rec.stacks.iter().filter(|s| s.kind == kind && (kind == StackKind::Gil || s.reason == reason) && !view.is_quiet(s.pid, s.tid)) {
        // A worker group's stacks merge into its shown member's (compact).
        let Some(pid) = view.counted_as(s.pid) else { continue };
        let key = (pid, s.frames.iter().map(|f| f.function.clone()).collect());
        let e = m.entry(key).or_insert((0, &s.frames));
        e.0 = e.0.saturating_add(stack_weight(s));
    }
    let mut v: Vec<(u32, u64, &[Frame])> = m.into_iter().map(|((pid, _), (w, f))| (pid, w, f)).collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v
}

fn stacks_section(out: &mut String, rec: &Recording, view: &View, kind: StackKind, reason: Option<OffCpuReason>) {
    let stacks = merged(rec, view, kind, reason);
    let (top, depth) = (if kind == StackKind::Cpu { view.limits.cpu_stacks } else { view.limits.wait_stacks }, view.limits.depth);
    if stacks.is_empty() {
        return;
    }
    let total = saturating_sum(stacks.iter().map(|s| s.1));
    match (kind, reason) {
        (StackKind::Cpu, _) => {
            let _ = writeln!(out, "\n== top on-CPU stacks ({total} samples at {} Hz)", rec.sample_hz);
        }
        (StackKind::OffCpu, Some(r)) => {
            let _ = writeln!(out, "\n== top off-CPU stacks: {} ({} total)", r.name(), fmt_duration(total));
        }
        (StackKind::Gil, _) => {
            let _ = writeln!(out, "\n== top GIL-wait stacks ({} total)", fmt_duration(total));
        }
        (StackKind::Syscall, _) => {
            let _ = writeln!(out, "\n== slow syscalls by stack ({} total)", fmt_duration(total));
        }
        _ => {}
    }
    let floor = total as f64 * view.limits.stack_min_share;
    let shown = stacks.iter().enumerate().take(top).take_while(|(i, s)| *i == 0 || s.1 as f64 >= floor).count();
    let more = stacks.len().saturating_sub(shown);
    for (pid, w, frames) in stacks.into_iter().take(shown) {
        let amount = match kind {
            StackKind::Cpu => format!("{w} samples"),
            _ => fmt_duration(w),
        };
        let _ = writeln!(out, "{}  {amount}  {}", fmt_share(w, total), view.name(pid));
        if frames.is_empty() {
            out.push_str("         (no stack)\n");
        }
        // Compact: the kernel's part of a stack (how the thread went to
        // sleep) on one line, the frames that say why after it.
        let kernel = if view.verbose { 0 } else { frames.iter().take_while(|f| f.kind == FrameKind::Kernel).count() };
        if kernel > 1 {
            let _ = writeln!(out, "         {} .. {} [k] ({kernel} kernel frames)", printable(&frames[0].function), printable(&frames[kernel - 1].function));
        }
        let rest = &frames[if kernel > 1 { kernel } else { 0 }..];
        for f in rest.iter().take(depth) {
            let _ = writeln!(out, "         {}", frame_text(f));
        }
        if rest.len() > depth {
            let _ = writeln!(out, "         ... {} more frames", rest.len() - depth);
        }
    }
    if more > 0 && !view.verbose {
        let _ = writeln!(out, "  ... {more} more stacks (`--verbose`, or a flame graph: `--format svg`)");
    }
}

/// Run-queue delay per process: waits, total, and a log2 histogram.
pub fn render_runqueue(out: &mut String, rec: &Recording) {
    for (pid, hist) in &rec.runqueue_hist {
        let n = saturating_sum(hist.iter().copied());
        if n == 0 {
            continue;
        }
        let waited = saturating_sum(rec.threads.iter().filter(|t| t.pid == *pid).map(|t| t.runqueue_ns));
        let _ = writeln!(out, "\n== run-queue delay, pid {pid}: {n} waits, {} total", fmt_duration(waited));
        histogram_rows(out, hist);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(on: u64, sys: u64, rq: u64, io: u64) -> ThreadTimes {
        ThreadTimes {
            pid: 1,
            tid: 2,
            comm: "t".into(),
            wall_ns: on + rq + io,
            on_cpu_ns: on,
            syscall_ns: sys,
            off_cpu: crate::recording::OffCpuTimes { io_ns: io, ..Default::default() },
            runqueue_ns: rq,
            aggregated_threads: 0,
        }
    }

    #[test]
    fn gil_stacks_are_shown() {
        let mut rec = crate::recording::tests::sample();
        rec.threads = vec![thread(500, 0, 0, 500)];
        let frame = Frame { function: "wait_for_gil".into(), file: None, line: None, kind: crate::recording::FrameKind::Python, module: None };
        rec.stacks = vec![crate::recording::StackRecord {
            kind: StackKind::Gil,
            reason: Some(OffCpuReason::Gil),
            pid: 1,
            tid: 2,
            samples: 0,
            weight_ns: 7_000_000,
            syscall: None,
            frames: vec![frame],
        }];
        let mut out = String::new();
        render(&mut out, &rec, &View::verbose());
        assert!(out.contains("== top GIL-wait stacks (7.00 ms total)") && out.contains("wait_for_gil"), "{out}");
    }

    /// Issue 15: rows whose parts exceed their wall time (by a lot) render
    /// as one bounded line each, flagged, and the totals saturate.
    #[test]
    fn hostile_rows_are_clamped_and_flagged() {
        let mut rec = crate::recording::tests::sample();
        let crafted = |wall: u64, on: u64| ThreadTimes { wall_ns: wall, on_cpu_ns: on, ..thread(0, 0, 0, 0) };
        rec.threads = vec![crafted(1, 2_000_000_000), crafted(1, 200_000_000), crafted(0, u64::MAX), crafted(u64::MAX, u64::MAX), crafted(10, 5)];
        rec.threads[3].runqueue_ns = u64::MAX;
        let mut out = String::new();
        render(&mut out, &rec, &View::verbose());
        let rows: Vec<&str> = out.lines().filter(|l| l.contains(" tid ") || l.contains(" all ")).collect();
        assert_eq!(rows.len(), 6, "{out}");
        for l in &rows {
            assert!(l.len() < 300, "row too long: {l}");
            let bar = l.split('|').nth(1).unwrap_or_default();
            assert_eq!(bar.chars().count(), BAR, "{l}");
        }
        // Flagged: the four rows beyond their wall time and the process sum.
        assert_eq!(rows.iter().filter(|l| l.contains("|!")).count(), 5, "{out}");
        assert!(rows[1].contains("cpu 100.0%!"), "{out}");
        assert!(rows[5].contains("cpu  50.0% ") && !rows[5].contains('!'), "{out}");
        assert!(out.contains("! 5 rows whose parts exceed the wall time"), "{out}");
    }

    #[test]
    fn bar_is_proportional() {
        let b = bar(&thread(500, 0, 0, 500));
        assert_eq!(b.chars().filter(|c| *c == '#').count(), 25);
        assert_eq!(b.chars().filter(|c| *c == 'i').count(), 25);
        let b = bar(&thread(100, 100, 100, 0));
        assert_eq!(b.chars().filter(|c| *c == 's').count(), 25);
    }
}
