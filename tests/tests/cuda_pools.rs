//! Pool allocations and the driver's virtual memory (issue 24,
//! deliverable 7): `cudaMallocFromPoolAsync[_ptsz]`,
//! `cuMemAllocFromPoolAsync[_ptsz]`, `cuMemCreate`, `cuMemRelease`,
//! `cuMemMap`, `cuMemUnmap` counted with their bytes, and both halves of
//! each allocation seen by the leak detector: a pool allocation freed by
//! `cudaFreeAsync` is freed, a `cuMemCreate` handle released by
//! `cuMemRelease` too; what stays live is a leak at its line.
//!
//! On tests/cudasim's stand-ins (NOT CUDA) and on the REAL libcudart.so.12
//! and .so.13 (their calls fail without a driver, but are entered). Needs
//! root, the binary, gcc, python3 and PyPI once (target/cuda-real); under
//! CI=true a missing one fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

#[test]
fn pool_and_vmm_allocations_counted_and_paired() {
    let test = "pool_and_vmm_allocations_counted_and_paired";
    let Some((dir, run)) = record_on_standins(test, "pools") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    for (marker, api, n, bytes, class) in [
        ("pool_alloc", "cudaMallocFromPoolAsync", 40, 40 << 16, "memory"),
        ("pool_free", "cudaFreeAsync", 10, 0, "memory"),
        ("pool_alloc_ptsz", "cudaMallocFromPoolAsync_ptsz", 3, 3 * 4096, "memory"),
        ("drv_pool_alloc", "cuMemAllocFromPoolAsync", 5, 5 * 8192, "memory"),
        ("drv_pool_free", "cuMemFreeAsync", 5, 0, "memory"),
        ("vmm_create", "cuMemCreate", 20, 20 << 21, "memory"),
        ("vmm_map", "cuMemMap", 20, 20 << 21, "memory"),
        ("vmm_unmap", "cuMemUnmap", 20, 20 << 21, "memory"),
        ("vmm_release", "cuMemRelease", 20, 0, "memory"),
        ("vmm_leak", "cuMemCreate", 18, 18 << 21, "memory"),
    ] {
        let rows: Vec<Value> = rows_at_line(&cuda["calls"], m[marker]).into_iter().filter(|r| r["api"] == api).collect();
        assert_eq!(rows.len(), 1, "{api} @{marker}: {:#}\n{}", cuda["calls"], run.describe());
        let r = &rows[0];
        assert_eq!((u(&r["count"]), u(&r["bytes"]), u(&r["errors"]), r["class"].as_str()), (n, bytes, 0, Some(class)), "@{marker}: {r}");
    }
    // The leaks: the pool allocations never freed (30 of 40) and the
    // physical chunks never released (18); none where both halves met.
    let leaks: BTreeMap<u64, (u64, u64)> = report.0["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "device_memory_leak")
        .map(|f| (f["site"]["line"].as_u64().unwrap_or(0), (u(&f["count"]), u(&f["bytes"]))))
        .collect();
    let want: BTreeMap<u64, (u64, u64)> = [(m["pool_alloc"], (30, 30 << 16)), (m["vmm_leak"], (18, 18 << 21))].into_iter().collect();
    assert_eq!(leaks, want, "{:#}", report.0["findings"]);
    // Device memory held by line, at the end and at most, as the workload
    // allocates and frees in order.
    let dm = cuda["device_memory"].as_array().and_then(|a| a.iter().find(|d| d["lines"].as_array().is_some_and(|l| !l.is_empty()))).unwrap_or_else(|| panic!("no device_memory: {:#}", cuda["device_memory"]));
    let held: BTreeMap<u64, (u64, u64, u64, u64)> = dm["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| (u(&l["site"]["line"]), (u(&l["held_bytes"]), u(&l["peak_held_bytes"]), u(&l["allocs"]), u(&l["frees"]))))
        .collect();
    let want: BTreeMap<u64, (u64, u64, u64, u64)> = [
        (m["pool_alloc"], (30 << 16, 40 << 16, 40, 10)),
        (m["pool_alloc_ptsz"], (0, 4096, 3, 3)),
        (m["drv_pool_alloc"], (0, 8192, 5, 5)),
        (m["vmm_create"], (0, 2 << 20, 20, 20)),
        (m["vmm_leak"], (18 << 21, 18 << 21, 18, 0)),
    ]
    .into_iter()
    .collect();
    assert_eq!(held, want, "{:#}", dm);
    // The process: 30 pool chunks and 18 physical ones at the end, the
    // peak with them (the 2 MiB chunks came and went before).
    let end = (30u64 << 16) + (18 << 21);
    assert_eq!((u(&dm["held_bytes"]), u(&dm["peak_held_bytes"])), (end, end), "{dm:#}");
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    assert!(text.stdout.contains("GPU memory held by line"), "{}", text.stdout);
}

#[test]
fn real_libcudart_pool_allocations_counted_with_return_codes() {
    let test = "real_libcudart_pool_allocations_counted_with_return_codes";
    let Some(runs) = record_on_real_cudarts(test, "pools_real") else { return };
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        for (marker, api, n) in [("real_pool_alloc", "cudaMallocFromPoolAsync", 3), ("real_pool_alloc_ptsz", "cudaMallocFromPoolAsync_ptsz", 2)] {
            assert_failed_as_seen(&run, &m, marker, api, n);
        }
    }
}
