//! The calibration, kept per boot (`crate::os::boot_cache`:
//! `/run/infertrace/calibration.json`), used again while the boot, the
//! kernel release and the tracer's version are the same. A calibration
//! takes about a third of a second of the tracer's start-up
//! (docs/overhead.md); the costs it measures belong to the machine and its
//! kernel, not to a run. Only a complete calibration (every cost measured)
//! is kept. `INFERTRACE_RECALIBRATE=1` calibrates anew (and keeps the new
//! one).

use crate::{os::boot_cache, recording::overhead::Calibration};

const NAME: &str = "calibration";
/// Set to calibrate anew whatever is kept.
pub const RECALIBRATE_ENV: &str = "INFERTRACE_RECALIBRATE";

/// The calibration kept for this boot, kernel and version, if any.
pub fn load() -> Option<Calibration> {
    if std::env::var_os(RECALIBRATE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    boot_cache::load(NAME).and_then(usable)
}

/// A kept calibration, marked so, when complete.
fn usable(c: Calibration) -> Option<Calibration> {
    let complete = c.uprobe_ns > 0.0 && c.syscall_tracepoints_ns > 0.0 && c.uretprobe_ns >= 0.0;
    complete.then_some(Calibration { cached: true, ..c })
}

/// Keeps `c` for the next runs on this boot (a complete calibration only).
pub fn store(c: &Calibration) {
    if c.uprobe_ns <= 0.0 || c.syscall_tracepoints_ns <= 0.0 || c.cached {
        return;
    }
    boot_cache::store(NAME, c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_complete_calibration_is_used() {
        let c = Calibration { uprobe_ns: 1500.0, uretprobe_ns: 900.0, syscall_tracepoints_ns: 120.0, took_ms: 330.0, cached: false };
        assert_eq!(usable(c.clone()), Some(Calibration { cached: true, ..c.clone() }));
        assert_eq!(usable(Calibration { uprobe_ns: 0.0, ..c.clone() }), None);
        assert_eq!(usable(Calibration { syscall_tracepoints_ns: 0.0, ..c }), None);
    }
}
