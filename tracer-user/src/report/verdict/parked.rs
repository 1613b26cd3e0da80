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
/// A helper thread is busy (on CPU or in the run queue: its GIL waits are
/// not its work) less than this share of its life.
pub const HELPER_MAX_BUSY_SHARE: f64 = 0.20;

/// The parked threads left out of a process's shares.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Parked {
    pub threads: u32,
    /// Their wall time, summed.
    pub wall_ns: u64,
    /// Which they are, (pid, tid): what the compact text report leaves out
    /// of its rows and stacks (not in the JSON: `threads[]` has them all).
    #[serde(skip)]
    pub tids: Vec<(u32, u32)>,
}

/// Removes the parked threads of one process from `threads` (when it runs
/// Python at all) and says how many there were.
pub(super) fn drop_parked(threads: &mut Vec<(&ThreadTimes, Acc)>, stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>) -> Parked {
    let python = |f: &Frame| f.kind == FrameKind::Python;
    drop_idle(threads, stacks_of, python, Busy { max_share: PARKED_MAX_BUSY_SHARE, gil: true })
}

/// Removes the helper threads of one Python process from `threads`: not
/// the main thread, stacks recorded and none with a frame of the user's
/// code (queue feeders, listeners and idle executor workers in the
/// standard library, library helpers, an idle native pool), and busy (on
/// CPU or in the run queue) less than [`HELPER_MAX_BUSY_SHARE`] of its
/// life. What they wait for is not what the process waits for: the
/// multiprocessing queue feeder of a DataLoader parked in `Condition.wait`
/// made its process's headline "waiting on other threads" while the main
/// thread waited for the workers. Their GIL waits do not make them busy:
/// a DataLoader worker's fd-passing listener (`socket.accept`) waits for
/// the GIL a third of its life, behind the worker's `__getitem__`, and
/// made the workers' headline "polling at socket.accept".
pub(super) fn drop_helpers(threads: &mut Vec<(&ThreadTimes, Acc)>, stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>) -> Parked {
    let user_code = |f: &Frame| f.kind == FrameKind::Python && f.file.as_deref().is_some_and(is_user_file);
    drop_idle(threads, stacks_of, user_code, Busy { max_share: HELPER_MAX_BUSY_SHARE, gil: false })
}

/// What makes a thread busy for [`drop_idle`]: on CPU and in the run
/// queue, and waiting for the GIL where `gil`; at least `max_share` of its
/// life.
struct Busy {
    max_share: f64,
    gil: bool,
}

/// Removes from the threads of a Python process those, other than the
/// main thread, with stacks recorded, none with a frame `working`
/// accepts, and not `busy`; counts them.
fn drop_idle(
    threads: &mut Vec<(&ThreadTimes, Acc)>,
    stacks_of: &HashMap<(u32, u32), Vec<&StackRecord>>,
    working: impl Fn(&Frame) -> bool,
    busy: Busy,
) -> Parked {
    let stacks = |t: &ThreadTimes| stacks_of.get(&(t.pid, t.tid)).map(Vec::as_slice).unwrap_or(&[]);
    let has = |t: &ThreadTimes, pred: &dyn Fn(&Frame) -> bool| stacks(t).iter().any(|s| s.frames.iter().any(pred));
    if !threads.iter().any(|(t, _)| has(t, &|f: &Frame| f.kind == FrameKind::Python)) {
        return Parked::default();
    }
    let mut dropped = Parked::default();
    threads.retain(|(t, _)| {
        let gil = if busy.gil { t.off_cpu.gil_ns } else { 0 };
        let ran = t.on_cpu_ns.saturating_add(gil).saturating_add(t.runqueue_ns);
        let idle = t.tid != t.pid
            && t.tid != 0
            && t.wall_ns > 0
            && !stacks(t).is_empty()
            && !has(t, &working)
            && (ran as f64) < t.wall_ns as f64 * busy.max_share;
        if idle {
            dropped.threads += 1;
            dropped.wall_ns = dropped.wall_ns.saturating_add(t.wall_ns);
            dropped.tids.push((t.pid, t.tid));
        }
        !idle
    });
    dropped
}
