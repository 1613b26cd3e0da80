//! `infertrace::python` against real interpreters: for every CPython 3.8 ..
//! 3.13 on the machine (pyenv builds with a shared libpython, Debian's static
//! stripped /usr/bin/python3.11), the stacks read from a process blocked at a
//! known depth must equal py-spy's frame by frame (function, file, line) and
//! the source lines of the workload; the frames a kernel walker following
//! `layout()` would capture must resolve to the same; spinning processes and
//! GIL-bound threads must dump without error; 2.7, 3.6, 3.7 are refused with
//! `PythonError::Unsupported`.
//!
//! Needs root (reading another process's memory), `py-spy` on PATH and the
//! interpreters. A missing prerequisite fails the test under `CI=true`;
//! otherwise it prints `SKIPPED ...` and the test returns.

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use infertrace::{
    python::{Interpreter, PythonError, ThreadDump, ABSENT},
    recording::{Frame, FrameKind},
};
use serde_json::Value;

// ---------------------------------------------------------------------------
// Prerequisites

/// True when nothing is missing; else panics under CI=true or prints
/// SKIPPED and returns false.
fn require(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    infertrace_e2e::skip(test, &missing.join(", "));
    false
}

fn base_missing() -> Vec<String> {
    let mut m = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        m.push("root (euid 0)".to_string());
    }
    if !infertrace_e2e::in_path("py-spy") {
        m.push("py-spy on PATH (pip install py-spy)".to_string());
    }
    m
}

use infertrace_e2e::{expected_pythons as supported_pythons, pyenv_python, PythonExe as Python};

// ---------------------------------------------------------------------------
// Workload

fn workload() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/py_blocked.py").canonicalize().unwrap()
}

/// A running `py_blocked.py MODE`, killed on drop.
struct Workload {
    child: Child,
}

impl Workload {
    fn start(python: &Path, mode: &str) -> Workload {
        let mut child = Command::new(python)
            .arg(workload())
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", python.display()));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let w = Workload { child };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.trim_end() == "ready" => w,
            other => panic!("{} {mode}: no \"ready\" line: {other:?}", python.display()),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 1-based line of the first source line whose trimmed text is `text`.
fn line_of(text: &str) -> u32 {
    let src = fs::read_to_string(workload()).unwrap();
    let n = src.lines().position(|l| l.trim() == text).unwrap_or_else(|| panic!("no line {text:?} in the workload"));
    n as u32 + 1
}

fn tasks(pid: u32) -> BTreeSet<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn attach(p: &Python, pid: u32) -> Interpreter {
    let interp = Interpreter::attach(pid)
        .unwrap_or_else(|e| panic!("{}: attach: {e}", p.label))
        .unwrap_or_else(|| panic!("{}: attach found no CPython", p.label));
    let (major, minor, _) = interp.version();
    assert_eq!((major, minor), (3, p.minor), "{}: version {}", p.label, interp.version_string());
    assert_eq!(interp.layout().version, 300 + p.minor);
    interp
}

fn py_spy(pid: u32) -> Vec<Value> {
    let mut last = String::new();
    for _ in 0..3 {
        let out = Command::new("py-spy").args(["dump", "--json", "--pid", &pid.to_string()]).output().unwrap();
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("py-spy json: {e}"));
            return v.as_array().unwrap().clone();
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("py-spy dump --pid {pid} failed: {last}");
}

fn show(frames: &[Frame]) -> String {
    frames
        .iter()
        .map(|f| format!("{} ({}:{})", f.function, f.file.as_deref().unwrap_or("?"), f.line.map_or(-1, i64::from)))
        .collect::<Vec<_>>()
        .join(" <- ")
}

fn thread<'a>(dumps: &'a [ThreadDump], tid: u32) -> &'a ThreadDump {
    dumps.iter().find(|d| d.tid == tid).unwrap_or_else(|| panic!("no thread {tid} in {dumps:?}"))
}

/// The frames a kernel walker would capture following only `layout()` and
/// `thread_states()`, resolved with `resolve_frame`.
fn kernel_view(interp: &mut Interpreter, pid: u32) -> Vec<(u32, Vec<Frame>)> {
    let l = interp.layout();
    let read = |addr: u64, len: usize| -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: len };
        // SAFETY: local describes buf.
        let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
        assert_eq!(n, len as isize, "read {len} at {addr:#x}");
        buf
    };
    let u64_at = |a: u64| u64::from_le_bytes(read(a, 8).try_into().unwrap());
    let u32_at = |a: u64| u32::from_le_bytes(read(a, 4).try_into().unwrap());
    let mut out = Vec::new();
    for (tid, tstate) in interp.thread_states().unwrap() {
        let mut frame = u64_at(tstate + u64::from(l.tstate_frame));
        if l.cframe_current_frame != ABSENT && frame != 0 {
            frame = u64_at(frame + u64::from(l.cframe_current_frame));
        }
        let mut frames = Vec::new();
        while frame != 0 {
            let shim = l.frame_owner != ABSENT && read(frame + u64::from(l.frame_owner), 1)[0] >= 3;
            if !shim {
                let code = u64_at(frame + u64::from(l.frame_code));
                let instr = if l.version <= 310 {
                    u64::from(u32_at(frame + u64::from(l.frame_instr)))
                } else {
                    u64_at(frame + u64::from(l.frame_instr))
                };
                let checksum = u32_at(code + u64::from(l.code_firstlineno));
                frames.push(interp.resolve_frame(code, instr, checksum));
                // A stale checksum (code address reused) must not resolve.
                let stale = interp.resolve_frame(code, instr, checksum.wrapping_add(1));
                assert_eq!(stale.function, "[unknown]");
                assert_eq!((stale.file, stale.line), (None, None));
            }
            frame = u64_at(frame + u64::from(l.frame_back));
        }
        out.push((tid, frames));
    }
    out
}

// ---------------------------------------------------------------------------
// Tests

/// Blocked process: main thread in os.read under Worker.run -> level1 ->
/// level2 -> level3, a "sleeper" thread in time.sleep under Worker.nap.
#[test]
fn blocked_stacks_match_py_spy_on_every_interpreter() {
    let test = "blocked_stacks_match_py_spy_on_every_interpreter";
    let (pythons, missing_pythons) = supported_pythons();
    let mut missing = base_missing();
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        missing.extend(missing_pythons.iter().cloned());
    } else {
        for m in &missing_pythons {
            eprintln!("note: {m} not found, not tested");
        }
    }
    if !require(test, &missing) || pythons.is_empty() && !require(test, &["a supported CPython".to_string()]) {
        return;
    }
    let file = workload().to_str().unwrap().to_string();
    let l = |t: &str| line_of(t);
    let mut report = Vec::new();
    for p in &pythons {
        let qual = |q: &str, plain: &str| if p.minor >= 11 { q.to_string() } else { plain.to_string() };
        let main_expected: Vec<(String, u32)> = vec![
            ("level3".into(), l("return os.read(fd, 1)")),
            ("level2".into(), l("return level3(fd, how)")),
            ("level1".into(), l("return level2(fd, how)")),
            (qual("Worker.run", "run"), l("return level1(fd, \"read\")")),
            ("block".into(), l("Worker().run(r)")),
            ("<module>".into(), l("{\"block\": block, \"spin\": spin, \"gil\": gil}[sys.argv[1] if len(sys.argv) > 1 else \"block\"]()")),
        ];
        let sleeper_expected: Vec<(String, u32)> = vec![
            ("level3".into(), l("time.sleep(3600)")),
            ("level2".into(), l("return level3(fd, how)")),
            ("level1".into(), l("return level2(fd, how)")),
            (qual("Worker.nap", "nap"), l("return level1(None, \"sleep\")")),
            (qual("block.<locals>.sleeper", "sleeper"), l("Worker().nap()")),
        ];

        let w = Workload::start(&p.exe, "block");
        let pid = w.pid();
        let mut interp = attach(p, pid);

        // The main thread reaches os.read right after printing "ready" (and
        // the sleeper time.sleep shortly before, on a loaded machine after).
        let deadline = Instant::now() + Duration::from_secs(10);
        let ours = loop {
            let d = interp.dump().unwrap_or_else(|e| panic!("{}: dump: {e}", p.label));
            let in_level3 = d.iter().all(|t| t.frames.first().is_some_and(|f| f.function == "level3"));
            if (in_level3 && d.len() == 2) || Instant::now() > deadline {
                break d;
            }
            std::thread::sleep(Duration::from_millis(50));
        };

        // Threads: the process's, with distinct tstates.
        let states = interp.thread_states().unwrap();
        let tids: BTreeSet<u32> = states.iter().map(|(t, _)| *t).collect();
        assert_eq!(tids, tasks(pid), "{}: thread_states tids", p.label);
        assert_eq!(states.iter().map(|(_, s)| *s).collect::<BTreeSet<_>>().len(), states.len());
        let dump_tids: BTreeSet<u32> = ours.iter().map(|d| d.tid).collect();
        assert_eq!(dump_tids, tids, "{}: dump tids", p.label);

        // Ground truth from the source.
        let check = |d: &ThreadDump, want: &[(String, u32)], what: &str| {
            let got: Vec<(String, u32)> =
                d.frames.iter().take(want.len()).map(|f| (f.function.clone(), f.line.unwrap_or(0))).collect();
            assert_eq!(got, want, "{}: {what} stack: {}", p.label, show(&d.frames));
            for f in &d.frames[..want.len()] {
                assert_eq!(f.file.as_deref(), Some(file.as_str()), "{}: {what} file", p.label);
                assert_eq!(f.kind, FrameKind::Python);
                assert_eq!(f.module, None);
            }
        };
        let main = thread(&ours, pid);
        check(main, &main_expected, "main thread");
        assert_eq!(main.frames.len(), main_expected.len(), "{}: main depth: {}", p.label, show(&main.frames));
        let sleeper = ours.iter().find(|d| d.tid != pid).expect("sleeper thread");
        check(sleeper, &sleeper_expected, "sleeper thread");
        assert!(main.thread_name.is_some() && sleeper.thread_name.is_some());

        // py-spy, frame by frame.
        let spy = py_spy(pid);
        assert_eq!(spy.len(), ours.len(), "{}: thread count vs py-spy", p.label);
        for t in &spy {
            let tid = t["os_thread_id"].as_u64().unwrap_or_else(|| panic!("py-spy gave no os_thread_id: {t}")) as u32;
            let mine = thread(&ours, tid);
            let theirs = t["frames"].as_array().unwrap();
            let spy_frames: Vec<(String, String, u32)> = theirs
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["filename"].as_str().unwrap().to_string(),
                        f["line"].as_u64().unwrap() as u32,
                    )
                })
                .collect();
            let my_frames: Vec<(String, String, u32)> = mine
                .frames
                .iter()
                .map(|f| (f.function.clone(), f.file.clone().unwrap_or_default(), f.line.unwrap_or(0)))
                .collect();
            assert_eq!(my_frames, spy_frames, "{}: thread {tid} vs py-spy", p.label);
        }

        // What the kernel walker would see, resolved, is the same.
        let kernel = kernel_view(&mut interp, pid);
        for (tid, frames) in &kernel {
            assert_eq!(frames, &thread(&ours, *tid).frames, "{}: kernel view of thread {tid}", p.label);
        }
        report.push(format!(
            "{:<36} {:<10} threads {} main depth {} gil {}",
            p.label,
            interp.version_string(),
            ours.len(),
            main.frames.len(),
            interp.gil_range().map_or("-".to_string(), |(a, b)| format!("{a:#x}+{}", b - a)),
        ));
    }
    for r in report {
        eprintln!("ok: {r}");
    }
}

/// A process spinning in pure Python: every dump succeeds and shows the loop.
#[test]
fn spinning_process_dumps() {
    let test = "spinning_process_dumps";
    let (pythons, _) = supported_pythons();
    if !require(test, &base_missing()) {
        return;
    }
    let first = line_of("def busy_loop(n):");
    let last = line_of("total %= 1000003");
    for p in &pythons {
        let w = Workload::start(&p.exe, "spin");
        let pid = w.pid();
        let mut interp = attach(p, pid);
        // "ready" is printed just before busy_loop is entered.
        let deadline = Instant::now() + Duration::from_secs(10);
        while interp.dump().unwrap()[0].frames.first().is_none_or(|f| f.function != "busy_loop") {
            assert!(Instant::now() < deadline, "{}: busy_loop never seen", p.label);
            std::thread::sleep(Duration::from_millis(20));
        }
        for i in 0..40 {
            let d = interp.dump().unwrap_or_else(|e| panic!("{}: dump {i}: {e}", p.label));
            assert_eq!(d.len(), 1, "{}: {d:?}", p.label);
            let f = &d[0].frames;
            let names: Vec<&str> = f.iter().map(|f| f.function.as_str()).collect();
            assert_eq!(names, ["busy_loop", "spin", "<module>"], "{}: {}", p.label, show(f));
            let line = f[0].line.unwrap();
            assert!((first..=last).contains(&line), "{}: busy_loop at line {line}", p.label);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Four CPU-bound threads contending for the GIL: every dump succeeds, with
/// five threads of the process, each worker in busy_loop.
#[test]
fn gil_contention_dumps() {
    let test = "gil_contention_dumps";
    let (pythons, _) = supported_pythons();
    if !require(test, &base_missing()) {
        return;
    }
    for p in &pythons {
        let w = Workload::start(&p.exe, "gil");
        let pid = w.pid();
        let mut interp = attach(p, pid);
        // On a loaded machine the workers may reach busy_loop after "ready".
        let deadline = Instant::now() + Duration::from_secs(10);
        while !interp
            .dump()
            .unwrap()
            .iter()
            .filter(|t| t.tid != pid)
            .all(|t| t.frames.first().is_some_and(|f| f.function == "busy_loop"))
        {
            assert!(Instant::now() < deadline, "{}: workers never all in busy_loop", p.label);
            std::thread::sleep(Duration::from_millis(20));
        }
        let worker_tail: Vec<String> = if p.minor >= 11 {
            vec!["busy_loop".into(), "spin_worker".into(), "Thread.run".into()]
        } else {
            vec!["busy_loop".into(), "spin_worker".into(), "run".into()]
        };
        for i in 0..40 {
            let d = interp.dump().unwrap_or_else(|e| panic!("{}: dump {i}: {e}", p.label));
            let tids: BTreeSet<u32> = d.iter().map(|t| t.tid).collect();
            assert_eq!(tids, tasks(pid), "{}: dump {i} threads", p.label);
            let workers: Vec<&ThreadDump> = d.iter().filter(|t| t.tid != pid).collect();
            assert_eq!(workers.len(), 4);
            for t in workers {
                let names: Vec<String> = t.frames.iter().take(3).map(|f| f.function.clone()).collect();
                assert_eq!(names, worker_tail, "{}: dump {i} thread {}: {}", p.label, t.tid, show(&t.frames));
            }
            let states = interp.thread_states().unwrap();
            assert_eq!(states.len(), 5);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(interp.gil_range().is_some(), "{}: GIL state not located", p.label);
    }
}

/// Interpreters outside 3.8 .. 3.13 are refused with a typed error; a
/// process without Python is `Ok(None)`.
#[test]
fn unsupported_and_non_python() {
    let test = "unsupported_and_non_python";
    if !require(test, &base_missing()) {
        return;
    }
    let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let r = Interpreter::attach(sleep.id());
    let _ = sleep.kill();
    let _ = sleep.wait();
    assert!(matches!(r, Ok(None)), "sleep: {r:?}");

    let mut tested = 0;
    for (major, minor) in [(2, 7), (3, 6), (3, 7)] {
        let Some(exe) = pyenv_python(major, minor) else {
            eprintln!("note: pyenv CPython {major}.{minor} not found, not tested");
            continue;
        };
        let mut child = Command::new(&exe)
            .args(["-c", "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let r = Interpreter::attach(child.id());
        let _ = child.kill();
        let _ = child.wait();
        match r {
            Err(e @ PythonError::Unsupported { .. }) => {
                let PythonError::Unsupported { version } = &e else { unreachable!() };
                assert!(version.starts_with(&format!("{major}.{minor}.")), "{major}.{minor}: version {version:?}");
                assert!(!e.to_string().contains('\n'));
                eprintln!("ok: {}: {e}", exe.display());
            }
            other => panic!("{}: expected Unsupported, got {other:?}", exe.display()),
        }
        tested += 1;
    }
    if tested == 0 {
        eprintln!("note: no unsupported CPython found, only the non-Python case tested");
    }
}
