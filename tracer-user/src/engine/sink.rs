//! The one channel for what a recording says besides its data: one-line
//! notes and lost-event counters, from every collector.

use std::collections::BTreeMap;

use crate::recording::Recording;

/// Where a note belongs in the recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// The recording's `notes`.
    General,
    /// The CUDA report's `notes` when the recording has a CUDA report,
    /// else the recording's `notes`.
    Gpu,
    /// The recording's `details`: how the tracer worked (which library was
    /// probed when, interpreter internals), shown in text with `--verbose`.
    Detail,
}

#[derive(Default, Debug)]
pub struct Sink {
    notes: Vec<Note>,
    lost: BTreeMap<String, u64>,
}

#[derive(Debug)]
struct Note {
    topic: Topic,
    /// A note about a state that changes (a count so far) replaces the
    /// earlier note with the same key.
    key: Option<String>,
    text: String,
}

impl Sink {
    /// Adds a note (once: the same note again is dropped).
    pub fn note(&mut self, text: impl Into<String>) {
        self.note_on(Topic::General, text);
    }

    pub fn note_on(&mut self, topic: Topic, text: impl Into<String>) {
        let text = text.into();
        if !self.notes.iter().any(|n| n.topic == topic && n.text == text) {
            self.notes.push(Note { topic, key: None, text });
        }
    }

    /// A detail (`Topic::Detail`), once.
    pub fn detail(&mut self, text: impl Into<String>) {
        self.note_on(Topic::Detail, text);
    }

    /// A note on the state so far, replacing the one with the same `key`.
    pub fn state_note(&mut self, key: impl Into<String>, text: impl Into<String>) {
        self.state_note_on(Topic::General, key, text);
    }

    /// [`Self::state_note`] for a `topic`.
    pub fn state_note_on(&mut self, topic: Topic, key: impl Into<String>, text: impl Into<String>) {
        let (key, text) = (Some(key.into()), text.into());
        match self.notes.iter_mut().find(|n| n.key == key) {
            Some(n) => n.text = text,
            None => self.notes.push(Note { topic, key, text }),
        }
    }

    /// Drops the notes about these processes (those that start `pid N:`,
    /// as every per-process note does, and the state notes keyed by one):
    /// the agent forgets processes gone for a window, and their notes
    /// would otherwise pile up in every later window.
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.notes.retain(|n| {
            let about = note_pid(&n.text).or_else(|| n.key.as_deref().and_then(key_pid));
            !about.is_some_and(|p| pids.contains(&p))
        });
    }

    /// Sets a lost-event counter (the kernel's counters are cumulative).
    pub fn set_lost(&mut self, name: impl Into<String>, n: u64) {
        if n > 0 {
            self.lost.insert(name.into(), n);
        }
    }

    /// Copies the notes and counters into `rec` (which already holds its
    /// CUDA report, if any).
    pub fn fill(&self, rec: &mut Recording) {
        for n in &self.notes {
            match (n.topic, rec.cuda.as_mut()) {
                (Topic::Gpu, Some(cuda)) => cuda.notes.push(n.text.clone()),
                (Topic::Detail, _) => rec.details.push(n.text.clone()),
                _ => rec.notes.push(n.text.clone()),
            }
        }
        rec.lost.extend(self.lost.iter().map(|(k, v)| (k.clone(), *v)));
    }
}

/// The process a note is about: `pid N: ...`.
fn note_pid(text: &str) -> Option<u32> {
    let rest = text.strip_prefix("pid ")?;
    let (n, _) = rest.split_once(':')?;
    n.parse().ok()
}

/// The process a state note's key names: `..._N_I` (`python_unresolved_PID_I`).
fn key_pid(key: &str) -> Option<u32> {
    let mut parts = key.rsplit('_');
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_notes_of_forgotten_processes() {
        let mut sink = Sink::default();
        sink.note("pid 12: CPython 3.11.7, Python stacks attributed");
        sink.note_on(Topic::Gpu, "pid 13: cannot open x");
        sink.note("pid 14: kept");
        sink.note("mounted tracefs");
        sink.state_note("python_unresolved_12_0", "pid 12: 3 frames");
        sink.state_note("exited_threads", "2 exited threads");
        sink.forget(&[12, 13].into_iter().collect());
        let mut rec = crate::recording::tests::sample();
        rec.notes.clear();
        rec.cuda = None;
        sink.fill(&mut rec);
        assert_eq!(rec.notes, ["pid 14: kept", "mounted tracefs", "2 exited threads"]);
    }

    #[test]
    fn notes_once_gpu_notes_follow_the_cuda_report() {
        let mut sink = Sink::default();
        sink.note("a");
        sink.note("a");
        sink.note_on(Topic::Gpu, "g");
        sink.state_note("k", "old");
        sink.state_note("k", "new");
        sink.detail("d");
        sink.state_note_on(Topic::Detail, "dk", "d1");
        sink.state_note_on(Topic::Detail, "dk", "d2");
        sink.set_lost("cuda_lost", 3);
        sink.set_lost("none", 0);
        let mut rec = crate::recording::tests::sample();
        rec.notes.clear();
        rec.lost.clear();
        rec.cuda = None;
        sink.fill(&mut rec);
        assert_eq!(rec.notes, vec!["a".to_owned(), "g".to_owned(), "new".to_owned()]);
        assert_eq!(rec.details, ["d", "d2"]);
        assert_eq!(rec.lost.len(), 1);
        let mut rec2 = crate::recording::tests::sample();
        rec2.notes.clear();
        rec2.cuda = Some(Default::default());
        sink.fill(&mut rec2);
        assert_eq!(rec2.notes, vec!["a".to_owned(), "new".to_owned()]);
        assert_eq!(rec2.cuda.map(|c| c.notes), Some(vec!["g".to_owned()]));
    }
}
