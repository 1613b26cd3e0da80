//! Bounded walks over a target's memory. Every linked structure read out
//! of a process (interpreter and thread-state lists, frame chains, asyncio
//! task lists and coroutine chains) is walked through a [`Walk`]: at most
//! so many VISITED nodes (kept or skipped), at most so long (a deadline of
//! its own and the deadline of the whole operation, e.g. one `dump`), and
//! never the same address twice. Hostile or corrupted memory (a `next`
//! pointing at itself, a buffer whose every word holds its own address)
//! then stops the walk at once with a [`Stopped`] that says why, which the
//! caller turns into one note; what was read before is kept.

use std::{
    collections::HashSet,
    fmt,
    time::{Duration, Instant},
};

/// How long one walk may take.
pub(super) const WALK_TIME: Duration = Duration::from_millis(200);

/// Why a walk stopped before the end of its structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trip {
    /// The node at this address was visited already.
    Cycle(u64),
    /// More nodes than the bound.
    TooMany(usize),
    /// Not done before its deadline.
    Timeout,
}

/// A walk that tripped a bound, after `after` nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub trip: Trip,
    pub after: usize,
}

impl Stopped {
    /// `what` (e.g. "thread list of pid 12") and why it stopped, one line.
    pub fn describe(&self, what: impl fmt::Display) -> String {
        let n = self.after;
        match self.trip {
            Trip::Cycle(at) => format!("{what}: cycle at {at:#x}, stopped after {n} nodes"),
            Trip::TooMany(max) => format!("{what}: more than {max} nodes, stopped after {n} nodes"),
            Trip::Timeout => format!("{what}: not done in time, stopped after {n} nodes"),
        }
    }
}

/// The bounds of one walk and what it visited so far.
pub struct Walk {
    seen: HashSet<u64>,
    max: usize,
    deadline: Instant,
}

impl Walk {
    /// At most `max` nodes, until `time` from now or `overall` (the
    /// deadline of the whole operation), whichever comes first.
    pub fn new(max: usize, time: Duration, overall: Option<Instant>) -> Walk {
        let own = Instant::now() + time;
        Walk { seen: HashSet::new(), max, deadline: overall.map_or(own, |o| o.min(own)) }
    }

    /// Visits the node at `addr`: an error when it was visited already,
    /// is one too many, or the time is up.
    pub fn visit(&mut self, addr: u64) -> Result<(), Stopped> {
        let after = self.seen.len();
        if self.seen.contains(&addr) {
            return Err(Stopped { trip: Trip::Cycle(addr), after });
        }
        if after >= self.max {
            return Err(Stopped { trip: Trip::TooMany(self.max), after });
        }
        if Instant::now() >= self.deadline {
            return Err(Stopped { trip: Trip::Timeout, after });
        }
        self.seen.insert(addr);
        Ok(())
    }

    /// Nodes visited so far.
    pub fn visited(&self) -> usize {
        self.seen.len()
    }
}

/// Follows a singly linked chain from `first` while `next` gives a non-zero
/// address: the nodes in order, and why the walk stopped early, if it did.
/// An error of `next` ends the chain (it is returned with what was read).
pub fn chain<E>(
    first: u64,
    walk: &mut Walk,
    mut next: impl FnMut(u64) -> Result<u64, E>,
) -> (Vec<u64>, Option<Stopped>, Option<E>) {
    let mut out = Vec::new();
    let mut node = first;
    while node != 0 {
        if let Err(s) = walk.visit(node) {
            return (out, Some(s), None);
        }
        out.push(node);
        node = match next(node) {
            Ok(n) => n,
            Err(e) => return (out, None, Some(e)),
        };
    }
    (out, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fake process memory: address -> u64.
    struct Fake(HashMap<u64, u64>);

    impl Fake {
        fn next(&self, addr: u64) -> Result<u64, String> {
            self.0.get(&(addr + 8)).copied().ok_or_else(|| format!("unmapped {addr:#x}"))
        }
    }

    fn long() -> Walk {
        Walk::new(1 << 20, Duration::from_secs(60), None)
    }

    #[test]
    fn a_node_pointing_at_itself_stops_at_once() {
        let m = Fake(HashMap::from([(0x1008, 0x2000), (0x2008, 0x2000)]));
        let (nodes, stopped, err) = chain(0x1000, &mut long(), |a| m.next(a));
        assert_eq!(nodes, [0x1000, 0x2000]);
        assert_eq!(stopped, Some(Stopped { trip: Trip::Cycle(0x2000), after: 2 }));
        assert!(err.is_none());
        assert_eq!(stopped.unwrap().describe("thread list of pid 7"), "thread list of pid 7: cycle at 0x2000, stopped after 2 nodes");
    }

    #[test]
    fn a_longer_cycle_is_found() {
        // 1 -> 2 -> 3 -> 4 -> 2
        let m = Fake((1..=4u64).map(|i| (i * 0x100 + 8, if i == 4 { 0x200 } else { (i + 1) * 0x100 })).collect());
        let (nodes, stopped, _) = chain(0x100, &mut long(), |a| m.next(a));
        assert_eq!(nodes, [0x100, 0x200, 0x300, 0x400]);
        assert_eq!(stopped.map(|s| s.trip), Some(Trip::Cycle(0x200)));
    }

    /// A buffer whose every word holds its own address: a chain of
    /// distinct nodes as long as the buffer, stopped by the node bound.
    #[test]
    fn a_self_addressed_buffer_stops_at_the_node_bound() {
        let base = 0x10_0000u64;
        let m = Fake((0..100_000u64).map(|i| (base + 8 * i, base + 8 * i)).collect());
        let mut w = Walk::new(1000, Duration::from_secs(60), None);
        let (nodes, stopped, _) = chain(base, &mut w, |a| m.next(a));
        assert_eq!(nodes.len(), 1000);
        assert_eq!(stopped, Some(Stopped { trip: Trip::TooMany(1000), after: 1000 }));
        assert_eq!(w.visited(), 1000);
    }

    #[test]
    fn the_deadline_stops_a_walk() {
        let m = Fake((0..10_000_000u64).step_by(8).map(|a| (a + 8, a + 8)).collect());
        let mut w = Walk::new(usize::MAX, Duration::from_millis(20), None);
        let t = Instant::now();
        let (_, stopped, _) = chain(8, &mut w, |a| {
            std::thread::sleep(Duration::from_micros(100));
            m.next(a)
        });
        assert_eq!(stopped.map(|s| s.trip), Some(Trip::Timeout));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // The overall deadline, already past, stops the next walk at its first node.
        let mut w = Walk::new(10, Duration::from_secs(60), Some(Instant::now()));
        assert_eq!(w.visit(8), Err(Stopped { trip: Trip::Timeout, after: 0 }));
    }

    #[test]
    fn a_clean_list_ends_at_null_or_an_unreadable_node() {
        let m = Fake(HashMap::from([(0x108, 0x200), (0x208, 0)]));
        let (nodes, stopped, err) = chain(0x100, &mut long(), |a| m.next(a));
        assert_eq!((nodes, stopped, err), (vec![0x100, 0x200], None, None));
        let m = Fake(HashMap::from([(0x108, 0x200)]));
        let (nodes, stopped, err) = chain(0x100, &mut long(), |a| m.next(a));
        assert_eq!((nodes, stopped), (vec![0x100, 0x200], None));
        assert!(err.is_some());
    }
}
