//! The chroot interpreters' wrappers (tests/src/pyroot.rs) behave like the
//! interpreter itself, which every Python test relies on: the spawned pid
//! is the interpreter's (its /proc/PID/exe the root's python3.X, its
//! /proc/PID/root the root), stdin and stdout are the pipes given, the
//! working directory and relative paths are kept, SIGINT and SIGKILL reach
//! Python, the workloads and temporary directories are at their host
//! paths, the root's libcudart is at [`CUDART_IN_ROOT`] and the host's copy
//! is not visible, and nothing stays mounted once it exits.
//!
//! Needs root and the root built by `cargo xtask setup`; under `CI=true` a
//! missing one fails the test.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

const PROBE: &str = r#"
import os, sys, ctypes
print("ready", os.getpid(), os.getcwd(), flush=True)
line = sys.stdin.readline().strip()
print("stdin", line, flush=True)
print("rel", open("data.txt").read().strip(), flush=True)
print("workload", os.path.isfile(sys.argv[1]), flush=True)
print("cudart", os.path.isfile(sys.argv[2]), os.path.exists(sys.argv[3]), flush=True)
ctypes.CDLL(sys.argv[2])
print("loaded", flush=True)
import time
time.sleep(60)
"#;

#[test]
fn wrapper_is_the_interpreter() {
    let test = "wrapper_is_the_interpreter";
    require!(test, Root);
    for p in chroot_pythons_or_skip(test) {
        let label = &p.label;
        let root = p.root.clone().expect("a chroot interpreter has a root").canonicalize().unwrap();
        let dir = TempDir::new("pyroot");
        fs::write(dir.join("probe.py"), PROBE).unwrap();
        fs::write(dir.join("data.txt"), "relative ok\n").unwrap();
        let workload = workspace_root().join("tests/workloads/py_blocked.py").canonicalize().unwrap();
        let host_cudart = workspace_root().join("target/cuda-real/libcudart.so.12");
        for signal in [libc::SIGINT, libc::SIGKILL] {
            let mut child = Command::new(&p.exe)
                .arg("probe.py")
                .arg(&workload)
                .arg(CUDART_IN_ROOT)
                .arg(&host_cudart)
                .current_dir(dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id();
            let mut guard = KillOnDrop::new(pid);
            let lines = line_channel(child.stdout.take().unwrap());
            let next = |what: &str| {
                lines
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|e| panic!("{label}: no {what} line: {e}"))
            };
            // The interpreter reports the spawned pid, inside a PID
            // namespace it shares with us, and the host directory.
            let dirname = dir.path().canonicalize().unwrap();
            assert_eq!(next("ready"), format!("ready {pid} {}", dirname.display()), "{label}");
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap();
            assert_eq!(exe, root.join(format!("usr/bin/python3.{}", p.minor)), "{label}: /proc/{pid}/exe");
            assert_eq!(fs::read_link(format!("/proc/{pid}/root")).unwrap(), root, "{label}: /proc/{pid}/root");
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "hello").unwrap();
            drop(stdin);
            assert_eq!(next("stdin"), "stdin hello", "{label}");
            assert_eq!(next("rel"), "rel relative ok", "{label}");
            assert_eq!(next("workload"), "workload True", "{label}");
            // The root's copy is there, the host's is not.
            assert_eq!(next("cudart"), "cudart True False", "{label}");
            assert_eq!(next("loaded"), "loaded", "{label}");
            // SAFETY: kill(2) with a pid we spawned and own.
            unsafe { libc::kill(pid as i32, signal) };
            let st = child.wait().unwrap();
            guard.disarm();
            // Python re-raises SIGINT after its KeyboardInterrupt.
            assert_eq!(st.signal(), Some(signal), "{label}: exit status {st:?} after signal {signal}");
        }
        eprintln!("ok: {label}");
    }
    // The wrappers' binds were in mount namespaces of their own.
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = pyroot().canonicalize().unwrap();
    // (Mount points with spaces are escaped: this root's path has none.)
    let left: Vec<&str> =
        mounts.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| std::path::Path::new(m).starts_with(&root))).collect();
    assert!(left.is_empty(), "mounts left under {}: {left:#?}", root.display());
}

/// py-spy, the reference for stacks, reads a wrapper-spawned interpreter.
#[test]
fn py_spy_dumps_a_chroot_interpreter() {
    let test = "py_spy_dumps_a_chroot_interpreter";
    require!(test, Root);
    if !in_path("py-spy") {
        skip(test, "py-spy on PATH (pip install py-spy)");
        return;
    }
    for p in chroot_pythons_or_skip(test) {
        let mut child = Command::new(&p.exe)
            .args(["-c", "import time\ndef napping():\n    time.sleep(60)\nprint('ready', flush=True)\nnapping()"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = KillOnDrop::new(child.id());
        let mut l = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready", "{}", p.label);
        let r = run_cmd(Command::new("py-spy").args(["dump", "--pid", &child.id().to_string()]), RUN_TIMEOUT);
        r.assert_ok();
        assert!(
            r.stdout.contains(&format!("Python v3.{}.", p.minor)) && r.stdout.contains("napping (<string>:3)"),
            "{}: py-spy dump\n{}",
            p.label,
            r.stdout
        );
        let _ = child.kill();
        let _ = child.wait();
        guard.disarm();
        eprintln!("ok: {}", p.label);
    }
}
