//! Memsets and `cuCtxSynchronize_v2` (issue 24, deliverable 7, part):
//! `cudaMemsetAsync[_ptsz]`, `cuMemsetD8Async[_ptsz]` and
//! `cuMemsetD32Async[_ptsz]` counted with their bytes like copies (a runtime
//! memset once, not also as the driver memset it enters), memsets made
//! while a stream captures counted as captured, and `cuCtxSynchronize_v2`
//! (what CUDA 13's libcudart resolves `cuCtxSynchronize` to) as a sync.
//!
//! On tests/cudasim's stand-ins (NOT CUDA) and on the REAL libcudart.so.12 and .so.13
//! (its calls fail without a driver, but are entered). Needs root, the
//! binary, gcc, python3 and PyPI once (target/cuda-real); under CI=true a
//! missing one fails the test.

use infertrace_e2e::serde_json::{json, Value};
use infertrace_e2e::*;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

#[test]
fn memsets_counted_with_bytes_once_and_captured_ones_not_run() {
    let test = "memsets_counted_with_bytes_once_and_captured_ones_not_run";
    let Some((_dir, run)) = record_on_standins(test, "memsets") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    let expected: &[(&str, &str, u64, u64, &str)] = &[
        ("ms_rt", "cudaMemsetAsync", 12, 12 * 4096, "other"),
        ("ms_rt_ptsz", "cudaMemsetAsync_ptsz", 5, 5 * 2048, "other"),
        ("ms_d8", "cuMemsetD8Async", 7, 7 * 1000, "other"),
        ("ms_d32", "cuMemsetD32Async", 4, 4 * 1024, "other"),
        ("ms_ctx_sync", "cuCtxSynchronize_v2", 3, 0, "sync"),
        ("ms_cap_begin", "cudaStreamBeginCapture", 1, 0, "other"),
        ("ms_cap_end", "cudaStreamEndCapture", 1, 0, "other"),
    ];
    for &(marker, api, n, bytes, class) in expected {
        let rows = rows_at_line(&cuda["calls"], m[marker]);
        assert_eq!(rows.len(), 1, "@{marker}: {:#}\n{}", cuda["calls"], run.describe());
        let r = &rows[0];
        assert_eq!((r["api"].as_str(), u(&r["count"]), u(&r["bytes"]), u(&r["errors"])), (Some(api), n, bytes, 0), "@{marker}: {r}");
        assert_eq!(r["class"], class, "@{marker}: {r}");
    }
    // Nothing else: the driver memsets inside the runtime's are not
    // counted, nor the captured ones.
    let total: u64 = cuda["calls"].as_array().unwrap().iter().map(|c| u(&c["count"])).sum();
    assert_eq!(total, expected.iter().map(|e| e.2).sum::<u64>(), "{:#}", cuda["calls"]);
    let cap = rows_at_line(&cuda["graph_captures"], m["ms_cap_begin"]);
    assert_eq!(cap.len(), 1, "{:#}", cuda["graph_captures"]);
    assert_eq!((u(&cap[0]["captures"]), u(&cap[0]["kernels"]), u(&cap[0]["copies"]), u(&cap[0]["copy_bytes"])), (1, 0, 2, 1024), "{}", cap[0]);
}

#[test]
fn real_libcudart_memsets_counted_with_bytes_and_return_codes() {
    let test = "real_libcudart_memsets_counted_with_bytes_and_return_codes";
    let Some(runs) = record_on_real_cudarts(test, "memsets_real") else { return };
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        let report = run.json();
        let cuda = &report.0["cuda"];
        let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
        for (marker, api, n, bytes) in [("real_ms", "cudaMemsetAsync", 6, 6 * 4096), ("real_ms_ptsz", "cudaMemsetAsync_ptsz", 2, 200)] {
            let rows = rows_at_line(&cuda["calls"], m[marker]);
            assert_eq!(rows.len(), 1, "@{marker}: {:#}\n{}", cuda["calls"], run.describe());
            let r = &rows[0];
            assert_eq!((r["api"].as_str(), u(&r["count"]), u(&r["bytes"]), u(&r["errors"])), (Some(api), n, bytes, n), "@{marker}: {r}");
            assert_eq!(r["return_codes"], json!({ "35": n }), "@{marker}: {r}");
            assert_eq!(r["site"]["function"], "memsets_real", "@{marker}: {r}");
        }
    }
}
