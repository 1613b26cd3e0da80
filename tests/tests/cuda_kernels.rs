//! Kernel names (issue 24, deliverable 6): driver launches named by the
//! lookup that made their handle (`cuModuleGetFunction`,
//! `cuLibraryGetKernel`, `cuKernelGetFunction`), C++ names demangled, the
//! launches table with launches per second, and `launch_bound` for a line
//! that issues thousands of small kernels, not for lines that issue a few.
//!
//! On tests/cudasim's stand-ins (NOT CUDA: no real libcuda exists without
//! a GPU). Needs root, the binary and gcc; under CI=true a missing one
//! fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

#[test]
fn driver_kernels_named_by_their_lookup_and_launch_bound_lines_found() {
    let test = "driver_kernels_named_by_their_lookup_and_launch_bound_lines_found";
    let Some((dir, run)) = record_on_standins(test, "kernels") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m: BTreeMap<String, u64> = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    let launch = |marker: &str| -> Value {
        let rows = rows_at_line(&cuda["launches"], m[marker]);
        assert_eq!(rows.len(), 1, "@{marker}: {:#}\n{}", cuda["launches"], run.describe());
        rows[0].clone()
    };
    for (marker, kernel, n) in [
        ("kn_launch_vec", "vec_kernel(float*, float*, int)", 30),
        ("kn_launch_triton", "triton_poi_fused_add_0", 20),
        ("kn_launch_kernel", "void ops::gelu_kernel<float>(float*, int)", 5),
        ("kn_launch_function", "void ops::gelu_kernel<float>(float*, int)", 7),
    ] {
        let l = launch(marker);
        assert_eq!((l["kernel"].as_str(), u(&l["count"]), l["api"].as_str()), (Some(kernel), n, Some("cuLaunchKernel")), "@{marker}: {l}");
    }
    // A handle no lookup named shows as the handle.
    let anon = launch("kn_launch_unnamed");
    assert!(anon["kernel"].as_str().is_some_and(|k| k.starts_with("CUfunction 0x")), "{anon}");
    // The lookups are counted as calls, with the failed one.
    for (marker, api, n, errors) in [
        ("kn_get_vec", "cuModuleGetFunction", 1, 0),
        ("kn_get_triton", "cuModuleGetFunction", 1, 0),
        ("kn_get_kernel", "cuLibraryGetKernel", 1, 0),
        ("kn_get_function", "cuKernelGetFunction", 1, 0),
        ("kn_get_fails", "cuModuleGetFunction", 1, 1),
    ] {
        let rows: Vec<Value> = rows_at_line(&cuda["calls"], m[marker]).into_iter().filter(|r| r["api"] == api).collect();
        assert_eq!(rows.len(), 1, "{api} @{marker}: {:#}", cuda["calls"]);
        assert_eq!((u(&rows[0]["count"]), u(&rows[0]["errors"])), (n, errors), "@{marker}: {}", rows[0]);
    }

    // launch_bound: the bulk line, exactly its launches; no other line.
    let bulk: u64 = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("bulk ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no bulk line: {}", run.stderr));
    let bound: Vec<&Value> = report.0["findings"].as_array().expect("findings").iter().filter(|f| f["kind"] == "launch_bound").collect();
    assert_eq!(bound.len(), 1, "{:#}", report.0["findings"]);
    let f = bound[0];
    assert_eq!((f["site"]["line"].as_u64(), u(&f["count"]), u(&f["kernels"])), (Some(m["kn_bulk"]), bulk, 1), "{f}");
    let window_s = u(&report.0["duration_ns"]) as f64 / 1e9;
    let per_s = f["per_s"].as_f64().expect("per_s");
    assert!((per_s - bulk as f64 / window_s).abs() <= 1.0, "{per_s}/s against {bulk} in {window_s} s");

    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    assert!(text.stdout.contains("kernel launches from this line (1 kernels"), "{}", text.stdout);
    assert!(text.stdout.contains("triton_poi_fused_add_0") && text.stdout.contains("PER S"), "{}", text.stdout);
}
