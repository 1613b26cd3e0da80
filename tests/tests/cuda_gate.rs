//! One probe hit per runtime call (docs/cuda.md, "One probe hit per runtime
//! call"): in one process making hot runtime calls (which enter the driver)
//! and direct driver calls, the driver function reached only through the
//! runtime stops being probed there, and
//!
//! - every runtime call and every direct driver call is still counted
//!   exactly (against the counts the workload made);
//! - the kernel's own run counts of the entry programs (`bpftool prog show`
//!   with `kernel.bpf_stats_enabled=1`, the independent oracle) show one
//!   entry-probe hit per runtime copy once it is off, where there were two;
//! - direct calls of that function made later are found by a re-check and
//!   flagged in the report (`cuda.driver_probes_off[].direct_seen_at_s`,
//!   and a note), never dropped silently.
//!
//! Runs on tests/cudasim's stand-ins (libcudart.so.12 calling libcuda.so.1,
//! like the real runtime; NOT CUDA). Needs root, the binary, gcc, python3,
//! bpftool and multi-uprobe links (Linux 6.6+); under CI=true a missing one
//! fails the test.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

/// `kernel.bpf_stats_enabled` on while alive, the previous value restored
/// on drop (it costs every BPF program a little while on).
struct BpfStats(String);

impl BpfStats {
    fn enable() -> BpfStats {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let before = fs::read_to_string(path)
            .expect("reading kernel.bpf_stats_enabled")
            .trim()
            .to_owned();
        fs::write(path, "1").expect("enabling kernel.bpf_stats_enabled");
        BpfStats(before)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// Run counts of the BPF programs process `holder` holds, by name
/// (`bpftool prog show -j`; names are cut at 15 characters by the kernel).
fn run_counts(holder: u32) -> BTreeMap<String, u64> {
    let held = held_prog_ids(holder);
    assert!(!held.is_empty(), "infertrace {holder} holds no BPF program");
    let o = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("running bpftool");
    assert!(
        o.status.success(),
        "bpftool prog show: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = infertrace_e2e::serde_json::from_slice(&o.stdout).expect("bpftool json");
    let mut out = BTreeMap::new();
    for p in v.as_array().expect("bpftool array") {
        let Some(id) = p["id"].as_u64() else { continue };
        if !held.contains(&id) {
            continue;
        }
        let name = p["name"].as_str().unwrap_or("").to_owned();
        *out.entry(name).or_default() += p["run_cnt"].as_u64().unwrap_or(0);
    }
    out
}

fn wait_file(p: &Path, child: &mut std::process::Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !p.exists() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("infertrace exited ({st}) before {what}");
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

#[test]
fn hot_runtime_calls_hit_one_probe_and_direct_driver_calls_stay_counted() {
    let test = "hot_runtime_calls_hit_one_probe_and_direct_driver_calls_stay_counted";
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc, Need::Bpftool]) {
        return;
    }
    let Some(sim) = cuda_standin_dir(test) else {
        return;
    };
    let Some(python) = python3_executable(test) else {
        return;
    };
    let dir = TempDir::new("cuda-gate");
    // Private copies (the workload waits for int3 on them): the runtime
    // stand-in loads the driver stand-in next to it ($ORIGIN).
    let cudart = dir.join("libcudart.so.12");
    let driver = dir.join("libcuda.so.1");
    fs::copy(sim.join("libcudart.so.12"), &cudart).unwrap();
    fs::copy(sim.join("libcuda.so.1"), &driver).unwrap();
    let sync = dir.join("sync");
    fs::create_dir(&sync).unwrap();
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    let n: u64 = 20_000;

    let stats = BpfStats::enable();
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(dir.join("rec.itr"))
        .arg("--")
        .arg(&python)
        .arg(&source)
        .arg("hot");
    cmd.env("CUDART", &cudart)
        .env("CUDA_DRIVER", &driver)
        .env("FAKE_KERNELS", sim.join("libfakekernels.so"))
        .env("HOT_N", n.to_string())
        .env("HOT_DIRECT_S", "7")
        .env("HOT_SYNC_DIR", &sync)
        .env("END_SLEEP_S", "0.2")
        .stdin(Stdio::null());
    let mut child = spawn(&mut cmd);
    let tracer = child.id();

    wait_file(
        &sync.join("phase1.ready"),
        &mut child,
        "phase 1 (the driver probe coming off)",
    );
    let a = run_counts(tracer);
    fs::write(sync.join("phase1.go"), "").unwrap();
    wait_file(&sync.join("phase2.ready"), &mut child, "phase 2");
    let b = run_counts(tracer);
    fs::write(sync.join("phase2.go"), "").unwrap();
    let run = wait_child(child, Duration::from_secs(120), "infertrace record");
    drop(stats);
    run.assert_ok();
    let num = |key: &str| -> Vec<f64> {
        let line = run
            .stderr
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}`\n{}", run.describe()));
        line.split_whitespace()
            .skip(1)
            .map(|w| w.parse().unwrap())
            .collect()
    };
    let phase1 = num("phase1")[0] as u64;
    let phase2_s = num("phase2")[1];
    let direct = num("direct")[0] as u64;

    // The oracle: entry programs run per runtime copy in phase 2. Runtime
    // copies run `cuda_copy_enter`; the driver copies they enter run
    // `cuda_drv_copy_enter` while the driver is probed, as do the direct
    // driver copies (one per 10 iterations here).
    // (bpftool names a program by its BTF name, else the kernel's first 15 characters.)
    let count = |m: &BTreeMap<String, u64>, name: &str| -> u64 {
        m.iter()
            .filter(|(k, _)| name.starts_with(k.as_str()) && k.len() >= 15.min(name.len()))
            .map(|(_, v)| v)
            .sum()
    };
    let delta = |name: &str| count(&b, name) - count(&a, name);
    let rt_hits = delta("cuda_copy_enter");
    let drv_hits = delta("cuda_drv_copy_enter");
    assert_eq!(
        rt_hits, n,
        "runtime copy entries in phase 2 (bpftool run_cnt): {a:?} -> {b:?}"
    );
    // Before, in phase 1, both were probed: the driver program ran for
    // the runtime copies too (1 000 of them at least before it came off).
    assert!(
        count(&a, "cuda_drv_copy_enter") >= 1000 + 5,
        "driver copy entries in phase 1: {a:?}"
    );
    // The direct driver copies run it: the oracle sees the driver program.
    assert!(
        drv_hits >= n / 10,
        "driver copy entries in phase 2: {drv_hits} (< {} direct): {a:?} -> {b:?}",
        n / 10
    );
    let nested = drv_hits.saturating_sub(n / 10);
    let per_call = (rt_hits + nested) as f64 / n as f64;
    eprintln!(
        "phase 1: {phase1} runtime copies until the driver probe was off; phase 2: {n} in {phase2_s:.2} s, \
         {rt_hits} runtime entries + {drv_hits} driver copy entries ({} direct): {per_call:.3} entry hits per runtime copy",
        n / 10
    );
    // A re-check probes it again for 0.2 s (until the next 100 ms poll)
    // every 5 s: at most ceil(phase 2 / 5 s) of them, 0.35 s each, in
    // phase 2. Both probed: 2 hits per runtime copy.
    let slices = (phase2_s / 5.0).ceil().max(1.0);
    let bound = 1.05 + slices * 0.35 / phase2_s.max(0.35);
    assert!(
        per_call <= bound.min(1.8),
        "{per_call:.3} entry hits per runtime copy (bound {:.2})",
        bound.min(1.8)
    );

    let report = run.json();
    let cuda = &report.0["cuda"];
    let markers = markers_of(&source);
    let calls = cuda["calls"].as_array().expect("cuda.calls");
    let count_at = |list: &Vec<Value>, api: &str, marker: &str| -> u64 {
        let line = markers[marker];
        list.iter()
            .filter(|c| c["api"] == api && c["site"]["line"] == line)
            .map(|c| u(&c["count"]))
            .sum()
    };
    let launches = cuda["launches"].as_array().expect("cuda.launches");
    // Exact: runtime calls, and direct driver calls of functions that
    // stayed probed (direct calls seen before the runtime made them hot).
    for (list, api, marker, want) in [
        (calls, "cudaMemcpyAsync", "hot_rt_copy1", phase1),
        (calls, "cudaMemcpyAsync", "hot_rt_copy", n),
        (launches, "cudaLaunchKernel", "hot_rt_launch1", phase1),
        (launches, "cudaLaunchKernel", "hot_rt_launch", n),
        (launches, "cuLaunchKernel", "hot_drv_launch0", 5),
        (launches, "cuLaunchKernel", "hot_drv_launch", n / 10),
        (calls, "cuMemcpyHtoDAsync_v2", "hot_drv_h2d0", 5),
        (calls, "cuMemcpyHtoDAsync_v2", "hot_drv_h2d", n / 10),
    ] {
        assert_eq!(count_at(list, api, marker), want, "{api} at {marker}: {list:#?}");
    }
    // The runtime's own driver calls are not counted.
    let all_launches: u64 = launches.iter().map(|l| u(&l["count"])).sum();
    assert_eq!(all_launches, phase1 + n + 5 + n / 10, "{launches:#?}");

    // Off, and said so: only the function the runtime alone reached.
    let off = cuda["driver_probes_off"]
        .as_array()
        .expect("cuda.driver_probes_off");
    let names: Vec<&str> = off.iter().filter_map(|o| o["function"].as_str()).collect();
    assert_eq!(names, ["cuMemcpyDtoDAsync_v2"], "{off:#?}");
    let o = &off[0];
    assert!(u(&o["calls_through_runtime"]) >= 1000, "{o}");
    assert!(
        o["library"].as_str().unwrap().ends_with("libcuda.so.1"),
        "{o}"
    );
    // The direct calls made after it went off: a re-check found them
    // (probed for good from then), and the time they went uncounted is
    // reported; what was counted is what ran while probed.
    let seen = o["direct_seen_at_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no re-check saw the {direct} direct calls: {o}"));
    assert!(seen > o["off_at_s"].as_f64().unwrap(), "{o}");
    assert!(o["off_s"].as_f64().unwrap() > 0.0, "{o}");
    let counted = count_at(calls, "cuMemcpyDtoDAsync_v2", "hot_drv_dtod");
    assert!(
        counted >= 1 && counted <= direct,
        "direct cuMemcpyDtoDAsync_v2: {counted} counted of {direct}"
    );
    let notes = report.0["notes"].to_string() + &cuda["notes"].to_string();
    assert!(
        notes.contains("a re-check saw direct calls of cuMemcpyDtoDAsync_v2"),
        "{notes}"
    );
}
