//! CUDA runtime tracing through `infertrace record`: Python workloads
//! calling libcudart through ctypes in the patterns PyTorch produces
//! (tests/workloads/cuda_patterns.py). The REAL libcudart.so.12 (NVIDIA's
//! nvidia-cuda-runtime-cu12 wheel, fetched once into target/cuda-real by
//! tests/cudasim/fetch-cudart.sh) checks probes, argument decoding, counts,
//! call sites and findings: without a GPU driver every call fails with
//! cudaErrorInsufficientDriver (35) but is entered. Durations come from
//! tests/cudasim, a timing simulator with the same soname (not CUDA).
//!
//! Needs root, the binary, python3, gcc, and PyPI once (or a populated
//! target/cuda-real); under CI=true a missing one fails the test.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn script(name: &str) -> Result<PathBuf, String> {
    let o = Command::new("sh")
        .arg(workspace_root().join("tests/cudasim").join(name))
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
}

struct Env {
    python: PathBuf,
    real: PathBuf,
    sim: PathBuf,
    kernels: PathBuf,
}

/// Root, the binary, and the libraries (fetched / built when missing).
fn prerequisites(test: &str) -> Option<Env> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let real = match script("fetch-cudart.sh") {
        Ok(p) => p,
        Err(e) => {
            skip(test, &format!("the real libcudart.so.12 (tests/cudasim/fetch-cudart.sh): {e}"));
            return None;
        }
    };
    let sim = match script("build.sh") {
        Ok(p) => p,
        Err(e) => {
            skip(test, &format!("tests/cudasim/build.sh: {e}"));
            return None;
        }
    };
    // The interpreter itself (not a pyenv shim script).
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(python) = python else {
        skip(test, "python3");
        return None;
    };
    Some(Env { python, real, sim: sim.join("libcudart.so.12"), kernels: sim.join("libfakekernels.so") })
}

/// A copy of `lib` of this test's own (another inode): the workloads wait
/// for int3 on the functions, which any tracer's probes put there.
fn private_copy(dir: &TempDir, lib: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    fs::copy(lib, &p).unwrap();
    p
}

/// `# @name` markers of the workload -> line.
fn markers() -> BTreeMap<String, u64> {
    let text = fs::read_to_string(workspace_root().join("tests/workloads/cuda_patterns.py")).unwrap();
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| l.rsplit_once("# @").map(|(_, m)| (m.trim().to_string(), i as u64 + 1)))
        .collect()
}

struct Cuda {
    report: Report,
    markers: BTreeMap<String, u64>,
    run: Run,
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
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).args(args);
    cmd.env("CUDART", cudart).env("FAKE_KERNELS", &env.kernels);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let run = run_cmd(&mut cmd, Duration::from_secs(120));
    run.assert_ok();
    let report = run.json();
    // Not `check_invariants`: it wants no lost event at all, and a CPU
    // sample deep in Python's import machinery may be truncated.
    assert_eq!(report.0["schema_version"], 1);
    let lost = report.0["lost_detail"].as_object().expect("lost_detail");
    assert!(!lost.contains_key("cuda_lost"), "CUDA events lost: {lost:?}");
    Cuda { report, markers: markers(), run }
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
    assert_eq!(libs[0]["functions"].as_array().unwrap().len(), 27);

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
    }
    let total: u64 = t.calls().iter().map(|c| u(&c["count"])).sum();
    assert_eq!(total, expected.iter().map(|e| e.3).sum::<u64>(), "calls outside the markers: {:#?}", t.calls());
    assert_eq!(t.call("cudaMemcpyAsync", "small_copy")["site"]["function"], "small_batches");

    let launches = cuda["launches"].as_array().expect("launches");
    let launch = |marker: &str| -> &Value {
        let line = t.line(marker);
        let v: Vec<&Value> = launches.iter().filter(|l| l["site"]["line"] == line).collect();
        assert_eq!(v.len(), 1, "{launches:#?}");
        v[0]
    };
    assert_eq!(launch("launch_vec")["kernel"], "vector_add_kernel");
    assert_eq!(u(&launch("launch_vec")["count"]), 300);
    assert_eq!(launch("launch_mm")["kernel"], "matmul_kernel(float*, float*, float*, int)");
    assert_eq!(u(&launch("launch_mm")["count"]), 100);
    assert_eq!(launch("launch_mm")["api"], "cudaLaunchKernel_ptsz");

    assert_eq!(t.findings_at("small_copy"), ["small_htod_copies", "sync_after_copy"]);
    assert_eq!(t.findings_at("item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("const_copy"), ["repeated_upload"]);
    assert_eq!(t.findings_at("pageable_copy"), ["pageable_copy"]);
    assert_eq!(t.findings_at("ptsz_copy"), ["small_htod_copies", "sync_after_copy"]);
    // The stream of cudaMemcpy2DAsync is on the stack: pairs need it right.
    assert_eq!(t.findings_at("copy2d_async"), ["sync_after_copy"]);
    for quiet in ["large_copy", "large_async", "large_sync", "copy2d_other"] {
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
    assert_eq!((u(&pageable["pinned"]), u(&pageable["pageable"])), (0, 40));
    // The simulator: pageable 3 GB/s blocking, pinned 12 GB/s async.
    let pageable_ns = u(&pageable["total_ns"]) / 40;
    assert!(pageable_ns >= 11_000_000, "pageable copy {pageable_ns} ns");
    assert!(u(&pinned["total_ns"]) / 40 < 500_000, "pinned copy {}", pinned["total_ns"]);
    let sync_ns = u(&t.call("cudaStreamSynchronize", "sim_pinned_sync")["total_ns"]) / 40;
    assert!(sync_ns >= 2_700_000, "sync after a pinned copy {sync_ns} ns");
    assert_eq!(t.findings_at("sim_pageable_copy"), ["copy_time_share", "pageable_copy", "sync_after_copy"]);
    assert_eq!(t.findings_at("sim_pinned_copy"), ["sync_after_copy"]);
    assert_eq!(t.findings_at("sim_item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("sim_leak"), ["device_memory_leak"]);
    assert!(t.findings_at("sim_tmp_malloc").is_empty());
    let leak = t.report.0["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "device_memory_leak").unwrap();
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
    assert_eq!(u(&t.call("cudaMemcpyAsync", "small_copy")["count"]), 50);
    assert_eq!(u(&t.call("cudaStreamSynchronize", "small_sync")["count"]), 50);
    // Found by a later scan: the note is in `notes` or `cuda.notes`.
    let notes: Vec<&str> = [&t.report.0["notes"], &t.cuda()["notes"]]
        .into_iter()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(notes.iter().any(|n| n.contains("CUDA runtime") && n.contains("libcudart-5f1a2b3c.so.12")), "{notes:?}");
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
