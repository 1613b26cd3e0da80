//! `record` can be read at any moment: SIGUSR1 writes the recording so far
//! (`FILE.snapshot.itr`) while the window goes on. Ground truth: a workload
//! that makes exactly N1 getppid calls, says so, waits, then makes N2 more.
//! The snapshot must hold exactly N1 (the second phase has not started), the
//! final recording exactly N1 + N2: a snapshot neither loses nor stops
//! anything.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

const N1: u64 = 1000;
const N2: u64 = 700;

#[test]
fn sigusr1_snapshot_mid_window_then_final() {
    require!("sigusr1_snapshot_mid_window_then_final", Root, Binary);
    let Some((python, _)) = system_python() else {
        return skip("sigusr1_snapshot_mid_window_then_final", "a python3 on PATH");
    };
    let dir = TempDir::new("snapshot");
    let out = dir.join("rec.itr");
    let snap = dir.join("rec.snapshot.itr");
    let mut child = Command::new(bin())
        .args(["record", "--format", "json", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&python)
        .arg(workspace_root().join("tests/workloads/two_phases.py"))
        .args([N1.to_string(), N2.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn infertrace");
    let _guard = KillOnDrop::new(child.id());
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("workload's phase1 line");
    let pid: u32 = line
        .strip_prefix("phase1 ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected `phase1 PID`, got {line:?}"));

    kill(child.id(), libc::SIGUSR1);
    let written = poll(Duration::from_secs(20), || snap.is_file().then_some(()));
    assert!(written.is_some(), "no snapshot at {} after SIGUSR1", snap.display());
    let r = run_infertrace(["report".as_ref(), "--format".as_ref(), "json".as_ref(), snap.as_os_str()]);
    r.assert_ok();
    let mid = r.json();
    mid.check_invariants();
    assert_eq!(mid.count(pid, "getppid"), N1, "snapshot: getppid of pid {pid}");
    assert!(alive(child.id()), "the snapshot stopped the recording");

    child.stdin.take().expect("stdin").write_all(b"go\n").expect("release the workload");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("report");
    let status = child.wait().expect("infertrace exits");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "{status:?}\n{err}");
    assert!(err.contains("snapshot of the first"), "the snapshot's stderr line: {err}");
    let fin = Report::parse(&rest).unwrap_or_else(|e| panic!("final report: {e}\n{rest}"));
    fin.check_invariants();
    assert_eq!(fin.count(pid, "getppid"), N1 + N2, "final: getppid of pid {pid}");
    let dur = |r: &Report| r.0["duration_ns"].as_u64().unwrap_or(0);
    assert!(dur(&mid) > 0 && dur(&mid) < dur(&fin), "durations: snapshot {} final {}", dur(&mid), dur(&fin));
}
