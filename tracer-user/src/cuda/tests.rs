//! CUDA tracing against the running kernel, without the `record` session:
//! the real libcudart.so.12 (NVIDIA's wheel; calls fail without a driver but
//! are entered) for argument decoding, counts, sites and findings, and the
//! tests/cudasim timing simulator for durations, pinned memory and leaks.
//! Needs root, python3, gcc and (once) PyPI for the real library; a missing
//! prerequisite skips with a `SKIPPED` line, or fails under `CI=true`.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use aya::{Ebpf, EbpfLoader};

use super::*;
use crate::{process, pystacks::PythonTargets, symbolize::Symbolizer};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn skip(test: &str, why: &str) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: missing prerequisite under CI=true: {why}");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    true
}

/// Runs a script of tests/cudasim and returns the path it prints.
fn cudasim_script(name: &str) -> Result<PathBuf, String> {
    let out = Command::new("sh")
        .arg(workspace().join("tests/cudasim").join(name))
        .output()
        .map_err(|e| format!("{name}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{name}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

struct Libs {
    real: PathBuf,
    sim: PathBuf,
    kernels: PathBuf,
    native_app: PathBuf,
}

fn prerequisites(test: &str) -> Option<Libs> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "root");
        return None;
    }
    let real = match cudasim_script("fetch-cudart.sh") {
        Ok(p) => p,
        Err(e) => {
            skip(test, &format!("the real libcudart.so.12 (tests/cudasim/fetch-cudart.sh): {e}"));
            return None;
        }
    };
    let sim_dir = match cudasim_script("build.sh") {
        Ok(d) => d,
        Err(e) => {
            skip(test, &format!("building tests/cudasim (gcc): {e}"));
            return None;
        }
    };
    Some(Libs {
        real,
        sim: sim_dir.join("libcudart.so.12"),
        kernels: sim_dir.join("libfakekernels.so"),
        native_app: sim_dir.join("native_app"),
    })
}

/// The line of each `# @name` / `/* @name */` marker in a source file.
fn markers(source: &Path) -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(source).unwrap();
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some((_, name)) = line.rsplit_once("# @").or_else(|| line.rsplit_once("/* @")) {
            m.insert(name.trim_end_matches("*/").trim().to_owned(), i as u32 + 1);
        }
    }
    m
}

/// A private copy of `lib` named `name` (its own inode: probes of other
/// tests running at the same time on the original do not show in it),
/// removed with the returned guard.
fn private_copy(lib: &Path, test: &str, name: &str) -> (PathBuf, RemoveOnDrop) {
    let dir = std::env::temp_dir().join(format!("infertrace-cuda-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(lib, &tmp).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    (path, RemoveOnDrop(dir))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Traced {
    report: CudaReport,
    notes: Vec<String>,
    markers: BTreeMap<String, u32>,
    pid: u32,
    window_ns: u64,
    stderr: String,
    /// Threads with entries left in the kernel's CUDA_STATS at the end.
    leftover_tids: Vec<u32>,
}

impl Traced {
    fn line(&self, marker: &str) -> u32 {
        *self.markers.get(marker).unwrap_or_else(|| panic!("no marker {marker}"))
    }

    fn calls_at(&self, api: &str, marker: &str) -> Vec<&CudaCall> {
        let line = self.line(marker);
        self.report.calls.iter().filter(|c| c.api == api && c.site.line == Some(line)).collect()
    }

    #[track_caller]
    fn call(&self, api: &str, marker: &str) -> &CudaCall {
        let v = self.calls_at(api, marker);
        assert_eq!(v.len(), 1, "{api} at @{marker}: {v:#?}\n{}", self.describe());
        v[0]
    }

    fn findings_at(&self, marker: &str) -> Vec<&str> {
        let line = self.line(marker);
        let mut v: Vec<&str> =
            self.report.findings.iter().filter(|f| f.site.line == Some(line)).map(|f| f.kind.as_str()).collect();
        v.sort_unstable();
        v
    }

    fn describe(&self) -> String {
        let mut s = String::new();
        crate::report::text::cuda::render(&mut s, &self.report);
        format!("{s}\nnotes: {:#?}\nstderr: {}", self.notes, self.stderr)
    }
}

fn python_command() -> String {
    std::env::var("INFERTRACE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Launches the workload, traces it to its end, returns the report.
fn trace(mode: &str, cudart: &Path, kernels: &Path, env: &[(&str, &str)]) -> Traced {
    // The interpreter itself, not a pyenv shim script.
    let exe = Command::new(python_command()).args(["-c", "import sys; print(sys.executable)"]).output().unwrap();
    let exe = String::from_utf8_lossy(&exe.stdout).trim().to_owned();
    let script = workspace().join("tests/workloads/cuda_patterns.py");
    let mut cmd = Command::new(&exe);
    cmd.arg(&script).arg(mode).env("CUDART", cudart).env("FAKE_KERNELS", kernels).envs(env.iter().copied());
    trace_command(cmd, &script, true)
}

/// Traces `cmd` to its end (`python`: wait until its interpreter is found,
/// for Python stacks, before scanning).
fn trace_command(mut cmd: Command, source: &Path, python_expected: bool) -> Traced {
    let btf = crate::session::load_btf().expect("kernel BTF");
    let mut ebpf: Ebpf = EbpfLoader::new().btf(Some(&btf)).load(crate::probe::object_bytes()).expect("load object");
    let start = crate::clock::monotonic_ns();
    let mut cuda = CudaTracer::new();
    let mut python = PythonTargets::default();
    let mut symbolizer = Symbolizer::new();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    process::add_target(&mut ebpf, pid, tracer_common::target_flags::LAUNCHED).unwrap();
    let mut notes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut python_found = !python_expected;
    let mut scanned = false;
    let mut last_refresh = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "workload {cmd:?} did not finish");
        if !python_found {
            python.examine(&mut ebpf, pid, true).unwrap();
            python_found = python.versions().contains_key(&pid);
        }
        if python_found {
            // As the session does: one scan, then polls.
            if !scanned {
                notes.extend(cuda.scan(&mut ebpf, pid).unwrap());
                scanned = true;
            }
            cuda.poll(&mut ebpf).unwrap();
            if last_refresh.elapsed() > Duration::from_millis(100) {
                python.refresh_all(&mut ebpf).unwrap();
                python.resolve_new(&mut ebpf).unwrap();
                symbolizer.observe_process(pid);
                last_refresh = Instant::now();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "workload {cmd:?} failed: {status}\n{stderr}\nnotes: {notes:#?}");
    let window_ns = crate::clock::monotonic_ns() - start;
    let leftover_tids: Vec<u32> = {
        let map: aya::maps::HashMap<_, tracer_common::cuda::CudaKey, tracer_common::cuda::CudaStats> =
            crate::probe::hash_map(&mut ebpf, "CUDA_STATS").unwrap();
        map.keys().filter_map(Result::ok).map(|k| k.tid).collect()
    };
    let mut resolver = crate::stacks::StackResolver::load(&mut ebpf, &mut symbolizer, &mut python).unwrap();
    let report = cuda.finish(&mut ebpf, &mut resolver, window_ns).unwrap();
    let lost: Vec<(String, u64)> = process::lost_counters(&mut ebpf).unwrap();
    assert!(lost.iter().all(|(n, _)| n != "cuda_lost"), "CUDA events lost: {lost:?}");
    Traced { report, notes, markers: markers(source), pid, window_ns, stderr, leftover_tids }
}

#[test]
fn real_libcudart_calls_sites_and_findings() {
    let test = "real_libcudart_calls_sites_and_findings";
    let Some(libs) = prerequisites(test) else { return };
    let (lib, _dir) = private_copy(&libs.real, test, "libcudart.so.12");
    let t = trace("patterns", &lib, &libs.kernels, &[]);
    eprintln!("{}", t.describe());
    let r = &t.report;
    assert_eq!(r.libraries.len(), 1, "{:#?}", r.libraries);
    assert_eq!(Path::new(&r.libraries[0].path), lib);
    assert_eq!(r.libraries[0].functions.len(), 27, "{:#?}", r.libraries[0]);
    assert_eq!(r.libraries[0].pids, vec![t.pid]);
    // Without a driver every call fails with cudaErrorInsufficientDriver (35).
    const NO_DRIVER: i32 = 35;
    let expect = |api: &str, marker: &str, kind: Option<&str>, count: u64, bytes: u64| {
        let c = t.call(api, marker);
        assert_eq!(
            (c.kind.as_deref(), c.count, c.bytes, c.errors),
            (kind, count, bytes, count),
            "{api} @{marker}\n{}",
            t.describe()
        );
        assert_eq!(c.return_codes, BTreeMap::from([(NO_DRIVER, count)]), "{api} @{marker}");
        assert_eq!(c.site.function, function_of(marker), "{api} @{marker}");
        assert!(c.site.file.as_deref().is_some_and(|f| f.ends_with("cuda_patterns.py")), "{c:?}");
        c
    };
    let small = expect("cudaMemcpyAsync", "small_copy", Some("HtoD"), 200, 200 * 4096);
    assert_eq!((small.pinned, small.pageable), (Some(0), Some(200)));
    expect("cudaStreamSynchronize", "small_sync", None, 200, 0);
    expect("cudaMemcpyAsync", "item_copy", Some("DtoH"), 100, 400);
    expect("cudaStreamSynchronize", "item_sync", None, 100, 0);
    expect("cudaMemcpyAsync", "const_copy", Some("HtoD"), 64, 64 * 65536);
    expect("cudaMemcpy", "pageable_copy", Some("HtoD"), 20, 20 * (8 << 20));
    expect("cudaMemcpy", "large_copy", Some("HtoD"), 1, 64 << 20);
    expect("cudaMemcpyAsync", "large_async", Some("HtoD"), 1, 64 << 20);
    expect("cudaStreamSynchronize", "large_sync", None, 1, 0);
    expect("cudaMemcpyAsync_ptsz", "ptsz_copy", Some("HtoD"), 40, 40 * 2048);
    expect("cudaStreamSynchronize_ptsz", "ptsz_sync", None, 40, 0);
    expect("cudaMemcpy_ptds", "ptds_copy", Some("DtoD"), 5, 5 * 1024);
    expect("cudaMemcpy2DAsync", "copy2d_async", Some("HtoD"), 16, 16 * 2000);
    expect("cudaStreamSynchronize", "copy2d_sync", None, 16, 0);
    expect("cudaMemcpy2DAsync", "copy2d_other", Some("HtoD"), 1, 2000);
    expect("cudaStreamSynchronize", "other_stream_sync", None, 1, 0);
    expect("cudaMemcpy2D", "copy2d", Some("DtoH"), 2, 2 * 500);
    expect("cudaMemcpy2DAsync_ptsz", "copy2d_ptsz", Some("HtoD"), 1, 256);
    expect("cudaMemcpy2D_ptds", "copy2d_ptds", Some("DtoD"), 1, 64);
    expect("cudaMemcpyAsync", "default_copy", Some("Default"), 3, 3 * 512);
    expect("cudaMemcpyPeer", "peer_copy", Some("DtoD"), 3, 3 << 20);
    expect("cudaMemcpyPeerAsync", "peer_async", Some("DtoD"), 2, 2 * 4096);
    expect("cudaMallocAsync", "malloc_async", None, 2, 2 << 20);
    expect("cudaFreeAsync", "free_async", None, 1, 0);
    expect("cudaMalloc", "malloc", None, 4, 4 << 20);
    expect("cudaFree", "free", None, 2, 0);
    expect("cudaHostAlloc", "host_alloc", None, 1, 1 << 20);
    expect("cudaFreeHost", "free_host", None, 1, 0);
    expect("cudaMallocHost", "malloc_host", None, 1, 2 << 20);
    expect("cudaHostRegister", "host_register", None, 1, 8192);
    expect("cudaHostUnregister", "host_unregister", None, 1, 0);
    expect("cudaDeviceSynchronize", "device_sync", None, 3, 0);
    expect("cudaEventSynchronize", "event_sync", None, 2, 0);
    // Nothing else: every call has its marker's line.
    let total: u64 = r.calls.iter().map(|c| c.count).sum();
    assert_eq!(total, 200 + 200 + 100 + 100 + 64 + 20 + 3 + 40 + 40 + 5 + 16 + 16 + 1 + 1 + 2 + 1 + 1 + 3 + 4 + 2 + 1 + 1 + 1 + 1 + 1 + 3 + 2 + 3 + 2 + 2 + 1);

    // Launches: by kernel (symbolized, demangled) and site.
    let launch = |kernel: &str, marker: &str| {
        let line = t.line(marker);
        let v: Vec<&CudaLaunch> = r.launches.iter().filter(|l| l.site.line == Some(line)).collect();
        assert_eq!(v.len(), 1, "{kernel}: {:#?}", r.launches);
        assert_eq!(v[0].kernel, kernel);
        v[0].clone()
    };
    let vec = launch("vector_add_kernel", "launch_vec");
    assert_eq!((vec.count, vec.api.as_str()), (300, "cudaLaunchKernel"));
    let mm = launch("matmul_kernel(float*, float*, float*, int)", "launch_mm");
    assert_eq!((mm.count, mm.api.as_str()), (100, "cudaLaunchKernel_ptsz"));
    assert_eq!(r.launches.len(), 2);

    // Findings at the right lines, none at the single large copies.
    assert_eq!(t.findings_at("small_copy"), ["small_htod_copies", "sync_after_copy"], "{}", t.describe());
    assert_eq!(t.findings_at("item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("const_copy"), ["repeated_upload"]);
    assert_eq!(t.findings_at("pageable_copy"), ["pageable_copy"]);
    assert_eq!(t.findings_at("ptsz_copy"), ["small_htod_copies", "sync_after_copy"]);
    // 16 copies on stream 0x5a0 (read from the stack), each followed by a
    // sync of that stream.
    assert_eq!(t.findings_at("copy2d_async"), ["sync_after_copy"]);
    for quiet in ["large_copy", "large_async", "large_sync", "copy2d_other", "default_copy", "malloc"] {
        assert!(t.findings_at(quiet).is_empty(), "@{quiet}: {:?}", t.findings_at(quiet));
    }
    assert_eq!(r.findings.len(), 8, "{:#?}", r.findings);
    let f = r.findings.iter().find(|f| f.kind == "tiny_dtoh_sync").unwrap();
    assert_eq!((f.count, f.bytes), (100, 400));
    let f = r.findings.iter().find(|f| f.kind == "repeated_upload").unwrap();
    assert_eq!((f.count, f.bytes), (64, 64 * 65536));
}

/// The Python function holding a marker (for the expected sites).
fn function_of(marker: &str) -> String {
    let text = std::fs::read_to_string(workspace().join("tests/workloads/cuda_patterns.py")).unwrap();
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

#[test]
fn simulator_durations_pinned_memory_and_leaks() {
    let test = "simulator_durations_pinned_memory_and_leaks";
    let Some(libs) = prerequisites(test) else { return };
    let t = trace("sim", &libs.sim, &libs.kernels, &[("END_SLEEP_S", "0.2")]);
    eprintln!("{}", t.describe());
    let n = 32u64 << 20;
    let pinned = t.call("cudaMemcpyAsync", "sim_pinned_copy");
    let pageable = t.call("cudaMemcpyAsync", "sim_pageable_copy");
    assert_eq!((pinned.count, pinned.bytes, pinned.errors, pinned.pinned, pinned.pageable), (40, 40 * n, 0, Some(40), Some(0)));
    assert_eq!((pageable.count, pageable.bytes, pageable.pinned, pageable.pageable), (40, 40 * n, Some(0), Some(40)));
    // Pageable: the call blocks for the copy at 3 GB/s (11.2 ms for 32 MiB).
    let per_pageable = pageable.total_ns / 40;
    assert!(per_pageable >= 11_000_000, "pageable copy {per_pageable} ns");
    // Pinned: the call returns at once; the sync waits for 12 GB/s (2.8 ms).
    let per_pinned = pinned.total_ns / 40;
    assert!(per_pinned < 500_000, "pinned {per_pinned} ns vs pageable {per_pageable} ns");
    let sync = t.call("cudaStreamSynchronize", "sim_pinned_sync");
    assert!(sync.total_ns / 40 >= 2_700_000, "pinned sync {} ns", sync.total_ns / 40);
    // .item() after 10 launches of 100 us: a pageable D2H copy waits for
    // the stream to drain (in the copy), then the sync.
    let item = t.call("cudaMemcpyAsync", "sim_item_copy").total_ns + t.call("cudaStreamSynchronize", "sim_item_sync").total_ns;
    assert!(item / 40 >= 50_000, "item copy + sync {} ns", item / 40);
    let launches: u64 = t.report.launches.iter().filter(|l| l.kernel == "vector_add_kernel").map(|l| l.count).sum();
    assert_eq!(launches, 400);
    let leak = t.call("cudaMalloc", "sim_leak");
    assert_eq!((leak.count, leak.bytes, leak.errors), (40, 40 << 20, 0));

    // Most of the window goes to copies and syncs; the pageable copies
    // take the most of it.
    assert_eq!(t.findings_at("sim_pageable_copy"), ["copy_time_share", "pageable_copy", "sync_after_copy"], "{}", t.describe());
    assert_eq!(t.findings_at("sim_pinned_copy"), ["sync_after_copy"]);
    assert_eq!(t.findings_at("sim_item_copy"), ["tiny_dtoh_sync"]);
    assert_eq!(t.findings_at("sim_leak"), ["device_memory_leak"]);
    assert!(t.findings_at("sim_tmp_malloc").is_empty());
    assert!(t.findings_at("sim_malloc_input").is_empty());
    let share = t.report.findings.iter().find(|f| f.kind == "copy_time_share").expect("copy_time_share");
    assert!(share.time_ns * 5 >= t.window_ns, "{share:?}");
    assert_eq!(t.report.findings.len(), 6, "{:#?}", t.report.findings);
    let leak = t.report.findings.iter().find(|f| f.kind == "device_memory_leak").unwrap();
    assert_eq!((leak.count, leak.bytes), (40, 40 << 20));
}

#[test]
fn library_loaded_after_attach() {
    let test = "library_loaded_after_attach";
    let Some(libs) = prerequisites(test) else { return };
    // A renamed copy, as auditwheel vendors it into wheels.
    let (lib, _dir) = private_copy(&libs.real, test, "libcudart-5f1a2b3c.so.12");
    let t = trace("late", &lib, &libs.kernels, &[("LATE_S", "1.0")]);
    assert!(t.notes.is_empty(), "libcudart was not mapped at the first scan: {:?}", t.notes);
    let c = t.call("cudaMemcpyAsync", "small_copy");
    assert_eq!((c.count, c.bytes), (50, 50 * 4096));
    assert_eq!(t.call("cudaStreamSynchronize", "small_sync").count, 50);
    assert!(
        t.report.notes.iter().any(|n| n.contains("CUDA runtime") && n.contains("libcudart-5f1a2b3c.so.12")),
        "{:?}",
        t.report.notes
    );
}

#[test]
fn native_call_site() {
    let test = "native_call_site";
    let Some(libs) = prerequisites(test) else { return };
    let source = workspace().join("tests/cudasim/native_app.c");
    let t = trace_command(Command::new(&libs.native_app), &source, false);
    eprintln!("{}", t.describe());
    let copy = t.call("cudaMemcpyAsync", "native_copy");
    assert_eq!((copy.kind.as_deref(), copy.count, copy.bytes, copy.errors), (Some("HtoD"), 32, 32 * 4096, 32));
    assert_eq!(copy.site.function, "upload_batch");
    assert!(copy.site.file.as_deref().is_some_and(|f| f.ends_with("native_app.c")), "{:?}", copy.site);
    assert_eq!(t.call("cudaStreamSynchronize", "native_sync").count, 32);
    assert_eq!(t.findings_at("native_copy"), ["small_htod_copies", "sync_after_copy"]);
}

#[test]
fn exited_threads_leave_the_kernel_maps() {
    let test = "exited_threads_leave_the_kernel_maps";
    let Some(libs) = prerequisites(test) else { return };
    let (lib, _dir) = private_copy(&libs.real, test, "libcudart.so.12");
    let t = trace("threads", &lib, &libs.kernels, &[]);
    // The workers' entries were moved out while the main thread waited.
    assert!(t.leftover_tids.iter().all(|tid| *tid == t.pid), "{:?} (pid {})", t.leftover_tids, t.pid);
    let c = t.call("cudaMemcpyAsync", "thread_copy");
    assert_eq!((c.count, c.bytes, c.errors), (80, 80 * 1024, 80), "{}", t.describe());
    assert_eq!(t.call("cudaStreamSynchronize", "thread_sync").count, 80);
    assert_eq!(t.call("cudaMemcpyAsync", "small_copy").count, 10);
    // The same (zeroed) 1 KiB each time; pairs are per thread: every
    // worker copy was followed by its own sync.
    assert_eq!(t.findings_at("thread_copy"), ["repeated_upload", "sync_after_copy"]);
    let f = t.report.findings.iter().find(|f| f.kind == "sync_after_copy" && f.site.line == Some(t.line("thread_copy"))).unwrap();
    assert_eq!(f.count, 80);
}
