//! Targets in PID (and mount) namespaces of their own, as containers run
//! them: `unshare -p -f`, `unshare -m -p -f --mount-proc`, and the latter
//! with the interpreter's installation, the script and libcudart under a
//! tmpfs only the namespace sees (paths the host cannot open: files must be
//! read through /proc/PID/map_files or /proc/PID/root). Inside, the
//! process is pid 1 and CPython stores its namespace's thread ids, not the
//! host's. Checked, launched (`record -- unshare ...`) and attached
//! (`record -p HOSTPID`): Python attribution (a function burning CPU at a
//! known line, a thread sleeping at a known line) on every CPython 3.8 ..
//! 3.15 (pyenv's, the system's static python3.11, and Debian sid's 3.14
//! and 3.15 in a chroot inside those namespaces: tests/src/pyroot.rs),
//! `dump -p HOSTPID` (exact threads, by host tid, and frames), and CUDA
//! call sites (the real libcudart through ctypes: exact counts at known
//! functions and lines) on 3.8, 3.12, the system's python3 and the chroot's
//! 3.14 and 3.15 (which load the root's own copy of libcudart, at a path
//! only the chroot has).
//!
//! Needs root, the binary, util-linux's `unshare`, bpftool (the attach
//! tests: to know when the tracer is attached), gcc and the real libcudart
//! (the CUDA tests), and the root `cargo xtask setup` builds; under
//! `CI=true` a missing one fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// How long the workload burns CPU and sleeps.
const SECONDS: &str = "1.5";
const SECONDS_NS: u64 = 1_500_000_000;

// ---------------------------------------------------------------------------
// Namespaces

/// How the workload is put in namespaces of its own.
#[derive(Clone, Copy, Debug)]
enum Ns {
    /// `unshare -p -f`: a PID namespace; the host's /proc and files.
    Pid,
    /// `unshare -m -p -f --mount-proc`: also a mount namespace and its own /proc.
    PidMountProc,
    /// As [`Ns::PidMountProc`], and the interpreter (its installation
    /// bind-mounted), the script and libraries are under a tmpfs mounted
    /// inside: the paths in its maps do not exist on the host. A chroot
    /// interpreter stays in its root (already a tree of its own; its
    /// wrapper binds the tmpfs in with the temporary directory).
    Private,
}

const ALL: [Ns; 3] = [Ns::Pid, Ns::PidMountProc, Ns::Private];

/// Mounts a tmpfs on $1 (seen by this mount namespace only), bind-mounts
/// the installation $2 at $1/prefix (none when $2 is empty), copies the
/// files before `--` into $1 and runs what follows.
const PRIVATE_SH: &str = r#"set -e
d=$1; prefix=$2; shift 2
mount -t tmpfs infertrace-ns "$d"
if [ -n "$prefix" ]; then
    mkdir "$d/prefix"
    mount --bind "$prefix" "$d/prefix"
fi
while [ "$1" != -- ]; do cp "$1" "$d/"; shift; done
shift
exec "$@""#;

impl Ns {
    fn label(self) -> &'static str {
        match self {
            Ns::Pid => "unshare -p -f",
            Ns::PidMountProc => "unshare -m -p -f --mount-proc",
            Ns::Private => "unshare -m -p -f --mount-proc, private tmpfs",
        }
    }

    /// Where the workload's files are, as it sees them.
    fn files_dir(self, dir: &TempDir) -> PathBuf {
        dir.join("files")
    }

    /// The command line running interpreter `py` on `args` in the
    /// namespaces, with `files` in [`Ns::files_dir`] (which `args` name).
    fn argv(self, dir: &TempDir, py: &PythonExe, files: &[&Path], args: &[OsString]) -> Vec<OsString> {
        self.argv_of(dir, &py.exe, py.root.is_some(), files, args)
    }

    /// [`Ns::argv`] of the interpreter `py`; `chroot`: a wrapper running it
    /// in a root of its own (nothing to bind for [`Ns::Private`]).
    fn argv_of(self, dir: &TempDir, py: &Path, chroot: bool, files: &[&Path], args: &[OsString]) -> Vec<OsString> {
        let files_dir = self.files_dir(dir);
        fs::create_dir_all(&files_dir).unwrap();
        let mut v: Vec<OsString> = vec!["unshare".into()];
        match self {
            Ns::Pid => v.extend(["-p", "-f"].map(OsString::from)),
            Ns::PidMountProc | Ns::Private => v.extend(["-m", "-p", "-f", "--mount-proc"].map(OsString::from)),
        }
        if let Ns::Pid | Ns::PidMountProc = self {
            for f in files {
                fs::copy(f, files_dir.join(f.file_name().unwrap())).unwrap();
            }
            v.push(py.into());
        } else {
            // The installation: the directory above bin/.
            let (prefix, inside) = if chroot {
                (PathBuf::new(), py.to_path_buf())
            } else {
                let prefix = py.parent().and_then(Path::parent).expect("interpreter in PREFIX/bin");
                (prefix.to_path_buf(), files_dir.join("prefix").join(py.strip_prefix(prefix).unwrap()))
            };
            v.extend(["sh", "-c", PRIVATE_SH, "sh"].map(OsString::from));
            v.push(files_dir.clone().into());
            v.push(prefix.into());
            v.extend(files.iter().map(OsString::from));
            v.push("--".into());
            v.push(inside.into());
        }
        v.extend(args.iter().cloned());
        v
    }
}

/// The host pid of the interpreter among `root` and its descendants: pid 1
/// of its own PID namespace, named `python*` (after the exec).
fn find_interpreter(root: u32) -> Option<u32> {
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let comm = fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        if comm.starts_with("python") && nspid(p, u64::from(p)).last() == Some(&1) {
            return Some(p);
        }
        todo.extend(children_of(p));
    }
    None
}

/// The ids of thread `tid` from the host's PID namespace down to its own.
fn nspid(pid: u32, tid: u64) -> Vec<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

fn tasks(pid: u32) -> BTreeSet<u64> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Interpreters and reporting

fn interpreters(test: &str, needs: &[Need]) -> Option<Vec<PythonExe>> {
    if !require(test, needs) {
        return None;
    }
    let (found, missing) = expected_pythons();
    if found.is_empty() {
        skip(test, &format!("a CPython 3.8 .. 3.15 (missing: {})", missing.join(", ")));
        return None;
    }
    skip_some(test, &missing).then_some(found)
}

/// `X.Y.Z` of the interpreter `exe`.
fn version_of(exe: &Path) -> String {
    let o = Command::new(exe)
        .args(["-c", "import sys; sys.stdout.write('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(o.status.success(), "{} -c ...: {o:?}", exe.display());
    String::from_utf8(o.stdout).unwrap()
}

/// Runs `check` for every (interpreter, namespace setup), a panic failing
/// that one only; prints one line each and fails if any failed.
fn for_each(test: &str, cases: &[(PythonExe, Ns)], check: impl Fn(&PythonExe, Ns) -> Result<String, String>) {
    let mut table = format!("{test}:\n");
    let mut failed = 0;
    for (py, ns) in cases {
        let res = catch_unwind(AssertUnwindSafe(|| check(py, *ns))).unwrap_or_else(|e| {
            Err(e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string()))
        });
        match res {
            Ok(s) => table += &format!("  PASS {} [{}]: {s}\n", py.label, ns.label()),
            Err(s) => {
                failed += 1;
                table += &format!("  FAIL {} [{}]: {s}\n", py.label, ns.label());
            }
        }
    }
    let _ = std::io::stderr().write_all(table.as_bytes());
    assert!(failed == 0, "{failed} of {} case(s) failed:\n{table}", cases.len());
}

fn cases(pythons: &[PythonExe], setups: &[Ns]) -> Vec<(PythonExe, Ns)> {
    pythons.iter().flat_map(|p| setups.iter().map(move |ns| (p.clone(), *ns))).collect()
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn notes(rep: &Report) -> Vec<String> {
    rep.0["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).map(str::to_string).collect()
}

/// The recording's details (`details`: the CPython seen in each process...).
fn details(rep: &Report) -> Vec<String> {
    rep.0["details"].as_array().map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn pct(a: u64, b: u64) -> f64 {
    a as f64 * 100.0 / b.max(1) as f64
}

fn render(s: &Value) -> String {
    python_frames_of(s).iter().map(|(f, _, l)| format!("{f}:{l}")).collect::<Vec<_>>().join(" <- ")
}

// ---------------------------------------------------------------------------
// Python attribution (tests/workloads/ns_work.py)

fn ns_work() -> PathBuf {
    workspace_root().join("tests/workloads/ns_work.py").canonicalize().unwrap()
}

/// The target that ran `script`: the interpreter (not `unshare`, nor the
/// `sh` and `cp` of [`Ns::Private`]).
fn script_target(rep: &Report, script: &str) -> Result<u32, String> {
    let pids: Vec<u32> = rep
        .targets()
        .iter()
        .filter(|t| t["comm"].as_str().is_some_and(|c| c.starts_with("python")))
        .filter(|t| t["cmdline"].as_array().is_some_and(|c| c.iter().any(|a| a.as_str().is_some_and(|a| a.ends_with(script)))))
        .filter_map(|t| t["pid"].as_u64().map(|p| p as u32))
        .collect();
    ensure!(pids.len() == 1, "expected one interpreter target running {script}: {}", Value::Array(rep.targets().clone()));
    Ok(pids[0])
}

/// The recording of ns_work.py (host pid `pid`, files seen under
/// `files_dir`): attributed; of the main thread's CPU samples taken in its
/// main(), >= 95% at burn()'s line, and those are >= 80% of all its
/// samples (the rest: start-up, interpreter initialization and imports,
/// ~20 samples at 199 Hz here); the `blocker` thread's sleep is at
/// block()'s line.
fn check_attribution(rep: &Report, pid: u32, py: &PythonExe, files_dir: &Path) -> Result<String, String> {
    let version = version_of(&py.exe);
    let want = format!("pid {pid}: CPython {version}, Python stacks attributed");
    let n = details(rep);
    ensure!(n.contains(&want), "details lack {want:?}: {n:?}");
    let m = markers_of(&ns_work());
    let file = files_dir.join("ns_work.py").to_string_lossy().into_owned();
    let at = |s: &Value, func: &str, marker: &str| {
        python_frames_of(s).first() == Some(&(func.to_string(), file.clone(), m[marker]))
    };
    let in_main = |s: &Value| python_frames_of(s).iter().any(|(f, path, _)| f == "main" && *path == file);
    let stacks: Vec<&Value> = rep.stacks().iter().filter(|s| s["pid"] == pid).collect();
    let cpu: Vec<&&Value> = stacks.iter().filter(|s| s["kind"] == "cpu" && s["tid"] == pid).collect();
    let samples = |v: &[&&Value]| v.iter().map(|s| s["samples"].as_u64().unwrap_or(0)).sum::<u64>();
    let total = samples(&cpu);
    let main: Vec<&&Value> = cpu.iter().copied().filter(|s| in_main(s)).collect();
    let in_burn = samples(&main.iter().copied().filter(|s| at(s, "burn", "burn")).collect::<Vec<_>>());
    let (precision, recall) = (pct(in_burn, samples(&main)), pct(in_burn, total));
    let others = || {
        let mut o: Vec<&&&Value> = cpu.iter().filter(|s| !at(s, "burn", "burn")).collect();
        o.sort_by_key(|s| std::cmp::Reverse(s["samples"].as_u64()));
        o.iter().take(6).map(|s| format!("{} x {}", s["samples"], render(s))).collect::<Vec<_>>().join("; ")
    };
    let summary = format!(
        "burn:{} {in_burn} of {} samples in main() ({precision:.1}%), of {total} in all ({recall:.1}%)",
        m["burn"],
        samples(&main)
    );
    // 1.5 s at 199 Hz is ~300 samples on an idle CPU; the machine may be busy.
    ensure!(in_burn >= 50, "main thread: {summary} (expected >= 50 at burn)");
    ensure!(precision >= 95.0 && recall >= 80.0, "main thread: {summary}; others: {}", others());

    let blocker = rep.thread_named("blocker");
    ensure!(blocker.pid == u64::from(pid) && blocker.tid != u64::from(pid), "blocker thread: {}", blocker.describe());
    let off: Vec<&&Value> =
        stacks.iter().filter(|s| s["kind"] == "off_cpu" && s["tid"] == blocker.tid).collect();
    let weight = |v: &[&&Value]| v.iter().map(|s| s["weight_ns"].as_u64().unwrap_or(0)).sum::<u64>();
    let at_block: Vec<&&Value> = off.iter().copied().filter(|s| at(s, "block", "block")).collect();
    let blocked = weight(&at_block);
    // time.sleep: clock_nanosleep from 3.11, select() before.
    let reason = if py.minor >= 11 { "sleep" } else { "poll" };
    ensure!(
        blocked >= SECONDS_NS * 9 / 10 && at_block.iter().all(|s| s["reason"] == reason),
        "blocker (tid {}): {:.0} ms off-CPU at block:{} (expected >= {:.0} ms, reason {reason}); its off-CPU stacks: {}",
        blocker.tid,
        blocked as f64 / 1e6,
        m["block"],
        SECONDS_NS as f64 * 0.9 / 1e6,
        off.iter().map(|s| format!("{} {} ms {}", s["reason"], s["weight_ns"].as_u64().unwrap_or(0) / 1_000_000, render(s))).collect::<Vec<_>>().join("; ")
    );
    Ok(format!(
        "{summary}; blocker tid {} {:.0} ms at block:{}",
        blocker.tid,
        blocked as f64 / 1e6,
        m["block"]
    ))
}

#[test]
fn launched_in_namespaces_python_attributed() {
    let test = "launched_in_namespaces_python_attributed";
    let Some(pythons) = interpreters(test, &[Need::Root, Need::Binary, Need::Unshare]) else { return };
    for_each(test, &cases(&pythons, &ALL), |py, ns| {
        let dir = TempDir::new("ns-launch");
        let files_dir = ns.files_dir(&dir);
        let script = files_dir.join("ns_work.py");
        let argv = ns.argv(&dir, py, &[&ns_work()], &[script.into(), SECONDS.into(), "launch".into()]);
        let out = dir.join("rec.itr");
        let r = run_cmd(
            infertrace(["record", "-q", "--format", "json", "-F", "199", "-o"]).arg(&out).arg("--").args(&argv),
            RUN_TIMEOUT,
        );
        r.assert_ok();
        let rep = r.json();
        rep.check_invariants();
        let pid = script_target(&rep, "ns_work.py")?;
        ensure!(rep.target(pid).unwrap()["origin"] == "followed", "target {pid}: {}", rep.target(pid).unwrap());
        check_attribution(&rep, pid, py, &files_dir)
    });
}

/// `unshare ... ns_work.py SECONDS attach`: stdout lines through a channel;
/// the namespace's processes are killed on drop.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// The interpreter's host pid (pid 1 in its namespace).
    pid: u32,
    _guard: KillOnDrop,
}

impl Workload {
    fn start(argv: &[OsString], env: &[(&str, &Path)]) -> Workload {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {argv:?}: {e}"));
        let stdin = child.stdin.take();
        let lines = line_channel(child.stdout.take().unwrap());
        let root = child.id();
        let pid = poll(Duration::from_secs(20), || find_interpreter(root));
        let mut w = Workload { child, stdin, lines, pid: 0, _guard: KillOnDrop(None) };
        w.pid = pid.unwrap_or_else(|| panic!("no interpreter started under {argv:?}"));
        w._guard = KillOnDrop::new(w.pid);
        w
    }

    fn line(&self, what: &str) -> String {
        self.lines.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("workload: no {what} line: {e}"))
    }

    fn go(&mut self) {
        writeln!(self.stdin.as_mut().unwrap(), "go").unwrap();
        self.stdin.take();
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `infertrace record -p PID` started and attached (bpftool sees it), then
/// `go` sent; the recording once the target exited.
fn record_attached(w: &mut Workload, dir: &TempDir, extra: &[&str]) -> Result<Report, String> {
    let out = dir.join("rec.itr");
    let before = bpf_prog_ids();
    let tracer = spawn(
        infertrace(["record", "-q", "--format", "json", "-p", &w.pid.to_string(), "-o"])
            .arg(&out)
            .args(extra)
            .current_dir(dir.path()),
    );
    let mut guard = KillOnDrop::new(tracer.id());
    wait_attached(tracer.id(), w.pid, &before);
    w.go();
    let r = wait_child(tracer, Duration::from_secs(60), "infertrace record -p (namespaced target)");
    guard.disarm();
    let st = w.child.wait().unwrap();
    ensure!(st.success(), "workload exited with {st}");
    ensure!(r.status.success(), "record did not exit 0 once its target exited\n{}", r.describe());
    Ok(r.json())
}

#[test]
fn attached_in_namespaces_python_dumped_and_attributed() {
    let test = "attached_in_namespaces_python_dumped_and_attributed";
    let Some(pythons) =
        interpreters(test, &[Need::Root, Need::Binary, Need::Unshare, Need::Bpftool])
    else {
        return;
    };
    for_each(test, &cases(&pythons, &ALL), |py, ns| {
        let dir = TempDir::new("ns-attach");
        let files_dir = ns.files_dir(&dir);
        let script = files_dir.join("ns_work.py");
        let argv = ns.argv(&dir, py, &[&ns_work()], &[script.clone().into(), SECONDS.into(), "attach".into()]);
        let mut w = Workload::start(&argv, &[]);
        let pid = w.pid;
        let ready = w.line("ready");
        // Its own PID namespace: pid 1 there.
        ensure!(ready == "ready 1", "first line {ready:?} (pid {pid})");

        // dump: the threads by host tid (the main thread and idle()'s),
        // each at its line.
        let host = tasks(pid);
        let ns_tids: BTreeMap<u64, Vec<u64>> = host.iter().map(|t| (*t, nspid(pid, *t))).collect();
        ensure!(
            host.len() == 2 && ns_tids.values().all(|ids| ids.len() == 2 && ids[0] != ids[1]),
            "threads of pid {pid} (host tid -> NSpid): {ns_tids:?}"
        );
        let r = run_infertrace(["dump", "-p", &pid.to_string(), "--format", "json"]);
        ensure!(r.status.success(), "dump -p {pid} failed\n{}", r.describe());
        let dump: Value = serde_json::from_str(&r.stdout).map_err(|e| format!("dump is not JSON: {e}\n{}", r.stdout))?;
        let dump = dump.as_array().cloned().unwrap_or_default();
        let by_tid: BTreeMap<u64, Vec<(String, String, u64)>> =
            dump.iter().map(|t| (t["tid"].as_u64().unwrap_or(0), python_frames_of(t))).collect();
        ensure!(
            dump.len() == 2 && by_tid.keys().copied().collect::<BTreeSet<u64>>() == host,
            "dumped tids {:?}, the process's (host) {host:?} (NSpid {ns_tids:?})",
            dump.iter().map(|t| &t["tid"]).collect::<Vec<_>>()
        );
        let m = markers_of(&ns_work());
        let file = script.to_string_lossy().into_owned();
        let leaf = |tid: u64| by_tid[&tid].first().cloned().unwrap_or_default();
        let idle_tid = *host.iter().find(|t| **t != u64::from(pid)).unwrap();
        ensure!(
            leaf(u64::from(pid)) == ("wait_go".to_string(), file.clone(), m["wait"]),
            "main thread {pid}: dumped {:?}",
            by_tid[&u64::from(pid)]
        );
        ensure!(
            leaf(idle_tid) == ("idle".to_string(), file.clone(), m["idle"]),
            "idle thread {idle_tid}: dumped {:?}",
            by_tid[&idle_tid]
        );

        let rep = record_attached(&mut w, &dir, &["-F", "199"])?;
        rep.check_invariants();
        ensure!(rep.target(pid).is_some_and(|t| t["origin"] == "attached"), "targets {}", Value::Array(rep.targets().clone()));
        let s = check_attribution(&rep, pid, py, &files_dir)?;
        Ok(format!("dump: tids {host:?} (NSpid {ns_tids:?}) at wait_go:{} / idle:{}; {s}", m["wait"], m["idle"]))
    });
}

// ---------------------------------------------------------------------------
// CUDA call sites (tests/workloads/cuda_patterns.py, the real libcudart)

struct CudaEnv {
    real: PathBuf,
    kernels: PathBuf,
    source: PathBuf,
}

fn cuda_env(test: &str, needs: &[Need]) -> Option<(CudaEnv, Vec<PythonExe>)> {
    let pythons = interpreters(test, needs)?;
    let real = real_cudart(test)?;
    let sim = cuda_standin_dir(test)?;
    // The pthread path (3.8), native_thread_id (3.12), the static 3.11,
    // and the chroot's 3.14 and 3.15 (libcudart only the chroot has).
    let chosen: Vec<PythonExe> = pythons
        .into_iter()
        .filter(|p| p.minor == 8 || p.minor == 12 || p.label.starts_with("system") || p.root.is_some())
        .collect();
    // A chroot lacking the copy of libcudart is a missing prerequisite.
    let no_lib = |p: &PythonExe| {
        let root = p.root.as_ref()?;
        let lib = root.join(CUDART_IN_ROOT.trim_start_matches('/'));
        (!lib.is_file()).then(|| format!("{}: {} (`cargo xtask setup` copies it)", p.label, lib.display()))
    };
    let missing: Vec<String> = chosen.iter().filter_map(no_lib).collect();
    if !skip_some(test, &missing) {
        return None;
    }
    let chosen = chosen.into_iter().filter(|p| no_lib(p).is_none()).collect();
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    Some((CudaEnv { real, kernels: sim.join("libfakekernels.so"), source }, chosen))
}

/// One run of cuda_patterns.py.
struct CudaCase {
    argv: Vec<OsString>,
    env: Vec<(&'static str, PathBuf)>,
    /// The libcudart it loads, by the path it sees.
    lib: PathBuf,
    /// A chroot interpreter's own copy in its root, removed on drop.
    _copy: Option<CudartInRoot>,
}

impl CudaEnv {
    /// cuda_patterns.py MODE in `ns`, the script and the kernel stubs in its
    /// files directory, and libcudart there too; a chroot interpreter
    /// loads a copy of the root's own instead: a path that exists only in
    /// its root, visible to the tracer through /proc/PID/root alone.
    fn command(&self, ns: Ns, dir: &TempDir, py: &PythonExe, mode: &str) -> CudaCase {
        let files_dir = ns.files_dir(dir);
        let (files, lib, copy): (Vec<&Path>, PathBuf, Option<CudartInRoot>) = match &py.root {
            Some(root) => {
                let copy = CudartInRoot::new(root, "ns-cuda").unwrap_or_else(|e| panic!("{}: {e}", py.label));
                (vec![&self.kernels, &self.source], copy.inside.clone(), Some(copy))
            }
            None => (vec![&self.real, &self.kernels, &self.source], files_dir.join("libcudart.so.12"), None),
        };
        let argv = ns.argv(dir, py, &files, &[files_dir.join("cuda_patterns.py").into(), mode.into()]);
        let env = vec![
            ("CUDART", lib.clone()),
            ("FAKE_KERNELS", files_dir.join("libfakekernels.so")),
            ("LATE_S", PathBuf::from("0")),
            // The workload starts calling 0.2 s after the first probe shows
            // by default; the tracer can take longer to finish attaching on
            // a busy machine (3 of 9 attached cases lost every call once,
            // with other tests running).
            ("PROBE_SETTLE_S", PathBuf::from("1.0")),
        ];
        CudaCase { argv, env, lib, _copy: copy }
    }

    /// One library, `lib` (as the process sees its path), in pid `pid`;
    /// every call counted at a line of the workload (as the process sees
    /// its path) in the function around it; the `expected` ones exactly:
    /// (api, marker, count, bytes); `total` calls in all.
    fn check_sites(&self, rep: &Report, pid: u32, lib: &Path, files_dir: &Path, expected: &[(&str, &str, u64, u64)], total: u64) -> Result<String, String> {
        let cuda = &rep.0["cuda"];
        ensure!(cuda.is_object(), "no `cuda` in the report; notes {:?}", notes(rep));
        let libs = cuda["libraries"].as_array().cloned().unwrap_or_default();
        ensure!(
            libs.len() == 1 && libs[0]["path"] == lib.to_str().unwrap() && libs[0]["pids"] == serde_json::json!([pid]),
            "libraries {libs:?} (expected {} in pid {pid})",
            lib.display()
        );
        let file = files_dir.join("cuda_patterns.py").to_string_lossy().into_owned();
        let markers = markers_of(&self.source);
        let line_fn: BTreeMap<u64, String> =
            markers.iter().map(|(m, l)| (*l, function_of(&self.source, m))).collect();
        let calls = cuda["calls"].as_array().cloned().unwrap_or_default();
        let mut counted = 0;
        for c in &calls {
            let site = &c["site"];
            let line = site["line"].as_u64().unwrap_or(0);
            ensure!(
                site["file"] == file.as_str() && line_fn.get(&line).is_some_and(|f| site["function"] == f.as_str()),
                "call {} x{} at {site} (expected a marked line of {file})",
                c["api"],
                c["count"]
            );
            counted += c["count"].as_u64().unwrap_or(0);
        }
        for &(api, marker, count, bytes) in expected {
            let line = markers[marker];
            let v: Vec<&Value> = calls.iter().filter(|c| c["api"] == api && c["site"]["line"] == line).collect();
            ensure!(
                v.len() == 1 && v[0]["count"] == count && v[0]["bytes"] == bytes,
                "{api} at @{marker} (line {line}): {v:?}, expected {count} calls of {bytes} bytes ({counted} calls in all; cuda.notes {}; notes {:?})",
                cuda["notes"],
                notes(rep)
            );
        }
        ensure!(counted == total, "{counted} calls counted, expected {total}");
        Ok(format!("{counted} calls, all at their lines of {file}"))
    }
}

#[test]
fn cuda_sites_launched_in_namespaces() {
    let test = "cuda_sites_launched_in_namespaces";
    let Some((env, pythons)) = cuda_env(test, &[Need::Root, Need::Binary, Need::Unshare, Need::Gcc]) else { return };
    for_each(test, &cases(&pythons, &ALL), |py, ns| {
        let dir = TempDir::new("ns-cuda");
        let case = env.command(ns, &dir, py, "patterns");
        let out = dir.join("rec.itr");
        let r = run_cmd(
            infertrace(["record", "-q", "--format", "json", "-o"])
                .arg(&out)
                .arg("--")
                .args(&case.argv)
                .envs(case.env.iter().map(|(k, v)| (k, v))),
            Duration::from_secs(120),
        );
        r.assert_ok();
        let rep = r.json();
        let pid = script_target(&rep, "cuda_patterns.py")?;
        let want = format!("pid {pid}: CPython {}, Python stacks attributed", version_of(&py.exe));
        ensure!(details(&rep).contains(&want), "details lack {want:?}: {:?}", details(&rep));
        // A few of the patterns mode's sites (tests/tests/cuda.rs checks
        // them all), and its 837 calls.
        let expected = [
            ("cudaMemcpyAsync", "small_copy", 200, 200 * 4096),
            ("cudaStreamSynchronize", "small_sync", 200, 0),
            ("cudaMemcpyAsync", "item_copy", 100, 400),
            ("cudaMemcpy", "pageable_copy", 20, 20 << 23),
            ("cudaMemcpyAsync_ptsz", "ptsz_copy", 40, 40 * 2048),
        ];
        env.check_sites(&rep, pid, &case.lib, &ns.files_dir(&dir), &expected, 837)
    });
}

#[test]
fn cuda_sites_attached_in_namespaces() {
    let test = "cuda_sites_attached_in_namespaces";
    let Some((env, pythons)) =
        cuda_env(test, &[Need::Root, Need::Binary, Need::Unshare, Need::Gcc, Need::Bpftool])
    else {
        return;
    };
    for_each(test, &cases(&pythons, &ALL), |py, ns| {
        let dir = TempDir::new("ns-cuda-attach");
        // `late` with LATE_S=0: loads libcudart at once, then waits for the
        // probes before its 50 copies and syncs.
        let case = env.command(ns, &dir, py, "late");
        let vars: Vec<(&str, &Path)> = case.env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        let w = Workload::start(&case.argv, &vars);
        let pid = w.pid;
        // (A chroot's maps name the library under the root: a suffix.)
        let lib = &case.lib;
        let mapped = poll(Duration::from_secs(10), || {
            fs::read_to_string(format!("/proc/{pid}/maps")).ok()?.contains(lib.to_str().unwrap()).then_some(())
        });
        ensure!(mapped.is_some(), "pid {pid} never mapped {}", lib.display());
        let out = dir.join("rec.itr");
        let r = run_cmd(
            infertrace(["record", "-q", "--format", "json", "-p", &pid.to_string(), "-o"]).arg(&out),
            Duration::from_secs(120),
        );
        r.assert_ok();
        let rep = r.json();
        ensure!(rep.target(pid).is_some_and(|t| t["origin"] == "attached"), "targets {}", Value::Array(rep.targets().clone()));
        let expected = [("cudaMemcpyAsync", "small_copy", 50, 50 * 4096), ("cudaStreamSynchronize", "small_sync", 50, 0)];
        env.check_sites(&rep, pid, &case.lib, &ns.files_dir(&dir), &expected, 100)
    });
}

// ---------------------------------------------------------------------------
// The dump's hint

/// `dump -p` of a namespaced root process by user nobody (a copy of the
/// binary, no capabilities): refused, and the one error line says to run as
/// root; as root the same process dumps (above). The hint is not given for
/// what root would not fix: an unsupported version (tests/tests/python_dump.rs
/// checks the message) says which versions are.
#[test]
fn dump_suggests_root_only_when_refused() {
    let test = "dump_suggests_root_only_when_refused";
    require!(test, Root, Binary, Unshare, Setpriv);
    let Some(py) = pyenv_python(3, 12).or_else(|| system_python().map(|p| p.0)) else {
        skip(test, "a CPython 3.8 .. 3.13");
        return;
    };
    let dir = TempDir::new("ns-dump-nobody");
    let argv = Ns::Pid.argv_of(&dir, &py, false, &[&ns_work()], &[dir.join("files/ns_work.py").into(), SECONDS.into(), "attach".into()]);
    let w = Workload::start(&argv, &[]);
    assert_eq!(w.line("ready"), "ready 1");
    let b = dir.join("infertrace");
    fs::copy(bin(), &b).unwrap();
    let as_nobody = run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
            .arg(&b)
            .args(["dump", "-p", &w.pid.to_string()]),
        RUN_TIMEOUT,
    );
    assert!(!as_nobody.status.success(), "dump as nobody succeeded\n{}", as_nobody.describe());
    let line = single_error_line(&as_nobody);
    assert!(line.contains("(hint: run as root"), "{line}");

    let unsupported = pyenv_python(3, 7).or_else(|| pyenv_python(3, 6));
    let Some(old) = unsupported else {
        skip(test, "pyenv CPython 3.7 or 3.6 (an unsupported version)");
        return;
    };
    let mut child = Command::new(&old)
        .args(["-c", "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _guard = KillOnDrop::new(child.id());
    let mut l = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
    let r = run_infertrace(["dump", "-p", &child.id().to_string()]);
    let _ = child.kill();
    let _ = child.wait();
    let line = single_error_line(&r);
    assert!(line.contains("is not supported") && !line.contains("root"), "{line}");
}
