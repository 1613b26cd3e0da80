//! `infertrace diff` (docs/verdict.md, "diff"): two recordings of the same
//! paced loop (tests/workloads/verdict_cases.py `paced`), the second doing
//! half the work at one line (work_b). The workload measures the CPU time
//! it spent in work_a and work_b itself (`site_cpu_ms`, time.thread_time);
//! the diff's changes are bound by those measurements (a site's time is
//! on-CPU and blocked time at the line; run-queue delay, which the load of
//! a shared machine moves between runs, stays in its class).
//! Then the `--fail-if-slower` exit codes, both ways, and a metric in
//! neither recording.
//!
//! Needs root, the binary and python3; under CI=true a missing one fails.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn source() -> PathBuf {
    workspace_root().join("tests/workloads/verdict_cases.py")
}

/// Records the paced loop with work_b scaled by `scale`; returns the
/// workload's own (CPU ms in work_a, in work_b) and the window (ns).
fn record_paced(python: &Path, out: &Path, scale: &str) -> ((f64, f64), u64) {
    let cmd: Vec<OsString> = vec![python.into(), source().into(), "paced".into(), "6".into(), scale.into()];
    let cmd: Vec<&OsStr> = cmd.iter().map(OsString::as_os_str).collect();
    let (run, report) = record_launch_with(out, &["-F", "999"], &cmd);
    let ms: Vec<f64> = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("site_cpu_ms "))
        .unwrap_or_else(|| panic!("no site_cpu_ms from the workload\n{}", run.describe()))
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    ((ms[0], ms[1]), report.0["duration_ns"].as_u64().unwrap())
}

/// The change (in %) of `metric` in a JSON diff.
fn change(d: &Value, metric: &str) -> f64 {
    let rows: Vec<&Value> = d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["python_sites"].as_array().unwrap().iter())
        .filter(|r| r["metric"] == metric)
        .collect();
    assert_eq!(rows.len(), 1, "{metric} in {:#}", d["processes"]);
    rows[0]["change_pct"].as_f64().unwrap_or_else(|| panic!("no change for {metric}: {:#}", rows[0]))
}

#[test]
fn diff_halved_site_and_fail_if_slower() {
    let test = "diff_halved_site_and_fail_if_slower";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let dir = TempDir::new("diff");
    let (before, after) = (dir.join("before.itr"), dir.join("after.itr"));
    let ((a0, b0), w0) = record_paced(&python, &before, "1.0");
    let ((a1, b1), w1) = record_paced(&python, &after, "0.5");
    let markers = markers_of(&source());
    let site_a = format!("verdict_cases.py:{}", markers["work_a"]);
    let site_b = format!("verdict_cases.py:{}", markers["work_b"]);
    let r = run_infertrace(["diff".as_ref(), before.as_os_str(), after.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    r.assert_ok();
    let d: Value = infertrace_e2e::serde_json::from_str(&r.stdout).unwrap();
    // What the workload measured, per second of its window.
    let rate = |ms: f64, w: u64| ms / (w as f64 / 1e9);
    let measured_a = (rate(a1, w1) / rate(a0, w0) - 1.0) * 100.0;
    let measured_b = (rate(b1, w1) / rate(b0, w0) - 1.0) * 100.0;
    let (got_a, got_b) = (change(&d, &site_a), change(&d, &site_b));
    eprintln!("{test}: work_b {got_b:+.1}% (workload measured {measured_b:+.1}%), work_a {got_a:+.1}% (measured {measured_a:+.1}%)");
    // The halved site halves, as the workload measured it, within 10 points.
    assert!((got_b - measured_b).abs() <= 10.0, "work_b: diff {got_b:+.1}%, workload {measured_b:+.1}%");
    assert!((got_b + 50.0).abs() <= 10.0 + (measured_b + 50.0).abs(), "work_b did not halve: {got_b:+.1}%");
    // The other stays where the workload says it stayed, within noise (at
    // 999 Hz work_a gets a few hundred samples a run, +-5% each).
    assert!((got_a - measured_a).abs() <= 12.0, "work_a: diff {got_a:+.1}%, workload {measured_a:+.1}%");
    // The text names both lines.
    let t = run_infertrace(["diff".as_ref(), before.as_os_str(), after.as_os_str()]);
    t.assert_ok();
    assert!(t.stdout.contains(&format!("{site_b} work_b")), "{}", t.stdout);
    assert!(t.stdout.starts_with("infertrace diff: window "), "{}", t.stdout);

    // --fail-if-slower: after is faster at work_b (0); the other way round it regressed (3).
    let fail = |x: &Path, y: &Path, metric: &str| {
        run_infertrace(["diff".as_ref(), x.as_os_str(), y.as_os_str(), "--fail-if-slower".as_ref(), "20".as_ref(), "--metric".as_ref(), metric.as_ref()])
    };
    let ok = fail(&before, &after, &site_b);
    assert_eq!(ok.code(), Some(0), "{}", ok.describe());
    assert!(ok.stderr.contains("within 20%"), "{}", ok.describe());
    let slower = fail(&after, &before, &site_b);
    assert_eq!(slower.code(), Some(3), "{}", slower.describe());
    assert!(slower.stderr.contains("REGRESSED beyond 20%"), "{}", slower.describe());
    // A class works as a metric too: python_compute went down with
    // work_b. By how much depends on the machine's load (the pacing
    // stretches under it: work_b measured -31% instead of -50% in a loaded
    // run), so the threshold is half the drop the workload measured in
    // its two sites.
    let measured_ab = (rate(a1 + b1, w1) / rate(a0 + b0, w0) - 1.0) * 100.0;
    assert!(measured_ab < -4.0, "the workload's compute in work_a + work_b did not go down: {measured_ab:+.1}%");
    let threshold = format!("{:.0}", (-measured_ab / 2.0).max(1.0));
    let args: [&OsStr; 7] = [
        "diff".as_ref(),
        after.as_os_str(),
        before.as_os_str(),
        "--fail-if-slower".as_ref(),
        threshold.as_ref(),
        "--metric".as_ref(),
        "python_compute".as_ref(),
    ];
    let class = run_infertrace(args);
    assert_eq!(class.code(), Some(3), "python_compute beyond {threshold}% (work_a + work_b measured {measured_ab:+.1}%): {}", class.describe());
    // A metric in neither recording is an error (1), not a pass.
    let unknown = fail(&before, &after, "nowhere.py:1");
    assert_eq!(unknown.code(), Some(1), "{}", unknown.describe());
    assert!(single_error_line(&unknown).contains("no metric `nowhere.py:1` in either recording"), "{}", unknown.describe());
}
