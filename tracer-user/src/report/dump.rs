//! The `infertrace dump` command's output format: the Python stack of
//! every thread of a process, as py-spy-like text ([`render_dump_text`]) or
//! JSON ([`render_dump_json`]).

use std::fmt::Write;

use super::fmt::{printable, printable_json, printable_text};
use crate::recording::{Frame, FrameKind, ThreadDump};

/// py-spy-like text:
///
/// ```text
/// Thread 4057 (python3)
///     level3 (/srv/app.py:39)
///     Worker.run (/srv/app.py:23)
/// ```
///
/// Python frames only, unless `native` is set: then every frame is shown,
/// native ones as `function (module)` or `function (file:line)` when known.
/// A thread whose tid is unknown shows `?`; one without Python frames shows
/// `    (no Python frames)`. Names and paths are escaped for the terminal
/// ([`printable`]): a thread can name itself anything.
pub fn render_dump_text(dumps: &[ThreadDump], native: bool) -> String {
    let mut out = String::new();
    for d in dumps {
        let tid = if d.tid == 0 { "?".to_string() } else { d.tid.to_string() };
        match &d.thread_name {
            Some(name) => writeln!(out, "Thread {tid} ({})", printable(name)).unwrap(),
            None => writeln!(out, "Thread {tid}").unwrap(),
        }
        let frames: Vec<&Frame> = d.frames.iter().filter(|f| native || f.kind == FrameKind::Python).collect();
        if frames.is_empty() {
            out.push_str("    (no Python frames)\n");
        }
        for f in frames {
            writeln!(out, "    {}", frame_text(f)).unwrap();
        }
    }
    printable_text(out)
}

fn frame_text(f: &Frame) -> String {
    let function = printable(&f.function);
    match (&f.file, f.line, &f.module) {
        (Some(file), Some(line), _) => format!("{function} ({}:{line})", printable(file)),
        (Some(file), None, _) => format!("{function} ({})", printable(file)),
        (None, _, Some(module)) => format!("{function} ({})", printable(module)),
        (None, _, None) => function.into_owned(),
    }
}

/// JSON: a list of `{"tid", "thread_name", "frames": [{"function", "file",
/// "line", "kind"}]}`, frames leaf first (`module` too on native frames
/// where known).
pub fn render_dump_json(dumps: &[ThreadDump]) -> String {
    printable_json(serde_json::to_string_pretty(dumps).expect("thread dumps serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: Some("/srv/app.py".into()),
            line: Some(line),
            kind: FrameKind::Python,
            module: None,
        }
    }

    fn dumps() -> Vec<ThreadDump> {
        vec![
            ThreadDump {
                tid: 4057,
                thread_name: Some("python3".into()),
                frames: vec![
                    Frame {
                        function: "read".into(),
                        file: None,
                        line: None,
                        kind: FrameKind::Native,
                        module: Some("libc.so.6".into()),
                    },
                    py("level3", 39),
                    py("Worker.run", 23),
                ],
            },
            ThreadDump { tid: 0, thread_name: None, frames: vec![] },
        ]
    }

    #[test]
    fn text() {
        assert_eq!(
            render_dump_text(&dumps(), false),
            "Thread 4057 (python3)\n    level3 (/srv/app.py:39)\n    Worker.run (/srv/app.py:23)\n\
             Thread ?\n    (no Python frames)\n"
        );
        assert!(render_dump_text(&dumps(), true).contains("    read (libc.so.6)\n    level3 (/srv/app.py:39)\n"));
    }

    #[test]
    fn text_escapes_names() {
        let d = vec![ThreadDump {
            tid: 7,
            thread_name: Some("\x1b]0;PWNED\x07\x1b[2J".into()),
            frames: vec![Frame { function: "f\nThread 1 (forged)".into(), ..py("x", 1) }],
        }];
        let text = render_dump_text(&d, false);
        assert_eq!(text, "Thread 7 (\\x1b]0;PWNED\\x07\\x1b[2J)\n    f\\nThread 1 (forged) (/srv/app.py:1)\n");
    }

    #[test]
    fn json() {
        let v: serde_json::Value = serde_json::from_str(&render_dump_json(&dumps())).unwrap();
        let t = &v[0];
        assert_eq!(t["tid"], 4057);
        assert_eq!(t["thread_name"], "python3");
        assert_eq!(
            t["frames"][1],
            serde_json::json!({"function": "level3", "file": "/srv/app.py", "line": 39, "kind": "python"})
        );
        assert_eq!(t["frames"][0]["kind"], "native");
        assert_eq!(v[1]["thread_name"], serde_json::Value::Null);
        assert_eq!(v[1]["frames"], serde_json::json!([]));
    }
}
