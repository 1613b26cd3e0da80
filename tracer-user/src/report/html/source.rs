//! The source lines around a finding's line, read when the page is made
//! (`report --format html`), never by the agent. Only a Python source file
//! the path names directly: absolute, ending in `.py`, a regular file
//! opened without following a link in its last component and without
//! blocking (a FIFO planted at the path is refused), at most
//! [`MAX_SOURCE_BYTES`]. A file changed after the recording started is
//! shown with a warning (its lines may have moved).

use std::{collections::HashMap, fs::File, io::Read as _, os::unix::fs::OpenOptionsExt as _, time::UNIX_EPOCH};

/// Larger source files are not read.
const MAX_SOURCE_BYTES: u64 = 8 << 20;
/// Lines shown before and after the line.
pub const CONTEXT_LINES: u32 = 2;

/// Lines around one line of a file.
pub struct Excerpt {
    /// (line number, text), the finding's line among them.
    pub lines: Vec<(u32, String)>,
    pub line: u32,
    /// The file was modified after the recording started.
    pub changed_since: bool,
}

/// Reads each file once.
pub struct Sources {
    enabled: bool,
    started_unix_ms: u64,
    files: HashMap<String, Option<(Vec<String>, bool)>>,
}

impl Sources {
    pub fn new(enabled: bool, started_unix_ms: u64) -> Sources {
        Sources { enabled, started_unix_ms, files: HashMap::new() }
    }

    /// The lines around `line` of `path`, or None (not a readable Python
    /// source, line past its end, or reading off).
    pub fn excerpt(&mut self, path: &str, line: u32) -> Option<Excerpt> {
        if !self.enabled || line == 0 {
            return None;
        }
        let started = self.started_unix_ms;
        let (lines, changed) = self.files.entry(path.to_owned()).or_insert_with(|| read(path, started)).as_ref()?;
        let idx = usize::try_from(line).ok()?.checked_sub(1)?;
        if idx >= lines.len() {
            return None;
        }
        let from = line.saturating_sub(CONTEXT_LINES).max(1);
        let to = line.saturating_add(CONTEXT_LINES).min(u32::try_from(lines.len()).unwrap_or(u32::MAX));
        let shown = (from..=to).filter_map(|n| lines.get(n as usize - 1).map(|t| (n, t.clone()))).collect();
        Some(Excerpt { lines: shown, line, changed_since: *changed })
    }
}

fn read(path: &str, started_unix_ms: u64) -> Option<(Vec<String>, bool)> {
    if !path.starts_with('/') || !path.ends_with(".py") {
        return None;
    }
    let mut f = File::options().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_file() || meta.len() > MAX_SOURCE_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    f.by_ref().take(MAX_SOURCE_BYTES).read_to_end(&mut bytes).ok()?;
    let changed = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .is_some_and(|d| d.as_millis() > u128::from(started_unix_ms));
    let text = String::from_utf8_lossy(&bytes);
    Some((text.lines().map(|l| crate::report::fmt::printable(l).into_owned()).collect(), changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_around_a_line_and_refusals() {
        let dir = std::env::temp_dir().join(format!("infertrace-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let py = dir.join("m.py");
        std::fs::write(&py, "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\n").unwrap();
        let link = dir.join("link.py");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&py, &link).unwrap();
        let txt = dir.join("m.txt");
        std::fs::write(&txt, "secret\n").unwrap();
        let mut s = Sources::new(true, 0);
        let e = s.excerpt(py.to_str().unwrap(), 4).unwrap();
        assert_eq!(e.lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![2, 3, 4, 5, 6]);
        assert_eq!(e.lines[2].1, "d = 4");
        assert!(e.changed_since, "written after the epoch");
        assert_eq!(s.excerpt(py.to_str().unwrap(), 1).unwrap().lines.len(), 3);
        assert!(s.excerpt(py.to_str().unwrap(), 7).is_none(), "past the end");
        assert!(s.excerpt(link.to_str().unwrap(), 1).is_none(), "a link is not followed");
        assert!(s.excerpt(txt.to_str().unwrap(), 1).is_none(), "not a .py file");
        assert!(s.excerpt("m.py", 1).is_none(), "relative");
        assert!(Sources::new(false, 0).excerpt(py.to_str().unwrap(), 1).is_none(), "off");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
