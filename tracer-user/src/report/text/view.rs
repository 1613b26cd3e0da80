//! How much the text report shows. By default a compact view that fits a
//! short run on two screens: the sections of the processes that hold most
//! of the thread time (at most [`MAX_PROCESSES`]), the top rows of each
//! table, the hottest stacks, and the notes a user acts on. `--verbose`
//! shows every process, row, stack, histogram and detail; the JSON report
//! always has everything.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    recording::Recording,
    report::rows::SyscallRow,
};

/// Processes with sections of their own in the compact view.
pub const MAX_PROCESSES: usize = 3;
/// A process below this share of the busiest one's thread time is left
/// out of the compact view's per-process sections.
pub(crate) const MIN_SHARE_OF_FIRST: f64 = 0.05;

/// Rows and stacks per section: compact, verbose (`usize::MAX`: all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Syscall rows per process table.
    pub syscalls: usize,
    /// Thread rows per process in the wall-time section.
    pub threads: usize,
    /// On-CPU stacks.
    pub cpu_stacks: usize,
    /// Stacks per off-CPU, GIL and slow-syscall section.
    pub wait_stacks: usize,
    /// Off-CPU, GIL and slow-syscall stack sections (the largest first).
    pub wait_sections: usize,
    /// Frames shown per stack.
    pub depth: usize,
    /// Stacks under this share of their section are not shown (but the
    /// first).
    pub stack_min_share: f64,
    /// Python functions per ranking.
    pub functions: usize,
    /// Python rankings besides on-CPU (the largest first).
    pub wait_rankings: usize,
    /// Notes printed (after the details are left out).
    pub notes: usize,
    /// Lines per process in the resident-growth-by-line table.
    pub memory_lines: usize,
    /// Processes in the resident-memory section.
    pub memory_processes: usize,
    /// Processes with a tracer-overhead line of their own.
    pub overhead_rows: usize,
    /// Verdict rows: processes with at least this share of the first's
    /// thread time.
    pub verdict_min_share: f64,
}

const COMPACT: Limits = Limits {
    syscalls: 8,
    threads: 5,
    cpu_stacks: 3,
    wait_stacks: 1,
    wait_sections: 2,
    depth: 6,
    stack_min_share: 0.02,
    functions: 5,
    wait_rankings: 1,
    notes: 8,
    memory_lines: 3,
    memory_processes: 2,
    overhead_rows: 2,
    verdict_min_share: MIN_SHARE_OF_FIRST,
};

const VERBOSE: Limits = Limits {
    syscalls: usize::MAX,
    threads: usize::MAX,
    cpu_stacks: 5,
    wait_stacks: 5,
    wait_sections: usize::MAX,
    depth: 12,
    stack_min_share: 0.0,
    functions: 10,
    wait_rankings: usize::MAX,
    notes: usize::MAX,
    memory_lines: 10,
    memory_processes: 5,
    overhead_rows: 5,
    verdict_min_share: crate::report::verdict::PROCESS_MIN_SHARE,
};

/// What one rendering of the text report shows.
#[derive(Clone, Debug)]
pub struct View {
    pub verbose: bool,
    pub limits: Limits,
    /// The processes with sections of their own; `None`: all.
    shown: Option<BTreeSet<u32>>,
    /// Compact view: each member of a worker group whose busiest member is
    /// shown -> that member (it stands for them in stacks and functions).
    stands_for: BTreeMap<u32, u32>,
    /// Compact view: group size by the member that stands for it.
    group_size: BTreeMap<u32, usize>,
    /// Compact view: the threads the verdict left out (parked, helpers),
    /// (pid, tid): not in the rows and stacks.
    quiet: BTreeSet<(u32, u32)>,
    /// Compact view: processes left out of the per-process sections.
    left_out: usize,
}

impl View {
    /// Everything (`--verbose`).
    pub fn verbose() -> Self {
        Self { verbose: true, limits: VERBOSE, shown: None, stands_for: BTreeMap::new(), group_size: BTreeMap::new(), quiet: BTreeSet::new(), left_out: 0 }
    }

    /// The compact default for `rec`: its busiest processes by thread time
    /// (by syscall time where the scheduler was not traced); of a group of
    /// worker processes (`groups`: their pids, from the verdict), only the
    /// busiest member, which stands for the others.
    pub fn compact(rec: &Recording, rows: &BTreeMap<u32, Vec<SyscallRow>>, groups: &[Vec<u32>]) -> Self {
        let mut busy: BTreeMap<u32, u64> = BTreeMap::new();
        for t in &rec.threads {
            let e = busy.entry(t.pid).or_default();
            *e = e.saturating_add(t.wall_ns);
        }
        if busy.is_empty() {
            for (pid, r) in rows {
                busy.insert(*pid, r.iter().fold(0u64, |a, r| a.saturating_add(r.total_ns)));
            }
        }
        let all: BTreeSet<u32> = rec.targets.iter().map(|t| t.pid).chain(busy.keys().copied()).collect();
        let mut ranked: Vec<(u32, u64)> = busy.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        // A group's members after its busiest: not candidates.
        let mut first_of: BTreeMap<usize, u32> = BTreeMap::new();
        ranked.retain(|(pid, _)| match groups.iter().position(|g| g.contains(pid)) {
            Some(g) => match first_of.entry(g) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(*pid);
                    true
                }
                std::collections::btree_map::Entry::Occupied(_) => false,
            },
            None => true,
        });
        let first = ranked.first().map_or(0, |r| r.1);
        let shown: BTreeSet<u32> = ranked
            .iter()
            .take(MAX_PROCESSES)
            .filter(|(_, ns)| first == 0 || *ns as f64 >= first as f64 * MIN_SHARE_OF_FIRST)
            .map(|(pid, _)| *pid)
            .collect();
        // A recording with no time at all (nothing ran): show what there is.
        let shown = if shown.is_empty() { all.clone() } else { shown };
        let mut stands_for = BTreeMap::new();
        let mut group_size = BTreeMap::new();
        for (g, first) in &first_of {
            if shown.contains(first) {
                stands_for.extend(groups[*g].iter().map(|m| (*m, *first)));
                group_size.insert(*first, groups[*g].len());
            }
        }
        let left_out = all.difference(&shown).count();
        Self { verbose: false, limits: COMPACT, shown: Some(shown), stands_for, group_size, quiet: BTreeSet::new(), left_out }
    }

    /// Whether process `pid` gets its own sections.
    pub fn shows(&self, pid: u32) -> bool {
        self.shown.as_ref().is_none_or(|s| s.contains(&pid))
    }

    /// Leaves these threads (pid, tid) out of the rows and stacks: those
    /// the verdict left out (compact view).
    pub fn quieten(mut self, threads: impl IntoIterator<Item = (u32, u32)>) -> Self {
        if !self.verbose {
            self.quiet.extend(threads);
        }
        self
    }

    /// Whether thread `tid` of `pid` is left out (compact view).
    pub fn is_quiet(&self, pid: u32, tid: u32) -> bool {
        self.quiet.contains(&(pid, tid))
    }

    /// The process whose stacks and functions `pid`'s count with: the
    /// member shown for its worker group, else itself; `None` when
    /// neither is shown.
    pub fn counted_as(&self, pid: u32) -> Option<u32> {
        let p = self.stands_for.get(&pid).copied().unwrap_or(pid);
        self.shows(p).then_some(p)
    }

    /// The size of the worker group `pid` stands for (compact view).
    pub fn group_of(&self, pid: u32) -> Option<usize> {
        self.group_size.get(&pid).copied().filter(|n| *n > 1)
    }

    /// How a shown process is named: `pid N`, or for the member that
    /// stands for a worker group `pid N and 27 workers like it`.
    pub fn name(&self, pid: u32) -> String {
        match self.group_of(pid) {
            Some(2) => format!("pid {pid} and 1 more worker like it"),
            Some(n) => format!("pid {pid} and {} more workers like it", n - 1),
            None => format!("pid {pid}"),
        }
    }

    /// Processes left out of the per-process sections.
    pub fn left_out(&self) -> usize {
        self.left_out
    }
}

/// Keeps the `n` items with the largest `size` (ties: the earlier), in
/// their order.
pub fn keep_largest<T>(items: &mut Vec<T>, n: usize, size: impl Fn(&T) -> u64) {
    if items.len() <= n {
        return;
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(size(&items[i])), i));
    let keep: BTreeSet<usize> = order.into_iter().take(n).collect();
    let mut i = 0;
    items.retain(|_| {
        i += 1;
        keep.contains(&(i - 1))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::ThreadTimes;

    fn thread(pid: u32, wall_ns: u64) -> ThreadTimes {
        ThreadTimes {
            pid,
            tid: pid,
            comm: "t".into(),
            wall_ns,
            on_cpu_ns: wall_ns,
            syscall_ns: 0,
            off_cpu: Default::default(),
            runqueue_ns: 0,
            aggregated_threads: 0,
        }
    }

    #[test]
    fn keeps_the_largest_in_order() {
        let mut v = vec![("a", 5), ("b", 9), ("c", 1), ("d", 9), ("e", 7)];
        keep_largest(&mut v, 3, |x| x.1);
        assert_eq!(v, [("b", 9), ("d", 9), ("e", 7)]);
        keep_largest(&mut v, 5, |x| x.1);
        assert_eq!(v.len(), 3);
    }

    #[test]
    fn compact_shows_the_busiest_processes() {
        let mut rec = crate::recording::tests::sample();
        rec.threads = vec![thread(1, 1000), thread(2, 40), thread(3, 900), thread(4, 800), thread(5, 700), thread(6, 60)];
        let v = View::compact(&rec, &BTreeMap::new(), &[]);
        assert!(v.shows(1) && v.shows(3) && v.shows(4), "{v:?}");
        assert!(!v.shows(5) && !v.shows(2) && !v.shows(6), "{v:?}");
        assert!(v.left_out() >= 3, "{v:?}");
        // Under 5% of the busiest: left out even when there is room.
        rec.threads = vec![thread(1, 1000), thread(2, 40), thread(6, 60)];
        let v = View::compact(&rec, &BTreeMap::new(), &[]);
        assert!(v.shows(1) && v.shows(6) && !v.shows(2), "{v:?}");
        // Workers 3, 4, 5 of one group: the busiest stands for them.
        rec.threads = vec![thread(1, 1000), thread(3, 900), thread(4, 950), thread(5, 700), thread(6, 60)];
        let v = View::compact(&rec, &BTreeMap::new(), &[vec![3, 4, 5]]);
        assert!(v.shows(1) && v.shows(4) && v.shows(6), "{v:?}");
        assert!(!v.shows(3) && !v.shows(5), "{v:?}");
        assert_eq!((v.counted_as(3), v.counted_as(5), v.counted_as(1), v.counted_as(2)), (Some(4), Some(4), Some(1), None));
        assert_eq!((v.name(4).as_str(), v.name(1).as_str()), ("pid 4 and 2 more workers like it", "pid 1"));
        let all = View::verbose();
        assert!(all.shows(2) && all.left_out() == 0);
    }
}
