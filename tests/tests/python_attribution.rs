//! Python attribution in `infertrace record`: CPU samples, off-CPU intervals,
//! GIL waits and slow syscalls attributed to Python stacks, on every CPython
//! 3.8 .. 3.15 of the machine (pyenv shared-libpython builds, the system's
//! python3, on Debian 12 a static python3.11, and Debian sid's static 3.14
//! and 3.15 in a chroot: tests/src/pyroot.rs), and a one-line
//! notice for the unsupported 2.7 / 3.6 / 3.7 (traced natively).
//!
//! Each test runs every interpreter found, reports one line per version
//! (pass/fail with the measured numbers, on stderr; run with --nocapture to
//! see them when all pass) and fails if any version failed.
//!
//! Needs root, the infertrace binary and the interpreters; under `CI=true` a
//! missing interpreter fails the test, otherwise it is noted and not tested.
//! The attach test also needs bpftool (to know when the tracer is attached).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

// ---------------------------------------------------------------------------
// Interpreters

/// One interpreter under test.
#[derive(Clone, Debug)]
struct Python {
    label: String,
    exe: PathBuf,
    minor: u32,
    /// `X.Y.Z`, as the interpreter reports it.
    version: String,
}

impl Python {
    /// The name infertrace reports for a function: `co_qualname` on 3.11+,
    /// `co_name` (no class prefix) before.
    fn name(&self, qualname: &str) -> String {
        if self.major() == 3 && self.minor >= 11 {
            qualname.to_string()
        } else {
            qualname.rsplit('.').next().unwrap().to_string()
        }
    }
    fn major(&self) -> u32 {
        self.version.split('.').next().unwrap().parse().unwrap()
    }
}

/// `X.Y.Z` of the interpreter `exe`.
fn version_of(exe: &Path) -> String {
    let o = Command::new(exe)
        .args(["-c", "import sys; sys.stdout.write('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(o.status.success(), "{} -c ...: {o:?}", exe.display());
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// (major, minor) of the glibc the interpreter `exe` runs with.
fn glibc_of(exe: &Path) -> Option<(u32, u32)> {
    let o = Command::new(exe)
        .args(["-c", "import os; print(os.confstr('CS_GNU_LIBC_VERSION'))"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&o.stdout);
    let (major, minor) = text.trim().strip_prefix("glibc ")?.split_once('.')?;
    Some((major.parse().ok()?, minor.split('.').next()?.parse().ok()?))
}

/// Finds the interpreters `wanted` ((label, exe or None, minor)); applies the
/// CI rule to the missing ones. `None`: skip the test.
fn collect_pythons(test: &str, wanted: Vec<(String, Option<PathBuf>, u32)>) -> Option<Vec<Python>> {
    if !require(test, &[Need::Root, Need::Binary]) {
        return None;
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (label, exe, minor) in wanted {
        match exe {
            Some(exe) => {
                let version = version_of(&exe);
                found.push(Python {
                    label,
                    exe,
                    minor,
                    version,
                })
            }
            None => missing.push(label),
        }
    }
    if found.is_empty() {
        skip(test, &format!("any of the expected interpreters ({})", missing.join(", ")));
        return None;
    }
    // Under CI=true every one; otherwise what is there.
    skip_some(test, &missing).then_some(found)
}

/// CPython 3.8 .. 3.13 from pyenv, the system's python3 and sid's 3.14 and
/// 3.15 in a chroot (`expected_pythons`).
fn supported_pythons(test: &str) -> Option<Vec<Python>> {
    let (found, missing) = expected_pythons();
    let wanted = found
        .into_iter()
        .map(|p| (p.label, Some(p.exe), p.minor))
        .chain(missing.into_iter().map(|label| (label, None, 0)))
        .collect();
    collect_pythons(test, wanted)
}

/// The unsupported CPythons pyenv has: 2.7, 3.6, 3.7.
fn legacy_pythons(test: &str) -> Option<Vec<Python>> {
    let wanted = [(2, 7), (3, 6), (3, 7)]
        .into_iter()
        .map(|(major, minor)| {
            (
                format!("pyenv {major}.{minor}"),
                pyenv_python(major, minor),
                minor,
            )
        })
        .collect();
    collect_pythons(test, wanted)
}

fn workload_py(name: &str) -> PathBuf {
    workspace_root()
        .join("tests/workloads")
        .join(name)
        .canonicalize()
        .unwrap_or_else(|e| panic!("workload {name}: {e}"))
}

// ---------------------------------------------------------------------------
// Running each version, reporting

/// Runs `check` for every interpreter (a panic fails that version only),
/// prints one line per version and fails the test if any failed.
fn for_each_python(test: &str, pythons: &[Python], check: impl Fn(&Python) -> Result<String, String>) {
    let mut rows = Vec::new();
    for py in pythons {
        let res = catch_unwind(AssertUnwindSafe(|| check(py))).unwrap_or_else(|e| {
            Err(e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string()))
        });
        rows.push((format!("{} ({})", py.label, py.version), res));
    }
    let mut table = format!("{test}:\n");
    for (who, res) in &rows {
        match res {
            Ok(s) => table += &format!("  PASS {who}: {s}\n"),
            Err(s) => table += &format!("  FAIL {who}: {s}\n"),
        }
    }
    let _ = std::io::stderr().write_all(table.as_bytes());
    let failed = rows.iter().filter(|(_, r)| r.is_err()).count();
    assert!(failed == 0, "{failed} of {} version(s) failed:\n{table}", rows.len());
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            return Err(format!($($fmt)+));
        }
    };
}

/// Records `python script args...` (launched), returns the run, the report
/// and the interpreter's pid.
fn record_python(py: &Python, script: &str, args: &[&str]) -> (Run, Report, u32) {
    record_python_with(&[], py, script, args)
}

/// [`record_python`] with extra `record` options (`-F HZ`, ...): like
/// `record_launch`, `record -q --format json -o OUT OPTIONS -- CMD`, which
/// must succeed and write a report that passes `check_invariants`.
fn record_python_with(opts: &[&str], py: &Python, script: &str, args: &[&str]) -> (Run, Report, u32) {
    let dir = TempDir::new("pyattr");
    let out = dir.join("rec.itr");
    let script = workload_py(script);
    let r = run_cmd(
        infertrace(["record", "-q", "--format", "json", "-o"])
            .arg(&out)
            .args(opts)
            .arg("--")
            .arg(&py.exe)
            .arg(&script)
            .args(args),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    assert!(out.is_file(), "recording {} not written\n{}", out.display(), r.describe());
    let rep = r.json();
    rep.check_invariants();
    let pid = rep.one_target("launched")["pid"].as_u64().unwrap() as u32;
    (r, rep, pid)
}

/// The note infertrace writes for a supported interpreter.
fn attributed_note(pid: u32, py: &Python) -> String {
    format!("pid {pid}: CPython {}, Python stacks attributed", py.version)
}

fn notes(rep: &Report) -> Vec<String> {
    rep.0["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap_or("").to_string())
        .collect()
}

/// The recording's details (`details`: how the tracer worked, e.g. the
/// CPython seen in each process).
fn details(rep: &Report) -> Vec<String> {
    rep.0["details"].as_array().map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn check_attributed_note(rep: &Report, pid: u32, py: &Python) -> Result<(), String> {
    let want = attributed_note(pid, py);
    let n = details(rep);
    let with_py = rep
        .stacks()
        .iter()
        .filter(|s| s["pid"] == pid && !py_frames(s).is_empty())
        .count();
    ensure!(
        n.contains(&want),
        "details lack {want:?}: details {n:?}; {with_py} of {} stacks of pid {pid} have Python frames; targets {}",
        rep.stacks().iter().filter(|s| s["pid"] == pid).count(),
        Value::Array(rep.targets().clone())
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Stacks

fn frames(s: &Value) -> &Vec<Value> {
    s["frames"].as_array().expect("frames")
}

/// The Python frames of a stack, leaf first.
fn py_frames(s: &Value) -> Vec<&Value> {
    frames(s).iter().filter(|f| f["kind"] == "python").collect()
}

/// (function, line) of the Python leaf frame.
fn py_leaf(s: &Value) -> Option<(String, Option<u64>)> {
    py_frames(s)
        .first()
        .map(|f| (f["function"].as_str().unwrap_or("").to_string(), f["line"].as_u64()))
}

fn has_py_function(s: &Value, name: &str) -> bool {
    py_frames(s).iter().any(|f| f["function"] == name)
}

fn samples(s: &Value) -> u64 {
    s["samples"].as_u64().unwrap_or(0)
}

fn weight(s: &Value) -> u64 {
    s["weight_ns"].as_u64().unwrap_or(0)
}

fn stacks_of<'a>(rep: &'a Report, pid: u32, kind: &str) -> Vec<&'a Value> {
    rep.stacks()
        .iter()
        .filter(|s| s["pid"] == pid && s["kind"] == kind)
        .collect()
}

/// Short rendering of a stack's frames (leaf first).
fn render(s: &Value) -> String {
    frames(s)
        .iter()
        .map(|f| {
            let k = f["kind"].as_str().unwrap_or("?");
            let func = f["function"].as_str().unwrap_or("?");
            match (k, f["line"].as_u64()) {
                ("python", Some(l)) => format!("py:{func}:{l}"),
                ("python", None) => format!("py:{func}"),
                ("kernel", _) => format!("k:{func}"),
                _ => func.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

/// Frames are leaf first: kernel frames, then native, then Python.
fn check_frame_order(rep: &Report, pid: u32) -> Result<(), String> {
    let rank = |k: &str| match k {
        "kernel" => 0,
        "native" => 1,
        "python" => 2,
        _ => 3,
    };
    for s in rep.stacks().iter().filter(|s| s["pid"] == pid) {
        let ranks: Vec<u8> = frames(s)
            .iter()
            .map(|f| rank(f["kind"].as_str().unwrap_or("")))
            .collect();
        ensure!(
            ranks.iter().all(|r| *r < 3) && ranks.windows(2).all(|w| w[0] <= w[1]),
            "frames not ordered kernel, native, python (leaf first): {} stack {}",
            s["kind"],
            render(s)
        );
    }
    Ok(())
}

/// Lines `<tag> tid TID ...` in `text`: the TIDs.
fn tids_tagged(text: &str, tag: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() >= 3 && t[0] == tag && t[1] == "tid").then(|| t[2].parse().ok())?
        })
        .collect()
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

fn load_avg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// CPU

#[test]
fn cpu_recursive_fib_gets_90_percent() {
    let test = "cpu_recursive_fib_gets_90_percent";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        let (_r, rep, pid) = record_python(py, "pyattr_cpu.py", &["fib", "2"]);
        check_attributed_note(&rep, pid, py)?;
        check_frame_order(&rep, pid)?;
        let cpu = stacks_of(&rep, pid, "cpu");
        let total: u64 = cpu.iter().map(|s| samples(s)).sum();
        let fib: u64 = cpu
            .iter()
            .filter(|s| has_py_function(s, "fib"))
            .map(|s| samples(s))
            .sum();
        let no_py: u64 = cpu
            .iter()
            .filter(|s| py_frames(s).is_empty())
            .map(|s| samples(s))
            .sum();
        let share = pct(fib, total);
        let summary = format!(
            "fib {fib}/{total} cpu samples = {share:.1}% (no Python frames: {no_py})"
        );
        ensure!(total >= 100, "too few cpu samples: {summary}");
        if share < 90.0 {
            let mut others: Vec<&&Value> = cpu.iter().filter(|s| !has_py_function(s, "fib")).collect();
            others.sort_by_key(|s| std::cmp::Reverse(samples(s)));
            let shown: Vec<String> = others
                .iter()
                .take(8)
                .map(|s| format!("    {} x {}", samples(s), render(s)))
                .collect();
            return Err(format!(
                "{summary} < 90%; non-fib cpu stacks:\n{}",
                shown.join("\n")
            ));
        }
        Ok(summary)
    });
}

#[test]
fn cpu_split_70_30_between_two_functions() {
    let test = "cpu_split_70_30_between_two_functions";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        // 499 Hz: at the default 99 Hz, 3 s give ~300 samples, one per
        // ~10 ms slice at a random phase, a binomial spread of +-2.6 points
        // (one run in ~16 would miss 5 points by chance alone); at 499 Hz
        // several samples land in each slice (measured spread: +-1 point).
        let (r, rep, pid) = record_python_with(&["-F", "499"], py, "pyattr_cpu.py", &["split", "3"]);
        check_attributed_note(&rep, pid, py)?;
        // Ground truth: the CPU time each function really got.
        let truth = r
            .stderr
            .lines()
            .find_map(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                (t.len() == 5 && t[0] == "split").then(|| {
                    let a: u64 = t[2].parse().ok()?;
                    let b: u64 = t[4].parse().ok()?;
                    Some(pct(a, a + b))
                })?
            })
            .ok_or_else(|| format!("no `split` line on stderr:\n{}", r.stderr))?;
        let mut by_leaf: BTreeMap<String, u64> = BTreeMap::new();
        let cpu = stacks_of(&rep, pid, "cpu");
        for s in &cpu {
            let leaf = py_leaf(s).map(|l| l.0).unwrap_or_else(|| "<no Python frame>".into());
            *by_leaf.entry(leaf).or_insert(0) += samples(s);
        }
        let total: u64 = cpu.iter().map(|s| samples(s)).sum();
        let a = by_leaf.get("busy_a").copied().unwrap_or(0);
        let b = by_leaf.get("busy_b").copied().unwrap_or(0);
        let share = pct(a, a + b);
        let summary = format!(
            "busy_a {a} / busy_b {b} samples = {share:.1}% busy_a (truth {truth:.1}%; {} of {total} cpu samples in busy_a/busy_b)",
            a + b
        );
        ensure!((truth - 70.0).abs() <= 1.0, "workload did not split 70/30: {summary}");
        ensure!(
            a + b >= 500 && (a + b) as f64 >= 0.8 * total as f64,
            "too few samples with busy_a/busy_b as Python leaf: {summary}; by leaf: {by_leaf:?}"
        );
        ensure!(
            (share - 70.0).abs() <= 5.0,
            "split off by more than 5 points: {summary}; by leaf: {by_leaf:?}"
        );
        Ok(summary)
    });
}

// ---------------------------------------------------------------------------
// I/O

#[test]
fn io_blocked_read_is_attributed_to_its_line() {
    let test = "io_blocked_read_is_attributed_to_its_line";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        let (r, rep, pid) = record_python(py, "pyattr_io.py", &["1.0"]);
        check_attributed_note(&rep, pid, py)?;
        check_frame_order(&rep, pid)?;
        let (tid, line) = r
            .stderr
            .lines()
            .find_map(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                (t.len() == 5 && t[0] == "reader" && t[1] == "tid" && t[3] == "line")
                    .then(|| Some((t[2].parse::<u64>().ok()?, t[4].parse::<u64>().ok()?)))?
            })
            .ok_or_else(|| format!("no `reader tid` line on stderr:\n{}", r.stderr))?;
        let io: Vec<&Value> = stacks_of(&rep, pid, "off_cpu")
            .into_iter()
            .filter(|s| s["tid"] == tid && s["reason"] == "io")
            .collect();
        let io_total: u64 = io.iter().map(|s| weight(s)).sum();
        let at_line: u64 = io
            .iter()
            .filter(|s| py_leaf(s) == Some(("reader".to_string(), Some(line))))
            .map(|s| weight(s))
            .sum();
        let listing = || {
            io.iter()
                .map(|s| format!("    {:.1} ms: {}", weight(s) as f64 / 1e6, render(s)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let summary = format!(
            "off_cpu io at reader:{line}: {:.0} ms (all io of the reader thread: {:.0} ms)",
            at_line as f64 / 1e6,
            io_total as f64 / 1e6
        );
        ensure!(
            at_line >= 800_000_000,
            "{summary}: expected >= 800 ms of off_cpu/io with Python leaf reader:{line}; io stacks of tid {tid}:\n{}",
            listing()
        );
        // The native frames below the Python leaf include libc's read.
        // From glibc 2.41 read makes its syscall in `__syscall_cancel_arch`,
        // a local function: in a stripped libc (Debian sid's, in the
        // chroot) that leaf frame has no name, and without frame pointers
        // nothing above it is found; it is still in libc.
        let main = io
            .iter()
            .max_by_key(|s| weight(s))
            .unwrap();
        let glibc = glibc_of(&py.exe).ok_or_else(|| format!("{}: no glibc version", py.exe.display()))?;
        let native = |f: &&Value| f["kind"] == "native";
        let found = if glibc >= (2, 41) {
            frames(main).iter().filter(native).any(|f| f["module"].as_str().is_some_and(|m| m.starts_with("libc.so")))
        } else {
            frames(main).iter().filter(native).any(|f| f["function"].as_str().unwrap_or("").contains("read"))
        };
        ensure!(found, "no native read frame (glibc {}.{}) in {}", glibc.0, glibc.1, render(main));
        // The slow-syscall stack of that read points at the same line.
        let sys_at_line = stacks_of(&rep, pid, "syscall")
            .into_iter()
            .filter(|s| s["tid"] == tid && s["syscall"] == "read")
            .filter(|s| py_leaf(s) == Some(("reader".to_string(), Some(line))))
            .map(weight)
            .sum::<u64>();
        ensure!(
            sys_at_line >= 800_000_000,
            "{summary}; but syscall read stacks at reader:{line} weigh {:.0} ms",
            sys_at_line as f64 / 1e6
        );
        Ok(summary)
    });
}

// ---------------------------------------------------------------------------
// The process exits right after its work

/// Work that ends with the process: `work()` for 0.3 s, then `tail()`,
/// compiled from a string right before (its code object is new), for 0.1 s,
/// then `os._exit(0)`, or a SIGKILL. No one can read the process's memory
/// afterwards: the frames resolve from what the kernel copied.
#[test]
fn frames_resolve_after_the_process_exits() {
    let test = "frames_resolve_after_the_process_exits";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        let exited = exits_right_after_work(py, "exit")?;
        let killed = exits_right_after_work(py, "kill")?;
        Ok(format!("os._exit: {exited}; SIGKILL: {killed}"))
    });
}

/// One run of `pyattr_exit.py`, ending with `os._exit(0)` (`exit`) or a
/// SIGKILL (`kill`, a crash).
fn exits_right_after_work(py: &Python, how: &str) -> Result<String, String> {
    let (r, rep, pid) = record_python(py, "pyattr_exit.py", &["0.3", "0.1", how]);
    check_attributed_note(&rep, pid, py)?;
    check_frame_order(&rep, pid)?;
    let cpu_line = r
        .stderr
        .lines()
        .find_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() == 3 && t[0] == "cpu").then(|| Some((t[1].parse::<f64>().ok()?, t[2].parse::<f64>().ok()?)))?
        })
        .ok_or_else(|| format!("no `cpu WORK TAIL` line on stderr:\n{}", r.stderr))?;
    let (work_s, tail_s) = cpu_line;
    let hz = rep.0["sample_hz"].as_f64().unwrap_or(0.0);
    // Every Python frame of every stack of the process names its
    // function and file; every frame of the stacks in work() and tail()
    // has its line too. (Start-up imports may not: the kernel copies the
    // first 2 KiB of a line table, and a big module's top-level code,
    // typing.py's say, has more; the report says so in a note.)
    let all: Vec<&Value> = rep.stacks().iter().filter(|s| s["pid"] == pid).collect();
    let unresolved: Vec<String> = all
        .iter()
        .filter(|s| {
            let ours = has_py_function(s, "work") || has_py_function(s, "tail");
            py_frames(s).iter().any(|f| f["function"] == "[unknown]" || f["file"].is_null() || (ours && f["line"].is_null()))
        })
        .map(|s| format!("{} {}", s["kind"], render(s)))
        .collect();
    ensure!(
        unresolved.is_empty(),
        "{} stacks with unresolved Python frames, e.g.:\n      {}\n    notes: {:?}",
        unresolved.len(),
        unresolved.iter().take(5).cloned().collect::<Vec<_>>().join("\n      "),
        notes(&rep).into_iter().filter(|n| n.contains("code objects")).collect::<Vec<_>>()
    );
    let cpu = stacks_of(&rep, pid, "cpu");
    let count = |f: &dyn Fn(&Value) -> bool| -> u64 { cpu.iter().filter(|s| f(s)).map(|s| samples(s)).sum() };
    let in_work = count(&|s| has_py_function(s, "work"));
    let in_tail = count(&|s| {
        py_frames(s)
            .first()
            .is_some_and(|f| f["function"] == "tail" && f["file"] == "generated_tail.py" && f["line"].as_u64().is_some_and(|l| (3..=6).contains(&l)))
    });
    let with_py = count(&|s| !py_frames(s).is_empty());
    // CPU-clock sampling: the thread's own CPU time times the rate, +-1.
    let (want_work, want_tail) = (work_s * hz, tail_s * hz);
    let summary = format!(
        "work {in_work} samples (its CPU time says {want_work:.1}), tail {in_tail} ({want_tail:.1}), {with_py} with Python frames, load {}",
        load_avg()
    );
    ensure!(in_work as f64 >= 0.8 * want_work - 1.0, "{summary}: too few samples under work()");
    ensure!(in_tail as f64 >= (0.5 * want_tail - 1.0).max(1.0), "{summary}: too few samples at tail() (generated_tail.py:3-6)");
    Ok(summary)
}

// ---------------------------------------------------------------------------
// GIL

fn gil_run(py: &Python, threads: usize) -> Result<(Report, u32, Vec<ThreadTimes>, String), String> {
    let (r, rep, pid) = record_python(py, "pyattr_gil.py", &[&threads.to_string(), "3"]);
    check_attributed_note(&rep, pid, py)?;
    check_frame_order(&rep, pid)?;
    let tids = tids_tagged(&r.stderr, "worker");
    ensure!(
        tids.len() == threads,
        "expected {threads} `worker tid` lines on stderr:\n{}",
        r.stderr
    );
    let all = rep.thread_times();
    let workers: Vec<ThreadTimes> = tids
        .iter()
        .map(|tid| {
            all.iter()
                .find(|t| t.tid == *tid && t.pid == pid as u64)
                .cloned()
                .ok_or_else(|| format!("worker {tid} not in threads[]:\n{}", rep.describe_threads()))
        })
        .collect::<Result<_, _>>()?;
    let mut desc = String::new();
    for t in &workers {
        let gil = t.extra_off_cpu.get("gil_ns").copied().unwrap_or(0);
        desc += &format!(
            "[tid {} gil {:.1}% rq {:.1}% cpu {:.1}% lock {:.1}%] ",
            t.tid,
            pct(gil, t.wall_ns),
            pct(t.runqueue_ns, t.wall_ns),
            pct(t.on_cpu_ns, t.wall_ns),
            pct(t.lock_ns, t.wall_ns)
        );
    }
    desc += &format!("loadavg {}", load_avg());
    Ok((rep, pid, workers, desc))
}

fn gil_ns(t: &ThreadTimes) -> Result<u64, String> {
    t.extra_off_cpu
        .get("gil_ns")
        .copied()
        .ok_or_else(|| format!("threads[] entry without off_cpu.gil_ns: {}", t.describe()))
}

#[test]
fn gil_four_threads_each_wait_75_percent() {
    let test = "gil_four_threads_each_wait_75_percent";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        let (rep, pid, workers, desc) = gil_run(py, 4)?;
        let mut problems = Vec::new();
        // Four spinning threads, one GIL: three of them wait for it at any
        // moment, so their GIL waits average 75% of the wall time. How the
        // interpreter shares it out is its own (one run: 64.5% and 75.9%
        // in one process), so each thread is held to its own time off CPU
        // and out of the run queue, all of which is GIL wait.
        let mut shares = Vec::new();
        for t in &workers {
            let gil = gil_ns(t)?;
            let share = pct(gil, t.wall_ns);
            shares.push(share);
            let waiting = t.wall_ns.saturating_sub(t.on_cpu_ns + t.runqueue_ns);
            if pct(gil, waiting) < 90.0 {
                problems.push(format!(
                    "tid {}: gil {:.1}% of its time neither on a CPU nor runnable, expected >= 90: {}",
                    t.tid,
                    pct(gil, waiting),
                    t.describe()
                ));
            }
        }
        let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
        if (mean - 75.0).abs() > 10.0 {
            problems.push(format!("the workers' gil waits average {mean:.1}% of wall, expected 75 +- 10: {shares:?}"));
        }
        // The GIL waits point at the spinning function.
        let tids: BTreeSet<u64> = workers.iter().map(|t| t.tid).collect();
        let gil_stacks: Vec<&Value> = stacks_of(&rep, pid, "gil")
            .into_iter()
            .filter(|s| s["tid"].as_u64().is_some_and(|t| tids.contains(&t)))
            .collect();
        for s in &gil_stacks {
            if s["reason"] != "gil" {
                problems.push(format!("gil stack with reason {}: {}", s["reason"], render(s)));
            }
        }
        let total: u64 = gil_stacks.iter().map(|s| weight(s)).sum();
        let in_spin: u64 = gil_stacks
            .iter()
            .filter(|s| py_leaf(s).is_some_and(|l| l.0 == "spin"))
            .map(|s| weight(s))
            .sum();
        let gil_sum: u64 = workers.iter().map(|t| gil_ns(t).unwrap_or(0)).sum();
        let mut top: Vec<&&Value> = gil_stacks.iter().collect();
        top.sort_by_key(|s| std::cmp::Reverse(weight(s)));
        let shown = || {
            top.iter()
                .take(6)
                .map(|s| format!("    {:.1} ms: {}", weight(s) as f64 / 1e6, render(s)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        if (total as f64) < 0.9 * gil_sum as f64 {
            problems.push(format!(
                "gil stacks of the workers weigh {:.0} ms, threads[] gil_ns sum to {:.0} ms; top stacks:\n{}",
                total as f64 / 1e6,
                gil_sum as f64 / 1e6,
                shown()
            ));
        }
        if pct(in_spin, total) < 90.0 {
            problems.push(format!(
                "only {:.1}% of the workers' gil stack weight has Python leaf `spin`; top stacks:\n{}",
                pct(in_spin, total),
                shown()
            ));
        }
        ensure!(
            problems.is_empty(),
            "{desc}; gil stacks in spin {:.1}%\n    {}",
            pct(in_spin, total),
            problems.join("\n    ")
        );
        Ok(format!("{desc}; gil stacks in spin {:.1}%", pct(in_spin, total)))
    });
}

#[test]
fn gil_single_thread_does_not_wait() {
    let test = "gil_single_thread_does_not_wait";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        let (_rep, _pid, workers, desc) = gil_run(py, 1)?;
        let t = &workers[0];
        let share = pct(gil_ns(t)?, t.wall_ns);
        ensure!(share < 5.0, "gil {share:.1}% of wall (expected < 5%); {desc}\n    {}", t.describe());
        Ok(desc)
    });
}

/// `gil_holder.py MODE`: the compute thread's GIL waits are charged to the
/// holder thread (`gil_holders` in JSON) about as long as the compute
/// thread waited by its own clock (wall minus CPU, minus the run-queue
/// delay the tracer measured), and its verdict names the holder, what it
/// did and its line.
fn gil_holder_run(py: &Python, mode: &str) -> Result<String, String> {
    let (r, rep, pid) = record_python(py, "gil_holder.py", &[mode, "2"]);
    check_attributed_note(&rep, pid, py)?;
    let printed = |k: &str| -> Result<f64, String> {
        r.stderr
            .lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no {k} printed:\n{}", r.stderr))
    };
    let (holder, compute) = (printed("holder_tid")? as u64, printed("compute_tid")? as u64);
    let rows: Vec<&Value> = rep.0["gil_holders"].as_array().map(|a| a.iter().filter(|h| h["tid"] == compute).collect()).unwrap_or_default();
    let charged: u64 = rows.iter().filter(|h| h["holder_tid"] == holder).filter_map(|h| h["wait_ns"].as_u64()).sum();
    let t = rep.thread_times().into_iter().find(|t| t.tid == compute).ok_or_else(|| format!("compute thread {compute} not in threads[]"))?;
    let waited = (printed("compute_wall_s")? - printed("compute_cpu_s")?) * 1e9 - t.runqueue_ns as f64;
    let desc = format!("charged to holder {:.3} s, compute waited {:.3} s (wall - cpu - run queue); loadavg {}", charged as f64 / 1e9, waited / 1e9, load_avg());
    ensure!((charged as f64 - waited).abs() <= 0.1 * waited + 50e6, "{desc}");
    // The compute thread's verdict names the holder.
    let m = markers_of(&workload_py("gil_holder.py"));
    let p = rep.0["verdict"]["processes"].as_array().and_then(|a| a.iter().find(|p| p["pid"] == pid)).ok_or("no verdict")?;
    let th = p["threads"].as_array().and_then(|a| a.iter().find(|x| x["tid"] == compute)).ok_or_else(|| format!("no verdict for the compute thread: {p:#}"))?;
    let h = &th["bottleneck"]["gil_holders"][0];
    ensure!(h["holder_tid"] == holder, "the first holder is not thread {holder}: {:#}", th["bottleneck"]);
    let (doing, function) = if mode == "native" { ("native_call", "holder_native") } else { ("python", "holder_python") };
    ensure!(h["doing"] == doing && h["site"]["function"] == py.name(function).as_str(), "holder: {h:#}");
    if mode == "native" {
        ensure!(h["site"]["line"].as_u64() == Some(m["native_call"]), "holder line: {h:#}");
        let kinds: Vec<&str> = th["bottleneck"]["findings"].as_array().map(|a| a.iter().filter_map(|f| f["kind"].as_str()).collect()).unwrap_or_default();
        ensure!(kinds.contains(&"gil_held_in_native_call"), "findings {kinds:?}");
        ensure!(th["bottleneck"]["class"] == "gil", "compute thread: {:#}", th["bottleneck"]);
    }
    Ok(desc)
}

#[test]
fn gil_holder_in_a_native_call_is_named() {
    let test = "gil_holder_in_a_native_call_is_named";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| gil_holder_run(py, "native"));
}

#[test]
fn gil_holder_running_python_is_named() {
    let test = "gil_holder_running_python_is_named";
    let Some(pythons) = supported_pythons(test) else { return };
    for_each_python(test, &pythons, |py| gil_holder_run(py, "python"));
}

// ---------------------------------------------------------------------------
// Attach

/// A `pyattr_attach.py` process: stdout lines through a channel; killed on drop.
struct Attached {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Attached {
    fn start(py: &Python, seconds: &str) -> Attached {
        let mut child = Command::new(&py.exe)
            .arg(workload_py("pyattr_attach.py"))
            .arg(seconds)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = line_channel(child.stdout.take().unwrap());
        Attached { child, stdin, lines }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("attach workload: no {what} line: {e}"))
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn attach_covers_new_threads_and_target_exit() {
    let test = "attach_covers_new_threads_and_target_exit";
    let Some(pythons) = supported_pythons(test) else { return };
    if !require(test, &[Need::Bpftool]) {
        return;
    }
    for_each_python(test, &pythons, |py| {
        // 3 s per late thread: ~200 samples each, so that the one sample a
        // thread may take in its native start (first touch of its stack,
        // before CPython binds its thread state) stays under 1%.
        let mut w = Attached::start(py, "3.0");
        let pid = w.pid();
        let ready = w.line("ready");
        ensure!(ready == format!("ready {pid}"), "unexpected first line {ready:?}");
        // Started, sleeping 0.5 s then working: attach now.
        let dir = TempDir::new("pyattr-attach");
        let out = dir.join("rec.itr");
        let before = bpf_prog_ids();
        let tracer = spawn(
            infertrace(["record", "-q", "-p", &pid.to_string(), "--format", "json", "-o"])
                .arg(&out)
                .current_dir(dir.path()),
        );
        let tpid = tracer.id();
        let mut guard = KillOnDrop::new(tpid);
        wait_attached(tpid, pid, &before);
        wait_python_attached(tpid, pid);
        // Let the main thread's early_work be sampled, then start the threads.
        std::thread::sleep(Duration::from_millis(500));
        writeln!(w.stdin.as_mut().unwrap(), "go").unwrap();
        w.stdin.take();
        let mut lines = Vec::new();
        loop {
            let l = w.line("late tid / done");
            if l == "done" {
                break;
            }
            lines.push(l);
        }
        let late = tids_tagged(&lines.join("\n"), "late");
        let sleeper = lines.iter().find_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() == 5 && t[0] == "sleeper" && t[1] == "tid" && t[3] == "line")
                .then(|| Some((t[2].parse::<u64>().ok()?, t[4].parse::<u64>().ok()?)))?
        });
        let st = w.child.wait().unwrap();

        // The target exited: record stops by itself, successfully.
        let r = wait_child(tracer, Duration::from_secs(30), "infertrace record -p (target exited)");
        guard.disarm();
        ensure!(late.len() == 2, "expected two `late tid` lines, got {lines:?}");
        ensure!(st.success(), "workload exited with {st:?}");
        ensure!(r.status.success(), "record did not exit 0 after its target exited\n{}", r.describe());
        let rep = r.json();
        rep.check_invariants();
        check_attributed_note(&rep, pid, py)?;
        check_frame_order(&rep, pid)?;
        let t = rep
            .target(pid)
            .ok_or_else(|| format!("pid {pid} not in targets"))?;
        ensure!(t["origin"] == "attached", "target origin: {t}");

        let cpu = stacks_of(&rep, pid, "cpu");
        let run = py.name("Late.run");
        let boot = py.name("Thread._bootstrap");
        let mut desc = Vec::new();
        let mut problems = Vec::new();
        // Threads started after the attach: their CPU samples have (resolved)
        // Python frames.
        for tid in &late {
            let mine: Vec<&&Value> = cpu.iter().filter(|s| s["tid"] == *tid).collect();
            let total: u64 = mine.iter().map(|s| samples(s)).sum();
            // Its own Python frames: Late.run, or threading's bootstrap
            // code around it (`_bootstrap_inner`, `_set_tstate_lock`...).
            // Samples in the thread's native start and exit (glibc's
            // start_thread, the kernel's do_exit: no interpreter frame)
            // are not Python time and are left out.
            let in_python = |s: &Value| {
                !py_frames(s).is_empty()
                    || frames(s).iter().any(|f| {
                        let m = f["module"].as_str().unwrap_or("");
                        m.starts_with("libpython") || m.starts_with("python")
                    })
            };
            let outside: u64 = mine.iter().filter(|s| !in_python(s)).map(|s| samples(s)).sum();
            let total = total - outside;
            let (covered, not): (Vec<&&&Value>, Vec<&&&Value>) = mine
                .iter()
                .filter(|s| in_python(s))
                .partition(|s| py_frames(s).last().is_some_and(|f| f["function"] == boot));
            let with_py: u64 = covered.iter().map(|s| samples(s)).sum();
            let in_run: u64 = mine.iter().filter(|s| has_py_function(s, &run)).map(|s| samples(s)).sum();
            let unresolved: Vec<String> = mine
                .iter()
                .filter(|s| py_frames(s).iter().any(|f| f["function"] == "[unknown]" || f["line"].is_null()))
                .map(|s| render(s))
                .collect();
            desc.push(format!(
                "late tid {tid}: {with_py}/{total} cpu samples in the interpreter ({:.1}%) with its Python frames, {in_run} under {run}, {outside} outside it",
                pct(with_py, total)
            ));
            if total < 20 {
                problems.push(format!("late thread {tid}: only {total} cpu samples"));
            }
            // The kernel finds a new thread's state on its first event
            // (docs/python.md): only the microseconds of native start-up
            // before its first Python frame may lack one.
            if pct(in_run, total) < 90.0 {
                problems.push(format!("late thread {tid}: only {in_run}/{total} cpu samples under {run}"));
            }
            if pct(with_py, total) < 99.0 {
                problems.push(format!(
                    "late thread {tid}: {with_py}/{total} cpu samples have its Python frames (root {boot}); the others:\n      {}",
                    not.iter()
                        .take(8)
                        .map(|s| format!("{} x {}", samples(s), render(s)))
                        .collect::<Vec<_>>()
                        .join("\n      ")
                ));
            }
            if !unresolved.is_empty() {
                problems.push(format!(
                    "late thread {tid}: {} stacks with unresolved Python frames (target exited), e.g. {}",
                    unresolved.len(),
                    unresolved[0]
                ));
            }
        }
        // A new thread whose first act is a sleep: that first wait is
        // charged to its line too (its state was found on that event).
        match sleeper {
            None => problems.push(format!("no `sleeper tid TID line LINE` line in {lines:?}")),
            Some((tid, line)) => {
                // (reason sleep; poll up to 3.10, whose time.sleep is a select)
                let sleeps: Vec<&Value> = stacks_of(&rep, pid, "off_cpu").into_iter().filter(|s| s["tid"] == tid).collect();
                let at_line: u64 = sleeps
                    .iter()
                    .filter(|s| py_leaf(s) == Some(("first_sleep".to_string(), Some(line))))
                    .map(|s| weight(s))
                    .sum();
                desc.push(format!("sleeper tid {tid}: {:.0} ms of sleep at first_sleep:{line}", at_line as f64 / 1e6));
                if at_line < 250_000_000 {
                    problems.push(format!(
                        "sleeper thread {tid}: {:.0} ms of sleep at first_sleep:{line} (slept 300 ms); its sleeps: {}",
                        at_line as f64 / 1e6,
                        sleeps.iter().map(|s| format!("{:.0} ms {}", weight(s) as f64 / 1e6, render(s))).collect::<Vec<_>>().join("; ")
                    ));
                }
            }
        }
        // The main thread, working since before the attach.
        let early: u64 = cpu
            .iter()
            .filter(|s| s["tid"] == pid && has_py_function(s, "early_work"))
            .map(|s| samples(s))
            .sum();
        desc.push(format!("main: {early} samples in early_work"));
        if early < 10 {
            problems.push(format!("main thread: {early} cpu samples in early_work"));
        }
        ensure!(
            problems.is_empty(),
            "{}\n    {}",
            desc.join("; "),
            problems.join("\n    ")
        );
        Ok(desc.join("; "))
    });
}

// ---------------------------------------------------------------------------
// Unsupported versions

#[test]
fn unsupported_versions_are_traced_natively_with_a_notice() {
    let test = "unsupported_versions_are_traced_natively_with_a_notice";
    let Some(pythons) = legacy_pythons(test) else { return };
    for_each_python(test, &pythons, |py| {
        const N: u64 = 1000;
        let (_r, rep, pid) = record_python(py, "pyattr_legacy.py", &[&N.to_string(), "0.5"]);
        let n = notes(&rep);
        let mine: Vec<&String> = n
            .iter()
            .filter(|s| s.starts_with(&format!("pid {pid}:")) || s.contains(&format!("pid {pid} ")))
            .collect();
        // One line: the version, the supported range, what is still traced;
        // no privilege hint (privileges are not the cause).
        // The full version where the interpreter had written it before it
        // was read; a process that exits first (a loaded machine) is named
        // by major.minor only ("CPython 3.7 is not supported").
        let version = format!("CPython {}.{}", py.major(), py.minor);
        let named = mine.first().is_some_and(|m| [".", " "].iter().any(|end| m.contains(&format!("{version}{end}"))));
        ensure!(
            mine.len() == 1
                && !mine[0].contains('\n')
                && named
                && mine[0].contains("is not supported (supported: 3.8 to 3.15")
                && mine[0].contains("still traced: syscalls, wall time")
                && mine[0].contains("native stacks")
                && !mine[0].contains("root"),
            "expected one notice `pid {pid}: {version}.. is not supported (supported: 3.8 to 3.15..); still traced: syscalls, wall time, .. native stacks`; notes: {n:?}"
        );
        ensure!(
            !mine[0].contains("Python stacks attributed"),
            "notice claims attribution: {:?}",
            mine[0]
        );
        // Wall time: the main thread's time is accounted for.
        let times: Vec<ThreadTimes> = rep.thread_times().into_iter().filter(|t| t.pid == u64::from(pid)).collect();
        let main = times.iter().find(|t| t.tid == u64::from(pid)).ok_or_else(|| format!("no wall time for pid {pid}"))?;
        ensure!(main.parts_ns() > 400_000_000, "main thread's wall time {}", main.describe());
        let count = rep.count(pid, "getppid");
        ensure!(count == N, "getppid counted {count}, expected {N}");
        let py_stacks = rep
            .stacks()
            .iter()
            .filter(|s| s["pid"] == pid && !py_frames(s).is_empty())
            .count();
        ensure!(py_stacks == 0, "{py_stacks} stacks with Python frames");
        let cpu_stacks = stacks_of(&rep, pid, "cpu");
        let cpu: u64 = cpu_stacks.iter().map(|s| samples(s)).sum();
        ensure!(cpu > 0, "no cpu samples");
        // Native stacks: the interpreter's own functions, symbolized.
        let native = cpu_stacks.iter().filter(|s| frames(s).iter().any(|f| f["kind"] == "native" && f["function"].as_str().is_some_and(|n| n.starts_with("_PyEval") || n.starts_with("PyEval")))).count();
        ensure!(native > 0, "no cpu stack shows the interpreter's native frames (_PyEval*)");
        Ok(format!("notice {:?}; getppid {count}; {cpu} native cpu samples", mine[0]))
    });
}
