//! Releasing many kernel attachments at once: each release (closing a
//! uprobe link or perf event) waits for the kernel's synchronizations, tens
//! to hundreds of ms, so they are dropped from several threads together
//! (the kernel lets waits of concurrent releases overlap where it can), and
//! the wait is shown on stderr when it takes more than a second. Returns
//! only when every one is released: nothing is left attached after the
//! tracer exits.

use std::{
    io::{IsTerminal, Write},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

/// At most this many threads release at once.
const MAX_THREADS: usize = 32;
/// Progress is shown once releasing has taken this long.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// What [`release_all`] did.
#[derive(Clone, Copy, Debug)]
pub struct Released {
    pub count: usize,
    pub elapsed: Duration,
    /// Whether progress was printed.
    pub shown: bool,
}

/// Drops every item of `items` (links, descriptors) from up to 32 threads
/// and waits for all of them. Unless `quiet`, after a second a line on
/// stderr says `infertrace: detaching WHAT: N/M released` (rewritten in
/// place on a terminal, every 5 s otherwise), and a last one how long it
/// took. If a thread cannot be started, the rest is dropped here.
pub fn release_all<T: Send>(items: Vec<T>, what: &str, quiet: bool) -> Released {
    let start = Instant::now();
    let count = items.len();
    if count == 0 {
        return Released { count, elapsed: start.elapsed(), shown: false };
    }
    let queue = Mutex::new(items);
    let done = AtomicUsize::new(0);
    let work = || loop {
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let Some(item) = next else { break };
        drop(item);
        done.fetch_add(1, Ordering::Relaxed);
    };
    let mut progress = Progress::new(what, count, quiet);
    std::thread::scope(|s| {
        let mut started = 0;
        for _ in 0..count.min(MAX_THREADS) {
            if std::thread::Builder::new().name("infertrace-detach".into()).spawn_scoped(s, work).is_err() {
                break;
            }
            started += 1;
        }
        if started == 0 {
            work();
        }
        while done.load(Ordering::Relaxed) < count {
            std::thread::sleep(Duration::from_millis(10));
            progress.show(done.load(Ordering::Relaxed), start.elapsed());
        }
    });
    let elapsed = start.elapsed();
    progress.finish(elapsed);
    Released { count, elapsed, shown: progress.shown }
}

struct Progress<'a> {
    what: &'a str,
    total: usize,
    enabled: bool,
    tty: bool,
    last: Option<Instant>,
    shown: bool,
}

impl<'a> Progress<'a> {
    fn new(what: &'a str, total: usize, quiet: bool) -> Self {
        Progress { what, total, enabled: !quiet, tty: std::io::stderr().is_terminal(), last: None, shown: false }
    }

    fn show(&mut self, done: usize, elapsed: Duration) {
        if !self.enabled || elapsed < SHOW_AFTER {
            return;
        }
        let every = if self.tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        self.shown = true;
        let line = format!("infertrace: detaching {}: {done}/{} released ({:.1} s)", self.what, self.total, elapsed.as_secs_f64());
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
        let _ = err.flush();
    }

    fn finish(&mut self, elapsed: Duration) {
        if !self.shown {
            return;
        }
        let line = format!("infertrace: detached {} {} in {:.1} s", self.total, self.what, elapsed.as_secs_f64());
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { writeln!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Counts drops, and the most drops in progress at once.
    #[derive(Default)]
    struct Tally {
        dropped: AtomicUsize,
        running: AtomicUsize,
        most: AtomicUsize,
    }

    struct Slow(Arc<Tally>);
    impl Drop for Slow {
        fn drop(&mut self) {
            let now = self.0.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.0.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            self.0.running.fetch_sub(1, Ordering::SeqCst);
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn releases_everything_from_several_threads() {
        let tally = Arc::new(Tally::default());
        let items: Vec<Slow> = (0..40).map(|_| Slow(tally.clone())).collect();
        let r = release_all(items, "test items", true);
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 40);
        assert_eq!(tally.running.load(Ordering::SeqCst), 0);
        assert!(tally.most.load(Ordering::SeqCst) > 1, "released one at a time");
        assert_eq!(r.count, 40);
        assert!(!r.shown);
    }

    struct Sleepy(Duration);
    impl Drop for Sleepy {
        fn drop(&mut self) {
            std::thread::sleep(self.0);
        }
    }

    #[test]
    fn progress_past_a_second_unless_quiet() {
        let slow = || vec![Sleepy(Duration::from_millis(1300)), Sleepy(Duration::from_millis(10))];
        let r = release_all(slow(), "slow test items", false);
        assert!(r.elapsed >= SHOW_AFTER);
        assert!(r.shown, "no progress after {:?}", r.elapsed);
        assert!(!release_all(slow(), "slow test items", true).shown);
        assert!(!release_all(vec![Sleepy(Duration::from_millis(10))], "quick test items", false).shown);
    }

    #[test]
    fn nothing_to_release() {
        let r = release_all(Vec::<Slow>::new(), "nothing", false);
        assert_eq!(r.count, 0);
        assert!(!r.shown);
    }
}
