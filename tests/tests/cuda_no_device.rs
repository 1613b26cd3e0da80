//! Saying when there is no GPU (issue 24, deliverable 8), on the REAL
//! libcudart.so.12 and .so.13 from PyPI, on this machine without a driver:
//! `cudaGetDeviceCount` and `cudaSetDevice` are counted at their Python
//! lines with the return codes the workload itself saw (its stderr: the
//! oracle), and the process gets one note that names the failing call,
//! its code and its line.
//!
//! Needs root, the binary, gcc, python3 and PyPI once (target/cuda-real);
//! under CI=true a missing one fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

/// `rc NAME CODE` lines of the workload: NAME -> CODE -> calls.
fn codes_seen(stderr: &str) -> BTreeMap<String, BTreeMap<i64, u64>> {
    let mut out: BTreeMap<String, BTreeMap<i64, u64>> = BTreeMap::new();
    for l in stderr.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let ["rc", name, code] = f[..] {
            let code: i64 = code.parse().unwrap_or_else(|_| panic!("a return code: {l}"));
            *out.entry(name.to_owned()).or_default().entry(code).or_default() += 1;
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map_or(Vec::new(), |a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
}

#[test]
fn no_device_is_counted_at_its_line_and_said_once() {
    let test = "no_device_is_counted_at_its_line_and_said_once";
    let Some(runs) = record_on_real_cudarts(test, "nodevice_real") else { return };
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    let markers = markers_of(&source);
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        let truth = codes_seen(&run.stderr);
        let count_codes = truth.get("cudaGetDeviceCount").cloned().unwrap_or_else(|| panic!("no rc lines: {}", run.stderr));
        let report = run.json();
        let calls = &report.0["cuda"]["calls"];
        for (api, marker, n) in [("cudaGetDeviceCount", "nodev_count", 3u64), ("cudaSetDevice", "nodev_set", 1)] {
            let rows: Vec<Value> = rows_at_line(calls, markers[marker]).into_iter().filter(|r| r["api"] == api).collect();
            assert_eq!(rows.len(), 1, "{api} @{marker}: {calls:#}");
            let row = &rows[0];
            assert_eq!(row["count"], n, "{row:#}");
            let codes: BTreeMap<i64, u64> = row["return_codes"]
                .as_object()
                .expect("return_codes")
                .iter()
                .map(|(k, v)| (k.parse().expect("a code"), v.as_u64().expect("a count")))
                .collect();
            assert_eq!(codes, truth[api], "{api}: recorded codes against the workload's");
            assert_eq!(row["site"]["function"], "nodevice_real", "{row:#}");
        }
        // The driver is missing here: every count failed.
        let (code, _) = count_codes.iter().next().expect("a code");
        assert!(*code != 0 && count_codes.len() == 1, "cudaGetDeviceCount succeeded without a GPU? {count_codes:?}");
        let notes: Vec<String> = [&report.0["notes"], &report.0["cuda"]["notes"]].into_iter().flat_map(strings).collect();
        let ours: Vec<&String> = notes.iter().filter(|n| n.contains("no usable device")).collect();
        assert_eq!(ours.len(), 1, "one no-device note: {notes:#?}");
        eprintln!("{test}: libcudart.so.{major}: {}", ours[0]);
        let line = markers["nodev_count"];
        let want = format!("cudaGetDeviceCount returned {code} ");
        assert!(ours[0].contains(&want) && ours[0].contains(&format!("cuda_patterns.py:{line})")), "{}", ours[0]);
        assert!(ours[0].contains("(3 calls)"), "{}", ours[0]);
        if *code == 35 {
            assert!(ours[0].contains("cudaErrorInsufficientDriver"), "{}", ours[0]);
        }
    }
}
