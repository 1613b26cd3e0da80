//! `infertrace dump -p PID`: the current Python stacks of a running
//! interpreter that knows nothing about the tracer, compared with py-spy
//! frame by frame, on every CPython 3.8 .. 3.13 of the machine (pyenv shared
//! builds and Debian's static stripped /usr/bin/python3.11).
//!
//! Needs root, the infertrace binary, `py-spy` on PATH and the interpreters;
//! under `CI=true` a missing one fails the test.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// py-spy and the expected interpreters (under CI=true all of them).
fn require_pythons(test: &str) -> Option<Vec<(String, PathBuf, u32)>> {
    let (found, mut missing) = expected_pythons();
    if !in_path("py-spy") {
        missing.push("py-spy on PATH (pip install py-spy)".to_string());
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && !found.is_empty() && missing.iter().all(|m| !m.starts_with("py-spy")) {
        // Off CI, test what is there.
        for m in &missing {
            eprintln!("note: {test}: {m} not found, not tested");
        }
        missing.clear();
    }
    if found.is_empty() {
        missing.push("a CPython 3.8 .. 3.13".into());
    }
    if !missing.is_empty() {
        skip(test, &missing.join(", "));
        return None;
    }
    Some(found.into_iter().map(|p| (p.label, p.exe, p.minor)).collect())
}

fn script() -> PathBuf {
    workspace_root()
        .join("tests/workloads/py_blocked.py")
        .canonicalize()
        .unwrap()
}

/// `py_blocked.py MODE`, started and waited for ("ready"); killed on drop.
struct Py(Child);

impl Py {
    fn start(python: &Path, mode: &str) -> Py {
        let mut child = Command::new(python)
            .arg(script())
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut l = String::new();
            let _ = BufReader::new(out).read_line(&mut l);
            let _ = tx.send(l);
        });
        let p = Py(child);
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.trim_end() == "ready" => p,
            other => panic!("{} {mode}: no ready line: {other:?}", python.display()),
        }
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn line_of(text: &str) -> u64 {
    let src = fs::read_to_string(script()).unwrap();
    src.lines()
        .position(|l| l.trim() == text)
        .unwrap_or_else(|| panic!("no line {text:?}")) as u64
        + 1
}

fn dump_json(pid: u32) -> Vec<Value> {
    let r = run_infertrace(["dump", "-p", &pid.to_string(), "--format", "json"]);
    r.assert_ok();
    let v: Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("dump output is not JSON: {e}\n{}", r.describe()));
    v.as_array()
        .unwrap_or_else(|| panic!("dump JSON is not a list: {v}"))
        .clone()
}

fn py_spy(pid: u32) -> Vec<Value> {
    let r = run_cmd(
        Command::new("py-spy").args(["dump", "--json", "--pid", &pid.to_string()]),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    serde_json::from_str::<Value>(&r.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// (function, file, line) of infertrace's JSON frames.
fn ours(t: &Value) -> Vec<(String, String, u64)> {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert_eq!(f["kind"], "python", "frame kind: {f}");
            (
                f["function"].as_str().unwrap().to_string(),
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// (name, filename, line) of py-spy's JSON frames.
fn theirs(t: &Value) -> Vec<(String, String, u64)> {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["filename"].as_str().unwrap().to_string(),
                f["line"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn tasks(pid: u32) -> BTreeSet<u64> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn dump_matches_py_spy() {
    let test = "dump_matches_py_spy";
    require!(test, Root, Binary);
    let Some(pythons) = require_pythons(test) else {
        return;
    };
    let file = script().to_str().unwrap().to_string();
    for (label, exe, minor) in &pythons {
        let w = Py::start(exe, "block");
        let pid = w.pid();
        // Both threads reach level3 around "ready".
        let dump = poll(Duration::from_secs(10), || {
            let d = dump_json(pid);
            let all = d.len() == 2 && d.iter().all(|t| t["frames"][0]["function"] == "level3");
            all.then_some(d)
        })
        .unwrap_or_else(|| panic!("{label}: threads never both seen in level3"));

        let tids: BTreeSet<u64> = dump.iter().map(|t| t["tid"].as_u64().unwrap()).collect();
        assert_eq!(tids, tasks(pid), "{label}: dumped threads");

        let run = if *minor >= 11 { "Worker.run" } else { "run" };
        let main = dump.iter().find(|t| t["tid"] == pid).unwrap();
        let want: Vec<(String, String, u64)> = [
            ("level3", line_of("return os.read(fd, 1)")),
            ("level2", line_of("return level3(fd, how)")),
            ("level1", line_of("return level2(fd, how)")),
            (run, line_of("return level1(fd, \"read\")")),
            ("block", line_of("Worker().run(r)")),
        ]
        .iter()
        .map(|(f, l)| (f.to_string(), file.clone(), *l))
        .collect();
        assert_eq!(ours(main)[..5], want[..], "{label}: main thread");

        let spy = py_spy(pid);
        assert_eq!(spy.len(), dump.len(), "{label}: threads vs py-spy");
        for t in &spy {
            let tid = t["os_thread_id"].as_u64().expect("py-spy os_thread_id");
            let mine = dump
                .iter()
                .find(|d| d["tid"] == tid)
                .unwrap_or_else(|| panic!("{label}: thread {tid} missing"));
            assert_eq!(ours(mine), theirs(t), "{label}: thread {tid} vs py-spy");
        }

        // Text: `Thread TID (name)`, then `    function (file:line)`.
        let r = run_infertrace(["dump", "-p", &pid.to_string()]);
        r.assert_ok();
        assert!(
            r.stdout.contains(&format!("Thread {pid} (")),
            "{label}: text\n{}",
            r.stdout
        );
        let leaf = format!("    level3 ({file}:{})\n", line_of("return os.read(fd, 1)"));
        assert!(r.stdout.contains(&leaf), "{label}: text\n{}", r.stdout);
        eprintln!("ok: {label}");
    }
}

#[test]
fn dump_busy_processes() {
    let test = "dump_busy_processes";
    require!(test, Root, Binary);
    let Some(pythons) = require_pythons(test) else {
        return;
    };
    for (label, exe, _) in &pythons {
        for (mode, threads) in [("spin", 1), ("gil", 5)] {
            let w = Py::start(exe, mode);
            let pid = w.pid();
            // Python threads in busy_loop: the spinning main thread, or the
            // four GIL-bound workers (not the main thread, asleep).
            let busy = |d: &[Value]| {
                d.len() == threads
                    && d.iter()
                        .filter(|t| mode == "spin" || t["tid"] != pid)
                        .all(|t| t["frames"][0]["function"] == "busy_loop")
            };
            poll(Duration::from_secs(10), || {
                busy(&dump_json(pid)).then_some(())
            })
            .unwrap_or_else(|| panic!("{label} {mode}: never all in busy_loop"));
            for _ in 0..5 {
                let d = dump_json(pid);
                assert!(busy(&d), "{label} {mode}: {d:?}");
            }
        }
    }
}
