//! The per-call CUDA events (`CUDA_EVENTS`), drained on a thread of their
//! own every [`DRAIN_EVERY`] while events come ([`DRAIN_IDLE_MAX`] at
//! most while none do) into the [`Replay`], so that nothing else the
//! session does (attaching probes to a new library, symbolizing, resolving
//! Python code objects, another collector's slow poll) can leave the ring
//! buffer full: at 50 000 events/s a 10 ms period needs about 52 KB of the
//! 2 MiB ring, which absorbs a 400 ms stall of the drain thread itself.
//! The collector's own `drain` (every poll, and before a report) empties
//! the ring too, under the same lock, so a report sees every event
//! submitted before it. Items too short to be an event are counted here
//! and reach the sink from the collector's snapshot ([`EventDrain::report`]).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use tracer_common::cuda::{CudaEvent, CudaName};

use super::replay::Replay;
use crate::engine::{ring::Records, Sink};

/// Period of the drain thread while events come.
pub const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// Its longest period: each drain that finds nothing doubles the wait up
/// to this (a target that makes no CUDA call wakes it 20 times a second,
/// not 100); the first drain with events goes back to [`DRAIN_EVERY`]. A
/// burst that starts just after an idle drain waits 50 ms for the next:
/// ~680 KB of the 2 MiB ring (104-byte records at 130 000 events/s, the
/// burst e2e test's rate).
pub const DRAIN_IDLE_MAX: Duration = Duration::from_millis(50);

/// The drain thread's next wait after a drain that took `drained` events.
fn next_wait(wait: Duration, drained: u64) -> Duration {
    if drained > 0 {
        DRAIN_EVERY
    } else {
        (wait * 2).min(DRAIN_IDLE_MAX)
    }
}

struct Shared {
    ring: Records<CudaEvent>,
    /// Kernel handles and their names (`CUDA_NAMES`), into the replay.
    names: Records<CudaName>,
    replay: Replay,
    /// `record --timeline`: a copy of every event, bounded (None: off).
    timeline: Option<crate::engine::Bounded<CudaEvent>>,
}

impl Shared {
    /// Applies every event (and name) in the rings; returns how many.
    fn drain(&mut self) -> u64 {
        let replay = &mut self.replay;
        let names = self.names.drain(|n| replay.add_name(&n));
        let (replay, timeline) = (&mut self.replay, &mut self.timeline);
        names
            + self.ring.drain(|ev| {
                replay.apply(&ev);
                if let Some(t) = timeline.as_mut() {
                    t.push(ev);
                }
            })
    }
}

/// The ring buffer and the replay it feeds, shared with the drain thread.
pub struct EventDrain {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic on the drain thread leaves a usable replay (events are
    // applied one at a time): go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EventDrain {
    /// Starts draining `ring` (the events) and `names` every [`DRAIN_EVERY`].
    pub fn start(ring: RingBuf<MapData>, names: RingBuf<MapData>) -> std::io::Result<Self> {
        let ring = Records::new(ring, "cuda_short_records");
        let names = Records::new(names, "cuda_short_name_records");
        let shared = Arc::new(Mutex::new(Shared { ring, names, replay: Replay::default(), timeline: None }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new().name("infertrace-cuda".into()).spawn(move || {
                let mut wait = DRAIN_EVERY;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(wait);
                    let drained = lock(&shared).drain();
                    wait = next_wait(wait, drained);
                }
            })?
        };
        Ok(EventDrain { shared, stop, thread: Some(thread) })
    }

    /// Keeps a copy of every event from now on, at most `limit` (`record --timeline`).
    pub fn keep_timeline(&self, limit: u64) {
        lock(&self.shared).timeline = Some(crate::engine::Bounded::new(limit));
    }

    /// The events kept for the timeline and how many did not fit (after draining the ring).
    pub fn timeline(&self) -> Option<(Vec<CudaEvent>, u64)> {
        let mut s = lock(&self.shared);
        s.drain();
        s.timeline.as_ref().map(|t| (t.items.clone(), t.dropped))
    }

    /// Sets the count of items too short to be an event in `sink` (drained from the thread, which has no sink).
    pub fn report(&self, sink: &mut Sink) {
        let s = lock(&self.shared);
        s.ring.report(sink);
        s.names.report(sink);
    }

    /// Drains what is in the ring now, then runs `f` on the replay.
    pub fn with<R>(&self, f: impl FnOnce(&mut Replay) -> R) -> R {
        let mut s = lock(&self.shared);
        s.drain();
        f(&mut s.replay)
    }
}

impl Drop for EventDrain {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_ring_is_drained_less_often_and_events_bring_the_period_back() {
        let mut wait = DRAIN_EVERY;
        let mut waits = Vec::new();
        for _ in 0..5 {
            wait = next_wait(wait, 0);
            waits.push(wait.as_millis());
        }
        assert_eq!(waits, [20, 40, 50, 50, 50]);
        assert_eq!(next_wait(DRAIN_IDLE_MAX, 1), DRAIN_EVERY);
    }
}
