//! The recording file survives what can go wrong around it (issue 15, items
//! 3 and 4): a failed launch leaves an existing file as it was; SIGHUP
//! writes the whole recording like SIGTERM; a tracer killed with SIGKILL
//! leaves its last checkpoint, readable and marked cut; a write that fails
//! at the end keeps the printed report and says that nothing was written;
//! no temporary file is left beside the output.
//!
//! Ground truth for the counts: `two_phases.py` makes exactly N1 getppid
//! calls, says so, and waits on its stdin (the test's pipe) before N2 more.

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use std::time::Duration;

use infertrace_e2e::*;

const N1: u64 = 1000;
const N2: u64 = 700;

/// A tracer launching `two_phases.py N1 N2`, its first phase done.
struct TwoPhases {
    tracer: Child,
    /// Kills the tracer, then the workload, if the test fails first.
    _guards: (KillOnDrop, KillOnDrop),
    /// The workload's pid (it reads `go` from here to start phase 2).
    pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// `record --format json -o OUT OPTIONS -- python3 two_phases.py N1 N2`,
/// returned once the workload printed `phase1 PID`: by then the probes are
/// attached and the tracer's signal handlers installed.
fn two_phases(python: &Path, out: &Path, options: &[&str]) -> TwoPhases {
    let mut tracer = Command::new(bin())
        .args(["record", "-q", "--format", "json", "-o"])
        .arg(out)
        .args(options)
        .arg("--")
        .arg(python)
        .arg(workspace_root().join("tests/workloads/two_phases.py"))
        .args([N1.to_string(), N2.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn infertrace");
    let tracer_guard = KillOnDrop::new(tracer.id());
    let stdin = tracer.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(tracer.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("workload's phase1 line");
    let pid: u32 = line
        .strip_prefix("phase1 ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected `phase1 PID`, got {line:?}"));
    TwoPhases {
        tracer,
        _guards: (tracer_guard, KillOnDrop::new(pid)),
        pid,
        stdin,
        stdout,
    }
}

impl TwoPhases {
    /// Lets the workload run its phase 2 (`release`) or not, waits for the
    /// tracer, then ends the workload if it still waits: (status, stdout,
    /// stderr). The workload shares the tracer's pipes: they are read on
    /// threads, so neither blocks on a full pipe.
    fn finish(self, release: bool) -> (std::process::ExitStatus, String, String) {
        let TwoPhases {
            mut tracer,
            _guards,
            pid,
            mut stdin,
            stdout,
        } = self;
        if release {
            stdin.write_all(b"go\n").expect("release the workload");
        }
        let read_all = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = read_all(Box::new(stdout));
        let err = read_all(Box::new(tracer.stderr.take().expect("stderr")));
        let status = tracer.wait().expect("infertrace exits");
        if !release && alive(pid) {
            // SAFETY: a plain kill(2) of the workload this test started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        drop(stdin);
        (
            status,
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    }
}

/// Root, the binary and a python3 on PATH (the two-phase workload's
/// interpreter), or the test is skipped (failed under CI=true).
fn python_for(test: &str) -> Option<PathBuf> {
    if !require(test, &[Need::Root, Need::Binary]) {
        return None;
    }
    match system_python() {
        Some((python, _)) => Some(python),
        None => {
            skip(test, "a python3 on PATH");
            None
        }
    }
}

fn report_json(path: &Path) -> Run {
    run_infertrace([
        OsStr::new("report"),
        OsStr::new("--format"),
        OsStr::new("json"),
        path.as_os_str(),
    ])
}

/// A stand-in for an earlier recording: any bytes must survive as they are.
fn old_recording(dir: &TempDir) -> (PathBuf, Vec<u8>) {
    let keep = dir.join("keep.itr");
    let bytes = b"ITRACE\r\nan earlier recording, byte for byte".to_vec();
    fs::write(&keep, &bytes).unwrap();
    (keep, bytes)
}

#[test]
fn failed_launch_keeps_an_existing_recording() {
    require!("failed_launch_keeps_an_existing_recording", Root, Binary);
    let dir = TempDir::new("out-launch");
    let (keep, bytes) = old_recording(&dir);
    // Not found (fails before any probe), and found but not executable
    // (fails at exec, after the probes are attached).
    let not_exec = TempDir::new("out-launch-bin");
    let script = not_exec.join("not-executable");
    fs::write(&script, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    for cmd in [Path::new("/nonexistent/binary"), script.as_path()] {
        let r = run_cmd(
            infertrace(["record", "-q", "-o", "keep.itr", "--"])
                .arg(cmd)
                .current_dir(dir.path()),
            Duration::from_secs(60),
        );
        assert!(
            !r.status.success(),
            "{}: expected failure\n{}",
            cmd.display(),
            r.describe()
        );
        assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
        let line = single_error_line(&r);
        assert!(
            line.contains(&*cmd.to_string_lossy()),
            "the command is not named: {line:?}"
        );
        assert_eq!(
            fs::read(&keep).unwrap(),
            bytes,
            "{}: keep.itr was touched\n{}",
            cmd.display(),
            r.describe()
        );
        assert_eq!(
            dir.entries(),
            ["keep.itr"],
            "{}: files left behind\n{}",
            cmd.display(),
            r.describe()
        );
    }
}

#[test]
fn sighup_writes_the_whole_recording() {
    let Some(python) = python_for("sighup_writes_the_whole_recording") else { return };
    let dir = TempDir::new("out-sighup");
    let out = dir.join("rec.itr");
    let run = two_phases(&python, &out, &[]);
    let (tracer, pid) = (run.tracer.id(), run.pid);
    kill(tracer, libc::SIGHUP);
    let (status, stdout, stderr) = run.finish(false);
    // As for SIGINT and SIGTERM (tests/cleanup.rs): a clean stop, exit 0.
    assert!(status.success(), "SIGHUP: {status:?}\n{stderr}");
    let printed = Report::parse(&stdout)
        .unwrap_or_else(|e| panic!("report on stdout: {e}\n{stdout}\n{stderr}"));
    assert_eq!(
        printed.count(pid, "getppid"),
        N1,
        "printed report: getppid of pid {pid}"
    );
    let r = report_json(&out);
    r.assert_ok();
    let rec = r.json();
    rec.check_invariants();
    assert_eq!(
        rec.count(pid, "getppid"),
        N1,
        "recording: getppid of pid {pid}"
    );
    assert!(
        rec.0["cut"].is_null(),
        "a finished recording is not cut: {}",
        rec.0["cut"]
    );
    assert_eq!(dir.entries(), ["rec.itr"], "temporary files left behind");
}

#[test]
fn sigkill_leaves_the_last_checkpoint_marked_cut() {
    let Some(python) = python_for("sigkill_leaves_the_last_checkpoint_marked_cut") else { return };
    let dir = TempDir::new("out-sigkill");
    let out = dir.join("rec.itr");
    let run = two_phases(&python, &out, &["--checkpoint-every", "300ms"]);
    let (tracer, pid) = (run.tracer.id(), run.pid);
    // A checkpoint taken after phase 1 holds exactly N1 calls.
    let checkpoint = poll(Duration::from_secs(60), || {
        let r = report_json(&out);
        let rec = Report::parse(&r.stdout).ok()?;
        (rec.count(pid, "getppid") == N1).then_some(rec)
    });
    let checkpoint = checkpoint
        .unwrap_or_else(|| panic!("no checkpoint with phase 1 in {} after 60 s", out.display()));
    assert_eq!(
        checkpoint.0["cut"]["reason"], "checkpoint",
        "a checkpoint is marked cut: {}",
        checkpoint.0["cut"]
    );
    kill(tracer, libc::SIGKILL);
    let (status, _, stderr) = run.finish(false);
    assert!(
        status.code().is_none(),
        "the tracer was not killed: {status:?}\n{stderr}"
    );

    let r = report_json(&out);
    r.assert_ok();
    let rec = r.json();
    rec.check_invariants();
    assert_eq!(
        rec.count(pid, "getppid"),
        N1,
        "the last checkpoint: getppid of pid {pid}"
    );
    assert_eq!(rec.0["cut"]["reason"], "checkpoint", "{}", rec.0["cut"]);
    let at = rec.0["cut"]["at_unix_ms"].as_u64().unwrap_or(0);
    assert!(
        at >= rec.0["started_unix_ms"].as_u64().unwrap_or(u64::MAX),
        "cut.at_unix_ms {at} before the start"
    );
    assert!(rec.0["duration_ns"].as_u64().unwrap_or(0) > 0);
    let text = run_infertrace([OsStr::new("report"), out.as_os_str()]);
    text.assert_ok();
    let cut_line = text
        .stdout
        .lines()
        .find(|l| l.starts_with("CUT: "))
        .unwrap_or_else(|| panic!("the text report does not say it is cut\n{}", text.stdout));
    assert!(
        cut_line.contains("last checkpoint") && cut_line.contains("did not finish"),
        "{cut_line}"
    );

    // A temporary file a killed tracer may leave (one is planted, named as
    // the dead tracer's) goes with the next recording to the same output.
    let stale = dir.join(format!(".rec.itr.tmp-{tracer}"));
    fs::write(&stale, b"half a checkpoint").unwrap();
    let again = run_infertrace([
        OsStr::new("record"),
        OsStr::new("-q"),
        OsStr::new("-o"),
        out.as_os_str(),
        OsStr::new("--"),
        OsStr::new("true"),
    ]);
    again.assert_ok();
    assert_eq!(
        dir.entries(),
        ["rec.itr"],
        "the dead tracer's temporary file is still there"
    );
    assert!(
        report_json(&out).json().0["cut"].is_null(),
        "the new, finished recording is not cut"
    );
}

#[test]
fn dev_full_keeps_the_report_and_says_nothing_was_written() {
    require!(
        "dev_full_keeps_the_report_and_says_nothing_was_written",
        Root,
        Binary
    );
    let r = run_infertrace([
        "record",
        "-q",
        "--format",
        "json",
        "-o",
        "/dev/full",
        "--",
        "true",
    ]);
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let rep = r.json();
    rep.check_invariants();
    assert_eq!(rep.one_target("launched")["comm"], "true");
    let line = single_error_line(&r);
    assert!(
        line.contains("nothing was written to /dev/full"),
        "{line:?}"
    );
    assert!(
        line.contains("No space left on device"),
        "does not say why: {line:?}"
    );
}

#[test]
fn vanished_directory_keeps_the_report_and_says_nothing_was_written() {
    let Some(python) = python_for("vanished_directory_keeps_the_report_and_says_nothing_was_written") else { return };
    let dir = TempDir::new("out-vanished");
    let sub = dir.join("sub");
    fs::create_dir(&sub).unwrap();
    let out = sub.join("rec.itr");
    // The output's directory goes while recording (before the first
    // checkpoint, 10 s in, or with it).
    let run = two_phases(&python, &out, &[]);
    let pid = run.pid;
    fs::remove_dir_all(&sub).unwrap();
    let (status, stdout, stderr) = run.finish(true);
    assert_eq!(status.code(), Some(1), "{status:?}\n{stderr}");
    let rep = Report::parse(&stdout)
        .unwrap_or_else(|e| panic!("report on stdout: {e}\n{stdout}\n{stderr}"));
    assert_eq!(
        rep.count(pid, "getppid"),
        N1 + N2,
        "printed report: getppid of pid {pid}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr}");
    assert!(
        lines[0].starts_with("error: nothing was written to ")
            && lines[0].contains(&*out.to_string_lossy()),
        "{stderr}"
    );
    assert!(
        lines[0].contains("No such file or directory"),
        "does not say why: {stderr}"
    );
    assert_eq!(dir.entries(), Vec::<String>::new(), "something was written");
}

#[test]
fn checkpoints_leave_no_temporary_files() {
    require!("checkpoints_leave_no_temporary_files", Root, Binary);
    let dir = TempDir::new("out-tmpfiles");
    let out = dir.join("rec.itr");
    let tracer = spawn(
        infertrace([
            "record",
            "-q",
            "--format",
            "json",
            "--checkpoint-every",
            "100ms",
            "-o",
        ])
        .arg(&out)
        .args(["--", "sleep", "4"]),
    );
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    // A checkpoint while the tracer runs.
    let seen = poll(Duration::from_secs(30), || {
        (out.is_file() || !alive(tpid)).then_some(out.is_file())
    });
    let r = wait_child(
        tracer,
        Duration::from_secs(60),
        "infertrace record --checkpoint-every 100ms",
    );
    guard.disarm();
    r.assert_ok();
    assert_eq!(
        seen,
        Some(true),
        "no checkpoint while recording\n{}",
        r.describe()
    );
    assert!(r.json().0["cut"].is_null(), "the printed report is not cut");
    assert_eq!(
        dir.entries(),
        ["rec.itr"],
        "files left beside the output\n{}",
        r.describe()
    );
    let rec = report_json(&out);
    rec.assert_ok();
    assert!(
        rec.json().0["cut"].is_null(),
        "the final recording replaced the checkpoints"
    );
}
