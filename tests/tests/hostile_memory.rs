//! Hostile process memory (issue 30): a Python process that corrupts its
//! own interpreter structures through ctypes (tests/workloads/hostile_memory.py)
//! must not spin the tracer's walks. For a thread-state list that loops on
//! a fake thread state, one that runs on through a buffer whose every word
//! holds its own address, and a frame chain that loops: `infertrace dump -p`
//! returns within seconds with one note naming the structure, `record -p
//! --duration 3s` finishes with the note and still has the worker thread's
//! syscalls, and the target survives. Also: a process whose main thread has
//! exited (a zombie leader) while a worker runs is traced by `-p`.
//!
//! Every CPython of the machine (`expected_pythons`; under CI=true all of
//! them, the system's python3 at least) for the dumps; the recordings on the
//! system's python3 and one interpreter of each layout family. Needs root
//! and the infertrace binary (and the kernel programs for `record`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// What `dump` may take on a hostile target (its own bound is 3 s).
const DUMP_LIMIT: Duration = Duration::from_secs(10);
/// What `record -p --duration 3s` may take (start-up included).
const RECORD_LIMIT: Duration = Duration::from_secs(40);

fn source() -> String {
    std::fs::read_to_string(workspace_root().join("tests/workloads/hostile_memory.py")).unwrap()
}

/// The workload in `mode` under `py`, once it printed "ready"; killed on drop.
struct Target(Child);

impl Target {
    fn start(py: &PythonExe, mode: &str) -> Target {
        let mut child = Command::new(&py.exe)
            .args(["-c", &source(), mode])
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
        let t = Target(child);
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.trim_end() == "ready" => t,
            other => panic!("{} {mode}: no ready line: {other:?}", py.label),
        }
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Still running: not reaped, and a thread of it not a zombie (the
    /// main one's may be, in main-exit).
    #[track_caller]
    fn assert_alive(&mut self, what: &str) {
        assert!(matches!(self.0.try_wait(), Ok(None)), "{what}: the target exited");
        let pid = self.pid();
        let running = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
        });
        assert!(running, "{what}: no thread of the target runs");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The interpreters for the dumps (all), or None when the test is skipped.
fn pythons(test: &str) -> Option<Vec<PythonExe>> {
    if !require(test, &[Need::Root, Need::Binary]) {
        return None;
    }
    let (found, missing) = expected_pythons();
    if found.is_empty() {
        skip(test, &format!("a CPython 3.8 .. 3.15 (missing: {})", missing.join(", ")));
        return None;
    }
    skip_some(test, &missing).then_some(found)
}

/// The interpreters recorded: the system's python3, and one of each
/// layout family (before 3.11, 3.11, 3.12 and 3.13, 3.14+).
fn recorded(all: &[PythonExe]) -> Vec<&PythonExe> {
    let mut out: Vec<&PythonExe> = all.iter().filter(|p| p.label.starts_with("system")).collect();
    for family in [8..=10, 11..=11, 12..=13, 14..=15] {
        if !out.iter().any(|p| family.contains(&p.minor)) {
            out.extend(all.iter().find(|p| family.contains(&p.minor)));
        }
    }
    out
}

/// `dump -p PID --format json`: within `DUMP_LIMIT`, successful, with a
/// note containing `note` on stderr (exactly once); returns its threads.
fn dump(py: &PythonExe, pid: u32, note: &str) -> Vec<Value> {
    let r = run_cmd(&mut infertrace(["dump", "-p", &pid.to_string(), "--format", "json"]), DUMP_LIMIT * 3);
    let what = format!("{}: dump -p {pid}", py.label);
    assert!(r.elapsed < DUMP_LIMIT, "{what} took {:?}\n{}", r.elapsed, r.describe());
    r.assert_ok();
    let notes: Vec<&str> = r.stderr.lines().filter(|l| l.contains(note)).collect();
    assert_eq!(notes.len(), 1, "{what}: expected one note with {note:?}\n{}", r.describe());
    assert!(notes[0].starts_with("note: "), "{what}: {}", notes[0]);
    let threads: Vec<Value> = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{what}: {e}\n{}", r.describe()));
    eprintln!("{what}: {:?}, {} threads, {}", r.elapsed, threads.len(), notes[0]);
    threads
}

/// A live thread of the dump runs `busy_worker_loop`.
#[track_caller]
fn assert_worker_stack(what: &str, threads: &[Value]) {
    let found = threads
        .iter()
        .any(|t| t["tid"].as_u64().is_some_and(|t| t != 0) && python_frames_of(t).iter().any(|f| f.0 == "busy_worker_loop"));
    assert!(found, "{what}: no busy-worker thread in busy_worker_loop: {}", Value::Array(threads.to_vec()));
}

/// `record -p PID --duration 3s`: within `RECORD_LIMIT`, successful; its
/// notes contain `note` (when given, exactly once) and the worker's
/// getppid calls are counted. Returns the report.
fn record(py: &PythonExe, pid: u32, note: Option<&str>) -> Report {
    let dir = TempDir::new("hostile-memory");
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "-p", &pid.to_string(), "--duration", "3s", "--format", "json", "-o"]);
    cmd.arg(&out).current_dir(dir.path());
    let r = run_cmd(&mut cmd, RECORD_LIMIT * 2);
    let what = format!("{}: record -p {pid}", py.label);
    assert!(r.elapsed < RECORD_LIMIT, "{what} took {:?}\n{}", r.elapsed, r.describe());
    r.assert_ok();
    let rep = r.json();
    rep.check_invariants();
    let notes: Vec<String> =
        rep.0["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap_or("").to_owned()).collect();
    if let Some(note) = note {
        let n = notes.iter().filter(|n| n.contains(note)).count();
        assert_eq!(n, 1, "{what}: expected one note with {note:?}: {notes:?}");
    }
    let getppid = rep.count(pid, "getppid");
    assert!(getppid > 100, "{what}: the worker's getppid calls: {getppid}; {:?}", rep.counts_for(pid));
    eprintln!("{what}: {:?}, {getppid} getppid, notes {notes:?}", r.elapsed);
    rep
}

/// A thread-state list corrupted in `mode`: dump and record say so in one
/// note on every interpreter, read the real threads, and leave the target running.
fn thread_list(test: &str, mode: &str, note: impl Fn(u32) -> String) {
    let Some(all) = pythons(test) else { return };
    let rec = recorded(&all);
    for py in &all {
        let mut t = Target::start(py, mode);
        let pid = t.pid();
        let threads = dump(py, pid, &note(pid));
        assert_worker_stack(&format!("{}: {mode}", py.label), &threads);
        t.assert_alive(&py.label);
        if rec.iter().any(|r| r.label == py.label) {
            record(py, pid, Some(&note(pid)));
            t.assert_alive(&py.label);
        }
    }
}

#[test]
fn a_thread_state_list_that_loops_is_walked_once() {
    thread_list("a_thread_state_list_that_loops_is_walked_once", "tstate-cycle", |pid| {
        format!("thread list of pid {pid}: cycle at 0x")
    });
}

#[test]
fn a_self_addressed_thread_list_stops_at_the_bound() {
    thread_list("a_self_addressed_thread_list_stops_at_the_bound", "tstate-selfaddr", |pid| {
        format!("thread list of pid {pid}: more than ")
    });
}

/// The main thread's frame chain loops: its dump stops with a note, the
/// worker's stack is whole; the recording (the kernel's walk is bounded by
/// its depth) still has the worker's calls.
#[test]
fn a_frame_chain_that_loops_is_walked_once() {
    let test = "a_frame_chain_that_loops_is_walked_once";
    let Some(all) = pythons(test) else { return };
    let rec = recorded(&all);
    for py in &all {
        let mut t = Target::start(py, "frame-cycle");
        let pid = t.pid();
        let threads = dump(py, pid, &format!("frame chain of thread {pid} of pid {pid}: cycle at 0x"));
        assert_worker_stack(&format!("{}: frame-cycle", py.label), &threads);
        let main = threads.iter().find(|t| t["tid"] == pid).unwrap_or_else(|| panic!("{}: no main thread", py.label));
        assert!(
            python_frames_of(main).iter().any(|f| f.0 == "hold"),
            "{}: the main thread's frames before the loop are kept: {main}",
            py.label
        );
        t.assert_alive(&py.label);
        if rec.iter().any(|r| r.label == py.label) {
            // The kernel's walk finds the loop (the main thread wakes every
            // second: an off-CPU stack each time) and the report says so
            // once, not as stacks deeper than the depth limit.
            let rep = record(py, pid, Some(&format!("pid {pid}: its Python frame chain loops")));
            // (The depth note is a detail of the recording: `details`.)
            let notes = format!("{} {}", rep.0["notes"], rep.0["details"]);
            assert!(!notes.contains("deeper than"), "{}: a loop read as depth: {notes}", py.label);
            t.assert_alive(&py.label);
        }
    }
}

/// The main thread called pthread_exit (its /proc entry a zombie) while
/// the worker runs on: `-p PID` traces the process, its worker's calls and
/// Python stack.
#[test]
fn a_process_whose_main_thread_exited_is_traced() {
    let test = "a_process_whose_main_thread_exited_is_traced";
    let Some(all) = pythons(test) else { return };
    let Some(py) = recorded(&all).into_iter().next().cloned() else { return };
    let mut t = Target::start(&py, "main-exit");
    let pid = t.pid();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(stat.contains(") Z "), "{}: the main thread is not a zombie: {stat}", py.label);

    let r = run_cmd(&mut infertrace(["dump", "-p", &pid.to_string(), "--format", "json"]), DUMP_LIMIT * 3);
    r.assert_ok();
    let threads: Vec<Value> = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}\n{}", r.describe()));
    assert_worker_stack(&format!("{}: main-exit", py.label), &threads);

    let rep = record(&py, pid, None);
    let worker_stack = rep.stacks().iter().any(|s| {
        s["pid"] == pid && python_frames_of(s).iter().any(|f| f.0 == "busy_worker_loop")
    });
    assert!(worker_stack, "{}: no recorded stack of the worker in busy_worker_loop", py.label);
    let target = rep.target(pid).unwrap_or_else(|| panic!("pid {pid} not among the targets"));
    assert_eq!(target["origin"], "attached", "{target}");
    t.assert_alive(&py.label);
}

/// 3.14+: the last task's list node points at itself instead of the list's
/// head: `dump --async` lists the tasks before the loop with one note
/// (it used to retry and fail), `record -p` finishes with the same note
/// (from its asyncio sampler) and the worker's calls, and the target survives.
#[test]
fn an_asyncio_task_list_that_loops_is_walked_once() {
    let test = "an_asyncio_task_list_that_loops_is_walked_once";
    let Some(all) = pythons(test) else { return };
    let newer: Vec<&PythonExe> = all.iter().filter(|p| p.minor >= 14).collect();
    if newer.is_empty() {
        skip(test, "a CPython 3.14+ (the chroot's: tests/src/pyroot.rs)");
        return;
    }
    for py in newer {
        let mut t = Target::start(py, "task-cycle");
        let pid = t.pid();
        let r = run_cmd(&mut infertrace(["dump", "-p", &pid.to_string(), "--async", "--format", "json"]), DUMP_LIMIT * 3);
        let what = format!("{}: dump --async -p {pid}", py.label);
        assert!(r.elapsed < DUMP_LIMIT, "{what} took {:?}\n{}", r.elapsed, r.describe());
        r.assert_ok();
        let note = format!("of pid {pid}: cycle at 0x");
        let notes: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("note: asyncio task list at ") && l.contains(&note)).collect();
        assert_eq!(notes.len(), 1, "{what}: expected one note on the task list\n{}", r.describe());
        let names: Vec<String> = r
            .stdout
            .match_indices("\"sleeper-")
            .map(|(i, _)| r.stdout[i + 1..].split('"').next().unwrap_or("").to_owned())
            .collect();
        for want in ["sleeper-0", "sleeper-1", "sleeper-2"] {
            assert!(names.iter().any(|n| n == want), "{what}: {want} missing\n{}", r.describe());
        }
        eprintln!("{what}: {:?}, {}", r.elapsed, notes[0]);
        t.assert_alive(&py.label);
        // The asyncio sampler reads the tasks too: its note reaches the recording.
        record(py, pid, Some(&format!("of pid {pid}: cycle at 0x")));
        t.assert_alive(&py.label);
    }
}
