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
use crate::recording::{attribution::is_user_file, FrameKind, StackRecord, ThreadTimes};

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
    let stacks = |t: &ThreadTimes| stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
    let python = |t: &ThreadTimes| stacks(t).iter().any(|s| s.frames.iter().any(|f| f.kind == FrameKind::Python));
    if !threads.iter().any(|(t, _)| python(t)) {
        return Parked::default();
    }
    let mut parked = Parked::default();
    threads.retain(|(t, _)| {
        let busy = t.on_cpu_ns.saturating_add(t.off_cpu.gil_ns).saturating_add(t.runqueue_ns);
        let is_parked = t.tid != t.pid
            && t.tid != 0
            && t.wall_ns > 0
            && !stacks(t).is_empty()
            && !python(t)
            && (busy as f64) < t.wall_ns as f64 * PARKED_MAX_BUSY_SHARE;
        if is_parked {
            parked.threads += 1;
            parked.wall_ns = parked.wall_ns.saturating_add(t.wall_ns);
        }
        !is_parked
    });
    parked
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
pub(super) fn drop_helpers(
    threads: &mut Vec<(&ThreadTimes, Acc)>,
    stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>,
) -> Parked {
    let stacks = |t: &ThreadTimes| stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
    let python = |t: &ThreadTimes| stacks(t).iter().any(|s| s.frames.iter().any(|f| f.kind == FrameKind::Python));
    if !threads.iter().any(|(t, _)| python(t)) {
        return Parked::default();
    }
    let user_code = |t: &ThreadTimes| {
        stacks(t).iter().any(|s| s.frames.iter().any(|f| f.kind == FrameKind::Python && f.file.as_deref().is_some_and(is_user_file)))
    };
    let mut helpers = Parked::default();
    threads.retain(|(t, _)| {
        let busy = t.on_cpu_ns.saturating_add(t.off_cpu.gil_ns).saturating_add(t.runqueue_ns);
        let is_helper = t.tid != t.pid
            && t.tid != 0
            && t.wall_ns > 0
            && !stacks(t).is_empty()
            && !user_code(t)
            && (busy as f64) < t.wall_ns as f64 * HELPER_MAX_BUSY_SHARE;
        if is_helper {
            helpers.threads += 1;
            helpers.wall_ns = helpers.wall_ns.saturating_add(t.wall_ns);
        }
        !is_helper
    });
    helpers
}
