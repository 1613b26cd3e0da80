//! An event loop's iterations from its selector calls (the kernel's
//! `SelectorEvent`s of one thread, in order): idle from entering
//! `epoll_wait` to its return, busy from the return to the next call. A
//! busy stretch is split by the thread's CPU time and run-queue wait read
//! at both ends (the rest: blocked off CPU), and one whose own time (busy
//! minus run-queue wait, which other processes cause) exceeds the
//! threshold is kept as a long step, to be named from the samples.

use tracer_common::asyncio::{SelectorEvent, KIND_ENTER, KIND_EXIT};

/// A busy stretch longer than the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongStep {
    pub start_ns: u64,
    pub end_ns: u64,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub blocked_ns: u64,
}

/// Log-scale histogram of busy stretches: 8 buckets per power of two.
const SUB: u32 = 8;
const BUCKETS: usize = 64 * SUB as usize;

fn bucket(ns: u64) -> usize {
    if ns < u64::from(SUB) {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros();
    let mant = ((ns >> (exp - 3)) & u64::from(SUB - 1)) as u32;
    ((exp - 2) * SUB + mant) as usize
}

/// The upper bound of a bucket (what a percentile reports).
fn bucket_ceiling(b: usize) -> u64 {
    let b = b as u32;
    if b < SUB {
        return u64::from(b);
    }
    let exp = b / SUB + 2;
    let mant = u64::from(b % SUB);
    ((SUB as u64 + mant + 1) << (exp - 3)).saturating_sub(1)
}

#[derive(Clone, Debug)]
pub struct LoopIterations {
    pub first_ns: u64,
    pub last_ns: u64,
    /// (ts, cpu, run delay) at the last selector return, while busy.
    busy_since: Option<(u64, u64, u64)>,
    /// ts of the last selector entry, while idle.
    idle_since: Option<u64>,
    pub iterations: u64,
    pub busy_ns: u64,
    pub idle_ns: u64,
    pub busy_on_cpu_ns: u64,
    pub busy_runqueue_ns: u64,
    pub busy_blocked_ns: u64,
    busy_sq: u128,
    pub busy_max_ns: u64,
    hist: Vec<u64>,
    /// Long steps not yet named.
    pub pending: Vec<LongStep>,
}

impl LoopIterations {
    pub fn new(first_ns: u64) -> Self {
        LoopIterations {
            first_ns,
            last_ns: first_ns,
            busy_since: None,
            idle_since: None,
            iterations: 0,
            busy_ns: 0,
            idle_ns: 0,
            busy_on_cpu_ns: 0,
            busy_runqueue_ns: 0,
            busy_blocked_ns: 0,
            busy_sq: 0,
            busy_max_ns: 0,
            hist: vec![0; BUCKETS],
            pending: Vec::new(),
        }
    }

    /// Takes the thread's next selector event.
    pub fn event(&mut self, e: &SelectorEvent, threshold_ns: u64) {
        self.last_ns = self.last_ns.max(e.ts_ns);
        match e.kind {
            KIND_ENTER => {
                if let Some((t0, c0, r0)) = self.busy_since.take() {
                    let d = e.ts_ns.saturating_sub(t0);
                    let on_cpu = if e.cpu_ns != 0 && c0 != 0 { e.cpu_ns.saturating_sub(c0).min(d) } else { 0 };
                    let rq = if e.run_delay_ns != 0 || r0 != 0 { e.run_delay_ns.saturating_sub(r0).min(d - on_cpu) } else { 0 };
                    let blocked = d - on_cpu - rq;
                    self.busy_ns += d;
                    self.busy_on_cpu_ns += on_cpu;
                    self.busy_runqueue_ns += rq;
                    self.busy_blocked_ns += blocked;
                    self.busy_sq += u128::from(d) * u128::from(d);
                    self.busy_max_ns = self.busy_max_ns.max(d);
                    self.hist[bucket(d).min(BUCKETS - 1)] += 1;
                    if d - rq > threshold_ns {
                        self.pending.push(LongStep { start_ns: t0, end_ns: e.ts_ns, on_cpu_ns: on_cpu, runqueue_ns: rq, blocked_ns: blocked });
                    }
                }
                self.idle_since = Some(e.ts_ns);
            }
            KIND_EXIT => {
                if let Some(t0) = self.idle_since.take() {
                    self.idle_ns += e.ts_ns.saturating_sub(t0);
                    self.iterations += 1;
                }
                self.busy_since = Some((e.ts_ns, e.cpu_ns, e.run_delay_ns));
            }
            _ => {}
        }
    }

    /// Mean lag over `wall_ns`: sum(busy^2) / (2 wall).
    pub fn lag_mean_ns(&self, wall_ns: u64) -> u64 {
        if wall_ns == 0 {
            return 0;
        }
        (self.busy_sq / (2 * u128::from(wall_ns))).min(u128::from(u64::MAX)) as u64
    }

    /// The `q` quantile (0..1) of busy stretches (bucket ceiling, at most the max).
    pub fn busy_quantile(&self, q: f64) -> u64 {
        let n: u64 = self.hist.iter().sum();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, c) in self.hist.iter().enumerate() {
            seen += c;
            if seen >= want {
                return bucket_ceiling(b).min(self.busy_max_ns);
            }
        }
        self.busy_max_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u32, ts: u64, cpu: u64, rd: u64) -> SelectorEvent {
        SelectorEvent { ts_ns: ts, cpu_ns: cpu, run_delay_ns: rd, ret: 0, pid: 1, tid: 1, kind, nr: 232 }
    }

    #[test]
    fn iterations_split_busy_and_idle_and_keep_long_steps() {
        let mut it = LoopIterations::new(0);
        let ms = 1_000_000;
        it.event(&ev(KIND_ENTER, 0, 1, 1), 20 * ms);
        it.event(&ev(KIND_EXIT, 10 * ms, 1, 1), 20 * ms);
        // 5 ms busy on CPU
        it.event(&ev(KIND_ENTER, 15 * ms, 1 + 5 * ms, 1), 20 * ms);
        it.event(&ev(KIND_EXIT, 16 * ms, 1 + 5 * ms, 1), 20 * ms);
        // 50 ms busy: 1 ms CPU, 49 blocked: a long step
        it.event(&ev(KIND_ENTER, 66 * ms, 1 + 6 * ms, 1), 20 * ms);
        it.event(&ev(KIND_EXIT, 67 * ms, 1 + 6 * ms, 1), 20 * ms);
        // 30 ms busy, 25 of them on the run queue: not a long step
        it.event(&ev(KIND_ENTER, 97 * ms, 1 + 11 * ms, 1 + 25 * ms), 20 * ms);
        assert_eq!(it.iterations, 3);
        assert_eq!(it.idle_ns, 12 * ms);
        assert_eq!(it.busy_ns, 85 * ms);
        assert_eq!(it.busy_on_cpu_ns, 11 * ms);
        assert_eq!(it.busy_runqueue_ns, 25 * ms);
        assert_eq!(it.busy_blocked_ns, 49 * ms);
        assert_eq!(it.pending, vec![LongStep { start_ns: 16 * ms, end_ns: 66 * ms, on_cpu_ns: ms, runqueue_ns: 0, blocked_ns: 49 * ms }]);
        assert_eq!(it.busy_max_ns, 50 * ms);
        assert_eq!(it.busy_quantile(1.0), 50 * ms);
        let p = it.busy_quantile(0.3);
        assert!((5 * ms..=5 * ms * 9 / 8).contains(&p), "{p}");
    }

    #[test]
    fn buckets_are_monotonic_and_ceilings_cover_them() {
        let mut last = 0;
        for ns in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 123_456, 50_000_000, u64::MAX / 2] {
            let b = bucket(ns);
            assert!(b >= last);
            assert!(bucket_ceiling(b) >= ns, "{ns} -> {b} -> {}", bucket_ceiling(b));
            last = b;
        }
    }
}
