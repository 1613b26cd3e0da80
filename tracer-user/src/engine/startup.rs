//! Where the tracer's start-up goes: wall and CPU time per phase of
//! [`super::run::Engine::open`] (the context: the kernel object loaded with
//! its maps; each family's programs loaded, verified and attached; the
//! named targets attached: descendants, per-target probes). Written to the
//! recording's details (`report --verbose`, JSON `details`), so a slow
//! start is measured where it happens (docs/overhead.md).

use std::{fmt::Write as _, time::Instant};

use crate::recording::overhead::{StartupCost, StartupPhase};

/// The phases measured so far.
pub struct Startup {
    began: Instant,
    cpu_began: u64,
    mark: (Instant, u64),
    phases: Vec<(&'static str, u64, u64)>,
}

/// The process's CPU time (user + system, every thread), ns.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec.max(0) as u64)
}

impl Startup {
    pub fn begin() -> Startup {
        let now = (Instant::now(), cpu_ns());
        Startup { began: now.0, cpu_began: now.1, mark: now, phases: Vec::new() }
    }

    /// Ends the phase `name` (since the previous one ended).
    pub fn phase(&mut self, name: &'static str) {
        let now = (Instant::now(), cpu_ns());
        let wall = u64::try_from(now.0.duration_since(self.mark.0).as_nanos()).unwrap_or(u64::MAX);
        self.phases.push((name, wall, now.1.saturating_sub(self.mark.1)));
        self.mark = now;
    }

    /// The phases so far, for the recording (`tracer_overhead.startup`).
    pub fn cost(&self) -> StartupCost {
        StartupCost {
            wall_ns: u64::try_from(self.mark.0.duration_since(self.began).as_nanos()).unwrap_or(u64::MAX),
            cpu_ns: self.mark.1.saturating_sub(self.cpu_began),
            phases: self
                .phases
                .iter()
                .map(|(name, wall_ns, cpu_ns)| StartupPhase { phase: (*name).to_string(), wall_ns: *wall_ns, cpu_ns: *cpu_ns })
                .collect(),
        }
    }

    /// `start-up: 212 ms wall, 150 ms CPU (context 40/35 ms, syscalls 4/4 ms, ...)`:
    /// each phase's wall/CPU, phases under 1 ms of both left out.
    pub fn line(&self) -> String {
        line(&self.cost())
    }
}

/// The detail line of a start-up (see [`Startup::line`]).
pub fn line(c: &StartupCost) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut s = format!("start-up (engine open): {:.0} ms wall, {:.0} ms CPU; per phase wall/CPU:", ms(c.wall_ns), ms(c.cpu_ns));
    let mut first = true;
    for p in &c.phases {
        if p.wall_ns < 1_000_000 && p.cpu_ns < 1_000_000 {
            continue;
        }
        let _ = write!(s, "{} {} {:.0}/{:.0} ms", if first { "" } else { "," }, p.phase, ms(p.wall_ns), ms(p.cpu_ns));
        first = false;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_small_ones_are_left_out() {
        let mut s = Startup::begin();
        s.phase("nothing");
        let t = Instant::now();
        while t.elapsed().as_millis() < 5 {}
        s.phase("spin");
        let line = s.line();
        assert!(line.starts_with("start-up (engine open): "), "{line}");
        assert!(line.contains(" spin ") && !line.contains("nothing"), "{line}");
        let c = s.cost();
        assert_eq!(c.phases.iter().map(|p| p.phase.as_str()).collect::<Vec<_>>(), ["nothing", "spin"]);
        assert!(c.phases[1].wall_ns >= 5_000_000 && c.wall_ns >= c.phases.iter().map(|p| p.wall_ns).sum::<u64>());
    }
}
