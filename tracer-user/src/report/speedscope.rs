//! `--format speedscope`: the speedscope file format
//! (<https://www.speedscope.app/file-format-schema.json>), one sampled
//! profile per thread, weighted in nanoseconds.
//!
//! `--profile` picks the time, as for the flame graph:
//! - `cpu`: CPU samples, each weighing one sampling period (1/`sample_hz`);
//! - `off-cpu`: off-CPU and GIL-wait time, under a root frame naming the
//!   reason (`[off-cpu: io]`);
//! - `wall`: both, on-CPU samples under `[on-cpu]`.
//!
//! Frames are shared by all profiles. A stack with Python frames starts at
//! its Python leaf: the interpreter's native (and kernel) frames above it
//! are left out, as py-spy does without `--native`, so that self time is
//! the Python function's; native frames below the Python root (`main`...)
//! stay. A Python frame carries its `file`
//! and `line`, a native frame its module as `file` when known, a kernel
//! frame the suffix `_[k]`. Samples list frame indices root first, as the
//! format wants. Threads are ordered by pid, tid; the summed row of exited
//! threads (tid 0) is named `pid N exited threads`.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::folded::{memory_stacks, off_cpu_frame, Profile};
use crate::recording::{Frame, FrameKind, OffCpuReason, Recording, StackKind};

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: &'a str,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<SsFrame>,
}

#[derive(Serialize, Clone, PartialEq, Eq, Hash)]
struct SsFrame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// One weighted stack of a thread: an optional context frame (the reason),
/// then the recorded frames (leaf first), and the weight in ns.
pub(crate) struct Weighted<'a> {
    pub pid: u32,
    pub tid: u32,
    pub context: Option<String>,
    pub frames: &'a [Frame],
    /// CPU samples (0 for off-CPU stacks; growth samples for memory ones).
    pub samples: u64,
    /// Nanoseconds; bytes grown for [`Profile::Memory`].
    pub weight_ns: u64,
    /// Off-CPU reason (`None` for CPU samples).
    pub reason: Option<OffCpuReason>,
    pub on_cpu: bool,
}

/// The stacks of `rec` that `profile` counts, with their weights in ns.
/// CPU samples weigh one sampling period each (none when `sample_hz` is 0).
pub(crate) fn weighted(rec: &Recording, profile: Profile) -> Vec<Weighted<'_>> {
    if profile == Profile::Memory {
        // Per process (tid = pid): the memory family samples processes.
        return memory_stacks(rec)
            .filter(|(_, s)| s.grown_bytes > 0)
            .map(|(pid, s)| Weighted {
                pid,
                tid: pid,
                context: None,
                frames: from_python_leaf(&s.frames),
                samples: s.samples,
                weight_ns: s.grown_bytes,
                reason: None,
                on_cpu: false,
            })
            .collect();
    }
    let period = 1_000_000_000u64.checked_div(rec.sample_hz);
    let mut out = Vec::new();
    for s in &rec.stacks {
        let (on_cpu, reason) = match s.kind {
            StackKind::Cpu => (true, None),
            StackKind::OffCpu => (false, s.reason),
            StackKind::Gil => (false, Some(OffCpuReason::Gil)),
            StackKind::Syscall => continue,
        };
        let (context, weight_ns) = match (profile, on_cpu) {
            (Profile::Cpu, true) => (None, period.map(|p| p.saturating_mul(s.samples))),
            (Profile::Wall, true) => (Some("[on-cpu]".to_owned()), period.map(|p| p.saturating_mul(s.samples))),
            (Profile::OffCpu | Profile::Wall, false) => (Some(off_cpu_frame(reason)), Some(s.weight_ns)),
            (Profile::Cpu, false) | (Profile::OffCpu, true) | (Profile::Memory, _) => continue,
        };
        let Some(weight_ns) = weight_ns.filter(|w| *w > 0) else { continue };
        out.push(Weighted {
            pid: s.pid,
            tid: s.tid,
            context,
            frames: from_python_leaf(&s.frames),
            samples: if on_cpu { s.samples } else { 0 },
            weight_ns,
            reason,
            on_cpu,
        });
    }
    out
}

/// With Python frames, the interpreter's own frames above the Python leaf
/// are left out (as py-spy shows them without --native): self time goes to
/// the Python function.
pub(crate) fn from_python_leaf(frames: &[Frame]) -> &[Frame] {
    match frames.iter().position(|f| f.kind == FrameKind::Python) {
        Some(i) => &frames[i..],
        None => frames,
    }
}

/// Display name of a process: `comm (pid N)`.
fn process_name(rec: &Recording, pid: u32) -> String {
    match rec.targets.iter().find(|t| t.pid == pid).map(|t| t.comm.as_str()).filter(|c| !c.is_empty()) {
        Some(comm) => format!("{comm} (pid {pid})"),
        None => format!("pid {pid}"),
    }
}

/// Display name of a thread: `comm (tid N)`, `pid N exited threads` for tid 0.
pub(crate) fn thread_names(rec: &Recording) -> HashMap<(u32, u32), String> {
    let mut names = HashMap::new();
    for t in &rec.threads {
        let name = if t.tid == 0 {
            format!("pid {} exited threads", t.pid)
        } else if t.comm.is_empty() {
            format!("pid {} tid {}", t.pid, t.tid)
        } else {
            format!("{} (pid {} tid {})", t.comm, t.pid, t.tid)
        };
        names.insert((t.pid, t.tid), name);
    }
    names
}

pub(crate) fn thread_name(names: &HashMap<(u32, u32), String>, pid: u32, tid: u32) -> String {
    names.get(&(pid, tid)).cloned().unwrap_or_else(|| {
        if tid == 0 {
            format!("pid {pid} exited threads")
        } else {
            format!("pid {pid} tid {tid}")
        }
    })
}

fn ss_frame(f: &Frame) -> SsFrame {
    let mut name = if f.function.is_empty() { crate::recording::UNKNOWN.to_owned() } else { f.function.clone() };
    if f.kind == FrameKind::Kernel {
        name.push_str("_[k]");
    }
    let file = f.file.clone().or_else(|| (f.kind == FrameKind::Native).then(|| f.module.clone()).flatten());
    SsFrame { name, file, line: f.line }
}

/// The speedscope JSON of `rec` for `profile`.
pub fn render(rec: &Recording, profile: Profile) -> String {
    let names = thread_names(rec);
    let mut frames: Vec<SsFrame> = Vec::new();
    let mut index: HashMap<SsFrame, usize> = HashMap::new();
    let mut intern = |f: SsFrame| -> usize {
        *index.entry(f.clone()).or_insert_with(|| {
            frames.push(f);
            frames.len() - 1
        })
    };
    // (pid, tid) -> (root-first stack -> weight), merged.
    let mut threads: BTreeMap<(u32, u32), BTreeMap<Vec<usize>, u64>> = BTreeMap::new();
    for w in weighted(rec, profile) {
        let mut stack = Vec::with_capacity(w.frames.len() + 1);
        if let Some(ctx) = w.context {
            stack.push(intern(SsFrame { name: ctx, file: None, line: None }));
        }
        stack.extend(w.frames.iter().rev().map(|f| intern(ss_frame(f))));
        let slot = threads.entry((w.pid, w.tid)).or_default().entry(stack).or_default();
        *slot = slot.saturating_add(w.weight_ns);
    }
    let profiles = threads
        .into_iter()
        .map(|((pid, tid), stacks)| {
            let (samples, weights): (Vec<_>, Vec<_>) = stacks.into_iter().unzip();
            let end_value = weights.iter().fold(0u64, |a, w| a.saturating_add(*w));
            SampledProfile {
                kind: "sampled",
                name: if profile == Profile::Memory { process_name(rec, pid) } else { thread_name(&names, pid, tid) },
                unit: if profile == Profile::Memory { "bytes" } else { "nanoseconds" },
                start_value: 0,
                end_value,
                samples,
                weights,
            }
        })
        .collect();
    let exporter = format!("infertrace {}", rec.tool_version);
    let file = File {
        schema: SCHEMA,
        shared: Shared { frames },
        profiles,
        name: format!("infertrace {} profile", profile.title()),
        active_profile_index: 0,
        exporter: &exporter,
    };
    let mut out = serde_json::to_string(&file).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::folded::tests::stacks_sample;

    #[test]
    fn one_profile_per_thread_root_first() {
        let rec = stacks_sample();
        let v: serde_json::Value = serde_json::from_str(&render(&rec, Profile::Cpu)).unwrap();
        let frames = v["shared"]["frames"].as_array().unwrap();
        let profiles = v["profiles"].as_array().unwrap();
        // Threads (10,10), (10,12), (11,11), (99,99).
        assert_eq!(profiles.len(), 4);
        let p = &profiles[0];
        assert_eq!(p["type"], "sampled");
        assert_eq!(p["unit"], "nanoseconds");
        // pid 10 tid 10: 3 samples of main;work and 1 of main;read;ksys_read at 100 Hz.
        let weights: Vec<u64> = p["weights"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).collect();
        assert_eq!(weights.iter().sum::<u64>(), 40_000_000);
        assert_eq!(p["endValue"], 40_000_000);
        for s in p["samples"].as_array().unwrap() {
            let first = s[0].as_u64().unwrap() as usize;
            assert_eq!(frames[first]["name"], "main", "root first");
        }
        assert!(frames.iter().any(|f| f["name"] == "ksys_read_[k]"));
        assert_eq!(profiles[2]["name"], "child (pid 11 tid 11)");
    }

    #[test]
    fn off_cpu_has_reason_root() {
        let v: serde_json::Value = serde_json::from_str(&render(&stacks_sample(), Profile::OffCpu)).unwrap();
        let frames = v["shared"]["frames"].as_array().unwrap();
        let p = &v["profiles"][0];
        // 1.5 ms + 0.5004 ms io, 2 ms sleep, 400 ns unknown.
        assert_eq!(p["endValue"], 1_500_000 + 500_400 + 2_000_000 + 400);
        let roots: Vec<&str> =
            p["samples"].as_array().unwrap().iter().map(|s| frames[s[0].as_u64().unwrap() as usize]["name"].as_str().unwrap()).collect();
        assert!(roots.contains(&"[off-cpu: io]") && roots.contains(&"[off-cpu: sleep]"), "{roots:?}");
    }

    #[test]
    fn python_frames_carry_file_and_line() {
        let mut rec = stacks_sample();
        rec.stacks[0].frames.insert(
            0,
            Frame { function: "fib".into(), file: Some("/w/bench_fib.py".into()), line: Some(7), kind: FrameKind::Python, module: None },
        );
        let v: serde_json::Value = serde_json::from_str(&render(&rec, Profile::Wall)).unwrap();
        let fib = v["shared"]["frames"].as_array().unwrap().iter().find(|f| f["name"] == "fib").unwrap();
        assert_eq!(fib["file"], "/w/bench_fib.py");
        assert_eq!(fib["line"], 7);
    }

    #[test]
    fn memory_is_one_profile_per_process_in_bytes() {
        let v: serde_json::Value = serde_json::from_str(&render(&crate::report::folded::tests::memory_sample(), Profile::Memory)).unwrap();
        let profiles = v["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 1, "{v}");
        let p = &profiles[0];
        assert_eq!((p["unit"].as_str(), p["name"].as_str()), (Some("bytes"), Some("demo (pid 10)")));
        assert_eq!(p["endValue"], 300u64 << 20);
    }
}
