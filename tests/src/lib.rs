//! Shared helpers for the infertrace end-to-end tests.
//!
//! The tests run the real `infertrace` binary against the running kernel and
//! compare what it reports with ground truth (known workloads, strace,
//! bpftool). They need root; see [`require`] for how missing prerequisites
//! are handled (never a silent skip).
//!
//! The binary is `$INFERTRACE_BIN`, or `<workspace>/target/release/infertrace`.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use serde_json;

/// Default timeout for one infertrace run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Locations

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The infertrace binary under test.
pub fn bin() -> PathBuf {
    match std::env::var_os("INFERTRACE_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => workspace_root().join("target/release/infertrace"),
    }
}

/// Directory holding the compiled workloads.
fn workload_dir() -> PathBuf {
    workspace_root().join("target/e2e-workloads")
}

// ---------------------------------------------------------------------------
// Prerequisites

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Effective uid 0.
    Root,
    /// The infertrace binary exists.
    Binary,
    Gcc,
    Strace,
    Bpftool,
    Setpriv,
}

/// An executable `prog` on PATH.
pub fn in_path(prog: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|d| {
        let p = d.join(prog);
        fs::metadata(&p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

fn missing(need: Need) -> Option<String> {
    match need {
        Need::Root => (unsafe { libc::geteuid() } != 0).then(|| "root (euid 0)".to_string()),
        Need::Binary => {
            let b = bin();
            (!b.is_file()).then(|| {
                format!(
                    "infertrace binary {} (build it or set INFERTRACE_BIN)",
                    b.display()
                )
            })
        }
        Need::Gcc => (!in_path("gcc")).then(|| "gcc".to_string()),
        Need::Strace => (!in_path("strace")).then(|| "strace".to_string()),
        Need::Bpftool => (!in_path("bpftool")).then(|| "bpftool".to_string()),
        Need::Setpriv => (!in_path("setpriv")).then(|| "setpriv".to_string()),
    }
}

/// Checks the prerequisites of `test`. Returns true when all are present.
/// When some are missing: panics under `CI=true` (a CI run must not pass by
/// skipping), otherwise prints `SKIPPED <test>: <missing>` to stderr and
/// returns false, and the test returns early.
pub fn require(test: &str, needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter_map(|n| missing(*n)).collect();
    if missing.is_empty() {
        return true;
    }
    skip(test, &missing.join(", "));
    false
}

/// A prerequisite of `test` is missing: panics under `CI=true` (a CI run
/// must not pass by skipping), else prints `SKIPPED <test>: <what>`.
pub fn skip(test: &str, what: &str) {
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{test}: missing prerequisite(s) under CI=true: {what}");
    }
    // Written to fd 2 directly, not through eprintln!, so that libtest's
    // output capture cannot hide the skip.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {what}");
}

/// `require!(needs...)`: returns from the calling test when a prerequisite is
/// missing (after printing SKIPPED, or panics under CI=true).
#[macro_export]
macro_rules! require {
    ($name:expr, $($need:ident),+ $(,)?) => {
        if !$crate::require($name, &[$($crate::Need::$need),+]) {
            return;
        }
    };
}

// ---------------------------------------------------------------------------
// Python interpreters

/// A CPython the tests expect on this machine.
#[derive(Clone, Debug)]
pub struct PythonExe {
    /// How failure messages name it (`pyenv 3.12`, `Debian /usr/bin/python3.11`).
    pub label: String,
    pub exe: PathBuf,
    pub minor: u32,
}

/// `$PYENV_ROOT`, else /root/.pyenv (where `cargo xtask setup`'s machine has it).
pub fn pyenv_root() -> PathBuf {
    match std::env::var_os("PYENV_ROOT") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/root/.pyenv"),
    }
}

/// The newest pyenv build of `major.minor` (its `pythonX.Y`, `pythonX` or
/// `python`).
pub fn pyenv_python(major: u32, minor: u32) -> Option<PathBuf> {
    let dir = pyenv_root().join("versions");
    let prefix = format!("{major}.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let micro: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let bin = dir.join(&name).join("bin");
            let exe = [
                bin.join(format!("python{major}.{minor}")),
                bin.join(format!("python{major}")),
                bin.join("python"),
            ]
            .into_iter()
            .find(|p| p.is_file())?;
            Some((micro, exe))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// The supported CPythons every test of Python attribution runs on: pyenv's
/// 3.8 .. 3.13 and Debian's statically linked /usr/bin/python3.11. Returns
/// those present and the labels of those missing.
pub fn expected_pythons() -> (Vec<PythonExe>, Vec<String>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for minor in 8..=13 {
        match pyenv_python(3, minor) {
            Some(exe) => found.push(PythonExe { label: format!("pyenv 3.{minor}"), exe, minor }),
            None => missing.push(format!("pyenv CPython 3.{minor} under {}", pyenv_root().display())),
        }
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.is_file() {
        found.push(PythonExe { label: "Debian /usr/bin/python3.11".into(), exe: debian, minor: 11 });
    } else {
        missing.push("Debian /usr/bin/python3.11".into());
    }
    (found, missing)
}

// ---------------------------------------------------------------------------
// Temp dirs

static TMP_SEQ: AtomicU32 = AtomicU32::new(0);

/// A directory removed on drop (kept when `INFERTRACE_E2E_KEEP` is set).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "infertrace-e2e-{tag}-{}-{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
    /// Names of the entries in the directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("INFERTRACE_E2E_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

// ---------------------------------------------------------------------------
// Workloads

/// Compiles `tests/workloads/<name>.c` with `gcc -O2 -static` (static, so the
/// dynamic loader adds no syscalls of its own) into `target/e2e-workloads/`
/// and returns the absolute path of the executable. Rebuilt when the source
/// is newer. Needs `Need::Gcc`.
pub fn workload(name: &str) -> PathBuf {
    let src = workspace_root()
        .join("tests/workloads")
        .join(format!("{name}.c"));
    let dir = workload_dir();
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let fresh = match (fs::metadata(&src), fs::metadata(&out)) {
        (Ok(s), Ok(o)) => o.modified().unwrap() >= s.modified().unwrap(),
        (Err(e), _) => panic!("workload source {}: {e}", src.display()),
        _ => false,
    };
    if !fresh {
        // Build under a unique name and rename, so concurrent builds are safe.
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let o = Command::new("gcc")
            .args(["-O2", "-static", "-Wall", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .expect("running gcc");
        assert!(
            o.status.success(),
            "gcc -O2 -static {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        fs::rename(&tmp, &out).unwrap();
    }
    out.canonicalize().unwrap()
}

// ---------------------------------------------------------------------------
// Running processes

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

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Whether a process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_fields(&s)
            .map(|f| f[0] != "Z" && f[0] != "X")
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The fields of /proc/PID/stat after the `(comm)`: index 0 is the state
/// (field 3), index 6 the flags (field 9).
fn stat_fields(stat: &str) -> Option<Vec<String>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Direct children of `pid` (all threads).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("children")) {
                v.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    v
}

/// A pid of a kernel thread (PF_KTHREAD set in /proc/PID/stat flags), other
/// than pid 0/1.
pub fn kernel_thread_pid() -> u32 {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort();
    for pid in pids {
        let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(f) = stat_fields(&s) else { continue };
        let flags: u64 = f.get(6).and_then(|x| x.parse().ok()).unwrap_or(0);
        if pid > 1 && flags & PF_KTHREAD != 0 {
            return pid;
        }
    }
    panic!("no kernel thread found in /proc");
}

/// A pid number that no process or thread currently has.
pub fn unused_pid() -> u32 {
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (1..1000)
        .map(|i| max - i)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("no free pid near pid_max")
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `timeout`.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
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

// ---------------------------------------------------------------------------
// JSON reports

/// A parsed `--format json` report (schema_version 1).
#[derive(Clone, Debug)]
pub struct Report(pub Value);

impl Report {
    pub fn parse(s: &str) -> Result<Report, serde_json::Error> {
        serde_json::from_str(s).map(Report)
    }

    pub fn read(path: &Path) -> Report {
        let s = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Report::parse(&s).unwrap_or_else(|e| panic!("{}: not a JSON report: {e}", path.display()))
    }

    pub fn targets(&self) -> &Vec<Value> {
        self.0["targets"].as_array().expect("targets array")
    }

    pub fn syscalls(&self) -> &Vec<Value> {
        self.0["syscalls"].as_array().expect("syscalls array")
    }

    /// The targets with `origin`.
    pub fn targets_with_origin(&self, origin: &str) -> Vec<&Value> {
        self.targets()
            .iter()
            .filter(|t| t["origin"] == origin)
            .collect()
    }

    /// The only target with `origin`.
    #[track_caller]
    pub fn one_target(&self, origin: &str) -> &Value {
        let v = self.targets_with_origin(origin);
        assert_eq!(
            v.len(),
            1,
            "expected one {origin} target, got {v:?}\nreport: {}",
            self.0
        );
        v[0]
    }

    pub fn target(&self, pid: u32) -> Option<&Value> {
        self.targets().iter().find(|t| t["pid"] == pid)
    }

    /// The row for (`pid`, `name`).
    pub fn row(&self, pid: u32, name: &str) -> Option<&Value> {
        self.syscalls()
            .iter()
            .find(|s| s["pid"] == pid && s["name"] == name)
    }

    /// A u64 field of the (`pid`, `name`) row, 0 when the row is absent.
    pub fn field(&self, pid: u32, name: &str, field: &str) -> u64 {
        self.row(pid, name)
            .map(|r| r[field].as_u64().expect("u64 field"))
            .unwrap_or(0)
    }

    pub fn count(&self, pid: u32, name: &str) -> u64 {
        self.field(pid, name, "count")
    }

    pub fn errors(&self, pid: u32, name: &str) -> u64 {
        self.field(pid, name, "errors")
    }

    /// Syscall name -> count for `pid`.
    pub fn counts_for(&self, pid: u32) -> BTreeMap<String, u64> {
        self.syscalls()
            .iter()
            .filter(|s| s["pid"] == pid)
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_string(),
                    s["count"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// Checks the schema and internal consistency: schema_version 1, each
    /// row's histogram sums to its count, errnos sum to errors, totals are
    /// the sums of the rows, no lost events.
    #[track_caller]
    pub fn check_invariants(&self) {
        let r = &self.0;
        assert_eq!(r["schema_version"], 1, "schema_version\n{r}");
        assert!(r["tool_version"].is_string(), "tool_version\n{r}");
        assert!(r["duration_ns"].is_u64(), "duration_ns\n{r}");
        assert!(r["notes"].is_array(), "notes\n{r}");
        assert!(r["lost_detail"].is_object(), "lost_detail\n{r}");
        assert_eq!(r["lost_events"], 0, "lost events\n{r}");
        for t in self.targets() {
            assert!(t["pid"].is_u64(), "target pid: {t}");
            assert!(t["comm"].is_string(), "target comm: {t}");
            assert!(t["cmdline"].is_array(), "target cmdline: {t}");
            assert!(
                ["attached", "launched", "followed"].contains(&t["origin"].as_str().unwrap_or("")),
                "target origin: {t}"
            );
            assert!(
                t["ppid"].is_u64() || t["ppid"].is_null(),
                "target ppid: {t}"
            );
            assert!(
                t["exe"].is_string() || t["exe"].is_null(),
                "target exe: {t}"
            );
            assert!(
                t["exit_code"].is_i64() || t["exit_code"].is_null(),
                "target exit_code: {t}"
            );
        }
        let (mut count, mut errors, mut total) = (0u64, 0u64, 0u64);
        let mut seen = HashSet::new();
        for s in self.syscalls() {
            let pid = s["pid"].as_u64().unwrap_or_else(|| panic!("row pid: {s}"));
            let name = s["name"]
                .as_str()
                .unwrap_or_else(|| panic!("row name: {s}"));
            assert!(
                seen.insert((pid, name.to_string())),
                "duplicate row {pid}/{name}"
            );
            assert!(s["nr"].is_u64(), "row nr: {s}");
            let c = s["count"].as_u64().unwrap();
            let e = s["errors"].as_u64().unwrap();
            let t = s["total_ns"].as_u64().unwrap();
            let m = s["max_ns"].as_u64().unwrap();
            let hist = s["hist_log2_ns"]
                .as_array()
                .unwrap_or_else(|| panic!("hist: {s}"));
            assert_eq!(hist.len(), 40, "hist length: {s}");
            let hsum: u64 = hist.iter().map(|h| h.as_u64().unwrap()).sum();
            assert_eq!(hsum, c, "histogram does not sum to count: {s}");
            assert!(e <= c, "errors > count: {s}");
            assert!(m <= t, "max_ns > total_ns: {s}");
            let esum: u64 = s["errnos"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(esum, e, "errnos do not sum to errors: {s}");
            count += c;
            errors += e;
            total += t;
        }
        assert_eq!(r["totals"]["count"], count, "totals.count\n{r}");
        assert_eq!(r["totals"]["errors"], errors, "totals.errors\n{r}");
        assert_eq!(r["totals"]["total_ns"], total, "totals.total_ns\n{r}");
    }
}

// ---------------------------------------------------------------------------
// strace

/// (calls, errors) per syscall from an strace `-c` table.
pub fn parse_strace_table(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 5 || t[0].starts_with('%') || t[0].starts_with('-') {
            continue;
        }
        let name = *t.last().unwrap();
        if name == "total" {
            continue;
        }
        let Ok(calls) = t[3].parse::<u64>() else {
            continue;
        };
        let errors = if t.len() >= 6 {
            t[4].parse().unwrap_or(0)
        } else {
            0
        };
        m.insert(name.to_string(), (calls, errors));
    }
    m
}

/// Runs `cmd` under `strace -c -f` and returns its per-syscall table.
#[track_caller]
pub fn strace_counts(cmd: &[&OsStr]) -> BTreeMap<String, (u64, u64)> {
    let dir = TempDir::new("strace");
    let out = dir.join("strace.txt");
    let r = run_cmd(
        Command::new("strace")
            .args(["-c", "-f", "-o"])
            .arg(&out)
            .arg("--")
            .args(cmd),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    parse_strace_table(&fs::read_to_string(&out).unwrap())
}

// ---------------------------------------------------------------------------
// bpftool

/// One loaded BPF program, from `bpftool prog list -j`.
#[derive(Clone, Debug)]
pub struct Prog {
    pub id: u64,
    pub name: String,
    /// Processes holding an fd to it (when bpftool reports them).
    pub pids: Vec<u32>,
}

/// The loaded BPF programs.
pub fn bpf_progs() -> Vec<Prog> {
    let o = Command::new("bpftool")
        .args(["prog", "list", "-j"])
        .output()
        .expect("running bpftool");
    assert!(
        o.status.success(),
        "bpftool prog list: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("bpftool json");
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| Prog {
            id: p["id"].as_u64().unwrap(),
            name: p["name"].as_str().unwrap_or("").to_string(),
            pids: p["pids"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x["pid"].as_u64())
                        .map(|x| x as u32)
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// The ids of all loaded programs.
pub fn bpf_prog_ids() -> HashSet<u64> {
    bpf_progs().into_iter().map(|p| p.id).collect()
}

/// Waits until infertrace process `pid` has its syscall programs loaded
/// (`sys_enter` and `sys_exit` programs held by `pid`, or, when bpftool does
/// not report holders, new ones not in `before`). Returns the ids of all
/// programs attributed to it.
pub fn wait_for_tracer_progs(
    pid: u32,
    before: &HashSet<u64>,
    timeout: Duration,
) -> Option<Vec<u64>> {
    poll(timeout, || {
        let progs = bpf_progs();
        let reports_pids = progs.iter().any(|p| !p.pids.is_empty());
        let mine: Vec<&Prog> = progs
            .iter()
            .filter(|p| !before.contains(&p.id))
            .filter(|p| !reports_pids || p.pids.contains(&pid))
            .collect();
        let linked = linked_prog_ids();
        // A syscall program counts once it is loaded and, when bpftool can
        // list links, attached through a link.
        let ready = |n: &str| {
            mine.iter()
                .any(|p| p.name == n && linked.as_ref().is_none_or(|l| l.contains(&p.id)))
        };
        (ready("sys_enter") && ready("sys_exit")).then(|| mine.iter().map(|p| p.id).collect())
    })
}

/// Ids of the programs attached through a BPF link (`bpftool link list`),
/// or `None` when bpftool cannot list links.
pub fn linked_prog_ids() -> Option<HashSet<u64>> {
    let o = Command::new("bpftool")
        .args(["link", "list", "-j"])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&o.stdout).ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter_map(|l| l["prog_id"].as_u64())
            .collect(),
    )
}

/// Whether the kernel-side target set of tracer `pid` contains `target`:
/// looks for a BPF map named TARGETS held by `pid` and dumps it. Returns
/// `None` if no such map is visible (then callers fall back to a delay).
pub fn tracer_targets_contain(tracer: u32, target: u32) -> Option<bool> {
    let o = Command::new("bpftool")
        .args(["map", "list", "-j"])
        .output()
        .ok()?;
    let maps: Value = serde_json::from_slice(&o.stdout).ok()?;
    let map = maps.as_array()?.iter().find(|m| {
        m["name"] == "TARGETS"
            && m["pids"]
                .as_array()
                .map(|a| a.iter().any(|p| p["pid"] == tracer))
                .unwrap_or(false)
    })?;
    let id = map["id"].as_u64()?;
    let o = Command::new("bpftool")
        .args(["map", "dump", "id", &id.to_string(), "-j"])
        .output()
        .ok()?;
    let entries: Value = serde_json::from_slice(&o.stdout).ok()?;
    let want = target.to_le_bytes();
    Some(entries.as_array()?.iter().any(|e| {
        if let Some(k) = e["formatted"]["key"].as_u64() {
            return k == target as u64;
        }
        let key: Vec<u8> = e["key"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter_map(|b| b.as_str())
                    .filter_map(|b| u8::from_str_radix(b.trim_start_matches("0x"), 16).ok())
                    .collect()
            })
            .unwrap_or_default();
        key.len() >= 4 && key[..4] == want
    }))
}

/// Waits until tracer `tracer` is tracing `target`: its programs are loaded
/// and (when visible through bpftool) `target` is in its target map; when the
/// map is not visible, waits an extra second after the programs appear.
/// Panics with the tracer's state on timeout.
pub fn wait_attached(tracer: u32, target: u32, before: &HashSet<u64>) {
    let progs = wait_for_tracer_progs(tracer, before, Duration::from_secs(15));
    assert!(
        progs.is_some(),
        "infertrace (pid {tracer}) did not load sys_enter/sys_exit within 15 s"
    );
    let in_map = poll(Duration::from_secs(10), || {
        match tracer_targets_contain(tracer, target) {
            Some(true) => Some(true),
            Some(false) => None,
            None => Some(false),
        }
    });
    match in_map {
        Some(true) => {}
        Some(false) => thread::sleep(Duration::from_secs(1)),
        None => panic!("pid {target} never appeared in infertrace's TARGETS map"),
    }
}

// ---------------------------------------------------------------------------
// Text checks

/// Whether `text` contains `word` (case-insensitive) as a whole word.
pub fn mentions_word(text: &str, word: &str) -> bool {
    let t = text.to_lowercase();
    let w = word.to_lowercase();
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    t.match_indices(&w).any(|(i, _)| {
        !is_word(t[..i].chars().next_back()) && !is_word(t[i + w.len()..].chars().next())
    })
}

/// (calls, errors) per syscall from a strace-like text table printed by
/// `infertrace report` (same layout as `strace -c`).
pub fn parse_text_table(text: &str) -> BTreeMap<String, (u64, u64)> {
    parse_strace_table(text)
}

/// The strace `-c` header line infertrace's text report reproduces.
pub const TEXT_HEADER: &str = "% time     seconds  usecs/call     calls    errors syscall";

/// SIGKILLs process `pid` on drop unless disarmed (cleanup when a test
/// panics while a tracer or workload is still running).
pub struct KillOnDrop(pub Option<u32>);

impl KillOnDrop {
    pub fn new(pid: u32) -> KillOnDrop {
        KillOnDrop(Some(pid))
    }
    /// Call once the process has been reaped.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            if alive(pid) {
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// Waits (up to 5 s) until the main thread of `pid` is blocked in syscall
/// `nr` (from /proc/PID/syscall). Panics on timeout.
#[track_caller]
pub fn wait_blocked_in(pid: u32, nr: u64) {
    let ok = poll(Duration::from_secs(5), || {
        let s = fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
        (s.split_whitespace().next()? == nr.to_string()).then_some(())
    });
    assert!(ok.is_some(), "pid {pid} not blocked in syscall {nr}");
}

// ---------------------------------------------------------------------------
// Wall-time accounting

/// Compiles `tests/workloads/<name>.c` like [`workload`] but with the extra
/// gcc `flags` (always `-static -Wall`), into `target/e2e-workloads/<name>-<tag>`.
/// Use a distinct `tag` per flag set. Rebuilt when the source is newer.
/// Needs `Need::Gcc`.
pub fn workload_with_flags(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let src = workspace_root()
        .join("tests/workloads")
        .join(format!("{name}.c"));
    let dir = workload_dir();
    fs::create_dir_all(&dir).unwrap();
    let out_name = format!("{name}-{tag}");
    let out = dir.join(&out_name);
    let fresh = match (fs::metadata(&src), fs::metadata(&out)) {
        (Ok(s), Ok(o)) => o.modified().unwrap() >= s.modified().unwrap(),
        (Err(e), _) => panic!("workload source {}: {e}", src.display()),
        _ => false,
    };
    if !fresh {
        let tmp = dir.join(format!(".{out_name}.{}.tmp", std::process::id()));
        let o = Command::new("gcc")
            .args(flags)
            .args(["-static", "-Wall", "-o"])
            .arg(&tmp)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .expect("running gcc");
        assert!(
            o.status.success(),
            "gcc {flags:?} -static {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        fs::rename(&tmp, &out).unwrap();
    }
    out.canonicalize().unwrap()
}

/// The wall-time breakdown of one thread (`threads[]` of a JSON report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTimes {
    pub pid: u64,
    pub tid: u64,
    pub comm: String,
    pub wall_ns: u64,
    pub on_cpu_ns: u64,
    pub syscall_ns: u64,
    pub io_ns: u64,
    pub lock_ns: u64,
    pub poll_ns: u64,
    pub sleep_ns: u64,
    pub other_ns: u64,
    /// Off-CPU reasons beyond the five above (e.g. `gil_ns`), by field name.
    pub extra_off_cpu: BTreeMap<String, u64>,
    pub runqueue_ns: u64,
}

impl ThreadTimes {
    /// Parses one `threads[]` entry; panics on a missing or mistyped field.
    #[track_caller]
    pub fn from_json(v: &Value) -> ThreadTimes {
        let u = |x: &Value, what: &str| -> u64 {
            x.as_u64()
                .unwrap_or_else(|| panic!("threads[]: {what} is not a u64: {v}"))
        };
        let off = &v["off_cpu"];
        let known = ["io_ns", "lock_ns", "poll_ns", "sleep_ns", "other_ns"];
        let extra_off_cpu = off
            .as_object()
            .unwrap_or_else(|| panic!("threads[]: off_cpu is not an object: {v}"))
            .iter()
            .filter(|(k, _)| !known.contains(&k.as_str()))
            .map(|(k, x)| (k.clone(), u(x, k)))
            .collect();
        ThreadTimes {
            pid: u(&v["pid"], "pid"),
            tid: u(&v["tid"], "tid"),
            comm: v["comm"]
                .as_str()
                .unwrap_or_else(|| panic!("threads[]: comm: {v}"))
                .to_string(),
            wall_ns: u(&v["wall_ns"], "wall_ns"),
            on_cpu_ns: u(&v["on_cpu_ns"], "on_cpu_ns"),
            syscall_ns: u(&v["syscall_ns"], "syscall_ns"),
            io_ns: u(&off["io_ns"], "off_cpu.io_ns"),
            lock_ns: u(&off["lock_ns"], "off_cpu.lock_ns"),
            poll_ns: u(&off["poll_ns"], "off_cpu.poll_ns"),
            sleep_ns: u(&off["sleep_ns"], "off_cpu.sleep_ns"),
            other_ns: u(&off["other_ns"], "off_cpu.other_ns"),
            extra_off_cpu,
            runqueue_ns: u(&v["runqueue_ns"], "runqueue_ns"),
        }
    }

    pub fn off_cpu_ns(&self) -> u64 {
        self.io_ns
            + self.lock_ns
            + self.poll_ns
            + self.sleep_ns
            + self.other_ns
            + self.extra_off_cpu.values().sum::<u64>()
    }

    /// on-CPU + off-CPU (all reasons) + run-queue: should equal `wall_ns`.
    pub fn parts_ns(&self) -> u64 {
        self.on_cpu_ns + self.off_cpu_ns() + self.runqueue_ns
    }

    /// The categories as (name, ns): on_cpu, io, lock, poll, sleep, other,
    /// any further off-CPU reasons (name without `_ns`), runqueue.
    pub fn categories(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = [
            ("on_cpu", self.on_cpu_ns),
            ("io", self.io_ns),
            ("lock", self.lock_ns),
            ("poll", self.poll_ns),
            ("sleep", self.sleep_ns),
            ("other", self.other_ns),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        for (k, n) in &self.extra_off_cpu {
            v.push((k.trim_end_matches("_ns").to_string(), *n));
        }
        v.push(("runqueue".to_string(), self.runqueue_ns));
        v
    }

    /// The largest category (first one on a tie).
    pub fn dominant(&self) -> (String, u64) {
        let mut best = (String::new(), 0);
        for x in self.categories() {
            if x.1 > best.1 || best.0.is_empty() {
                best = x;
            }
        }
        best
    }

    /// One line, in milliseconds, for assertion messages.
    pub fn describe(&self) -> String {
        let ms = |n: u64| n as f64 / 1e6;
        let extra: String = self
            .extra_off_cpu
            .iter()
            .map(|(k, n)| format!(" + {} {:.3}", k.trim_end_matches("_ns"), ms(*n)))
            .collect();
        format!(
            "{} (pid {} tid {}): wall {:.3} ms = on_cpu {:.3} (syscall {:.3}) + io {:.3} + lock {:.3} + poll {:.3} + sleep {:.3} + other {:.3}{extra} + runqueue {:.3} [parts {:.3}]",
            self.comm,
            self.pid,
            self.tid,
            ms(self.wall_ns),
            ms(self.on_cpu_ns),
            ms(self.syscall_ns),
            ms(self.io_ns),
            ms(self.lock_ns),
            ms(self.poll_ns),
            ms(self.sleep_ns),
            ms(self.other_ns),
            ms(self.runqueue_ns),
            ms(self.parts_ns()),
        )
    }
}

impl Report {
    /// `threads[]`.
    pub fn threads(&self) -> &Vec<Value> {
        self.0["threads"].as_array().expect("threads array")
    }

    /// `stacks[]`.
    pub fn stacks(&self) -> &Vec<Value> {
        self.0["stacks"].as_array().expect("stacks array")
    }

    /// Every thread's breakdown.
    pub fn thread_times(&self) -> Vec<ThreadTimes> {
        self.threads().iter().map(ThreadTimes::from_json).collect()
    }

    /// The threads named `comm`.
    pub fn threads_named(&self, comm: &str) -> Vec<ThreadTimes> {
        self.thread_times()
            .into_iter()
            .filter(|t| t.comm == comm)
            .collect()
    }

    /// The only thread named `comm`.
    #[track_caller]
    pub fn thread_named(&self, comm: &str) -> ThreadTimes {
        let mut v = self.threads_named(comm);
        assert_eq!(
            v.len(),
            1,
            "expected one thread named {comm:?}; threads:\n{}",
            self.describe_threads()
        );
        v.pop().unwrap()
    }

    /// All threads, one [`ThreadTimes::describe`] line each.
    pub fn describe_threads(&self) -> String {
        self.thread_times()
            .iter()
            .map(|t| format!("  {}", t.describe()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The stacks of `kind` (`"cpu"` or `"off_cpu"`).
    pub fn stacks_of_kind(&self, kind: &str) -> Vec<&Value> {
        self.stacks().iter().filter(|s| s["kind"] == kind).collect()
    }

    /// CPU samples summed by leaf function (first frame's `function`).
    pub fn cpu_samples_by_leaf(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for s in self.stacks_of_kind("cpu") {
            let leaf = s["frames"][0]["function"]
                .as_str()
                .unwrap_or("<no frames>")
                .to_string();
            *m.entry(leaf).or_insert(0) += s["samples"].as_u64().unwrap_or(0);
        }
        m
    }

    /// Checks the wall-time parts of the report: field types, `threads[]`
    /// parts adding up to `wall_ns` within `tolerance` (a fraction; the issue
    /// says 2%), `syscall_ns <= on_cpu_ns`, the stacks' schema, 40-bucket
    /// run-queue histograms, an integer `sample_hz`.
    #[track_caller]
    pub fn check_walltime_invariants(&self, tolerance: f64) {
        let r = &self.0;
        assert!(r["sample_hz"].is_u64(), "sample_hz\n{r}");
        let hists = r["runqueue_hist_log2_ns"]
            .as_object()
            .unwrap_or_else(|| panic!("runqueue_hist_log2_ns is not an object\n{r}"));
        for (pid, h) in hists {
            assert!(pid.parse::<u32>().is_ok(), "runqueue hist key {pid:?}");
            let h = h
                .as_array()
                .unwrap_or_else(|| panic!("runqueue hist of {pid}: {h}"));
            assert_eq!(
                h.len(),
                40,
                "runqueue hist of {pid} has {} buckets",
                h.len()
            );
            assert!(h.iter().all(Value::is_u64), "runqueue hist of {pid}: {h:?}");
        }
        let mut problems = Vec::new();
        for t in self.thread_times() {
            let parts = t.parts_ns() as f64;
            let wall = t.wall_ns as f64;
            if (parts - wall).abs() > tolerance * wall.max(1.0) {
                problems.push(format!(
                    "parts {} ns != wall {} ns (off by {:.2}%): {}",
                    t.parts_ns(),
                    t.wall_ns,
                    (parts - wall).abs() / wall.max(1.0) * 100.0,
                    t.describe()
                ));
            }
            if t.syscall_ns > t.on_cpu_ns {
                problems.push(format!(
                    "syscall_ns {} > on_cpu_ns {}: {}",
                    t.syscall_ns,
                    t.on_cpu_ns,
                    t.describe()
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "wall-time invariants violated:\n  {}\nall threads:\n{}",
            problems.join("\n  "),
            self.describe_threads()
        );
        for s in self.stacks() {
            let kind = s["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("stack kind: {s}"));
            assert!(s["pid"].is_u64() && s["tid"].is_u64(), "stack pid/tid: {s}");
            assert!(
                s["samples"].is_u64() && s["weight_ns"].is_u64(),
                "stack weights: {s}"
            );
            match kind {
                "cpu" => {
                    assert!(s["reason"].is_null(), "cpu stack with a reason: {s}");
                    assert!(
                        s["samples"].as_u64().unwrap() > 0,
                        "cpu stack without samples: {s}"
                    );
                }
                "off_cpu" => {
                    // io, lock, poll, sleep, other (and reasons added later).
                    assert!(
                        s["reason"].as_str().is_some_and(|r| !r.is_empty()),
                        "off_cpu stack reason: {s}"
                    );
                }
                // Kinds added after cpu/off_cpu: only the common fields.
                _ => {}
            }
            let frames = s["frames"]
                .as_array()
                .unwrap_or_else(|| panic!("stack frames: {s}"));
            for f in frames {
                assert!(f["function"].is_string(), "frame function: {f}");
                assert!(
                    f["kind"].as_str().is_some_and(|k| !k.is_empty()),
                    "frame kind: {f}"
                );
                assert!(
                    f["file"].is_string() || f["file"].is_null(),
                    "frame file: {f}"
                );
                assert!(f["line"].is_u64() || f["line"].is_null(), "frame line: {f}");
            }
        }
    }
}

/// Parses the `thread <comm> tid <tid> cpu_ns <ns>` lines the walltime
/// workload prints on stderr: comm -> (tid, own CPU time in ns).
pub fn parse_thread_lines(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() == 6 && t[0] == "thread" && t[2] == "tid" && t[4] == "cpu_ns" {
            if let (Ok(tid), Ok(cpu)) = (t[3].parse(), t[5].parse()) {
                m.insert(t[1].to_string(), (tid, cpu));
            }
        }
    }
    m
}
