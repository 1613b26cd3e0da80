//! Command lines as the agent shows them to others: `/targets`,
//! `/report/latest` and the windows it writes (which are shipped off the
//! node) carry the program and, for an interpreter, the script or module
//! it runs; every other argument is replaced by one marker, since
//! services take secrets as arguments (`--api-key=...`,
//! `--db-url=postgres://user:password@...`). `agent --show-args` keeps
//! them whole. The metrics carry no arguments at all (`comm` only).

use crate::recording::Recording;

/// What stands for the `n` arguments left out.
pub fn marker(n: usize) -> String {
    format!("<{n} argument{} redacted>", if n == 1 { "" } else { "s" })
}

/// Python interpreters, whose script or module is kept (other programs
/// keep their path only).
fn is_interpreter(argv0: &str) -> bool {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    ["python", "pypy"].iter().any(|i| {
        base.strip_prefix(i).is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.' || c == 'm' || c == 'd'))
    })
}

/// CPython options that take a value in the next argument (the value is an
/// interpreter setting, kept: `-X importtime`, `-W ignore`).
const PYTHON_VALUE_FLAGS: [&str; 3] = ["-X", "-W", "--check-hash-based-pycs"];

/// `cmdline` with its arguments redacted: the program, then for an
/// interpreter its options up to and including the script (`app.py`),
/// module (`-m pkg`) or `-c` (whose code is redacted), then one marker for
/// whatever follows.
pub fn cmdline(cmdline: &[String]) -> Vec<String> {
    let Some((argv0, args)) = cmdline.split_first() else { return Vec::new() };
    let mut out = vec![argv0.clone()];
    let mut kept = 0;
    if is_interpreter(argv0) {
        while kept < args.len() {
            let a = &args[kept];
            kept += 1;
            if a.len() >= 2 && a.starts_with('-') && !a.starts_with("--") && a.ends_with('m') {
                // `-m pkg` (or `-um pkg`): the module name is the program.
                if let Some(m) = args.get(kept) {
                    out.extend([a.clone(), m.clone()]);
                    kept += 1;
                }
                break;
            }
            if (a.starts_with('-') && !a.starts_with("--") && a.ends_with('c')) || a == "--" {
                out.push(a.clone());
                break;
            }
            if PYTHON_VALUE_FLAGS.contains(&a.as_str()) {
                out.push(a.clone());
                if let Some(v) = args.get(kept) {
                    out.push(v.clone());
                    kept += 1;
                }
                continue;
            }
            // A short option cluster (`-u`, `-OO`, `-Bu`) carries no value;
            // long options and `-opt=value` forms might: left out.
            let short_flags = a.len() >= 2 && a.starts_with('-') && !a.starts_with("--") && a[1..].chars().all(|c| c.is_ascii_alphabetic());
            if short_flags {
                out.push(a.clone());
                continue;
            }
            if a.starts_with('-') {
                kept -= 1;
                break;
            }
            // The script.
            out.push(a.clone());
            break;
        }
    }
    let rest = args.len() - kept;
    if rest > 0 {
        out.push(marker(rest));
    }
    out
}

/// Redacts the command line of every target of a window's recording.
pub fn recording(rec: &mut Recording) {
    for t in &mut rec.targets {
        t.cmdline = cmdline(&t.cmdline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(args: &[&str]) -> Vec<String> {
        cmdline(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn secrets_go_program_and_script_stay() {
        assert_eq!(
            r(&["/usr/bin/python3", "-u", "serve.py", "--api-key=sk-live-123", "--db-url", "postgres://admin:hunter2@db"]),
            ["/usr/bin/python3", "-u", "serve.py", "<3 arguments redacted>"]
        );
        assert_eq!(r(&["python3.12", "-X", "importtime", "-m", "vllm.entrypoints.api_server", "--token", "t"]),
            ["python3.12", "-X", "importtime", "-m", "vllm.entrypoints.api_server", "<2 arguments redacted>"]);
        assert_eq!(r(&["python3", "-c", "import os; KEY='sk'"]), ["python3", "-c", "<1 argument redacted>"]);
        assert_eq!(r(&["python3", "-uc", "KEY='sk'", "x"]), ["python3", "-uc", "<2 arguments redacted>"]);
        assert_eq!(r(&["python3", "-um", "pkg", "--key", "k"]), ["python3", "-um", "pkg", "<2 arguments redacted>"]);
        assert_eq!(r(&["node", "-e", "secret"]), ["node", "<2 arguments redacted>"]);
        assert_eq!(r(&["/srv/gunicorn", "--bind", "0.0.0.0", "app:app"]), ["/srv/gunicorn", "<3 arguments redacted>"]);
        assert_eq!(r(&["python3", "--password=x", "app.py"]), ["python3", "<2 arguments redacted>"]);
        assert_eq!(r(&["python3"]), ["python3"]);
        assert_eq!(r(&["python3", "app.py"]), ["python3", "app.py"]);
        assert!(r(&[]).is_empty());
        // Not an interpreter by a prefix alone.
        assert_eq!(r(&["pythonista", "x"]), ["pythonista", "<1 argument redacted>"]);
    }
}
