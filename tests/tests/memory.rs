//! Resident memory (issue 25): the series, the peak and the growth by
//! line of `tests/workloads/mem_growth.py`, against what the workload
//! measured itself (/proc/self/statm around each line, at each plateau of
//! a stepped growth, and VmHWM), on every CPython 3.8 .. 3.15 of the
//! machine. Needs root, the infertrace binary and the interpreters; under
//! `CI=true` a missing one fails the test.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn workload() -> std::path::PathBuf {
    workspace_root().join("tests/workloads/mem_growth.py")
}

/// `delta NAME BYTES`, `plateau N BYTES`, `hwm BYTES` lines.
struct Truth {
    delta: HashMap<String, u64>,
    plateaus: Vec<u64>,
    hwm: u64,
}

fn truth(stderr: &str) -> Truth {
    let mut t = Truth { delta: HashMap::new(), plateaus: Vec::new(), hwm: 0 };
    for l in stderr.lines() {
        match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["delta", name, v] => {
                t.delta.insert(name.to_owned(), v.parse().unwrap_or(0));
            }
            ["plateau", _, v] => t.plateaus.push(v.parse().unwrap_or(0)),
            ["hwm", v] => t.hwm = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    t
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// One interpreter: record the workload, compare. Ok: a summary line.
fn check(py: &PythonExe) -> Result<String, String> {
    let dir = TempDir::new("memory");
    let out = dir.join("rec.itr");
    let run = run_cmd(infertrace(["record", "-q", "--format", "json", "-o"]).arg(&out).arg("--").arg(&py.exe).arg(workload()), Duration::from_secs(120));
    run.assert_ok();
    let t = truth(&run.stderr);
    if t.plateaus.len() != 8 || t.hwm == 0 {
        return Err(format!("the workload's measurements are missing: {}", run.stderr));
    }
    let report = run.json();
    let m = markers_of(&workload());
    let procs = report.0["memory"]["processes"].as_array().ok_or_else(|| format!("no memory part: {:#}", report.0["notes"]))?;
    // The workload is the process with the largest peak.
    let p = procs.iter().max_by_key(|p| u(&p["peak_rss"])).ok_or("no process")?;
    let line_of = |marker: &str| -> Option<&Value> {
        p["lines"].as_array()?.iter().find(|l| l["site"]["line"].as_u64() == m.get(marker).copied() && l["site"]["file"].as_str().is_some_and(|f| f.ends_with("mem_growth.py")))
    };
    let grown = |marker: &str| line_of(marker).map_or(0, |l| u(&l["grown_bytes"]));
    let released = |marker: &str| line_of(marker).map_or(0, |l| u(&l["released_bytes"]));
    let within = |got: u64, want: u64, share: f64| (got as f64 - want as f64).abs() <= want as f64 * share;
    let mut summary = Vec::new();
    for (marker, name) in [("mem_a", "a"), ("mem_b", "b"), ("mem_c", "c")] {
        let want = t.delta[name];
        let got = grown(marker);
        summary.push(format!("{name}: {} MiB traced / {} MiB measured", got >> 20, want >> 20));
        if !within(got, want, 0.10) {
            return Err(format!("growth at @{marker}: {got} bytes traced, {want} measured by the workload: {:#}", p["lines"]));
        }
    }
    let freed = released("mem_c_free");
    summary.push(format!("c freed {} MiB / {} MiB", freed >> 20, t.delta["c_free"] >> 20));
    if !within(freed, t.delta["c_free"], 0.10) {
        return Err(format!("release at @mem_c_free: {freed} traced, {} measured: {:#}", t.delta["c_free"], p["lines"]));
    }
    let peak = u(&p["peak_rss"]);
    summary.push(format!("peak {} / VmHWM {}", peak, t.hwm));
    if !within(peak, t.hwm, 0.01) {
        return Err(format!("peak {peak} against the workload's VmHWM {}", t.hwm));
    }
    let series: Vec<u64> = p["series"].as_array().ok_or("no series")?.iter().map(|s| u(&s["rss"])).collect();
    for (i, want) in t.plateaus.iter().enumerate() {
        let tol = (*want as f64 * 0.02).max((1u64 << 20) as f64);
        if !series.iter().any(|got| (*got as f64 - *want as f64).abs() <= tol) {
            return Err(format!("plateau {i} ({want} bytes, statm) is in no point of the series: {series:?}"));
        }
    }
    let text = run_infertrace([std::ffi::OsString::from("report"), out.into()]);
    text.assert_ok();
    if !text.stdout.contains("resident growth by line") || !text.stdout.contains("mem_growth.py") {
        return Err(format!("no growth table in the text report:\n{}", text.stdout));
    }
    Ok(summary.join(", "))
}

#[test]
fn growth_by_line_peak_and_series_match_the_workload() {
    let test = "growth_by_line_peak_and_series_match_the_workload";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let (found, missing) = expected_pythons();
    if found.is_empty() {
        skip(test, &format!("a CPython 3.8 .. 3.15 (missing: {})", missing.join(", ")));
        return;
    }
    if !skip_some(test, &missing) {
        return;
    }
    let mut rows = Vec::new();
    for py in &found {
        let r = catch_unwind(AssertUnwindSafe(|| check(py))).unwrap_or_else(|e| {
            Err(e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "panicked".into()))
        });
        rows.push((py.label.clone(), r));
    }
    let mut table = format!("{test}:\n");
    for (who, r) in &rows {
        match r {
            Ok(s) => table += &format!("  PASS {who}: {s}\n"),
            Err(s) => table += &format!("  FAIL {who}: {s}\n"),
        }
    }
    eprint!("{table}");
    assert!(rows.iter().all(|(_, r)| r.is_ok()), "{table}");
}

/// Bytes per marked line of `mem_growth.py` from a peer's `NAME BYTES` view.
type PerLine = std::collections::BTreeMap<String, u64>;

/// memray (`memray run`, then `memray stats --json`): bytes allocated per
/// location, `FUNCTION:FILE:LINE`.
fn memray_per_line(python: &std::path::Path, dir: &TempDir, m: &std::collections::BTreeMap<String, u64>) -> Result<PerLine, String> {
    let bin = dir.join("memray.bin");
    let run = run_cmd(std::process::Command::new(python).args(["-m", "memray", "run", "-q", "-o"]).arg(&bin).arg(workload()), Duration::from_secs(120));
    if !run.status.success() {
        return Err(format!("memray run failed: {}", run.describe()));
    }
    let json = dir.join("memray.json");
    let stats = run_cmd(std::process::Command::new(python).args(["-m", "memray", "stats", "--json", "-f", "-n", "20", "-o"]).arg(&json).arg(&bin), Duration::from_secs(60));
    if !stats.status.success() {
        return Err(format!("memray stats failed: {}", stats.describe()));
    }
    let v: Value = infertrace_e2e::serde_json::from_str(&std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?).map_err(|e| e.to_string())?;
    let mut out = PerLine::new();
    for a in v["top_allocations_by_size"].as_array().ok_or("no top_allocations_by_size in memray's stats")? {
        let loc = a["location"].as_str().unwrap_or("");
        let Some((file, line)) = loc.rsplit_once(':') else { continue };
        if !file.ends_with("mem_growth.py") {
            continue;
        }
        if let Some((name, _)) = m.iter().find(|(_, l)| line.parse::<u64>().ok() == Some(**l)) {
            *out.entry(name.clone()).or_default() += u(&a["size"]);
        }
    }
    Ok(out)
}

/// tracemalloc (the workload under `-X tracemalloc=1`): live bytes at each
/// marked line, C right after its allocation, the others at the end.
fn tracemalloc_per_line(python: &std::path::Path) -> Result<PerLine, String> {
    let run = run_cmd(std::process::Command::new(python).args(["-X", "tracemalloc=1"]).arg(workload()), Duration::from_secs(120));
    if !run.status.success() {
        return Err(format!("the workload under tracemalloc failed: {}", run.describe()));
    }
    Ok(run
        .stderr
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["tracemalloc", name, bytes] => Some((name.to_owned(), bytes.parse().ok()?)),
            _ => None,
        })
        .collect())
}

/// Peers side by side: the same workload under memray and tracemalloc.
/// For every line that owns over 10% of the growth infertrace saw, the
/// three agree within 15%, and they rank those lines the same.
#[test]
fn growth_by_line_agrees_with_memray_and_tracemalloc() {
    let test = "growth_by_line_agrees_with_memray_and_tracemalloc";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let has_memray = std::process::Command::new(&python).args(["-c", "import memray"]).output().is_ok_and(|o| o.status.success());
    if !has_memray {
        skip(test, &format!("memray importable by {} (PyPI; cargo xtask setup)", python.display()));
        return;
    }
    let dir = TempDir::new("memory-peers");
    let out = dir.join("rec.itr");
    let run = run_cmd(infertrace(["record", "-q", "--format", "json", "-o"]).arg(&out).arg("--").arg(&python).arg(workload()), Duration::from_secs(120));
    run.assert_ok();
    let report = run.json();
    let m = markers_of(&workload());
    let procs = report.0["memory"]["processes"].as_array().unwrap_or_else(|| panic!("no memory part: {:#}", report.0["notes"]));
    let p = procs.iter().max_by_key(|p| u(&p["peak_rss"])).expect("a process");
    let mut ours = PerLine::new();
    for l in p["lines"].as_array().expect("lines") {
        if !l["site"]["file"].as_str().is_some_and(|f| f.ends_with("mem_growth.py")) {
            continue;
        }
        if let Some((name, _)) = m.iter().find(|(_, line)| l["site"]["line"].as_u64() == Some(**line)) {
            ours.insert(name.clone(), u(&l["grown_bytes"]));
        }
    }
    let total: u64 = p["lines"].as_array().expect("lines").iter().map(|l| u(&l["grown_bytes"])).sum();
    let memray = memray_per_line(&python, &dir, &m).unwrap_or_else(|e| panic!("{e}"));
    let tracemalloc = tracemalloc_per_line(&python).unwrap_or_else(|e| panic!("{e}"));
    let big: Vec<&String> = ours.iter().filter(|(_, b)| **b * 10 > total).map(|(n, _)| n).collect();
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut table = format!("{test}: line: infertrace / memray / tracemalloc MiB (total growth {:.0} MiB)\n", mib(total));
    for name in &big {
        let (o, r, t) = (ours[*name], memray.get(*name).copied().unwrap_or(0), tracemalloc.get(*name).copied().unwrap_or(0));
        table += &format!("  {name}: {:.1} / {:.1} / {:.1}\n", mib(o), mib(r), mib(t));
    }
    eprint!("{table}");
    assert!(big.len() >= 3, "fewer than 3 lines own over 10% of the growth: {ours:?}\n{table}");
    for name in &big {
        let o = ours[*name] as f64;
        for (peer, v) in [("memray", &memray), ("tracemalloc", &tracemalloc)] {
            let x = v.get(*name).copied().unwrap_or(0) as f64;
            assert!((o - x).abs() <= 0.15 * x, "@{name}: infertrace {o} bytes, {peer} {x}\n{table}");
        }
    }
    let rank = |v: &PerLine| {
        let mut names: Vec<&String> = big.clone();
        names.sort_by_key(|n| std::cmp::Reverse(v.get(*n).copied().unwrap_or(0)));
        names
    };
    assert_eq!(rank(&ours), rank(&memray), "rank against memray\n{table}");
    assert_eq!(rank(&ours), rank(&tracemalloc), "rank against tracemalloc\n{table}");
}

/// The verdict's memory class `class` of any process of `report` (the
/// run's `stderr` in the message when there is none).
fn memory_verdict<'a>(report: &'a Value, class: &str, stderr: &str) -> &'a Value {
    let procs = report["verdict"]["processes"].as_array().unwrap_or_else(|| panic!("no verdict: {:#}", report["verdict"]));
    procs
        .iter()
        .filter_map(|p| p["memory"].as_array())
        .flatten()
        .find(|v| v["class"] == class)
        .unwrap_or_else(|| panic!("no {class} verdict: {procs:#?}\nstderr: {stderr}"))
}

/// A service leaking 1 MiB per request at a known line for 20 s: the
/// verdict says `memory_growth` at that line, with the slope the workload
/// measured itself (within 10%).
#[test]
fn a_leaking_service_is_memory_growth_at_its_line() {
    let test = "a_leaking_service_is_memory_growth_at_its_line";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let source = workspace_root().join("tests/workloads/mem_leak.py");
    let dir = TempDir::new("memory-leak");
    let run = run_cmd(
        infertrace(["record", "-q", "--format", "json", "-o"]).arg(dir.join("rec.itr")).arg("--").arg(&python).arg(&source),
        Duration::from_secs(120),
    );
    run.assert_ok();
    let slope: f64 = run.stderr.lines().find_map(|l| l.strip_prefix("slope ")?.trim().parse().ok()).unwrap_or_else(|| panic!("no slope line: {}", run.stderr));
    let report = run.json();
    let m = markers_of(&source);
    let v = memory_verdict(&report.0, "memory_growth", &run.stderr);
    eprintln!("[{test}] {v}; the workload measured {slope:.0} B/s");
    assert_eq!((v["class"].as_str(), v["site"]["line"].as_u64()), (Some("memory_growth"), m.get("leak").copied()), "{v:#}");
    let traced = v["growth_bytes_per_s"].as_f64().unwrap_or(0.0);
    assert!((traced - slope).abs() <= slope * 0.10, "slope {traced} traced, {slope} measured: {v:#}");
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    assert!(text.stdout.contains("memory growth: resident memory grew") && text.stdout.contains("mem_leak.py"), "{}", text.stdout);
}

/// A memory cgroup of its own under this test's (v1
/// `memory.limit_in_bytes`, or v2 `memory.max`) limited to `bytes`:
/// (its directory, the limit file). None, with the reason, when neither
/// hierarchy lets us make one.
fn limited_cgroup(name: &str, bytes: u64) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let v1 = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, rel) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',').any(|c| c == "memory").then(|| rel.to_owned())
    });
    let (dir, file) = match v1 {
        Some(rel) => (std::path::Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/')).join(name), "memory.limit_in_bytes"),
        None => {
            let rel = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("no cgroup v1 memory controller nor a v2 hierarchy")?;
            let parent = std::path::Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
            // v2: the parent must hand the memory controller down.
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
            (parent.join(name), "memory.max")
        }
    };
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let limit = dir.join(file);
    std::fs::write(&limit, bytes.to_string()).map_err(|e| format!("writing {}: {e}", limit.display()))?;
    Ok((dir, limit))
}

/// A target killed by the OOM killer in a 150 MiB memory cgroup: the
/// report says so (when, its resident size, the limit and its file) and
/// names the growing line.
#[test]
fn an_oom_killed_target_is_reported_with_its_limit_and_line() {
    let test = "an_oom_killed_target_is_reported_with_its_limit_and_line";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let limit_bytes: u64 = 150 << 20;
    let (cg, limit_file) = match limited_cgroup(&format!("itr-oom-{}", std::process::id()), limit_bytes) {
        Ok(c) => c,
        Err(why) => {
            skip(test, &format!("a memory cgroup to limit the workload ({why})"));
            return;
        }
    };
    let source = workspace_root().join("tests/workloads/mem_oom.py");
    let dir = TempDir::new("memory-oom");
    let script = format!("echo $$ > {}/cgroup.procs && exec {} {}", cg.display(), python.display(), source.display());
    let run = run_cmd(infertrace(["record", "-q", "--format", "json", "-o"]).arg(dir.join("rec.itr")).args(["--", "sh", "-c", &script]), Duration::from_secs(120));
    let _ = std::fs::remove_dir(&cg);
    assert!(!run.stderr.contains("not killed"), "the workload was not killed: {}", run.stderr);
    let report = run.json();
    let m = markers_of(&source);
    let v = memory_verdict(&report.0, "oom_killed", &run.stderr);
    eprintln!("[{test}] {v}");
    assert_eq!(v["limit_bytes"].as_u64(), Some(limit_bytes), "{v:#}");
    assert_eq!(v["limit_file"].as_str(), Some(limit_file.to_str().unwrap()), "{v:#}");
    assert_eq!(v["site"]["line"].as_u64(), m.get("oom_grow").copied(), "{v:#}");
    // What the OOM killer saw: about the limit (the resident size counts
    // file pages the interpreter shares, charged to other cgroups: it can
    // pass the limit by their size).
    let rss = v["rss_bytes"].as_u64().unwrap_or(0);
    assert!(rss > limit_bytes / 2 && rss <= limit_bytes + limit_bytes / 2, "resident {rss} at the kill, limit {limit_bytes}: {v:#}");
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    assert!(text.stdout.contains("OOM-KILLED") && text.stdout.contains("mem_oom.py"), "{}", text.stdout);
}
