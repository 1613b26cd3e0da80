//! The wall-time sections of the text report: per-process and per-thread
//! breakdowns of wall time (with a bar), the top on-CPU, GIL-wait, off-CPU
//! (per reason) and slow-syscall stacks ([`render`]), and the run-queue
//! delay histograms ([`render_runqueue`]). The text report shows them only
//! when the recording has per-thread times.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    recording::{Frame, FrameKind, OffCpuReason, Recording, StackKind, ThreadTimes},
    report::{
        fmt::{fmt_duration, histogram_rows, printable},
        rows::stack_weight,
    },
};

const BAR: usize = 50;
const TOP_STACKS: usize = 5;
const STACK_DEPTH_SHOWN: usize = 12;

/// One-letter legend used in the bars.
const LEGEND: &str = "# on-CPU  s syscall(on-CPU)  r run-queue  g GIL  i io  l lock  p poll  z sleep  o other";

fn parts(t: &ThreadTimes) -> [(char, u64); 9] {
    [
        ('#', t.on_cpu_ns.saturating_sub(t.syscall_ns)),
        ('s', t.syscall_ns),
        ('r', t.runqueue_ns),
        ('g', t.off_cpu.gil_ns),
        ('i', t.off_cpu.io_ns),
        ('l', t.off_cpu.lock_ns),
        ('p', t.off_cpu.poll_ns),
        ('z', t.off_cpu.sleep_ns),
        ('o', t.off_cpu.other_ns),
    ]
}

fn bar(t: &ThreadTimes) -> String {
    let wall = t.wall_ns.max(1);
    let mut s = String::new();
    for (c, ns) in parts(t) {
        let n = ((ns as u128 * BAR as u128 + wall as u128 / 2) / wall as u128) as usize;
        s.extend(std::iter::repeat_n(c, n));
    }
    s.truncate(BAR);
    format!("{s:<BAR$}")
}

fn pct(ns: u64, wall: u64) -> String {
    format!("{:5.1}%", ns as f64 * 100.0 / wall.max(1) as f64)
}

fn sum(threads: &[&ThreadTimes]) -> ThreadTimes {
    let mut s = ThreadTimes {
        pid: 0,
        tid: 0,
        comm: String::new(),
        wall_ns: 0,
        on_cpu_ns: 0,
        syscall_ns: 0,
        off_cpu: Default::default(),
        runqueue_ns: 0,
    };
    for t in threads {
        s.wall_ns += t.wall_ns;
        s.on_cpu_ns += t.on_cpu_ns;
        s.syscall_ns += t.syscall_ns;
        s.runqueue_ns += t.runqueue_ns;
        s.off_cpu.io_ns += t.off_cpu.io_ns;
        s.off_cpu.lock_ns += t.off_cpu.lock_ns;
        s.off_cpu.poll_ns += t.off_cpu.poll_ns;
        s.off_cpu.sleep_ns += t.off_cpu.sleep_ns;
        s.off_cpu.other_ns += t.off_cpu.other_ns;
        s.off_cpu.gil_ns += t.off_cpu.gil_ns;
    }
    s
}

fn line(out: &mut String, label: &str, t: &ThreadTimes) {
    let w = t.wall_ns;
    let _ = writeln!(
        out,
        "{label:<24} {:>10} |{}| cpu {} (sys {}) rq {} gil {} io {} lock {} poll {} sleep {} other {}",
        fmt_duration(w),
        bar(t),
        pct(t.on_cpu_ns, w),
        pct(t.syscall_ns, w),
        pct(t.runqueue_ns, w),
        pct(t.off_cpu.gil_ns, w),
        pct(t.off_cpu.io_ns, w),
        pct(t.off_cpu.lock_ns, w),
        pct(t.off_cpu.poll_ns, w),
        pct(t.off_cpu.sleep_ns, w),
        pct(t.off_cpu.other_ns, w),
    );
}

/// Wall time per process and thread, then the top stacks of each kind.
pub fn render(out: &mut String, rec: &Recording) {
    let mut by_pid: BTreeMap<u32, Vec<&ThreadTimes>> = BTreeMap::new();
    for t in &rec.threads {
        by_pid.entry(t.pid).or_default().push(t);
    }
    let _ = writeln!(out, "\n== wall time per thread ({LEGEND})");
    for (pid, threads) in &by_pid {
        let comm = rec.targets.iter().find(|t| t.pid == *pid).map(|t| t.comm.as_str()).unwrap_or("?");
        line(out, &format!("pid {pid} ({}) all", printable(comm)), &sum(threads));
        for t in threads {
            line(out, &format!("  tid {} {}", t.tid, printable(&t.comm)), t);
        }
    }
    stacks_section(out, rec, StackKind::Cpu, None);
    stacks_section(out, rec, StackKind::Gil, None);
    for reason in [OffCpuReason::Io, OffCpuReason::Lock, OffCpuReason::Poll, OffCpuReason::Sleep, OffCpuReason::Other] {
        stacks_section(out, rec, StackKind::OffCpu, Some(reason));
    }
    stacks_section(out, rec, StackKind::Syscall, None);
}

fn reason_name(r: OffCpuReason) -> &'static str {
    match r {
        OffCpuReason::Io => "io",
        OffCpuReason::Lock => "lock",
        OffCpuReason::Poll => "poll",
        OffCpuReason::Sleep => "sleep",
        OffCpuReason::Other => "other",
        OffCpuReason::Gil => "gil",
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
    s
}

/// Stacks merged across threads of a process (same frames).
/// (pid, function names) -> (weight, frames of the first stack seen).
type MergedStacks<'a> = BTreeMap<(u32, Vec<String>), (u64, &'a [Frame])>;

fn merged<'a>(rec: &'a Recording, kind: StackKind, reason: Option<OffCpuReason>) -> Vec<(u32, u64, &'a [Frame])> {
    let mut m: MergedStacks<'a> = BTreeMap::new();
    // GIL stacks carry `reason: gil` (older recordings none): the kind says it all.
    for s in rec.stacks.iter().filter(|s| s.kind == kind && (kind == StackKind::Gil || s.reason == reason)) {
        let key = (s.pid, s.frames.iter().map(|f| f.function.clone()).collect());
        let e = m.entry(key).or_insert((0, &s.frames));
        e.0 += stack_weight(s);
    }
    let mut v: Vec<(u32, u64, &[Frame])> = m.into_iter().map(|((pid, _), (w, f))| (pid, w, f)).collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v
}

fn stacks_section(out: &mut String, rec: &Recording, kind: StackKind, reason: Option<OffCpuReason>) {
    let stacks = merged(rec, kind, reason);
    if stacks.is_empty() {
        return;
    }
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    match (kind, reason) {
        (StackKind::Cpu, _) => {
            let _ = writeln!(out, "\n== top on-CPU stacks ({total} samples at {} Hz)", rec.sample_hz);
        }
        (StackKind::OffCpu, Some(r)) => {
            let _ = writeln!(out, "\n== top off-CPU stacks: {} ({} total)", reason_name(r), fmt_duration(total));
        }
        (StackKind::Gil, _) => {
            let _ = writeln!(out, "\n== top GIL-wait stacks ({} total)", fmt_duration(total));
        }
        (StackKind::Syscall, _) => {
            let _ = writeln!(out, "\n== slow syscalls by stack ({} total)", fmt_duration(total));
        }
        _ => {}
    }
    for (pid, w, frames) in stacks.into_iter().take(TOP_STACKS) {
        let amount = match kind {
            StackKind::Cpu => format!("{w} samples"),
            _ => fmt_duration(w),
        };
        let _ = writeln!(out, "{:5.1}%  {amount}  pid {pid}", w as f64 * 100.0 / total.max(1) as f64);
        if frames.is_empty() {
            out.push_str("         (no stack)\n");
        }
        for f in frames.iter().take(STACK_DEPTH_SHOWN) {
            let _ = writeln!(out, "         {}", frame_text(f));
        }
        if frames.len() > STACK_DEPTH_SHOWN {
            let _ = writeln!(out, "         ... {} more frames", frames.len() - STACK_DEPTH_SHOWN);
        }
    }
}

/// Run-queue delay per process: waits, total, and a log2 histogram.
pub fn render_runqueue(out: &mut String, rec: &Recording) {
    for (pid, hist) in &rec.runqueue_hist {
        let n: u64 = hist.iter().sum();
        if n == 0 {
            continue;
        }
        let waited: u64 = rec.threads.iter().filter(|t| t.pid == *pid).map(|t| t.runqueue_ns).sum();
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
        render(&mut out, &rec);
        assert!(out.contains("== top GIL-wait stacks (7.00 ms total)") && out.contains("wait_for_gil"), "{out}");
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
