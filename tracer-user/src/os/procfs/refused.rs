//! Files of targets the tracer would not read, counted: a target's root is
//! not trusted (a FIFO where a library should be, a device, a file far
//! larger than its kind ever is, a malformed loader cache, a search path
//! with thousands of entries). Each refusal is counted here, process-wide,
//! and the recording says so in one note ([`note`]): never a hang, never
//! silent.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

/// Why a target's file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A FIFO, a device, a socket...: opening or reading it could block,
    /// never end, or act on hardware.
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    /// Larger than any file of its kind (`what`) the tracer reads.
    #[error("{what} of {size} bytes is over the {cap}-byte limit")]
    TooLarge { what: &'static str, size: u64, cap: u64 },
    /// The content is not what its kind must be.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    /// A list (of search paths, directory entries, candidates) cut at its cap.
    #[error("{what}: more than {cap}, the rest not searched")]
    TooMany { what: &'static str, cap: usize },
}

impl Refused {
    fn slot(&self) -> usize {
        match self {
            Refused::NotRegular(_) => 0,
            Refused::TooLarge { .. } => 1,
            Refused::Malformed { .. } => 2,
            Refused::TooMany { .. } => 3,
        }
    }
}

static COUNTS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
/// The first refusal of each kind, as an example for the note.
static FIRST: Mutex<[Option<String>; 4]> = Mutex::new([None, None, None, None]);
/// The latest refusal of each kind, the example of [`note_since`].
static LAST: Mutex<[Option<String>; 4]> = Mutex::new([None, None, None, None]);
/// How the note begins.
pub const NOTE_PREFIX: &str = "files of targets not read (hostile or unusual roots): ";
const LABELS: [&str; 4] = ["not a regular file", "over its size limit", "malformed", "a list cut at its cap"];

/// Counts a refusal of the file (or list) `path` and returns it as an
/// `io::Error` (its `get_ref` downcasts to [`Refused`]).
pub fn refuse(path: &str, why: Refused) -> std::io::Error {
    count(path, &why);
    std::io::Error::other(why)
}

/// Counts a refusal that is not returned as an error.
pub fn count(path: &str, why: &Refused) {
    let slot = why.slot();
    COUNTS[slot].fetch_add(1, Ordering::Relaxed);
    let example = format!("{path}: {why}");
    if let Ok(mut first) = FIRST.lock() {
        if first[slot].is_none() {
            first[slot] = Some(example.clone());
        }
    }
    if let Ok(mut last) = LAST.lock() {
        last[slot] = Some(example);
    }
}

/// Whether an error is a refusal counted here.
pub fn is_refusal(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|r| r.is::<Refused>())
}

/// The counts so far: not regular, too large, malformed, too many.
pub fn counts() -> [u64; 4] {
    [0, 1, 2, 3].map(|i| COUNTS[i].load(Ordering::Relaxed))
}

/// The one note on every refusal since the tracer started, `None` when there
/// was none.
pub fn note() -> Option<String> {
    let first = FIRST.lock().map(|f| f.clone()).unwrap_or_default();
    render(counts(), &first, "first")
}

/// The note on the refusals since the counts were `before` (the agent's
/// window: what it refused in that window), the latest of each kind as the
/// example; `None` when there was none.
pub fn note_since(before: [u64; 4]) -> Option<String> {
    let last = LAST.lock().map(|f| f.clone()).unwrap_or_default();
    render(since(counts(), before), &last, "latest")
}

/// Per kind, the refusals counted between `before` and `now`.
fn since(now: [u64; 4], before: [u64; 4]) -> [u64; 4] {
    [0, 1, 2, 3].map(|i| now[i].saturating_sub(before[i]))
}

fn render(c: [u64; 4], examples: &[Option<String>; 4], which: &str) -> Option<String> {
    if c.iter().all(|n| *n == 0) {
        return None;
    }
    let parts: Vec<String> = (0..4)
        .filter(|i| c[*i] > 0)
        .map(|i| format!("{} {} ({which}: {})", c[i], LABELS[i], examples[i].as_deref().unwrap_or("?")))
        .collect();
    Some(format!("{NOTE_PREFIX}{}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_note_counts_only_what_was_refused_since() {
        let examples = [Some("/x/fifo: not a regular file (a FIFO)".to_owned()), None, None, Some("/x/path: too many".to_owned())];
        let n = render(since([5, 0, 0, 9], [5, 0, 0, 7]), &examples, "latest").expect("two refused since");
        assert_eq!(n, format!("{NOTE_PREFIX}2 a list cut at its cap (latest: /x/path: too many)"));
        assert_eq!(render(since([5, 0, 0, 9], [5, 0, 0, 9]), &examples, "latest"), None);
        // The live counters: one refusal counted shows in the whole note.
        count("/x/first", &Refused::NotRegular("a FIFO"));
        assert!(note().is_some_and(|n| n.starts_with(NOTE_PREFIX) && n.contains("first: ")));
    }
}
