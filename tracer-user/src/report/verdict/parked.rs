//! Parked native threads: in a Python process, a thread that ran no Python
//! code (stacks recorded, none with a Python frame) and was busy (on CPU,
//! waiting for the GIL or in the run queue) less than
//! [`PARKED_MAX_BUSY_SHARE`] of its life. The idle helpers of native
//! libraries (an onnxruntime or OpenMP pool parked on a futex, a CUDA
//! callback thread) are such threads: their waiting is not the service's,
//! and counted in the process's thread time it made the verdict of an
//! onnxruntime service "waiting on other threads at
//! `__futex_abstimed_wait_common64`". They are left out of the process's
//! shares and counted in [`Parked`] (said on the process line).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Acc;
use crate::recording::{attribution::is_user_file, Frame, FrameKind, StackRecord, ThreadTimes};

/// A thread busy less than this share of its life can be parked.
pub const PARKED_MAX_BUSY_SHARE: f64 = 0.05;
/// A helper thread is busy (on CPU, GIL, run queue) less than this
/// share of its life.
pub const HELPER_MAX_BUSY_SHARE: f64 = 0.20;

/// The parked threads left out of a process's shares.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Parked {
    pub threads: u32,
    /// Their wall time, summed.
    pub wall_ns: u64,
}

/// Removes the parked threads of one process from `threads` (when it runs
/// Python at all) and says how many there were.
pub(super) fn drop_parked(threads: &mut Vec<(&ThreadTimes, Acc)>, stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>) -> Parked {
    let python = |f: &Frame| f.kind == FrameKind::Python;
    drop_idle(threads, stacks_of, python, PARKED_MAX_BUSY_SHARE)
}

/// Removes the helper threads of one Python process from `threads`: not
/// the main thread, stacks recorded and none with a frame of the user's
/// code (queue feeders, listeners and idle executor workers in the
/// standard library, library helpers, an idle native pool), and busy (on
/// CPU, waiting for the GIL or in the run queue) less than
/// [`HELPER_MAX_BUSY_SHARE`] of its life. What they wait for is not what
/// the process waits for: the multiprocessing queue feeder of a
/// DataLoader parked in `Condition.wait` made its process's headline
/// "waiting on other threads" while the main thread waited for the workers.
pub(super) fn drop_helpers(threads: &mut Vec<(&ThreadTimes, Acc)>, stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>) -> Parked {
    let user_code = |f: &Frame| f.kind == FrameKind::Python && f.file.as_deref().is_some_and(is_user_file);
    drop_idle(threads, stacks_of, user_code, HELPER_MAX_BUSY_SHARE)
}

/// Removes from the threads of a Python process those, other than the
/// main thread, with stacks recorded, none with a frame `working`
/// accepts, and busy (on CPU, waiting for the GIL, in the run queue) less
/// than `max_busy` of their life; counts them.
fn drop_idle(
    threads: &mut Vec<(&ThreadTimes, Acc)>,
    stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>,
    working: impl Fn(&Frame) -> bool,
    max_busy: f64,
) -> Parked {
    let stacks = |t: &ThreadTimes| stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
    let has = |t: &ThreadTimes, pred: &dyn Fn(&Frame) -> bool| stacks(t).iter().any(|s| s.frames.iter().any(pred));
    if !threads.iter().any(|(t, _)| has(t, &|f: &Frame| f.kind == FrameKind::Python)) {
        return Parked::default();
    }
    let mut dropped = Parked::default();
    threads.retain(|(t, _)| {
        let busy = t.on_cpu_ns.saturating_add(t.off_cpu.gil_ns).saturating_add(t.runqueue_ns);
        let idle = t.tid != t.pid
            && t.tid != 0
            && t.wall_ns > 0
            && !stacks(t).is_empty()
            && !has(t, &working)
            && (busy as f64) < t.wall_ns as f64 * max_busy;
        if idle {
            dropped.threads += 1;
            dropped.wall_ns = dropped.wall_ns.saturating_add(t.wall_ns);
        }
        !idle
    });
    dropped
}
