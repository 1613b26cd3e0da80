//! `record --timeline`: each thread's states over the window, for the
//! page's zoomable strip. Exact intervals while they fit the page's budget
//! ([`MAX_INTERVALS`] in all); a thread with more is drawn in buckets of
//! equal width, each in the state the thread spent most of it in (the
//! resolution is said on the page).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    recording::{timeline::ThreadState, OffCpuReason, Recording},
    report::fmt::printable,
};

/// Intervals embedded in all: ~12 bytes each, about 2.4 MB at most.
const MAX_INTERVALS: usize = 200_000;
/// Threads drawn (the longest-lived first).
const MAX_THREADS: usize = 64;

/// The state names, indexed by the intervals' state code.
pub const STATES: [&str; 9] = ["on-CPU", "run-queue", "GIL", "io", "lock", "poll", "sleep", "memory", "other"];

#[derive(Serialize)]
pub struct Strip {
    pub states: [&'static str; 9],
    pub window_us: u64,
    pub threads: Vec<Track>,
    /// Threads with intervals that were not drawn (past [`MAX_THREADS`]).
    pub threads_left_out: usize,
}

#[derive(Serialize)]
pub struct Track {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    /// Flat `[begin_us, length_us, state, ...]` since the window start.
    pub intervals: Vec<u64>,
    /// 0: exact intervals; otherwise the bucket width in microseconds.
    pub bucket_us: u64,
}

/// `(begin_us, end_us, state code)`.
type Interval = (u64, u64, u64);

fn code(state: ThreadState, reason: Option<OffCpuReason>) -> u64 {
    match (state, reason) {
        (ThreadState::OnCpu, _) => 0,
        (ThreadState::Runqueue, _) => 1,
        (ThreadState::OffCpu, Some(OffCpuReason::Gil)) => 2,
        (ThreadState::OffCpu, Some(OffCpuReason::Io)) => 3,
        (ThreadState::OffCpu, Some(OffCpuReason::Lock)) => 4,
        (ThreadState::OffCpu, Some(OffCpuReason::Poll)) => 5,
        (ThreadState::OffCpu, Some(OffCpuReason::Sleep)) => 6,
        (ThreadState::OffCpu, Some(OffCpuReason::Memory)) => 7,
        (ThreadState::OffCpu, _) => 8,
    }
}

/// The strip of `rec`'s timeline, or None without one.
pub fn of(rec: &Recording) -> Option<Strip> {
    let t = rec.timeline.as_ref()?;
    let window_us = rec.duration_ns / 1000;
    let mut by_thread: BTreeMap<(u32, u32), Vec<Interval>> = BTreeMap::new();
    for s in &t.states {
        // Times are relative to the window start already.
        let (b, e) = (s.begin_ns / 1000, s.end_ns / 1000);
        by_thread.entry((s.pid, s.tid)).or_default().push((b, e.max(b), code(s.state, s.reason)));
    }
    let times: std::collections::HashMap<(u32, u32), &crate::recording::ThreadTimes> = rec.threads.iter().map(|x| ((x.pid, x.tid), x)).collect();
    let mut keys: Vec<(u32, u32)> = by_thread.keys().copied().collect();
    keys.sort_by_key(|k| (std::cmp::Reverse(times.get(k).map_or(0, |x| x.wall_ns)), *k));
    let left_out = keys.len().saturating_sub(MAX_THREADS);
    keys.truncate(MAX_THREADS);
    let budget = MAX_INTERVALS / keys.len().max(1);
    let threads = keys
        .into_iter()
        .map(|(pid, tid)| {
            let mut iv = by_thread.remove(&(pid, tid)).unwrap_or_default();
            iv.sort_unstable();
            let name = times.get(&(pid, tid)).map(|x| printable(&x.comm).into_owned()).unwrap_or_default();
            let (intervals, bucket_us) = if iv.len() <= budget { (exact(&iv), 0) } else { bucketed(&iv, window_us.max(1), budget) };
            Track { pid, tid, name, intervals, bucket_us }
        })
        .collect();
    Some(Strip { states: STATES, window_us, threads, threads_left_out: left_out })
}

fn exact(iv: &[Interval]) -> Vec<u64> {
    iv.iter().flat_map(|&(b, e, c)| [b, e - b, c]).collect()
}

/// `budget` buckets over the window, each in its dominant state; adjacent
/// buckets in the same state merged.
fn bucketed(iv: &[Interval], window_us: u64, budget: usize) -> (Vec<u64>, u64) {
    let width = window_us.div_ceil(budget.max(1) as u64).max(1);
    let n = window_us.div_ceil(width) as usize;
    let mut time = vec![[0u64; STATES.len()]; n];
    for &(b, e, c) in iv {
        let mut at = b;
        while at < e {
            let i = (at / width) as usize;
            let Some(slot) = time.get_mut(i) else { break };
            let end = e.min((i as u64 + 1) * width);
            slot[c as usize] += end - at;
            at = end;
        }
    }
    let mut out: Vec<u64> = Vec::new();
    for (i, t) in time.iter().enumerate() {
        let Some((c, _)) = t.iter().enumerate().filter(|(_, v)| **v > 0).max_by_key(|(_, v)| **v) else { continue };
        let b = i as u64 * width;
        let len = out.len();
        // Merge with the previous bucket when it ends here in the same state.
        if len >= 3 && out[len - 1] == c as u64 && out[len - 3] + out[len - 2] == b {
            out[len - 2] += width;
        } else {
            out.extend([b, width, c as u64]);
        }
    }
    (out, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_the_dominant_state_and_merge() {
        // 0..60 on CPU, 60..100 GIL, 100..200 sleep; 2 buckets of 100.
        let iv = [(0, 60, 0), (60, 100, 2), (100, 200, 6)];
        let (out, w) = bucketed(&iv, 200, 2);
        assert_eq!(w, 100);
        assert_eq!(out, vec![0, 100, 0, 100, 100, 6]);
        let (out, _) = bucketed(&[(0, 50, 6), (50, 100, 6), (100, 200, 6)], 200, 2);
        assert_eq!(out, vec![0, 200, 6], "merged");
        assert_eq!(exact(&iv), vec![0, 60, 0, 60, 40, 2, 100, 100, 6]);
    }
}
