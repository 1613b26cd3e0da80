//! Issue 11, section 4: a syscall's time can never exceed the window it was
//! seen in. The reported case: `record -p HOSTPID --duration 2s` of a
//! `os.getppid(); time.sleep(0.001)` loop in a container, while other
//! tracing and load ran, once gave 24 s of getppid time in a 2 s window.
//! The cause: a sys_exit without its sys_enter (the kernel skips a
//! tracepoint program that is already running on that CPU, preempted; a
//! per-CPU target-verdict cache can also be stale for a moment) was taken
//! for a call in flight at attach and timed from the window start, for
//! every such exit. Now such an exit is counted as `syscall_enter_missed`
//! and not timed; the in-flight-at-attach case applies once per thread and
//! only to threads that existed before the window; a start is never before
//! the window.
//!
//! This test repeats the conditions, several runs: the loop in its own PID
//! namespace (`unshare --pid --fork`), six processes hammering syscalls on
//! the two CPUs, and a second tracer recording one of them at the same
//! time. Each run: getppid's total and longest call fit in the window, and
//! its mean stays far below a millisecond (a getppid takes microseconds,
//! preempted ones a few ms).

use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

const RUNS: usize = 5;

#[test]
fn syscall_time_never_exceeds_the_window_under_load_in_a_pid_namespace() {
    const TEST: &str = "syscall_time_never_exceeds_the_window_under_load_in_a_pid_namespace";
    require!(TEST, Root, Binary, Unshare);
    let Some((python, _)) = system_python() else {
        return skip(TEST, "a python3 on PATH");
    };
    let dir = TempDir::new("syscall-stress");
    let wl = workspace_root().join("tests/workloads/getppid_sleep.py");
    let load_code = "import os,time\nend=time.time()+8\nwhile time.time()<end:\n  [os.getppid() for _ in range(1000)]";
    let mut missed_total = 0;
    for run in 0..RUNS {
        let loads: Vec<_> = (0..6)
            .map(|_| Command::new(&python).args(["-c", load_code]).stdout(Stdio::null()).spawn().expect("load"))
            .collect();
        let _load_guards: Vec<KillOnDrop> = loads.iter().map(|c| KillOnDrop::new(c.id())).collect();
        let mut ns = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(&python)
            .arg(&wl)
            .arg("6")
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let _ns_guard = KillOnDrop::new(ns.id());
        let lines = line_channel(ns.stdout.take().expect("stdout"));
        let first = lines.recv_timeout(Duration::from_secs(30)).expect("pid line");
        assert_eq!(first.trim(), "pid 1", "the loop runs as pid 1 of its own namespace");
        let host_pid = poll(Duration::from_secs(10), || children_of(ns.id()).into_iter().next()).expect("the loop's host pid");
        // Other tracing at the same time.
        let other = Command::new(bin())
            .args(["record", "-q", "--duration", "3s", "--format", "json", "-p", &loads[0].id().to_string(), "-o"])
            .arg(dir.join(format!("other{run}.itr")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("second tracer");
        let _other_guard = KillOnDrop::new(other.id());
        let r = run_infertrace([
            "record",
            "-q",
            "--format",
            "json",
            "--duration",
            "2s",
            "-p",
            &host_pid.to_string(),
            "-o",
            dir.join(format!("r{run}.itr")).to_str().unwrap(),
        ]);
        r.assert_ok();
        let rep = r.json();
        rep.check_invariants();
        let window = rep.0["duration_ns"].as_u64().expect("duration_ns");
        let row = rep.row(host_pid, "getppid").unwrap_or_else(|| panic!("run {run}: no getppid row for pid {host_pid}"));
        let (count, total, max) = (row["count"].as_u64().unwrap(), row["total_ns"].as_u64().unwrap(), row["max_ns"].as_u64().unwrap());
        eprintln!(
            "run {run}: getppid {count} calls, {:.1} us/call, max {:.1} us, window {:.2} s, lost {}",
            total as f64 / count.max(1) as f64 / 1e3,
            max as f64 / 1e3,
            window as f64 / 1e9,
            rep.0["lost_detail"]
        );
        assert!(count > 100, "run {run}: only {count} getppid calls traced");
        assert!(max <= window, "run {run}: a getppid of {max} ns in a window of {window} ns");
        assert!(total <= window, "run {run}: {total} ns of getppid in a window of {window} ns");
        assert!(total / count < 1_000_000, "run {run}: {} ns per getppid", total / count);
        for s in rep.syscalls() {
            let m = s["max_ns"].as_u64().unwrap_or(0);
            assert!(m <= window, "run {run}: {} took {m} ns in a window of {window} ns", s["name"]);
        }
        missed_total += rep.0["lost_detail"]["syscall_enter_missed"].as_u64().unwrap_or(0);
        let _ = ns.wait();
    }
    eprintln!("sys_enter missed over {RUNS} runs: {missed_total}");
}
