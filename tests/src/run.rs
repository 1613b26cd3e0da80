//! Running commands, and the infertrace binary, to completion with a timeout.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{bin, Report, RUN_TIMEOUT};

/// Output of a finished command, with lossy-decoded text.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn describe(&self) -> String {
        format!(
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
    /// Asserts exit code 0.
    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "expected success\n{}",
            self.describe()
        );
        self
    }
    /// Parses stdout as a JSON report.
    #[track_caller]
    pub fn json(&self) -> Report {
        Report::parse(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not a JSON report: {e}\n{}", self.describe()))
    }
}

fn from_output(o: Output, elapsed: Duration) -> Run {
    Run {
        status: o.status,
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        elapsed,
    }
}

/// Spawns `cmd` with piped stdout/stderr and null stdin.
pub fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
}

/// Reads `r` on a thread, sending chunks through a channel, so the caller
/// can stop waiting for EOF (a grandchild may keep the pipe open).
fn pipe_reader<R: Read + Send + 'static>(r: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut r) = r {
        thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    rx
}

/// Collects what `rx` delivers until EOF, or until nothing arrived for
/// `quiet` (the writer is gone but a grandchild holds the pipe).
fn collect(rx: &mpsc::Receiver<Vec<u8>>, quiet: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(chunk) = rx.recv_timeout(quiet) {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Waits for a spawned child (stdout/stderr piped) for up to `timeout`,
/// collecting its output. On timeout it is killed and the test panics.
pub fn wait_child(mut child: Child, timeout: Duration, what: &str) -> Run {
    let start = Instant::now();
    let rx_out = pipe_reader(child.stdout.take());
    let rx_err = pipe_reader(child.stderr.take());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = loop {
        while let Ok(c) = rx_out.try_recv() {
            out.extend_from_slice(&c);
        }
        while let Ok(c) = rx_err.try_recv() {
            err.extend_from_slice(&c);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let st = child.wait().unwrap();
            out.extend(collect(&rx_out, Duration::from_millis(500)));
            err.extend(collect(&rx_err, Duration::from_millis(500)));
            let o = from_output(
                Output {
                    status: st,
                    stdout: out,
                    stderr: err,
                },
                start.elapsed(),
            );
            panic!(
                "{what}: still running after {timeout:?}, killed\n{}",
                o.describe()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    out.extend(collect(&rx_out, Duration::from_millis(500)));
    err.extend(collect(&rx_err, Duration::from_millis(500)));
    from_output(
        Output {
            status,
            stdout: out,
            stderr: err,
        },
        elapsed,
    )
}

/// Runs `cmd` to completion with a timeout.
pub fn run_cmd(cmd: &mut Command, timeout: Duration) -> Run {
    let what = format!("{cmd:?}");
    let child = spawn(cmd);
    wait_child(child, timeout, &what)
}

/// A `Command` for the infertrace binary with `args`.
pub fn infertrace<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(bin());
    c.args(args);
    c
}

/// Runs infertrace with `args` (timeout [`RUN_TIMEOUT`]).
pub fn run_infertrace<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_cmd(&mut infertrace(args), RUN_TIMEOUT)
}

/// `infertrace record -q --format json -o <out> -- <cmd...>`: launches and
/// traces `cmd`, asserts success, and returns the parsed JSON report after
/// checking its invariants and that `out` was written.
#[track_caller]
pub fn record_launch(out: &Path, cmd: &[&OsStr]) -> (Run, Report) {
    record_launch_with(out, &[], cmd)
}

/// `record_launch` with extra `record` options (`--no-sched`, `-F 0`, ...)
/// before the command.
#[track_caller]
pub fn record_launch_with(out: &Path, options: &[&str], cmd: &[&OsStr]) -> (Run, Report) {
    let mut args: Vec<&OsStr> = vec![
        "record".as_ref(),
        "-q".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(options.iter().map(|o| OsStr::new(*o)));
    args.push("--".as_ref());
    args.extend_from_slice(cmd);
    let r = run_infertrace(&args);
    r.assert_ok();
    assert!(
        out.is_file(),
        "recording {} not written\n{}",
        out.display(),
        r.describe()
    );
    let rep = r.json();
    rep.check_invariants();
    (r, rep)
}

/// Asserts that stderr is exactly one non-empty line of the form
/// `error: <what> (hint: <remedy>)` and returns it.
#[track_caller]
pub fn single_error_line(r: &Run) -> String {
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one line on stderr, got {}\n{}",
        lines.len(),
        r.describe()
    );
    assert!(
        lines[0].contains("error:"),
        "stderr line lacks \"error:\"\n{}",
        r.describe()
    );
    assert!(
        lines[0].trim_start().starts_with("error: ")
            && lines[0].contains(" (hint: ")
            && lines[0].trim_end().ends_with(')'),
        "not of the form `error: <what> (hint: <remedy>)`: {:?}",
        lines[0]
    );
    lines[0].to_string()
}
