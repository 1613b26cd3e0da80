//! CUDA graphs (issue 24, deliverable 1): calls made while a stream is
//! capturing are counted as captured (into the graph), not as launches or
//! copies; graph launches are counted per site and name the line that
//! captured their graph; a capture in the loop makes `graph_recaptured`.
//!
//! - On tests/cudasim's stand-ins (NOT CUDA: libcudart.so.12 over
//!   libcuda.so.1, whose capturing streams record launches instead of
//!   running them): capture then replay, at runtime and driver level.
//! - On the REAL libcudart.so.12 and .so.13 (every call fails without a driver, but is
//!   entered): capture, instantiation and launch calls are counted at their
//!   lines with their return codes.
//!
//! Needs root, the binary, gcc, python3 and PyPI once (target/cuda-real);
//! under CI=true a missing one fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::{json, Value};
use infertrace_e2e::*;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

#[test]
fn captured_calls_are_not_launches_and_replays_name_their_capture_line() {
    let test = "captured_calls_are_not_launches_and_replays_name_their_capture_line";
    let Some((dir, run)) = record_on_standins(test, "graphs") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    let describe = || format!("{cuda:#}\n{}", run.describe());

    // Kernel launches: only those made outside a capture.
    let launches = &cuda["launches"];
    let warm = rows_at_line(launches, m["graph_warmup"]);
    assert_eq!(warm.len(), 1, "{}", describe());
    assert_eq!((warm[0]["api"].as_str(), u(&warm[0]["count"])), (Some("cudaLaunchKernel"), 5));
    let all: u64 = launches.as_array().unwrap().iter().map(|l| u(&l["count"])).sum();
    assert_eq!(all, 5, "captured launches counted as launches: {launches:#}");
    // Captured copies are not copies.
    let calls = &cuda["calls"];
    assert!(rows_at_line(calls, m["graph_captured_copy"]).is_empty(), "{calls:#}");
    assert!(calls.as_array().unwrap().iter().all(|c| c["api"] != "cudaMemcpyAsync"), "{calls:#}");
    // The setup calls are counted as calls, once (not their driver twins).
    for (marker, api, n) in [
        ("graph_begin", "cudaStreamBeginCapture", 1),
        ("graph_end", "cudaStreamEndCapture", 1),
        ("graph_instantiate", "cudaGraphInstantiate", 1),
        ("drv_graph_begin", "cuStreamBeginCapture_v2", 1),
        ("drv_graph_end", "cuStreamEndCapture", 1),
        ("drv_graph_instantiate", "cuGraphInstantiateWithFlags", 1),
        ("recap_begin", "cudaStreamBeginCapture_ptsz", 20),
        ("recap_end", "cudaStreamEndCapture_ptsz", 20),
        ("recap_instantiate", "cudaGraphInstantiateWithFlags", 20),
    ] {
        let rows = rows_at_line(calls, m[marker]);
        assert_eq!(rows.len(), 1, "@{marker}: {rows:#?}\n{}", describe());
        assert_eq!((rows[0]["api"].as_str(), u(&rows[0]["count"]), u(&rows[0]["errors"])), (Some(api), n, 0), "@{marker}");
    }
    let setup: u64 = calls.as_array().unwrap().iter().filter(|c| c["api"].as_str().unwrap().contains("Graph") || c["api"].as_str().unwrap().contains("Capture")).map(|c| u(&c["count"])).sum();
    assert_eq!(setup, 6 + 60, "{calls:#}");

    // Graph launches by site, each naming the line that captured its graph.
    let glaunches = &cuda["graph_launches"];
    for (marker, api, n, captured) in [
        ("graph_replay", "cudaGraphLaunch", 50, "graph_begin"),
        ("graph_replay_ptsz", "cudaGraphLaunch_ptsz", 7, "graph_begin"),
        ("drv_graph_replay", "cuGraphLaunch", 20, "drv_graph_begin"),
        ("recap_replay", "cudaGraphLaunch", 20, "recap_begin"),
    ] {
        let rows = rows_at_line(glaunches, m[marker]);
        assert_eq!(rows.len(), 1, "@{marker}: {rows:#?}\n{}", describe());
        let r = &rows[0];
        assert_eq!((r["api"].as_str(), u(&r["count"])), (Some(api), n), "@{marker}: {r}");
        assert_eq!(r["captured_at"]["line"], m[captured], "@{marker}: {r}");
        let name = r["graph"].as_str().unwrap();
        assert!(name.starts_with("graph captured at graphs (") && name.ends_with(&format!("cuda_patterns.py:{})", m[captured])), "@{marker}: {name}");
    }
    let total: u64 = glaunches.as_array().unwrap().iter().map(|l| u(&l["count"])).sum();
    assert_eq!(total, 97, "graph launches counted twice or elsewhere: {glaunches:#}");

    // What each capture recorded.
    let captures = &cuda["graph_captures"];
    for (marker, n, kernels, copies, bytes) in
        [("graph_begin", 1, 10, 2, 8192), ("drv_graph_begin", 1, 3, 0, 0), ("recap_begin", 20, 80, 0, 0)]
    {
        let rows = rows_at_line(captures, m[marker]);
        assert_eq!(rows.len(), 1, "@{marker}: {captures:#}");
        let r = &rows[0];
        assert_eq!((u(&r["captures"]), u(&r["kernels"]), u(&r["copies"]), u(&r["copy_bytes"])), (n, kernels, copies, bytes), "@{marker}: {r}");
    }
    assert_eq!(captures.as_array().unwrap().len(), 3, "{captures:#}");

    // The capture in the loop, and only it.
    let findings: Vec<&Value> = report.0["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "graph_recaptured").collect();
    assert_eq!(findings.len(), 1, "{:#}", report.0["findings"]);
    let f = findings[0];
    assert_eq!((f["site"]["line"].as_u64(), u(&f["count"])), (Some(m["recap_begin"]), 20), "{f}");
    assert!(f["message"].as_str().unwrap().contains("captured 20 times"), "{f}");
    assert!(!f["advice"].as_str().unwrap().is_empty(), "{f}");
    // The text report shows the graph tables.
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    assert!(text.stdout.contains("CUDA graph launches by graph and site (97 in all)"), "{}", text.stdout);
    assert!(text.stdout.contains("CUDA graph captures by site"), "{}", text.stdout);
}

#[test]
fn real_libcudart_graph_calls_counted_with_return_codes() {
    let test = "real_libcudart_graph_calls_counted_with_return_codes";
    let Some(runs) = record_on_real_cudarts(test, "graphs_real") else { return };
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        let report = run.json();
        let cuda = &report.0["cuda"];
        let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
        let mut seen = BTreeMap::new();
        for (marker, api, n) in [
            ("real_graph_begin", "cudaStreamBeginCapture", 3),
            ("real_graph_end", "cudaStreamEndCapture", 3),
            ("real_graph_instantiate", "cudaGraphInstantiate", 2),
        ] {
            let rows = rows_at_line(&cuda["calls"], m[marker]);
            assert_eq!(rows.len(), 1, "@{marker}: {:#}\n{}", cuda["calls"], run.describe());
            let r = &rows[0];
            assert_eq!((r["api"].as_str(), u(&r["count"]), u(&r["errors"])), (Some(api), n, n), "@{marker}: {r}");
            assert_eq!(r["return_codes"], json!({ "35": n }), "@{marker}: {r}");
            seen.insert(api, n);
        }
        // No capture began, so nothing is captured and nothing names a graph.
        assert!(cuda["graph_captures"].as_array().is_none_or(|c| c.is_empty()), "{cuda:#}");
        let rows = rows_at_line(&cuda["graph_launches"], m["real_graph_launch"]);
        assert_eq!(rows.len(), 1, "{:#}", cuda["graph_launches"]);
        assert_eq!((rows[0]["api"].as_str(), u(&rows[0]["count"])), (Some("cudaGraphLaunch"), 5), "{}", rows[0]);
        assert_eq!(rows[0]["graph"], "cudaGraphExec 0x0", "{}", rows[0]);
        assert!(cuda["launches"].as_array().unwrap().is_empty(), "{:#}", cuda["launches"]);
    }
}
