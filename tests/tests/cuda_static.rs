//! Runtimes linked statically into other libraries (issue 24, deliverable
//! 4), on REAL CuPy (cupy-cuda12x from PyPI; `cargo xtask setup` installs
//! it): no libcudart.so is loaded, each of CuPy's extension modules that
//! carries a runtime (its `.symtab` defines `cudaMemcpyAsync` and
//! `cudaLaunchKernel` as local symbols) gets the runtime probes, and
//! calls into them (which fail without a GPU driver, but are entered) are
//! counted at their Python lines with the return codes the workload saw
//! (its stderr: the oracle). tests/workloads/cupy_static.py.
//!
//! Needs root, the binary and python3 with CuPy; under CI=true a missing
//! one fails the test.

use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, process::Command};

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn python_with_cupy(test: &str) -> Option<PathBuf> {
    let python = python3_executable(test)?;
    let ok = Command::new(&python).args(["-c", "import cupy, cupy_backends.cuda.api.runtime"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip(test, &format!("CuPy (cupy-cuda12x) for {} (cargo xtask setup)", python.display()));
        return None;
    }
    Some(python)
}

#[test]
fn cupy_static_runtimes_are_probed_and_counted_at_their_lines() {
    let test = "cupy_static_runtimes_are_probed_and_counted_at_their_lines";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python_with_cupy(test) else { return };
    let source = workspace_root().join("tests/workloads/cupy_static.py");
    // The recording goes to a temporary directory (by default it would be
    // written in the test's working directory, the source tree).
    let dir = TempDir::new("cuda-static");
    let run = run_infertrace([
        OsString::from("record"),
        "-q".into(),
        "--format".into(),
        "json".into(),
        "-o".into(),
        dir.join("rec.itr").into_os_string(),
        "--".into(),
        python.into_os_string(),
        source.clone().into_os_string(),
    ]);
    run.assert_ok();
    // The workload's own view: the CuPy modules that define a static
    // cudaLaunchKernel, and each call's return code.
    let mut runtimes = 0u64;
    let mut truth: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for l in run.stderr.lines() {
        match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["runtimes", n] => runtimes = n.parse().expect("runtimes N"),
            ["rc", name, code] => *truth.entry(name.to_owned()).or_default().entry(code.to_owned()).or_default() += 1,
            _ => {}
        }
    }
    assert!(runtimes >= 2, "the workload found {runtimes} static runtimes in CuPy: {}", run.stderr);
    let report = run.json();
    let cuda = &report.0["cuda"];
    let libs: Vec<&str> = cuda["libraries"].as_array().expect("libraries").iter().filter_map(|l| l["path"].as_str()).collect();
    assert_eq!(libs.len() as u64, runtimes, "one probed library per static runtime: {libs:#?}");
    assert!(libs.iter().all(|p| p.contains("cupy")), "{libs:#?}");
    assert!(!libs.iter().any(|p| p.contains("libcudart")), "no shared runtime here: {libs:#?}");
    let m = markers_of(&source);
    for (marker, api, n) in [("cupy_memcpy", "cudaMemcpy", 3u64), ("cupy_memcpy_async", "cudaMemcpyAsync", 4), ("cupy_sync", "cudaStreamSynchronize", 2), ("cupy_count", "cudaGetDeviceCount", 1)] {
        let rows: Vec<Value> = rows_at_line(&cuda["calls"], m[marker]).into_iter().filter(|r| r["api"] == api).collect();
        assert_eq!(rows.len(), 1, "{api} @{marker}: {:#}\n{}", cuda["calls"], run.describe());
        let r = &rows[0];
        let codes = codes_of(r);
        let want = truth.get(api).unwrap_or_else(|| panic!("no rc line for {api}: {}", run.stderr));
        assert_eq!((r["count"].as_u64(), &codes), (Some(n), want), "@{marker}: {r}");
    }
    // Only these calls: nothing counted twice across the runtimes.
    let total: u64 = cuda["calls"].as_array().unwrap().iter().filter_map(|c| c["count"].as_u64()).sum();
    assert_eq!(total, 10, "{:#}", cuda["calls"]);
    let notes: Vec<&str> = cuda["notes"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).collect());
    assert_eq!(notes.iter().filter(|n| n.contains("(linked statically)")).count() as u64, runtimes, "{notes:#?}");
}
