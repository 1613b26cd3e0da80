//! CUDA runtime tracing through `infertrace record`: Python workloads
//! calling libcudart through ctypes in the patterns PyTorch produces
//! (tests/workloads/cuda_patterns.py). The REAL libcudart.so.12 (NVIDIA's
//! nvidia-cuda-runtime-cu12 wheel, fetched once into target/cuda-real by
//! tests/cudasim/fetch-cudart.sh) checks probes, argument decoding, counts,
//! call sites and findings: without a GPU driver every call fails with
//! cudaErrorInsufficientDriver (35) but is entered. Durations come from
//! tests/cudasim, a timing simulator with the same soname (not CUDA). Also:
//! a native program's C call sites (tests/cudasim/native_app.c), and the
//! kernel maps of threads that exited (read with bpftool while recording).
//!
//! Needs root, the binary, python3 (on PATH), gcc, bpftool (the threads
//! test), and PyPI once (or a populated target/cuda-real); under CI=true a
//! missing one fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

struct Env {
    python: PathBuf,
    real: PathBuf,
    sim: PathBuf,
    kernels: PathBuf,
    /// tests/cudasim/native_app.c, linked to the real libcudart.so.12.
    native_app: PathBuf,
}

/// Root, the binary, and the libraries (fetched / built when missing).
fn prerequisites(test: &str) -> Option<Env> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let real = real_cudart(test)?;
    let sim = cuda_standin_dir(test)?;
    let python = python3_executable(test)?;
    Some(Env {
        python,
        real,
        sim: sim.join("libcudart.so.12"),
        kernels: sim.join("libfakekernels.so"),
        native_app: sim.join("native_app"),
    })
}

/// A copy of `lib` of this test's own (another inode): the workloads wait
/// for int3 on the functions, which any tracer's probes put there.
fn private_copy(dir: &TempDir, lib: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    fs::copy(lib, &p).unwrap();
    p
}

struct Cuda {
    report: Report,
    markers: BTreeMap<String, u64>,
    run: Run,
}

/// The Python function holding a marker of cuda_patterns.py.
fn function_of(marker: &str) -> String {
    let text = fs::read_to_string(workspace_root().join("tests/workloads/cuda_patterns.py")).unwrap();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("def ") {
            current = rest.split('(').next().unwrap().to_owned();
        }
        if line.trim_end().ends_with(&format!("# @{marker}")) {
            return current;
        }
    }
    panic!("no marker {marker}");
}

impl Cuda {
    fn cuda(&self) -> &Value {
        let c = &self.report.0["cuda"];
        assert!(c.is_object(), "no `cuda` in the report\n{}", self.run.describe());
        c
    }

    fn line(&self, marker: &str) -> u64 {
        self.markers[marker]
    }

    fn calls(&self) -> &Vec<Value> {
        self.cuda()["calls"].as_array().expect("cuda.calls")
    }

    /// The one `calls[]` entry of `api` at the marker's line.
    #[track_caller]
    fn call(&self, api: &str, marker: &str) -> &Value {
        let line = self.line(marker);
        let v: Vec<&Value> =
            self.calls().iter().filter(|c| c["api"] == api && c["site"]["line"] == line).collect();
        assert_eq!(v.len(), 1, "{api} at @{marker} (line {line}): {v:?}\ncalls: {:#?}", self.calls());
        v[0]
    }

    fn findings(&self) -> &Vec<Value> {
        self.report.0["findings"].as_array().expect("findings")
    }

    /// The one finding of `kind`.
    #[track_caller]
    fn finding(&self, kind: &str) -> &Value {
        let v: Vec<&Value> = self.findings().iter().filter(|f| f["kind"] == kind).collect();
        assert_eq!(v.len(), 1, "findings of kind {kind}: {:#?}", self.findings());
        v[0]
    }

    /// The `launched` target's pid.
    fn launched_pid(&self) -> u64 {
        self.report.one_target("launched")["pid"].as_u64().unwrap()
    }

    fn findings_at(&self, marker: &str) -> Vec<String> {
        let line = self.line(marker);
        let mut v: Vec<String> = self.report.0["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .filter(|f| f["site"]["line"] == line)
            .map(|f| f["kind"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// `infertrace record -q --format json -o DIR/rec.itr [ARGS] [-- python3 workload MODE]`.
fn record(env: &Env, dir: &TempDir, cudart: &Path, extra_env: &[(&str, &str)], args: &[OsString]) -> Cuda {
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    record_source(env, dir, cudart, extra_env, args, &source)
}

/// [`record`] of a workload whose markers are in `source`.
fn record_source(
    env: &Env,
    dir: &TempDir,
    cudart: &Path,
    extra_env: &[(&str, &str)],
    args: &[OsString],
    source: &Path,
) -> Cuda {
    let run = run_cmd(&mut record_command(env, dir, cudart, extra_env, args), Duration::from_secs(120));
    checked(run, source)
}

/// The `infertrace record` command of [`record`].
fn record_command(env: &Env, dir: &TempDir, cudart: &Path, extra_env: &[(&str, &str)], args: &[OsString]) -> Command {
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).args(args);
    cmd.env("CUDART", cudart).env("FAKE_KERNELS", &env.kernels);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

/// The finished `record` run: succeeded, a JSON report, no CUDA event lost.
fn checked(run: Run, source: &Path) -> Cuda {
    run.assert_ok();
    let report = run.json();
    // Not `check_invariants`: it wants no lost event at all, and a CPU
    // sample deep in Python's import machinery may be truncated.
    assert_eq!(report.0["schema_version"], 1);
    let lost = report.0["lost_detail"].as_object().expect("lost_detail");
    assert!(!lost.contains_key("cuda_lost"), "CUDA events lost: {lost:?}");
    Cuda { report, markers: markers_of(source), run }
}

fn launch_args(env: &Env, mode: &str) -> Vec<OsString> {
    vec![
        "--".into(),
        env.python.clone().into(),
        workspace_root().join("tests/workloads/cuda_patterns.py").into(),
        mode.into(),
    ]
}

#[test]
fn real_libcudart_counts_sites_and_findings() {
    let test = "real_libcudart_counts_sites_and_findings";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-real");
    let lib = private_copy(&dir, &env.real, "libcudart.so.12");
    let t = record(&env, &dir, &lib, &[], &launch_args(&env, "patterns"));
    let cuda = t.cuda();
    let libs = cuda["libraries"].as_array().expect("libraries");
    assert_eq!(libs.len(), 1, "{libs:?}");
    assert_eq!(Path::new(libs[0]["path"].as_str().unwrap()), lib);
    assert_eq!(libs[0]["functions"].as_array().unwrap().len(), 56, "the runtime functions of api::NAMES that libcudart 12 exports (43 + cudaGetDeviceCount, cudaSetDevice + 9 event and query functions + 2 pool allocations)");
    assert_eq!(libs[0]["pids"], serde_json::json!([t.launched_pid()]), "{libs:?}");

    // (api, marker, kind, calls, bytes); every call fails with 35.
    let expected: &[(&str, &str, Option<&str>, u64, u64)] = &[
        ("cudaMemcpyAsync", "small_copy", Some("HtoD"), 200, 200 * 4096),
        ("cudaStreamSynchronize", "small_sync", None, 200, 0),
        ("cudaMemcpyAsync", "item_copy", Some("DtoH"), 100, 400),
        ("cudaStreamSynchronize", "item_sync", None, 100, 0),
        ("cudaMemcpyAsync", "const_copy", Some("HtoD"), 64, 64 * 65536),
        ("cudaMemcpy", "pageable_copy", Some("HtoD"), 20, 20 << 23),
        ("cudaMemcpy", "large_copy", Some("HtoD"), 1, 64 << 20),
        ("cudaMemcpyAsync", "large_async", Some("HtoD"), 1, 64 << 20),
        ("cudaStreamSynchronize", "large_sync", None, 1, 0),
        ("cudaMemcpyAsync_ptsz", "ptsz_copy", Some("HtoD"), 40, 40 * 2048),
        ("cudaStreamSynchronize_ptsz", "ptsz_sync", None, 40, 0),
        ("cudaMemcpy_ptds", "ptds_copy", Some("DtoD"), 5, 5 * 1024),
        ("cudaMemcpy2DAsync", "copy2d_async", Some("HtoD"), 16, 16 * 2000),
        ("cudaStreamSynchronize", "copy2d_sync", None, 16, 0),
        ("cudaMemcpy2DAsync", "copy2d_other", Some("HtoD"), 1, 2000),
        ("cudaStreamSynchronize", "other_stream_sync", None, 1, 0),
        ("cudaMemcpy2D", "copy2d", Some("DtoH"), 2, 2 * 500),
        ("cudaMemcpy2DAsync_ptsz", "copy2d_ptsz", Some("HtoD"), 1, 256),
        ("cudaMemcpy2D_ptds", "copy2d_ptds", Some("DtoD"), 1, 64),
        ("cudaMemcpyAsync", "default_copy", Some("Default"), 3, 3 * 512),
        ("cudaMemcpyPeer", "peer_copy", Some("DtoD"), 3, 3 << 20),
        ("cudaMemcpyPeerAsync", "peer_async", Some("DtoD"), 2, 2 * 4096),
        ("cudaMalloc", "malloc", None, 4, 4 << 20),
        ("cudaFree", "free", None, 2, 0),
        ("cudaMallocAsync", "malloc_async", None, 2, 2 << 20),
        ("cudaFreeAsync", "free_async", None, 1, 0),
        ("cudaHostAlloc", "host_alloc", None, 1, 1 << 20),
        ("cudaFreeHost", "free_host", None, 1, 0),
        ("cudaMallocHost", "malloc_host", None, 1, 2 << 20),
        ("cudaHostRegister", "host_register", None, 1, 8192),
        ("cudaHostUnregister", "host_unregister", None, 1, 0),
        ("cudaDeviceSynchronize", "device_sync", None, 3, 0),
        ("cudaEventSynchronize", "event_sync", None, 2, 0),
    ];
    for &(api, marker, kind, count, bytes) in expected {
        let c = t.call(api, marker);
        assert_eq!(c["kind"].as_str(), kind, "{api} @{marker}: {c}");
        assert_eq!((u(&c["count"]), u(&c["bytes"]), u(&c["errors"])), (count, bytes, count), "{api} @{marker}: {c}");
        assert_eq!(c["return_codes"], serde_json::json!({ "35": count }), "{api} @{marker}");
        assert!(c["site"]["file"].as_str().unwrap().ends_with("cuda_patterns.py"), "{c}");
        assert_eq!(c["site"]["function"], function_of(marker).as_str(), "{api} @{marker}: {c}");
    }
    let total: u64 = t.calls().iter().map(|c| u(&c["count"])).sum();
    assert_eq!(total, expected.iter().map(|e| e.3).sum::<u64>(), "calls outside the markers: {:#?}", t.calls());
    assert_eq!(t.call("cudaMemcpyAsync", "small_copy")["site"]["function"], "small_batches");
    // Pageable host memory (no driver: nothing is pinned).
    let small = t.call("cudaMemcpyAsync", "small_copy");
    assert_eq!((u(&small["pinned"]), u(&small["pageable"])), (0, 200), "{small}");

    let launches = cuda["launches"].as_array().expect("launches");
    let launch = |marker: &str| -> &Value {
        let line = t.line(marker);
        let v: Vec<&Value> = launches.iter().filter(|l| l["site"]["line"] == line).collect();
        assert_eq!(v.len(), 1, "{launches:#?}");
        v[0]
    };
    assert_eq!(launch("launch_vec")["kernel"], "vector_add_kernel");
    assert_eq!(u(&launch("launch_vec")["count"]), 300);
    assert_eq!(launch("launch_vec")["api"], "cudaLaunchKernel");
    assert_eq!(launch("launch_mm")["kernel"], "matmul_kernel(float*, float*, float*, int)");
    assert_eq!(u(&launch("launch_mm")["count"]), 100);
    assert_eq!(launch("launch_mm")["api"], "cudaLaunchKernel_ptsz");
    assert_eq!(launches.len(), 2, "{launches:#?}");

    assert_eq!(t.findings_at("small_copy"), ["small_htod_copies", "sync_after_copy"]);
    assert_eq!(t.findings_at("item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("const_copy"), ["repeated_upload"]);
    assert_eq!(t.findings_at("pageable_copy"), ["pageable_copy"]);
    assert_eq!(t.findings_at("ptsz_copy"), ["small_htod_copies", "sync_after_copy"]);
    // The stream of cudaMemcpy2DAsync is on the stack: pairs need it right.
    assert_eq!(t.findings_at("copy2d_async"), ["sync_after_copy"]);
    for quiet in ["large_copy", "large_async", "large_sync", "copy2d_other", "default_copy", "malloc"] {
        assert!(t.findings_at(quiet).is_empty(), "a single large copy made a finding at @{quiet}");
    }
    let findings = t.report.0["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 8, "{findings:#?}");
    for f in findings {
        for k in ["severity", "message", "advice"] {
            assert!(f[k].as_str().is_some_and(|s| !s.is_empty()), "{k}: {f}");
        }
        assert!(f["count"].is_u64() && f["bytes"].is_u64() && f["time_ns"].is_u64(), "{f}");
    }
    let f = t.finding("tiny_dtoh_sync");
    assert_eq!((u(&f["count"]), u(&f["bytes"])), (100, 400), "{f}");
    let f = t.finding("repeated_upload");
    assert_eq!((u(&f["count"]), u(&f["bytes"])), (64, 64 * 65536), "{f}");

    // The text report: findings first, then the tables.
    let text = run_infertrace([OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    let at = |s: &str| text.stdout.find(s).unwrap_or_else(|| panic!("{s:?} not in\n{}", text.stdout));
    assert!(at("findings: 8") < at("copies by site:"));
    assert!(at("copies by site:") < at("syncs by site:"));
    assert!(at("kernel launches by kernel and site (400 in all)") > at("syncs by site:"));
    assert!(text.stdout.contains("small_batches (cuda_patterns.py:"), "{}", text.stdout);
}

#[test]
fn simulator_durations_pinned_memory_and_leaks() {
    let test = "simulator_durations_pinned_memory_and_leaks";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-sim");
    let t = record(&env, &dir, &env.sim, &[("END_SLEEP_S", "0.2")], &launch_args(&env, "sim"));
    let n: u64 = 32 << 20;
    let pinned = t.call("cudaMemcpyAsync", "sim_pinned_copy");
    let pageable = t.call("cudaMemcpyAsync", "sim_pageable_copy");
    assert_eq!((u(&pinned["count"]), u(&pinned["bytes"]), u(&pinned["errors"])), (40, 40 * n, 0));
    assert_eq!((u(&pinned["pinned"]), u(&pinned["pageable"])), (40, 0));
    assert_eq!((u(&pageable["count"]), u(&pageable["bytes"])), (40, 40 * n));
    assert_eq!((u(&pageable["pinned"]), u(&pageable["pageable"])), (0, 40));
    // The simulator: pageable 3 GB/s blocking, pinned 12 GB/s async.
    let pageable_ns = u(&pageable["total_ns"]) / 40;
    assert!(pageable_ns >= 11_000_000, "pageable copy {pageable_ns} ns");
    assert!(u(&pinned["total_ns"]) / 40 < 500_000, "pinned copy {}", pinned["total_ns"]);
    let sync_ns = u(&t.call("cudaStreamSynchronize", "sim_pinned_sync")["total_ns"]) / 40;
    assert!(sync_ns >= 2_700_000, "sync after a pinned copy {sync_ns} ns");
    // .item() after 10 launches of 100 us: a pageable D2H copy waits for the
    // stream to drain (in the copy), then the sync.
    let item = u(&t.call("cudaMemcpyAsync", "sim_item_copy")["total_ns"])
        + u(&t.call("cudaStreamSynchronize", "sim_item_sync")["total_ns"]);
    assert!(item / 40 >= 50_000, "item copy + sync {} ns", item / 40);
    let launches: u64 = t.cuda()["launches"]
        .as_array()
        .expect("launches")
        .iter()
        .filter(|l| l["kernel"] == "vector_add_kernel")
        .map(|l| u(&l["count"]))
        .sum();
    assert_eq!(launches, 400);
    let leak = t.call("cudaMalloc", "sim_leak");
    assert_eq!((u(&leak["count"]), u(&leak["bytes"]), u(&leak["errors"])), (40, 40 << 20, 0), "{leak}");
    assert_eq!(t.findings_at("sim_pageable_copy"), ["copy_time_share", "pageable_copy", "sync_after_copy"]);
    assert_eq!(t.findings_at("sim_pinned_copy"), ["sync_after_copy"]);
    assert_eq!(t.findings_at("sim_item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("sim_leak"), ["device_memory_leak"]);
    assert!(t.findings_at("sim_tmp_malloc").is_empty());
    assert!(t.findings_at("sim_malloc_input").is_empty());
    // Most of the window (the recording's: `duration_ns`) goes to copies
    // and syncs.
    let share = t.finding("copy_time_share");
    let window = u(&t.report.0["duration_ns"]);
    assert!(window > 0 && u(&share["time_ns"]) * 5 >= window, "{share} (window {window} ns)");
    assert_eq!(t.findings().len(), 6, "{:#?}", t.findings());
    let leak = t.finding("device_memory_leak");
    assert_eq!((u(&leak["count"]), u(&leak["bytes"])), (40, 40 << 20));
}

/// The driver API (libcuda) called directly is traced with its own names
/// and kinds; runtime calls, which enter the driver inside (as the real
/// libcudart does), are counted once, as runtime calls. Runs on
/// tests/cudasim's stand-ins (libcuda.so.1 under libcudart.so.12; NOT CUDA).
#[test]
fn driver_api_counted_once() {
    let test = "driver_api_counted_once";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-driver");
    let driver = env.sim.with_file_name("libcuda.so.1");
    let t = record(
        &env,
        &dir,
        &env.sim,
        &[("CUDA_DRIVER", driver.to_str().unwrap()), ("END_SLEEP_S", "0.2")],
        &launch_args(&env, "driver"),
    );
    let cuda = t.cuda();
    let libs: Vec<&str> = cuda["libraries"].as_array().unwrap().iter().filter_map(|l| l["path"].as_str()).collect();
    assert!(libs.iter().any(|p| p.ends_with("/libcuda.so.1")), "{libs:?}");
    // (api, marker, kind, calls, bytes); the stand-in succeeds.
    let expected: &[(&str, &str, Option<&str>, u64, u64)] = &[
        ("cuMemAlloc_v2", "drv_alloc", None, 1, 1 << 20),
        ("cuMemcpyHtoDAsync_v2", "drv_h2d_async", Some("HtoD"), 30, 30 * 4096),
        ("cuStreamSynchronize", "drv_sync", None, 30, 0),
        ("cuMemcpyDtoH_v2", "drv_item", Some("DtoH"), 25, 100),
        ("cuMemcpyHtoD_v2", "drv_h2d", Some("HtoD"), 3, 192),
        ("cuMemcpyAsync", "drv_unified", Some("Default"), 1, 512),
        ("cuMemcpyPeerAsync", "drv_peer", Some("DtoD"), 2, 512),
        ("cuCtxSynchronize", "drv_ctx_sync", None, 1, 0),
        ("cudaMemcpyAsync", "rt_h2d", Some("HtoD"), 20, 20 * 4096),
        ("cudaStreamSynchronize", "rt_sync", None, 20, 0),
        ("cudaMemcpyPeer", "rt_peer", Some("DtoD"), 1, 128),
        ("cudaMallocAsync", "rt_malloc_async", None, 1, 4096),
        ("cudaFreeAsync", "rt_free_async", None, 1, 0),
        ("cudaMalloc", "rt_malloc", None, 1, 1 << 16),
        ("cudaFree", "rt_free", None, 1, 0),
        ("cuMemFree_v2", "drv_free", None, 1, 0),
    ];
    for &(api, marker, kind, count, bytes) in expected {
        let c = t.call(api, marker);
        assert_eq!(c["kind"].as_str(), kind, "{api} @{marker}: {c}");
        assert_eq!((u(&c["count"]), u(&c["bytes"]), u(&c["errors"])), (count, bytes, 0), "{api} @{marker}: {c}");
    }
    // Nothing else: the driver calls inside runtime calls are not counted.
    let total: u64 = t.calls().iter().map(|c| u(&c["count"])).sum();
    assert_eq!(total, expected.iter().map(|e| e.3).sum::<u64>(), "calls counted twice? {:#?}", t.calls());

    let launches = cuda["launches"].as_array().expect("launches");
    let at = |marker: &str| -> Vec<&Value> {
        let line = t.line(marker);
        launches.iter().filter(|l| l["site"]["line"] == line).collect()
    };
    let (drv, ex, rt) = (at("drv_launch"), at("drv_launch_ex"), at("rt_launch"));
    assert_eq!((drv.len(), ex.len(), rt.len()), (1, 1, 1), "{launches:#?}");
    assert_eq!((&drv[0]["api"], u(&drv[0]["count"])), (&Value::from("cuLaunchKernel"), 12));
    assert_eq!((&ex[0]["api"], u(&ex[0]["count"])), (&Value::from("cuLaunchKernelEx"), 7));
    assert_eq!((&rt[0]["api"], u(&rt[0]["count"])), (&Value::from("cudaLaunchKernel"), 9));
    // A driver launch names a CUfunction handle; the runtime's, the host stub.
    assert!(drv[0]["kernel"].as_str().unwrap().starts_with("CUfunction 0x"), "{}", drv[0]);
    assert_eq!(rt[0]["kernel"], "vector_add_kernel");
    let (mixed_rt, mixed_drv) = (at("mixed_rt"), at("mixed_drv"));
    assert_eq!((mixed_rt.len(), mixed_drv.len()), (1, 1), "{launches:#?}");
    assert_eq!((&mixed_rt[0]["api"], u(&mixed_rt[0]["count"])), (&Value::from("cudaLaunchKernel"), 6));
    assert_eq!((&mixed_drv[0]["api"], u(&mixed_drv[0]["count"])), (&Value::from("cuLaunchKernel"), 6));
    assert_eq!(launches.iter().map(|l| u(&l["count"])).sum::<u64>(), 28 + 12, "{launches:#?}");

    // The detector sees driver copies as what they are.
    assert_eq!(t.findings_at("drv_h2d_async"), ["sync_after_copy"]);
}

/// `--no-cuda-driver`: libcuda is left alone, runtime calls are counted as
/// before (and launches, which then leave no nesting marks).
#[test]
fn no_cuda_driver_probes_the_runtime_only() {
    let test = "no_cuda_driver_probes_the_runtime_only";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-nodriver");
    let mut args: Vec<OsString> = vec!["--no-cuda-driver".into()];
    args.extend(launch_args(&env, "sim"));
    let t = record(&env, &dir, &env.sim, &[("END_SLEEP_S", "0.2")], &args);
    let libs: Vec<&str> =
        t.cuda()["libraries"].as_array().unwrap().iter().filter_map(|l| l["path"].as_str()).collect();
    assert_eq!(libs.len(), 1, "{libs:?}");
    assert!(libs[0].ends_with("/libcudart.so.12"), "{libs:?}");
    assert_eq!(u(&t.call("cudaMemcpyAsync", "sim_pinned_copy")["count"]), 40);
    assert_eq!(u(&t.call("cudaStreamSynchronize", "sim_item_sync")["count"]), 40);
    assert!(t.calls().iter().all(|c| c["api"].as_str().is_some_and(|a| a.starts_with("cuda"))), "{:#?}", t.calls());
    let launches = t.cuda()["launches"].as_array().unwrap();
    assert_eq!(launches.iter().map(|l| u(&l["count"])).sum::<u64>(), 400, "{launches:#?}");
}

#[test]
fn dlopen_after_attach_renamed_library() {
    let test = "dlopen_after_attach_renamed_library";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-late");
    let lib = private_copy(&dir, &env.real, "libcudart-5f1a2b3c.so.12");
    let t = record(&env, &dir, &lib, &[("LATE_S", "1.0")], &launch_args(&env, "late"));
    let c = t.call("cudaMemcpyAsync", "small_copy");
    assert_eq!((u(&c["count"]), u(&c["bytes"])), (50, 50 * 4096), "{c}");
    assert_eq!(u(&t.call("cudaStreamSynchronize", "small_sync")["count"]), 50);
    // Found by a later scan (`cuda.notes`), not by the first one, at the
    // launch (its notes are the report's `notes`): the library was not
    // mapped then.
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
    };
    let probed = |n: &String| n.contains("CUDA runtime") && n.contains("libcudart-5f1a2b3c.so.12");
    let (first, later) = (strings(&t.report.0["notes"]), strings(&t.cuda()["notes"]));
    assert!(later.iter().any(probed), "no note of the later scan: cuda.notes {later:?}, notes {first:?}");
    assert!(!first.iter().any(probed), "libcudart was mapped at the first scan: {first:?}");
}

#[test]
fn attach_to_running_process() {
    let test = "attach_to_running_process";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-attach");
    let lib = private_copy(&dir, &env.real, "libcudart.so.12");
    // Loads libcudart at once, then waits for the probes.
    let mut child = Command::new(&env.python)
        .arg(workspace_root().join("tests/workloads/cuda_patterns.py"))
        .arg("late")
        .env("CUDART", &lib)
        .env("LATE_S", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut guard = KillOnDrop::new(pid);
    let mapped = poll(Duration::from_secs(10), || {
        fs::read_to_string(format!("/proc/{pid}/maps")).ok()?.contains(lib.to_str().unwrap()).then_some(())
    });
    assert!(mapped.is_some(), "the workload never mapped {}", lib.display());
    let t = record(&env, &dir, &lib, &[], &["-p".into(), pid.to_string().into()]);
    let status = child.wait().unwrap();
    guard.disarm();
    assert!(status.success(), "workload: {status}");
    assert_eq!(u(&t.call("cudaMemcpyAsync", "small_copy")["count"]), 50);
    assert_eq!(t.findings_at("small_copy"), ["small_htod_copies", "sync_after_copy"]);
}

/// A native program (tests/cudasim/native_app.c, linked to the real
/// libcudart.so.12, built with frame pointers and debug information): its
/// call sites are C functions and lines.
#[test]
fn native_call_site() {
    let test = "native_call_site";
    let Some(env) = prerequisites(test) else { return };
    if !env.native_app.is_file() {
        skip(test, &format!("{} (tests/cudasim/build.sh builds it once the real libcudart is fetched)", env.native_app.display()));
        return;
    }
    let dir = TempDir::new("cuda-native");
    let source = workspace_root().join("tests/cudasim/native_app.c");
    let t = record_source(&env, &dir, &env.real, &[], &["--".into(), env.native_app.clone().into()], &source);
    let copy = t.call("cudaMemcpyAsync", "native_copy");
    assert_eq!(copy["kind"], "HtoD", "{copy}");
    // Without a driver every call fails (35), and is counted.
    assert_eq!((u(&copy["count"]), u(&copy["bytes"]), u(&copy["errors"])), (32, 32 * 4096, 32), "{copy}");
    assert_eq!(copy["site"]["function"], "upload_batch", "{copy}");
    assert!(copy["site"]["file"].as_str().is_some_and(|f| f.ends_with("native_app.c")), "{copy}");
    assert_eq!(u(&t.call("cudaStreamSynchronize", "native_sync")["count"]), 32);
    assert_eq!(t.findings_at("native_copy"), ["small_htod_copies", "sync_after_copy"]);
}

/// The thread ids in the tracer's CUDA_STATS map (keys are `CudaKey`:
/// pid, tid, ...), or None when bpftool shows no such map held by `tracer`.
fn cuda_stats_tids(tracer: u32) -> Option<BTreeSet<u64>> {
    let entries = tracer_map_entries(tracer, "CUDA_STATS")?;
    Some(
        entries
            .iter()
            .filter_map(|e| match e["formatted"]["key"]["tid"].as_u64() {
                Some(tid) => Some(tid),
                None => {
                    let k = entry_key_bytes(e)?;
                    Some(u64::from(u32::from_le_bytes(k.get(4..8)?.try_into().ok()?)))
                }
            })
            .collect(),
    )
}

/// Threads that exit (a pool that churns: 8 workers x 10 copies) leave the
/// kernel's per-thread CUDA_STATS map while the process goes on (the tracer
/// retires them every 40 polls, ~4 s), and their calls are still counted.
#[test]
fn exited_threads_leave_the_kernel_maps() {
    let test = "exited_threads_leave_the_kernel_maps";
    let Some(env) = prerequisites(test) else { return };
    if !require(test, &[Need::Bpftool]) {
        return;
    }
    let dir = TempDir::new("cuda-threads");
    let lib = private_copy(&dir, &env.real, "libcudart.so.12");
    // The main thread waits 7 s after the workers, then copies on its own.
    let mut cmd = record_command(&env, &dir, &lib, &[("AFTER_THREADS_S", "7")], &launch_args(&env, "threads"));
    let tracer = spawn(&mut cmd);
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    let python = env.python.canonicalize().unwrap();
    let pid = poll(Duration::from_secs(20), || {
        children_of(tpid).into_iter().find(|c| fs::read_link(format!("/proc/{c}/exe")).is_ok_and(|e| e == python))
    })
    .expect("the launched workload never appeared");

    // (seconds since the start, tids in CUDA_STATS) while the workload lives.
    let start = std::time::Instant::now();
    let mut snapshots: Vec<(f64, BTreeSet<u64>)> = Vec::new();
    let mut seen_map = false;
    while alive(pid) && start.elapsed() < Duration::from_secs(60) {
        if let Some(tids) = cuda_stats_tids(tpid) {
            seen_map = true;
            if alive(pid) {
                snapshots.push((start.elapsed().as_secs_f64(), tids));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = wait_child(tracer, Duration::from_secs(60), "infertrace record (threads)");
    guard.disarm();
    let t = checked(run, &workspace_root().join("tests/workloads/cuda_patterns.py"));
    assert_eq!(t.launched_pid(), u64::from(pid));
    if !seen_map {
        skip(test, &format!("bpftool showing the CUDA_STATS map held by pid {tpid} (`bpftool map list` with pids)"));
        return;
    }
    // The snapshots where the map's threads changed.
    let describe = || {
        let mut last = None;
        let mut v = Vec::new();
        for (s, t) in &snapshots {
            if last != Some(t) {
                v.push(format!("{s:.1}s: {t:?}"));
                last = Some(t);
            }
        }
        v.join("\n  ")
    };
    eprintln!("CUDA_STATS threads (pid {pid}):\n  {}", describe());
    // The workers' entries were there, then moved out while the main thread
    // waited: only its own (tid == pid) stay.
    let workers_seen = snapshots
        .iter()
        .find(|(_, tids)| tids.iter().any(|t| *t != u64::from(pid)))
        .map(|(s, _)| *s)
        .unwrap_or_else(|| panic!("worker threads never seen in CUDA_STATS (pid {pid}):\n  {}", describe()));
    let late: Vec<&(f64, BTreeSet<u64>)> = snapshots.iter().filter(|(s, _)| *s >= workers_seen + 5.0).collect();
    assert!(!late.is_empty(), "no snapshot 5 s after the workers ran (pid {pid}):\n  {}", describe());
    for (s, tids) in late {
        assert!(
            tids.iter().all(|t| *t == u64::from(pid)),
            "{s:.1}s: exited threads still in CUDA_STATS (pid {pid}, workers seen at {workers_seen:.1}s):\n  {}",
            describe()
        );
    }

    let c = t.call("cudaMemcpyAsync", "thread_copy");
    assert_eq!((u(&c["count"]), u(&c["bytes"]), u(&c["errors"])), (80, 80 * 1024, 80), "{c}");
    assert_eq!(u(&t.call("cudaStreamSynchronize", "thread_sync")["count"]), 80);
    assert_eq!(u(&t.call("cudaMemcpyAsync", "small_copy")["count"]), 10);
    // The same (zeroed) 1 KiB each time; pairs are per thread: every worker
    // copy was followed by its own sync.
    assert_eq!(t.findings_at("thread_copy"), ["repeated_upload", "sync_after_copy"]);
    let line = t.line("thread_copy");
    let f = t
        .findings()
        .iter()
        .find(|f| f["kind"] == "sync_after_copy" && f["site"]["line"] == line)
        .expect("sync_after_copy at @thread_copy");
    assert_eq!(u(&f["count"]), 80, "{f}");
}
