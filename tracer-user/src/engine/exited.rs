//! Exited threads: which keep a row of their own, which are summed.
//!
//! A target that starts and ends threads all the time (a thread per
//! request, a pool that grows and shrinks) would otherwise leave one
//! thread-time row and a few syscall rows per thread it ever ran: at 850
//! threads/s, 51k threads and 550k syscall rows a minute, held in memory
//! until the end. Instead, when a thread exits, the [`ExitedThreads`]
//! policy decides once: the [`KEEP_PER_PROCESS`] exited threads of each
//! process with the most wall time keep their rows; every other exited
//! thread is folded into one row per process (tid 0,
//! `aggregated_threads` = how many), in the thread table and the syscall
//! table alike. A kept thread pushed out of the top by a longer one is
//! folded then. Memory stays flat however many threads come and go; the
//! recording says how many threads were folded (a note).
//!
//! The collector that sees exits first hand leads: the scheduler collector
//! (a thread's final switch-out) when scheduler tracing is on, else the
//! syscall collector (/proc). Each decision is a [`Verdict`]; the leader
//! applies it at once, and the syscall collector, when it follows, takes
//! them with [`ExitedThreads::take_verdicts`] at its next drain, so that
//! both tables keep and fold the same threads.

use std::collections::{BTreeMap, HashMap};

/// Exited threads of one process that keep their own rows.
pub const KEEP_PER_PROCESS: usize = 32;

/// The decision about one exited thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub pid: u32,
    pub tid: u32,
    /// Identifies this life of the thread (a tid can be reused).
    pub id: u64,
    /// Keeps its own rows (else: folded into the process's row).
    pub keep: bool,
}

#[derive(Clone, Copy, Debug)]
struct Kept {
    tid: u32,
    id: u64,
    weight: u64,
}

/// The policy and its decisions so far (see the module comment).
#[derive(Debug)]
pub struct ExitedThreads {
    keep: usize,
    /// pid -> the exited threads that keep their rows (at most `keep`).
    kept: HashMap<u32, Vec<Kept>>,
    /// Decisions the follower has not taken yet.
    verdicts: Vec<Verdict>,
    /// pid -> exited threads folded so far.
    folded: BTreeMap<u32, u64>,
    next_id: u64,
}

impl Default for ExitedThreads {
    fn default() -> Self {
        ExitedThreads::new(KEEP_PER_PROCESS)
    }
}

impl ExitedThreads {
    /// Drops the decisions about these processes (`Collector::forget`).
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.kept.retain(|pid, _| !pids.contains(pid));
        self.folded.retain(|pid, _| !pids.contains(pid));
    }

    pub fn new(keep: usize) -> Self {
        ExitedThreads { keep, kept: HashMap::new(), verdicts: Vec::new(), folded: BTreeMap::new(), next_id: 1 }
    }

    /// Thread `tid` of `pid` exited, with `weight` (its wall time in the
    /// window). Returns its verdict and, when keeping it pushed a lighter
    /// kept thread out, that thread's (now folded) verdict. Both are also
    /// queued for the follower.
    pub fn exited(&mut self, pid: u32, tid: u32, weight: u64) -> (Verdict, Option<Verdict>) {
        let id = self.next_id;
        self.next_id += 1;
        let kept = self.kept.entry(pid).or_default();
        let mut verdict = Verdict { pid, tid, id, keep: true };
        let mut evicted = None;
        if kept.len() < self.keep {
            kept.push(Kept { tid, id, weight });
        } else {
            // The lightest kept thread (the oldest on a tie) gives way to a heavier one.
            let lightest = kept.iter().enumerate().min_by_key(|(_, k)| (k.weight, k.id)).map(|(i, k)| (i, *k));
            match lightest {
                Some((i, k)) if k.weight < weight => {
                    kept[i] = Kept { tid, id, weight };
                    evicted = Some(Verdict { pid, tid: k.tid, id: k.id, keep: false });
                }
                _ => verdict.keep = false,
            }
        }
        if !verdict.keep || evicted.is_some() {
            *self.folded.entry(pid).or_default() += 1;
        }
        self.verdicts.push(verdict);
        self.verdicts.extend(evicted);
        (verdict, evicted)
    }

    /// A thread of `pid` folded without a verdict (its exit was seen by
    /// the follower only: the leader missed it). Counted like the others.
    pub fn folded_unseen(&mut self, pid: u32) {
        *self.folded.entry(pid).or_default() += 1;
    }

    /// The decisions made since the last call, in order.
    pub fn take_verdicts(&mut self) -> Vec<Verdict> {
        std::mem::take(&mut self.verdicts)
    }

    /// Exited threads of `pid` folded into its summed row so far.
    pub fn folded(&self, pid: u32) -> u64 {
        self.folded.get(&pid).copied().unwrap_or(0)
    }

    /// What the recording should say about folded threads, if any were.
    pub fn note(&self) -> Option<String> {
        let threads: u64 = self.folded.values().sum();
        if threads == 0 {
            return None;
        }
        let processes = self.folded.len();
        Some(format!(
            "{threads} exited thread{} of {processes} process{} summed into one row per process (tid 0, `aggregated_threads`; their stacks too); the {} exited threads of each process with the most wall time (syscall time with --no-sched) keep their own rows",
            if threads == 1 { "" } else { "s" },
            if processes == 1 { "" } else { "es" },
            self.keep
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_heaviest_and_folds_the_rest() {
        let mut x = ExitedThreads::new(2);
        assert!(x.exited(1, 10, 100).0.keep);
        assert!(x.exited(1, 11, 50).0.keep);
        // Lighter than both kept threads: folded at once.
        let (v, e) = x.exited(1, 12, 10);
        assert!(!v.keep && e.is_none());
        // Heavier than the lightest kept (tid 11): kept, 11 folded.
        let (v, e) = x.exited(1, 13, 70);
        assert!(v.keep);
        assert_eq!(e.map(|e| (e.tid, e.keep)), Some((11, false)));
        // Another process has its own quota.
        assert!(x.exited(2, 20, 1).0.keep);
        assert_eq!((x.folded(1), x.folded(2)), (2, 0));
        let v = x.take_verdicts();
        assert_eq!(v.iter().map(|v| (v.tid, v.keep)).collect::<Vec<_>>(), [(10, true), (11, true), (12, false), (13, true), (11, false), (20, true)]);
        assert!(x.take_verdicts().is_empty());
        assert!(x.note().is_some_and(|n| n.starts_with("2 exited threads of 1 process summed")));
    }

    #[test]
    fn a_reused_tid_is_another_life() {
        let mut x = ExitedThreads::new(2);
        let (a, _) = x.exited(1, 10, 5);
        let (b, _) = x.exited(1, 10, 7);
        assert!(a.keep && b.keep && a.id != b.id);
    }

    #[test]
    fn no_note_when_nothing_was_folded() {
        let mut x = ExitedThreads::new(2);
        x.exited(1, 10, 5);
        assert_eq!(x.note(), None);
    }
}
