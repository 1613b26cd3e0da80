//! Which Python frame a stack's time is charged to: the innermost frame of
//! the user's own code (not the standard library, not site-packages or
//! dist-packages, not frozen importlib), with the innermost Python frame
//! beneath it when that is a different one (the `threading.py` wait under
//! the user's `q.get()`).
//!
//! Shared by the report (the verdict charges time to these lines) and the
//! collectors (`record --async` names a long step's line with them): it
//! reads only the model's frames.

use serde::{Deserialize, Serialize};

use super::{Frame, FrameKind};

/// A source line the verdict charges time to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SiteRef {
    pub function: String,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: Option<u32>,
    /// `python` (a Python line), `native` (no Python frame on the stack:
    /// the first native frame, with its library in `module`).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// False when the stack had Python frames but none of the user's code
    /// (all standard library or installed packages): the leaf is shown.
    #[serde(default)]
    pub user_code: bool,
}

impl SiteRef {
    fn of(f: &Frame, user_code: bool) -> Self {
        SiteRef {
            function: f.function.clone(),
            file: f.file.clone(),
            line: f.line,
            kind: match f.kind {
                FrameKind::Python => "python",
                FrameKind::Native => "native",
                FrameKind::Kernel => "kernel",
            }
            .to_owned(),
            module: f.module.clone(),
            user_code,
        }
    }

    /// `function (file.py:12)` with the file's basename, or
    /// `function [libfoo.so]` for a native frame.
    pub fn short(&self) -> String {
        let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
        match (&self.file, self.line, &self.module) {
            (Some(f), Some(l), _) => format!("{} ({}:{l})", self.function, base(f)),
            (Some(f), None, _) => format!("{} ({})", self.function, base(f)),
            (None, _, Some(m)) => format!("{} [{m}]", self.function, ),
            _ => self.function.clone(),
        }
    }

    /// `file:line` as `--metric` names a site (the file's basename).
    pub fn key(&self) -> String {
        let file = self.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
        match self.line {
            Some(l) => format!("{file}:{l}"),
            None => format!("{file}:{}", self.function),
        }
    }
}

/// Where a stack's time goes: the user line and the frame beneath it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Charged {
    pub site: SiteRef,
    pub beneath: Option<SiteRef>,
}

/// Whether a Python source file belongs to the user's code: not under a
/// `lib/pythonX.Y` tree (the standard library), not in `site-packages` or
/// `dist-packages` (installed packages), not `<frozen ...>` (importlib).
pub fn is_user_file(file: &str) -> bool {
    if file.starts_with("<frozen") || file.contains("/site-packages/") || file.contains("/dist-packages/") {
        return false;
    }
    // /usr/lib/python3.11/, /usr/local/lib/python3.12/, ~/.pyenv/versions/3.11.7/lib/python3.11/
    !file.split('/').collect::<Vec<_>>().windows(2).any(|w| {
        (w[0] == "lib" || w[0] == "lib64") && w[1].starts_with("python") && w[1][6..].chars().next().is_some_and(|c| c.is_ascii_digit())
    })
}

/// The user line a stack (leaf-first `frames`) is charged to: the innermost
/// Python frame of user code (with the innermost Python frame beneath it,
/// when different); the Python leaf when no frame is user code; the first
/// native frame when there is no Python frame. None for an empty stack.
pub fn charge(frames: &[Frame]) -> Option<Charged> {
    let py: Vec<&Frame> = frames.iter().filter(|f| f.kind == FrameKind::Python).collect();
    if let Some(i) = py.iter().position(|f| f.file.as_deref().is_some_and(is_user_file)) {
        let beneath = (i > 0).then(|| SiteRef::of(py[0], false));
        return Some(Charged { site: SiteRef::of(py[i], true), beneath });
    }
    if let Some(leaf) = py.first() {
        return Some(Charged { site: SiteRef::of(leaf, false), beneath: None });
    }
    let native = frames.iter().find(|f| f.kind == FrameKind::Native).or_else(|| frames.first())?;
    Some(Charged { site: SiteRef::of(native, false), beneath: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: Some(file.into()), line: Some(line), kind: FrameKind::Python, module: None }
    }

    #[test]
    fn user_files() {
        assert!(is_user_file("/srv/app/serve.py"));
        assert!(is_user_file("/work/wt/tests/workloads/verdict_cases.py"));
        assert!(is_user_file("/home/u/library/python_stuff.py"));
        assert!(!is_user_file("/usr/lib/python3.11/threading.py"));
        assert!(!is_user_file("/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py"));
        assert!(!is_user_file("/venv/lib/python3.12/site-packages/torch/nn/module.py"));
        assert!(!is_user_file("/usr/lib/python3/dist-packages/numpy/core.py"));
        assert!(!is_user_file("<frozen importlib._bootstrap>"));
    }

    #[test]
    fn a_lock_wait_is_charged_to_the_user_line_with_the_stdlib_frame_beneath() {
        let frames = vec![
            Frame { function: "futex_wait".into(), file: None, line: None, kind: FrameKind::Kernel, module: None },
            py("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
            py("Queue.get", "/usr/lib/python3.11/queue.py", 171),
            py("consume", "/srv/app.py", 20),
            py("main", "/srv/app.py", 40),
        ];
        let c = charge(&frames).unwrap();
        assert_eq!((c.site.function.as_str(), c.site.line, c.site.user_code), ("consume", Some(20), true));
        let b = c.beneath.unwrap();
        assert_eq!((b.function.as_str(), b.line), ("Condition.wait", Some(327)));
        assert_eq!(c.site.key(), "app.py:20");
        // No user frame: the leaf.
        let c = charge(&frames[..3]).unwrap();
        assert_eq!((c.site.function.as_str(), c.site.user_code), ("Condition.wait", false));
        // Native only: the first native frame.
        let n = Frame { function: "[unknown]".into(), file: None, line: None, kind: FrameKind::Native, module: Some("libfoo.so".into()) };
        assert_eq!(charge(&[frames[0].clone(), n]).unwrap().site.short(), "[unknown] [libfoo.so]");
        assert!(charge(&[]).is_none());
    }
}
