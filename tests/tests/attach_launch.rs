//! Attaching to a running process, and following the children of a launched
//! command.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

/// The `waiter` workload: blocked on stdin, N getppid per byte written.
struct Waiter {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Waiter {
    fn start(n: u64) -> Waiter {
        let mut child = Command::new(workload("waiter"))
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn waiter");
        let stdin = child.stdin.take();
        let mut w = Waiter {
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            stdin,
        };
        w.expect_line("ready");
        w
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn expect_line(&mut self, want: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), want, "waiter output");
    }
    /// Makes it do one round of N getppid and waits until it is done.
    fn trigger(&mut self) {
        self.stdin.as_mut().unwrap().write_all(b"x").unwrap();
        self.stdin.as_mut().unwrap().flush().unwrap();
        self.expect_line("done");
    }
    /// Closes its stdin and asserts it exits 0.
    fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "waiter exit: {st:?}");
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn attach_mid_flight_counts_exactly_and_detaches() {
    require!(
        "attach_mid_flight_counts_exactly_and_detaches",
        Root,
        Binary,
        Gcc,
        Bpftool
    );
    const N: u64 = 250;
    let mut w = Waiter::start(N);
    let pid = w.pid();
    let dir = TempDir::new("attach");
    let out = dir.join("rec.itr");

    let before = bpf_prog_ids();
    let pid_s = pid.to_string();
    let tracer = spawn(
        infertrace(["record", "-q", "-p", &pid_s, "--format", "json", "-o"])
            .arg(&out)
            .current_dir(dir.path()),
    );
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    wait_attached(tpid, pid, &before);

    // The waiter is blocked in read(0) since before the attach. Two rounds:
    // read returns, N getppid, write "done", read again.
    w.trigger();
    w.trigger();
    // Back in read(0) (nr 0 on x86_64) when the window closes.
    #[cfg(target_arch = "x86_64")]
    wait_blocked_in(pid, 0);

    kill(tpid, libc::SIGINT);
    let r = wait_child(tracer, Duration::from_secs(15), "infertrace after SIGINT");
    guard.disarm();
    r.assert_ok();
    assert!(out.is_file(), "recording not written\n{}", r.describe());
    let rep = r.json();
    rep.check_invariants();

    let t = rep
        .target(pid)
        .unwrap_or_else(|| panic!("pid {pid} not in targets: {}", rep.0));
    assert_eq!(t["origin"], "attached", "{t}");
    assert_eq!(t["comm"], "waiter", "{t}");
    assert_eq!(t["exe"], workload("waiter").to_str().unwrap(), "{t}");
    assert_eq!(
        t["exit_code"],
        serde_json::Value::Null,
        "still running: {t}"
    );
    let counts = rep.counts_for(pid);
    assert_eq!(rep.count(pid, "getppid"), 2 * N, "{counts:?}");
    // The read in flight at attach time completes in the window and counts;
    // the one still in flight at detach is counted too (infertrace accounts
    // calls in flight when the window closes, timed up to its end).
    assert_eq!(rep.count(pid, "read"), 3, "{counts:?}");
    assert_eq!(rep.errors(pid, "read"), 0, "{counts:?}");
    assert_eq!(rep.count(pid, "write"), 2, "{counts:?}");
    assert_eq!(counts.len(), 3, "nothing else: {counts:?}");

    // Detaching left the workload running and working.
    assert!(alive(pid), "workload {pid} died with the tracer");
    w.trigger();
    w.finish();
}

#[test]
fn attach_with_duration_stops_by_itself() {
    require!("attach_with_duration_stops_by_itself", Root, Binary, Gcc);
    let mut w = Waiter::start(10);
    let pid = w.pid();
    let dir = TempDir::new("attach-dur");
    let out = dir.join("rec.itr");
    let pid_s = pid.to_string();
    let r = run_cmd(
        infertrace([
            "record",
            "-q",
            "-p",
            &pid_s,
            "--duration",
            "1s",
            "--format",
            "json",
            "-o",
        ])
        .arg(&out)
        .current_dir(dir.path()),
        Duration::from_secs(15),
    );
    r.assert_ok();
    assert!(
        r.elapsed < Duration::from_millis(3500),
        "took {:?} for --duration 1s",
        r.elapsed
    );
    assert!(
        r.elapsed >= Duration::from_secs(1),
        "took {:?} for --duration 1s",
        r.elapsed
    );
    let rep = r.json();
    rep.check_invariants();
    let d = rep.0["duration_ns"].as_u64().unwrap();
    assert!(
        (1_000_000_000..1_500_000_000).contains(&d),
        "duration_ns {d}"
    );
    assert_eq!(rep.one_target("attached")["pid"], pid);
    assert!(out.is_file());
    assert!(alive(pid));
    w.trigger();
    w.finish();
}

/// `infertrace record -- forker CODE getppid_n N LINGER` and its report.
fn launch_forker(code: i32, n: u64) -> (Run, Report, std::path::PathBuf) {
    let forker = workload("forker");
    let child = workload("getppid_n");
    let (code_s, n_s) = (code.to_string(), n.to_string());
    let cmd: Vec<&OsStr> = vec![
        forker.as_os_str(),
        code_s.as_ref(),
        child.as_os_str(),
        n_s.as_ref(),
        "300".as_ref(),
    ];
    let dir = TempDir::new("fork");
    let (r, rep) = record_launch(&dir.join("rec.itr"), &cmd);
    (r, rep, child)
}

#[test]
fn launch_follows_fork_and_exec() {
    require!("launch_follows_fork_and_exec", Root, Binary, Gcc);
    const N: u64 = 321;
    let (_, rep, child_exe) = launch_forker(0, N);

    let parent = rep.one_target("launched");
    let ppid = parent["pid"].as_u64().unwrap() as u32;
    assert_eq!(parent["exit_code"], 0, "{parent}");
    assert_eq!(parent["comm"], "forker", "{parent}");
    assert_eq!(
        parent["exe"],
        workload("forker").to_str().unwrap(),
        "{parent}"
    );
    assert_eq!(rep.count(ppid, "getppid"), 0, "{:?}", rep.counts_for(ppid));

    let child = rep.one_target("followed");
    let cpid = child["pid"].as_u64().unwrap() as u32;
    assert_eq!(child["ppid"], ppid, "{child}");
    assert_eq!(child["comm"], "getppid_n", "{child}");
    assert_eq!(child["exe"], child_exe.to_str().unwrap(), "{child}");
    assert_eq!(
        child["cmdline"],
        serde_json::json!([child_exe.to_str().unwrap(), N.to_string(), "300"]),
        "{child}"
    );
    assert_eq!(rep.count(cpid, "getppid"), N, "{:?}", rep.counts_for(cpid));
    assert_eq!(rep.count(cpid, "execve"), 1, "{:?}", rep.counts_for(cpid));
    assert_eq!(
        rep.count(cpid, "exit_group"),
        1,
        "{:?}",
        rep.counts_for(cpid)
    );
    assert_eq!(rep.targets().len(), 2, "{}", rep.0);
}

#[test]
fn launched_exit_code_is_reported() {
    require!("launched_exit_code_is_reported", Root, Binary, Gcc);
    let (r, rep, _) = launch_forker(3, 10);
    assert_eq!(
        r.code(),
        Some(0),
        "infertrace itself succeeds\n{}",
        r.describe()
    );
    let parent = rep.one_target("launched");
    assert_eq!(parent["exit_code"], 3, "{parent}");
    let child = rep.one_target("followed");
    assert_eq!(
        rep.count(child["pid"].as_u64().unwrap() as u32, "getppid"),
        10
    );
}
