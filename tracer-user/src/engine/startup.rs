//! Where the tracer's start-up goes: wall and CPU time per phase of
//! [`super::run::Engine::open`] (the context: the kernel object loaded with
//! its maps; each family's programs loaded, verified and attached; the
//! named targets attached: descendants, per-target probes). Written to the
//! recording's details (`report --verbose`, JSON `details`), so a slow
//! start is measured where it happens (docs/overhead.md).

use std::{fmt::Write as _, time::Instant};

use crate::os::bpf_stats::own_usage;

/// The phases measured so far.
pub struct Startup {
    began: Instant,
    cpu_began: u64,
    mark: (Instant, u64),
    phases: Vec<(&'static str, u64, u64)>,
}

fn cpu_ns() -> u64 {
    let (user, system, _) = own_usage();
    user.saturating_add(system)
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

    /// `start-up: 212 ms wall, 150 ms CPU (context 40/35 ms, syscalls 4/4 ms, ...)`:
    /// each phase's wall/CPU, phases under 1 ms of both left out.
    pub fn line(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let wall = u64::try_from(self.mark.0.duration_since(self.began).as_nanos()).unwrap_or(u64::MAX);
        let mut s = format!(
            "start-up (engine open): {:.0} ms wall, {:.0} ms CPU; per phase wall/CPU:",
            ms(wall),
            ms(self.mark.1.saturating_sub(self.cpu_began))
        );
        let mut first = true;
        for (name, w, c) in &self.phases {
            if *w < 1_000_000 && *c < 1_000_000 {
                continue;
            }
            let _ = write!(s, "{} {name} {:.0}/{:.0} ms", if first { "" } else { "," }, ms(*w), ms(*c));
            first = false;
        }
        s
    }
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
    }
}
