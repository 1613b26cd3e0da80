//! Checkpoints of a running `record`: every `--checkpoint-every` (10 s by
//! default) the recording so far replaces the output, marked cut ([`crate::recording::Cut`]), so a
//! tracer that is killed (SIGKILL, the OOM killer, a crash) leaves its last
//! checkpoint, readable by `report`, instead of nothing (killed before the
//! first one, it leaves the output as it was). The final recording
//! replaces the last checkpoint and is not marked.
//!
//! The session takes the snapshot (it needs the collectors); compressing
//! and writing it happens on a thread of its own, so the event loop is held
//! up only for the snapshot. One checkpoint is written at a time, and the
//! session waits for it ([`Checkpoints::finish`]) before the final write.

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    os::clock,
    recording::{output::Output, Cut, CutReason, Recording, RecordingError},
};

/// `record --checkpoint-every`, as the flag's default text.
pub const DEFAULT_EVERY: &str = "10s";

/// A checkpoint that reached the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The window it holds (`duration_ns` of the recording).
    pub duration_ns: u64,
    /// How long compressing and writing it took.
    pub write_time: Duration,
}

type Job = JoinHandle<Result<Written, RecordingError>>;

/// The checkpoints of one output.
pub struct Checkpoints {
    output: Output,
    in_flight: Option<Job>,
    last: Option<Written>,
    last_error: Option<String>,
}

impl Checkpoints {
    /// `None` when the output cannot be replaced while recording (a device,
    /// a FIFO): it is written once, at the end.
    pub fn new(output: &Output) -> Option<Checkpoints> {
        output.replaceable().then(|| Checkpoints { output: output.clone(), in_flight: None, last: None, last_error: None })
    }

    /// Whether a checkpoint is still being written. Collects a finished
    /// one: a warning to print when it failed (once for the same error).
    pub fn poll(&mut self) -> (bool, Option<String>) {
        match &self.in_flight {
            Some(job) if !job.is_finished() => (true, None),
            Some(_) => (false, self.finish()),
            None => (false, None),
        }
    }

    /// Marks `rec` cut and starts writing it.
    pub fn start(&mut self, mut rec: Recording) -> Option<String> {
        if let Some(warning) = self.finish() {
            return Some(warning);
        }
        rec.cut = Some(Cut { reason: CutReason::Checkpoint, at_unix_ms: clock::unix_ms() });
        let output = self.output.clone();
        let spawned = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
            let t0 = Instant::now();
            output.write(&rec)?;
            Ok(Written { duration_ns: rec.duration_ns, write_time: t0.elapsed() })
        });
        match spawned {
            Ok(job) => {
                self.in_flight = Some(job);
                None
            }
            Err(e) => self.failed(format!("cannot start writing it: {e}")),
        }
    }

    /// Waits for the checkpoint being written, if any; a warning when it failed.
    pub fn finish(&mut self) -> Option<String> {
        let job = self.in_flight.take()?;
        match job.join() {
            Ok(Ok(w)) => {
                self.last = Some(w);
                self.last_error = None;
                None
            }
            Ok(Err(e)) => self.failed(e.to_string()),
            Err(_) => self.failed("its writer panicked".into()),
        }
    }

    /// The last checkpoint that reached the output.
    pub fn last(&self) -> Option<Written> {
        self.last
    }

    fn failed(&mut self, error: String) -> Option<String> {
        if self.last_error.as_deref() == Some(error.as_str()) {
            return None;
        }
        let warning = format!("checkpoint not written to {} ({error}); recording goes on", self.output.path().display());
        self.last_error = Some(error);
        Some(warning)
    }
}

impl Drop for Checkpoints {
    /// A checkpoint is never left half-renamed behind the session's back.
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_marked_cut_and_replaced_by_the_final() {
        let dir = std::env::temp_dir().join(format!("itr-checkpoint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rec.itr");
        let output = Output::prepare(&path).unwrap();
        let mut cps = Checkpoints::new(&output).unwrap();
        assert_eq!(cps.start(crate::recording::tests::sample()), None);
        assert_eq!(cps.finish(), None);
        assert_eq!(cps.last().map(|w| w.duration_ns), Some(1_000_000_000));
        let cut = Recording::read(&path).unwrap().cut.expect("a checkpoint is marked cut");
        assert_eq!(cut.reason, CutReason::Checkpoint);
        assert!(cut.at_unix_ms > 0);
        output.write(&crate::recording::tests::sample()).unwrap();
        assert_eq!(Recording::read(&path).unwrap().cut, None);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "temporary files left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failure_is_said_once() {
        let output = Output::prepare(std::path::Path::new("/nonexistent-dir/x.itr"));
        assert!(output.is_err());
        let dir = std::env::temp_dir().join(format!("itr-checkpoint-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let output = Output::prepare(&dir.join("rec.itr")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut cps = Checkpoints::new(&output).unwrap();
        let _ = cps.start(crate::recording::tests::sample());
        let first = cps.finish().expect("a warning");
        assert!(first.contains("rec.itr") && first.contains("recording goes on"), "{first}");
        let _ = cps.start(crate::recording::tests::sample());
        assert_eq!(cps.finish(), None, "the same error again is not repeated");
        assert_eq!(cps.last(), None);
    }
}
