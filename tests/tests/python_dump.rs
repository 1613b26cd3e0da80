//! `infertrace dump -p PID`: the current Python stacks of a running
//! interpreter that knows nothing about the tracer, compared with the
//! workload's source and with py-spy frame by frame, on every CPython 3.8 ..
//! 3.15 of the machine (pyenv shared builds, the system's python3, on
//! Debian 12 a static stripped python3.11, and Debian sid's static 3.14 and
//! 3.15 in a chroot: tests/src/pyroot.rs); what the kernel's walker captures
//! in `infertrace record` resolves to the same frames; 2.7, 3.6, 3.7 and a
//! process without Python are refused with one error line.
//!
//! Needs root, the infertrace binary, `py-spy` on PATH (the comparisons with
//! it), bpftool (the recording test) and the interpreters; under `CI=true` a
//! missing one fails the test.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// The expected interpreters (under CI=true all of them), and py-spy when
/// `py_spy`.
fn require_pythons(test: &str, py_spy: bool) -> Option<Vec<PythonExe>> {
    let (found, missing) = expected_pythons();
    if py_spy && !in_path("py-spy") {
        skip(test, "py-spy on PATH (pip install py-spy)");
        return None;
    }
    if found.is_empty() {
        skip(test, &format!("a CPython 3.8 .. 3.15 (missing: {})", missing.join(", ")));
        return None;
    }
    // Off CI, test what is there.
    skip_some(test, &missing).then_some(found)
}

fn script() -> PathBuf {
    workspace_root()
        .join("tests/workloads/py_blocked.py")
        .canonicalize()
        .unwrap()
}

/// (function, file, line) of each frame, leaf first.
type Frames = Vec<(String, String, u64)>;

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

/// (function, file, line) of infertrace's JSON frames (a dump's: all
/// Python frames, without a `module`).
fn ours(t: &Value) -> Frames {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert_eq!(f["kind"], "python", "frame kind: {f}");
            assert!(f.get("module").is_none(), "a Python frame with a module: {f}");
            (
                f["function"].as_str().unwrap().to_string(),
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// (name, filename, line) of py-spy's JSON frames.
fn theirs(t: &Value) -> Frames {
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

/// The dump's threads are exactly the process's, each once.
#[track_caller]
fn check_threads(label: &str, pid: u32, dump: &[Value]) {
    let tids: Vec<u64> = dump.iter().map(|t| t["tid"].as_u64().unwrap()).collect();
    let set: BTreeSet<u64> = tids.iter().copied().collect();
    assert_eq!(set.len(), tids.len(), "{label}: a thread dumped twice: {tids:?}");
    assert_eq!(set, tasks(pid), "{label}: dumped threads");
}

/// `co_qualname` (3.11+) or `co_name`.
fn qual(p: &PythonExe, qualname: &str) -> String {
    if p.minor >= 11 {
        qualname.to_string()
    } else {
        qualname.rsplit('.').next().unwrap().to_string()
    }
}

/// The known stacks of `py_blocked.py block` (leaf first): the main thread's
/// whole stack, and the first frames of the sleeper's (below them,
/// threading's own).
fn block_stacks(p: &PythonExe) -> (Frames, Frames) {
    let file = script().to_str().unwrap().to_string();
    let with_file = |v: Vec<(String, u64)>| v.into_iter().map(|(f, l)| (f, file.clone(), l)).collect();
    let main = vec![
        ("level3".to_string(), line_of("return os.read(fd, 1)")),
        ("level2".into(), line_of("return level3(fd, how)")),
        ("level1".into(), line_of("return level2(fd, how)")),
        (qual(p, "Worker.run"), line_of("return level1(fd, \"read\")")),
        ("block".into(), line_of("Worker().run(r)")),
        (
            "<module>".into(),
            line_of("{\"block\": block, \"spin\": spin, \"gil\": gil}[sys.argv[1] if len(sys.argv) > 1 else \"block\"]()"),
        ),
    ];
    let sleeper = vec![
        ("level3".to_string(), line_of("time.sleep(3600)")),
        ("level2".into(), line_of("return level3(fd, how)")),
        ("level1".into(), line_of("return level2(fd, how)")),
        (qual(p, "Worker.nap"), line_of("return level1(None, \"sleep\")")),
        (qual(p, "block.<locals>.sleeper"), line_of("Worker().nap()")),
    ];
    (with_file(main), with_file(sleeper))
}

/// Waits until both threads of `block` are in level3 (around "ready").
fn blocked_dump(label: &str, pid: u32) -> Vec<Value> {
    poll(Duration::from_secs(10), || {
        let d = dump_json(pid);
        let all = d.len() == 2 && d.iter().all(|t| t["frames"][0]["function"] == "level3");
        all.then_some(d)
    })
    .unwrap_or_else(|| panic!("{label}: threads never both seen in level3"))
}

/// Blocked process: main thread in os.read under Worker.run -> level1 ->
/// level2 -> level3, a "sleeper" thread in time.sleep under Worker.nap:
/// the source's lines, py-spy's frames, the text form.
#[test]
fn dump_matches_py_spy() {
    let test = "dump_matches_py_spy";
    require!(test, Root, Binary);
    let Some(pythons) = require_pythons(test, true) else {
        return;
    };
    let file = script().to_str().unwrap().to_string();
    for p in &pythons {
        let label = &p.label;
        let w = Py::start(&p.exe, "block");
        let pid = w.pid();
        let dump = blocked_dump(label, pid);
        check_threads(label, pid, &dump);
        for t in &dump {
            assert!(
                t["thread_name"].as_str().is_some_and(|n| !n.is_empty()),
                "{label}: thread without a name: {t}"
            );
        }

        // Ground truth from the source: the main thread's whole stack, the
        // sleeper's own frames.
        let (main_want, sleeper_want) = block_stacks(p);
        let main = dump.iter().find(|t| t["tid"] == pid).unwrap();
        assert_eq!(ours(main), main_want, "{label}: main thread");
        let sleeper = dump.iter().find(|t| t["tid"] != pid).expect("sleeper thread");
        let got = ours(sleeper);
        assert!(got.len() > sleeper_want.len(), "{label}: sleeper stack {got:?}");
        assert_eq!(got[..sleeper_want.len()], sleeper_want[..], "{label}: sleeper thread");

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

/// Busy processes dump without error, 40 times each: a main thread spinning
/// in pure Python (busy_loop <- spin <- <module>, at a line of the loop),
/// and four CPU-bound threads fighting for the GIL (each in busy_loop <-
/// spin_worker <- Thread.run, with every thread of the process dumped).
#[test]
fn dump_busy_processes() {
    let test = "dump_busy_processes";
    require!(test, Root, Binary);
    let Some(pythons) = require_pythons(test, false) else {
        return;
    };
    let file = script().to_str().unwrap().to_string();
    let (first, last) = (line_of("def busy_loop(n):"), line_of("total %= 1000003"));
    for p in &pythons {
        let label = &p.label;
        for (mode, threads) in [("spin", 1), ("gil", 5)] {
            let w = Py::start(&p.exe, mode);
            let pid = w.pid();
            // Python threads in busy_loop: the spinning main thread, or the
            // four GIL-bound workers (not the main thread, asleep).
            let busy = |d: &[Value]| {
                d.len() == threads
                    && d.iter()
                        .filter(|t| mode == "spin" || t["tid"] != pid)
                        .all(|t| t["frames"][0]["function"] == "busy_loop")
            };
            poll(Duration::from_secs(10), || busy(&dump_json(pid)).then_some(()))
                .unwrap_or_else(|| panic!("{label} {mode}: never all in busy_loop"));
            let tail: Vec<String> = match mode {
                "spin" => vec!["busy_loop".into(), "spin".into(), "<module>".into()],
                _ => vec!["busy_loop".into(), "spin_worker".into(), qual(p, "Thread.run")],
            };
            for i in 0..40 {
                let d = dump_json(pid);
                assert!(busy(&d), "{label} {mode}: dump {i}: {d:?}");
                check_threads(&format!("{label} {mode}: dump {i}"), pid, &d);
                for t in d.iter().filter(|t| mode == "spin" || t["tid"] != pid) {
                    let f = ours(t);
                    let names: Vec<String> = f.iter().take(3).map(|x| x.0.clone()).collect();
                    assert_eq!(names, tail, "{label} {mode}: dump {i}: thread {}: {f:?}", t["tid"]);
                    if mode == "spin" {
                        assert_eq!(f.len(), 3, "{label} spin: dump {i}: {f:?}");
                    }
                    assert_eq!(f[0].1, file, "{label} {mode}: dump {i}: {f:?}");
                    assert!((first..=last).contains(&f[0].2), "{label} {mode}: busy_loop at line {}", f[0].2);
                }
            }
        }
    }
}

/// Interpreters outside 3.8 .. 3.15 (pyenv's 2.7, 3.6, 3.7) and a process
/// without Python: `dump` fails with one error line, naming the version.
#[test]
fn dump_refuses_unsupported_and_non_python() {
    let test = "dump_refuses_unsupported_and_non_python";
    require!(test, Root, Binary);
    let (legacy, missing) = unsupported_pythons();
    if !skip_some(test, &missing) {
        return;
    }

    let sleep = which("sleep").expect("sleep on PATH");
    let mut child = Command::new(sleep).arg("30").spawn().unwrap();
    let mut guard = KillOnDrop::new(child.id());
    // Until it has exec'd sleep (not the test binary's fork).
    let pid = child.id();
    poll(Duration::from_secs(5), || {
        fs::read_to_string(format!("/proc/{pid}/comm")).ok().filter(|c| c.trim() == "sleep")
    })
    .expect("sleep never started");
    let r = run_infertrace(["dump", "-p", &pid.to_string()]);
    let _ = child.kill();
    let _ = child.wait();
    guard.disarm();
    assert!(!r.status.success(), "dump of sleep succeeded\n{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains(&format!("pid {pid} is not running CPython")), "{line}");
    assert!(r.stdout.is_empty(), "{}", r.describe());

    for p in &legacy {
        let mut child = Command::new(&p.exe)
            .args(["-c", "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = KillOnDrop::new(child.id());
        let mut l = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
        assert_eq!(l.trim_end(), "ready", "{}", p.label);
        for format in ["text", "json"] {
            let r = run_infertrace(["dump", "-p", &child.id().to_string(), "--format", format]);
            assert!(!r.status.success(), "{}: dump succeeded\n{}", p.label, r.describe());
            let line = single_error_line(&r);
            let version = format!("CPython {}.{}.", p.major, p.minor);
            assert!(line.contains(&version) && line.contains("is not supported"), "{}: {line}", p.label);
            assert!(r.stdout.is_empty(), "{}: {}", p.label, r.describe());
        }
        let _ = child.kill();
        let _ = child.wait();
        guard.disarm();
        eprintln!("ok: {}", p.label);
    }
}

/// What the kernel's walker captures (`infertrace record -p` on the blocked
/// process, woken by SIGSTOP/SIGCONT so that each thread blocks again with
/// the tracer attached) resolves to the frames `dump` reads, for both
/// threads, line for line.
#[test]
fn recorded_stacks_match_dump() {
    let test = "recorded_stacks_match_dump";
    require!(test, Root, Binary, Bpftool);
    let Some(pythons) = require_pythons(test, false) else {
        return;
    };
    for p in &pythons {
        let label = &p.label;
        let w = Py::start(&p.exe, "block");
        let pid = w.pid();
        let dump = blocked_dump(label, pid);
        let (main_want, _) = block_stacks(p);
        assert_eq!(ours(dump.iter().find(|t| t["tid"] == pid).unwrap()), main_want, "{label}: dump");

        let dir = TempDir::new("pydump-record");
        let before = bpf_prog_ids();
        let tracer = spawn(
            infertrace(["record", "-q", "-p", &pid.to_string(), "--format", "json", "-o"])
                .arg(dir.join("rec.itr"))
                .current_dir(dir.path()),
        );
        let tpid = tracer.id();
        let mut guard = KillOnDrop::new(tpid);
        wait_attached(tpid, pid, &before);
        // Each stop wakes both threads; after each continue they block again
        // (the read and the sleep restart) under the tracer's eyes.
        for _ in 0..3 {
            kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(150));
            kill(pid, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(350));
        }
        kill(tpid, libc::SIGINT);
        let r = wait_child(tracer, Duration::from_secs(30), "infertrace record -p (SIGINT)");
        guard.disarm();
        r.assert_ok();
        let rep = r.json();
        rep.check_invariants();

        for t in &dump {
            let tid = t["tid"].as_u64().unwrap();
            let want = ours(t);
            let stacks: Vec<&Value> = rep
                .stacks_of_kind("off_cpu")
                .into_iter()
                .filter(|s| s["pid"] == pid && s["tid"] == tid)
                .collect();
            let with_python: Vec<Frames> = stacks
                .iter()
                .map(|s| python_frames_of(s))
                .filter(|f| !f.is_empty())
                .collect();
            assert!(
                !with_python.is_empty(),
                "{label}: thread {tid}: no off-CPU stack with Python frames; its stacks: {stacks:#?}"
            );
            for f in &with_python {
                assert_eq!(f, &want, "{label}: thread {tid}: recorded vs dumped");
            }
        }
        eprintln!("ok: {label}");
    }
}
