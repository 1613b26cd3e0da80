//! Native worker pools: the threads of onnxruntime, OpenBLAS, OpenMP or
//! PyTorch's intra-op pool, accounted as their own class
//! ([`Class::NativePool`]), their CPU time per library, charged to the
//! Python line that hands them work, and named busy-waiting when they spin.
//!
//! The rules (docs/verdict.md#native-worker-pools), all deterministic:
//!
//! - A **pool thread** is a thread of a Python process (one of its threads
//!   has Python frames) that is not the main thread, has no Python frame on
//!   any of its stacks, and is on CPU at least [`POOL_MIN_CPU_SHARE`] of its
//!   life. Its native compute becomes `native_pool`, per library.
//! - **Charged** to the user lines of the process's Python threads whose
//!   stacks enter one of the pool's libraries (by their time there), else to
//!   the Python threads' line with the most native compute; the recording
//!   holds no wakeup chain yet, so this is a stand-in for the waker's stack.
//! - **Busy-waiting**: runnable (on CPU or in the run queue) at least
//!   [`BUSY_MIN_RUNNABLE`] of its life, and either at least
//!   [`BUSY_MIN_SPIN_SAMPLES`] of its CPU samples in a spin/yield/pause
//!   function, or running while every thread that feeds it was idle: its
//!   runnable share plus the idlest Python thread's idle share (sleep, I/O,
//!   poll) exceeds 1 by at least [`BUSY_MIN_IDLE_OVERLAP`], so they must
//!   have overlapped by that much.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::recording::attribution::{self as sites, Charged};
use super::{scale, Acc, Class};
use crate::recording::{FrameKind, StackKind, StackRecord, ThreadTimes};

/// A thread on CPU less than this share of its life is not a pool thread.
pub const POOL_MIN_CPU_SHARE: f64 = 0.05;
/// Nor one on CPU less than this in all (ns): a helper that lived a moment
/// (onnxruntime 1.32 starts one that runs ~150 us) is no worker pool.
pub const POOL_MIN_CPU_NS: u64 = 1_000_000;
/// A busy-waiting pool thread is runnable at least this share of its life.
pub const BUSY_MIN_RUNNABLE: f64 = 0.80;
/// ... with at least this share of its CPU samples in spin/yield functions,
pub const BUSY_MIN_SPIN_SAMPLES: f64 = 0.30;
/// ... or running at least this share of its life while its feeders idled.
pub const BUSY_MIN_IDLE_OVERLAP: f64 = 0.05;

/// Native function names (lowercased) that spin.
const SPIN_WORDS: &[&str] = &["spin", "yield", "pause", "relax", "busywait", "busy_wait"];

/// What the verdict found about one pool thread (`threads[].pool` in JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PoolThread {
    /// Its libraries, most CPU first.
    pub libraries: Vec<String>,
    /// On CPU or in the run queue, of its life (0 to 1).
    pub runnable_share: f64,
    /// Its CPU samples in spin/yield/pause functions (0 to 1).
    pub spin_sample_share: f64,
    /// The idle share (sleep, I/O, poll) of the process's idlest Python thread.
    pub feeder_idle_share: f64,
    pub busy_waiting: bool,
    /// How its time was charged to a Python line: `library` (Python stacks
    /// entering its library), `native_compute_line` (the Python threads'
    /// line with the most native compute), `none`.
    pub charged_by: String,
}

fn has_python(stacks: &[&StackRecord]) -> bool {
    stacks.iter().any(|s| s.frames.iter().any(|f| f.kind == FrameKind::Python))
}

fn spin_share(stacks: &[&StackRecord]) -> f64 {
    let cpu = stacks.iter().filter(|s| s.kind == StackKind::Cpu);
    let (mut spin, mut all) = (0u64, 0u64);
    for s in cpu {
        all = all.saturating_add(s.samples);
        let spins = s.frames.iter().filter(|f| f.kind == FrameKind::Native).any(|f| {
            let n = f.function.to_ascii_lowercase();
            SPIN_WORDS.iter().any(|w| n.contains(w))
        });
        if spins {
            spin = spin.saturating_add(s.samples);
        }
    }
    super::ratio(spin, all)
}

fn share(part: u64, whole: u64) -> f64 {
    super::ratio(part, whole)
}

/// Marks the pool threads among one process's `threads` (with their
/// stacks in `stacks_of`), moves their native compute to
/// [`Class::NativePool`] charged to the feeding Python lines, and returns
/// what it found per tid.
pub(super) fn apply(
    threads: &mut [(&ThreadTimes, Acc)],
    stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>,
    sample_hz: u64,
) -> HashMap<u32, PoolThread> {
    let stacks = |t: &ThreadTimes| stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
    let python: Vec<usize> = (0..threads.len()).filter(|i| has_python(stacks(threads[*i].0))).collect();
    if python.is_empty() {
        return HashMap::new();
    }
    let pool: Vec<usize> = (0..threads.len())
        .filter(|i| {
            let (t, a) = &threads[*i];
            t.tid != t.pid
                && t.tid != 0
                && !python.contains(i)
                && a.time.get(&Class::NativeCompute).copied().unwrap_or(0) > 0
                && share(t.on_cpu_ns, t.wall_ns) >= POOL_MIN_CPU_SHARE
                && t.on_cpu_ns >= POOL_MIN_CPU_NS
        })
        .collect();
    if pool.is_empty() {
        return HashMap::new();
    }
    let feeder_idle = python
        .iter()
        .map(|i| {
            let t = threads[*i].0;
            share(t.off_cpu.sleep_ns.saturating_add(t.off_cpu.io_ns).saturating_add(t.off_cpu.poll_ns), t.wall_ns)
        })
        .fold(0.0f64, f64::max);
    // The Python threads' line with the most native compute (the fallback charge).
    let mut native_lines: HashMap<Charged, u64> = HashMap::new();
    for i in &python {
        for (c, ns) in threads[*i].1.sites.get(&Class::NativeCompute).into_iter().flatten() {
            *native_lines.entry(c.clone()).or_default() += ns;
        }
    }
    let fallback = native_lines
        .into_iter()
        .filter(|(c, _)| c.site.kind == "python")
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map(|(c, _)| c);
    let sample_ns = 1_000_000_000u64.checked_div(sample_hz).unwrap_or(1);
    let mut out = HashMap::new();
    for i in pool {
        let t: &ThreadTimes = threads[i].0;
        let acc = &mut threads[i].1;
        let mut libs: Vec<(String, u64)> = acc.libs.iter().map(|(l, ns)| (l.clone(), *ns)).collect();
        libs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        // The libraries the pool works in: a tenth of its time at least,
        // not the kernel and not the C runtime every thread passes through
        // (a `time.sleep` in libc is no call into the pool: with libc
        // here, the feeder's sleeps drew the pool's time to the sleep).
        let total_lib_ns: u64 = libs.iter().map(|(_, ns)| *ns).sum();
        let real_libs: Vec<&str> = libs
            .iter()
            .filter(|(l, ns)| *l != "[kernel]" && *l != crate::recording::UNKNOWN && *l != crate::recording::STACK_LOST && !is_runtime_library(l) && *ns * 10 >= total_lib_ns)
            .map(|(l, _)| l.as_str())
            .collect();
        // Python stacks that enter one of the pool's libraries, by their time.
        let mut via: HashMap<Charged, u64> = HashMap::new();
        for s in stacks_of
            .iter()
            .filter(|((pid, tid), st)| *pid == t.pid && *tid != t.tid && has_python(st))
            .flat_map(|(_, st)| st.iter())
            .filter(|s| matches!(s.kind, StackKind::Cpu | StackKind::OffCpu))
        {
            let enters = s.frames.iter().any(|f| f.kind == FrameKind::Native && f.module.as_deref().is_some_and(|m| real_libs.contains(&m)));
            if !enters {
                continue;
            }
            let w = if s.kind == StackKind::Cpu { s.samples.saturating_mul(sample_ns) } else { s.weight_ns };
            if let Some(c) = sites::charge(&s.frames).filter(|c| c.site.kind == "python") {
                *via.entry(c).or_default() += w;
            }
        }
        let ns = acc.time.remove(&Class::NativeCompute).unwrap_or(0);
        let old_sites = acc.sites.remove(&Class::NativeCompute).unwrap_or_default();
        *acc.time.entry(Class::NativePool).or_default() += ns;
        acc.pool_libs = std::mem::take(&mut acc.libs);
        let charged_by = if !via.is_empty() {
            let total: u64 = via.values().fold(0u64, |a, b| a.saturating_add(*b));
            let m = acc.sites.entry(Class::NativePool).or_default();
            for (c, w) in via {
                *m.entry(c).or_default() += scale(ns, w, total);
            }
            "library"
        } else if let Some(c) = &fallback {
            *acc.sites.entry(Class::NativePool).or_default().entry(c.clone()).or_default() += ns;
            "native_compute_line"
        } else {
            acc.sites.insert(Class::NativePool, old_sites);
            "none"
        };
        let runnable = share(t.on_cpu_ns.saturating_add(t.runqueue_ns), t.wall_ns);
        let spin = spin_share(stacks(t));
        let busy = runnable >= BUSY_MIN_RUNNABLE && (spin >= BUSY_MIN_SPIN_SAMPLES || runnable + feeder_idle - 1.0 >= BUSY_MIN_IDLE_OVERLAP);
        out.insert(
            t.tid,
            PoolThread {
                libraries: libs.into_iter().map(|(l, _)| l).collect(),
                runnable_share: runnable,
                spin_sample_share: spin,
                feeder_idle_share: feeder_idle,
                busy_waiting: busy,
                charged_by: charged_by.to_owned(),
            },
        );
    }
    out
}

/// The C and C++ runtimes and the dynamic loader: every thread's stacks go
/// through them, whatever it does.
fn is_runtime_library(name: &str) -> bool {
    const RUNTIMES: [&str; 8] = ["libc.so", "libc-", "libpthread", "libm.so", "libstdc++", "libgcc_s", "ld-linux", "libdl"];
    RUNTIMES.iter().any(|p| name.starts_with(p))
}
