//! Folded stacks (Brendan Gregg's `stackcollapse` format, what
//! `flamegraph.pl` and inferno read): one line per unique stack, frames root
//! first separated by `;`, a space, then the weight.
//!
//! Every stack starts with the process (`comm` of the target, `pid N` when
//! unknown). Kernel frames get the `_[k]` suffix (colored apart by
//! flame graph tools). Weights by profile:
//! - `cpu`: CPU samples (count).
//! - `off-cpu`: off-CPU time in microseconds (rounded; summed in ns first),
//!   with the reason as a frame under the process, e.g. `[off-cpu: io]`.
//! - `wall`: both, in microseconds: each CPU sample counts 1/sample_hz
//!   seconds, under an `[on-cpu]` frame; off-CPU time under
//!   `[off-cpu: reason]`.
//! - `memory`: resident growth in bytes, at the stacks the memory family
//!   sampled (each sample weighs the bytes the process grew since the last;
//!   docs/memory.md).
//!
//! Lines are sorted; stacks whose weight rounds to 0 are left out.

use std::collections::{BTreeMap, HashMap};

use super::fmt::printable;
use crate::recording::{memory::GrowthStack, Frame, FrameKind, OffCpuReason, Recording, StackKind, StackRecord};

/// Which time a flame graph shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// On-CPU samples.
    Cpu,
    /// Time blocked off CPU, by reason.
    OffCpu,
    /// On-CPU and off-CPU time together.
    Wall,
    /// Resident memory growth by stack (the memory family).
    Memory,
}

impl Profile {
    /// Unit of the weights in [`render`]'s output.
    pub fn unit(self) -> &'static str {
        match self {
            Profile::Cpu => "samples",
            Profile::OffCpu | Profile::Wall => "us",
            Profile::Memory => "bytes",
        }
    }

    /// Human name, for titles.
    pub fn title(self) -> &'static str {
        match self {
            Profile::Cpu => "on-CPU",
            Profile::OffCpu => "off-CPU",
            Profile::Wall => "wall-clock",
            Profile::Memory => "resident memory growth",
        }
    }
}

/// The folded stacks of `rec` for `profile`, one `\n`-terminated line each.
pub fn render(rec: &Recording, profile: Profile) -> String {
    let mut out = String::new();
    for (stack, weight) in fold(rec, profile) {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&weight.to_string());
        out.push('\n');
    }
    out
}

/// (stack, weight) pairs, sorted by stack, weights in [`Profile::unit`].
pub(crate) fn fold(rec: &Recording, profile: Profile) -> BTreeMap<String, u64> {
    let comms = process_names(rec);
    // Cpu: samples; OffCpu and Wall: nanoseconds, converted at the end.
    let mut sums: BTreeMap<String, u128> = BTreeMap::new();
    if profile == Profile::Memory {
        for (pid, s) in memory_stacks(rec) {
            let line = stack_line_of(&comms, pid, &s.frames, None);
            *sums.entry(line).or_default() += u128::from(s.grown_bytes);
        }
    }
    for stack in &rec.stacks {
        let (context, weight) = match (profile, stack.kind) {
            (Profile::Cpu, StackKind::Cpu) => (None, stack.samples as u128),
            (Profile::OffCpu | Profile::Wall, StackKind::OffCpu) => (Some(off_cpu_frame(stack.reason)), stack.weight_ns as u128),
            (Profile::OffCpu | Profile::Wall, StackKind::Gil) => (Some(off_cpu_frame(Some(OffCpuReason::Gil))), stack.weight_ns as u128),
            (Profile::Wall, StackKind::Cpu) if rec.sample_hz > 0 => {
                (Some("[on-cpu]".to_owned()), stack.samples as u128 * 1_000_000_000 / rec.sample_hz as u128)
            }
            _ => continue,
        };
        if weight == 0 {
            continue;
        }
        let line = stack_line(&comms, stack, context.as_deref());
        *sums.entry(line).or_default() += weight;
    }
    sums.into_iter()
        .filter_map(|(line, w)| {
            let w = match profile {
                Profile::Cpu | Profile::Memory => w,
                Profile::OffCpu | Profile::Wall => (w + 500) / 1000,
            };
            (w > 0).then(|| (line, u64::try_from(w).unwrap_or(u64::MAX)))
        })
        .collect()
}

fn process_names(rec: &Recording) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for t in rec.threads.iter().filter(|t| t.pid == t.tid && !t.comm.is_empty()) {
        names.insert(t.pid, t.comm.clone());
    }
    for t in rec.targets.iter().filter(|t| !t.comm.is_empty()) {
        names.insert(t.pid, t.comm.clone());
    }
    names
}

pub(crate) fn off_cpu_frame(reason: Option<OffCpuReason>) -> String {
    match reason {
        None => "[off-cpu]".to_owned(),
        Some(r) => format!("[off-cpu: {}]", r.name()),
    }
}

/// Every growth stack of the memory part, with its process.
pub(crate) fn memory_stacks(rec: &Recording) -> impl Iterator<Item = (u32, &GrowthStack)> {
    rec.memory.iter().flat_map(|m| m.processes.iter()).flat_map(|p| p.stacks.iter().map(move |s| (p.pid, s)))
}

fn stack_line(comms: &HashMap<u32, String>, stack: &StackRecord, context: Option<&str>) -> String {
    stack_line_of(comms, stack.pid, &stack.frames, context)
}

fn stack_line_of(comms: &HashMap<u32, String>, pid: u32, frames: &[Frame], context: Option<&str>) -> String {
    let mut line = match comms.get(&pid) {
        Some(comm) => sanitize(comm),
        None => format!("pid {pid}"),
    };
    if let Some(context) = context {
        line.push(';');
        line.push_str(context);
    }
    for frame in frames.iter().rev() {
        line.push(';');
        let bracketed = frame.function.starts_with('[') && frame.function.ends_with(']') && frame.kind == FrameKind::Native;
        if frame.function.is_empty() || bracketed {
            // Unresolved (or a spin-wait): its library kept
            // (`[unknown in libgomp.so.1]`, `[spin-wait in libgomp.so.1]`), or `[jit]`.
            let what = if frame.function.is_empty() { crate::recording::UNKNOWN } else { frame.function.as_str() };
            match frame.module.as_deref() {
                Some(crate::recording::JIT_MODULE) if what == crate::recording::UNKNOWN => line.push_str(crate::recording::JIT_MODULE),
                Some(m) if !m.is_empty() => line.push_str(&sanitize(&format!("{} in {m}]", &what[..what.len() - 1]))),
                _ => line.push_str(&sanitize(what)),
            }
        } else {
            line.push_str(&sanitize(&frame.function));
        }
        if frame.kind == FrameKind::Kernel {
            line.push_str("_[k]");
        }
    }
    line
}

/// A name safe inside a folded line: no `;` (frame separator), and line
/// breaks and other control characters escaped as everywhere in the text
/// outputs ([`printable`]), which also keeps them out of the SVG (XML 1.0
/// allows no C0 control but tab and line breaks, escaped or not).
fn sanitize(name: &str) -> String {
    printable(name).replace(';', ":")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::recording::{Frame, Recording, StackKind, StackRecord, ThreadTimes};

    #[test]
    fn unresolved_frames_keep_their_library() {
        let unknown = |module: Option<&str>| Frame { function: crate::recording::UNKNOWN.into(), file: None, line: None, kind: FrameKind::Native, module: module.map(Into::into) };
        let comms = HashMap::from([(7, "python".to_owned())]);
        let spin = Frame { function: crate::os::symbolize::SPIN_WAIT.into(), ..unknown(Some("libgomp.so.1")) };
        let frames = [spin, unknown(Some("libgomp.so.1")), unknown(Some(crate::recording::JIT_MODULE)), unknown(None)];
        assert_eq!(stack_line_of(&comms, 7, &frames, None), "python;[unknown];[jit];[unknown in libgomp.so.1];[spin-wait in libgomp.so.1]");
    }

    fn frame(function: &str, kind: FrameKind) -> Frame {
        Frame { function: function.into(), file: None, line: None, kind, module: None }
    }

    fn stack(
        kind: StackKind,
        reason: Option<OffCpuReason>,
        pid: u32,
        samples: u64,
        weight_ns: u64,
        leaf_first: &[Frame],
    ) -> StackRecord {
        StackRecord { kind, reason, pid, tid: pid, samples, weight_ns, syscall: None, frames: leaf_first.to_vec() }
    }

    /// A recording with CPU and off-CPU stacks (sampling at 100 Hz).
    pub(crate) fn stacks_sample() -> Recording {
        let main = frame("main", FrameKind::Native);
        let work = frame("work;loop\nx", FrameKind::Native);
        let read = frame("read", FrameKind::Native);
        let ksys = frame("ksys_read", FrameKind::Kernel);
        let sched = frame("schedule", FrameKind::Kernel);
        let nanosleep = frame("clock_nanosleep", FrameKind::Native);
        // The shared sample's target (pid 10, "demo"), no syscalls.
        Recording {
            syscalls: vec![],
            threads: vec![ThreadTimes {
                pid: 11,
                tid: 11,
                comm: "child".into(),
                wall_ns: 1,
                on_cpu_ns: 1,
                syscall_ns: 0,
                off_cpu: Default::default(),
                runqueue_ns: 0,
                aggregated_threads: 0,
            }],
            stacks: vec![
                // Two threads' records of the same stack: merged.
                stack(StackKind::Cpu, None, 10, 3, 0, &[work.clone(), main.clone()]),
                StackRecord { tid: 12, ..stack(StackKind::Cpu, None, 10, 4, 0, &[work.clone(), main.clone()]) },
                stack(StackKind::Cpu, None, 10, 1, 0, &[ksys.clone(), read.clone(), main.clone()]),
                stack(StackKind::Cpu, None, 11, 2, 0, std::slice::from_ref(&main)),
                stack(StackKind::Cpu, None, 99, 5, 0, &[]),
                stack(
                    StackKind::OffCpu,
                    Some(OffCpuReason::Io),
                    10,
                    2,
                    1_500_000,
                    &[sched.clone(), read.clone(), main.clone()],
                ),
                stack(
                    StackKind::OffCpu,
                    Some(OffCpuReason::Io),
                    10,
                    1,
                    500_400,
                    &[sched.clone(), read.clone(), main.clone()],
                ),
                stack(
                    StackKind::OffCpu,
                    Some(OffCpuReason::Sleep),
                    10,
                    1,
                    2_000_000,
                    &[sched.clone(), nanosleep, main.clone()],
                ),
                // Rounds to 0 us: left out.
                stack(StackKind::OffCpu, None, 10, 1, 400, &[sched, main]),
            ],
            sample_hz: 100,
            ..crate::recording::tests::sample()
        }
    }

    #[test]
    fn cpu_root_first_merged() {
        let out = render(&stacks_sample(), Profile::Cpu);
        assert_eq!(
            out,
            "child;main 2\n\
             demo;main;read;ksys_read_[k] 1\n\
             demo;main;work:loop\\nx 7\n\
             pid 99 5\n"
        );
    }

    #[test]
    fn off_cpu_microseconds_with_reason() {
        let out = render(&stacks_sample(), Profile::OffCpu);
        assert_eq!(
            out,
            "demo;[off-cpu: io];main;read;schedule_[k] 2000\n\
             demo;[off-cpu: sleep];main;clock_nanosleep;schedule_[k] 2000\n"
        );
    }

    #[test]
    fn wall_combines_both() {
        let out = render(&stacks_sample(), Profile::Wall);
        // 100 Hz: one sample is 10 ms = 10000 us.
        assert_eq!(
            out,
            "child;[on-cpu];main 20000\n\
             demo;[off-cpu: io];main;read;schedule_[k] 2000\n\
             demo;[off-cpu: sleep];main;clock_nanosleep;schedule_[k] 2000\n\
             demo;[on-cpu];main;read;ksys_read_[k] 10000\n\
             demo;[on-cpu];main;work:loop\\nx 70000\n\
             pid 99;[on-cpu] 50000\n"
        );
        let mut rec = stacks_sample();
        rec.sample_hz = 0;
        assert!(!render(&rec, Profile::Wall).contains("[on-cpu]"));
    }

    #[test]
    fn empty() {
        let mut rec = stacks_sample();
        rec.stacks.clear();
        assert_eq!(render(&rec, Profile::Cpu), "");
        assert_eq!(Profile::OffCpu.unit(), "us");
    }

    /// `stacks_sample` with a memory part: two stacks of pid 10 (one
    /// Python, under interpreter frames), one that only released.
    pub(crate) fn memory_sample() -> Recording {
        use crate::recording::memory::{GrowthStack, MemoryReport, ProcessMemory};
        let py = |f: &str, line: u32| Frame { function: f.into(), file: Some("/srv/app.py".into()), line: Some(line), kind: FrameKind::Python, module: None };
        let eval = frame("_PyEval_EvalFrameDefault", FrameKind::Native);
        let grow = |g: u64, r: u64, frames: Vec<Frame>| GrowthStack { grown_bytes: g, released_bytes: r, samples: g / (256 << 10), frames };
        let mut rec = stacks_sample();
        rec.memory = Some(MemoryReport {
            growth_sample_bytes: 256 << 10,
            processes: vec![ProcessMemory {
                pid: 10,
                stacks: vec![
                    grow(200 << 20, 0, vec![eval.clone(), py("keep", 10), py("main", 40)]),
                    grow(100 << 20, 100 << 20, vec![py("transient", 20), py("main", 41)]),
                    grow(0, 1 << 20, vec![py("drop", 30)]),
                ],
                ..Default::default()
            }],
        });
        rec
    }

    #[test]
    fn memory_weighs_bytes_grown() {
        let out = render(&memory_sample(), Profile::Memory);
        assert_eq!(
            out,
            "demo;main;keep;_PyEval_EvalFrameDefault 209715200\n\
             demo;main;transient 104857600\n"
        );
        assert_eq!(Profile::Memory.unit(), "bytes");
        assert_eq!(render(&stacks_sample(), Profile::Memory), "");
        // The time profiles do not see it.
        assert_eq!(render(&memory_sample(), Profile::OffCpu), render(&stacks_sample(), Profile::OffCpu));
    }
}
