//! NVML GPU sampling through `infertrace record` (tracer-user/src/families/nvml/mod.rs).
//!
//! The library is tests/nvmlsim: a STAND-IN for libnvidia-ml.so.1, NOT NVML
//! (no GPU here), built by tests/nvmlsim/build.sh into target/nvmlsim and
//! found through LD_LIBRARY_PATH, as the real one is found through the
//! loader's path. It answers with fixed values for two fake GPUs:
//!   GPU 0: util 37 %, memory util 12 %, 1 GiB used of 16 GiB, PCIe TX 1000 KB/s, RX 2000 KB/s
//!   GPU 1: util 81 %, memory util 45 %, 3 GiB used of 80 GiB, PCIe not supported
//! Variants: old/ (no nvmlDeviceGetMemoryInfo_v2, no PCIe throughput; v1
//! memory reports used + 64 MiB reserved) and broken/ (no
//! nvmlDeviceGetUtilizationRates, no nvmlShutdown).
//!
//! Needs root, the binary and gcc; under CI=true a missing one fails the test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const NOT_FOUND: &str = "NVML not available (libnvidia-ml.so.1 not found): no GPU utilization samples";

/// Root, the binary, gcc, and the simulator (built when missing or stale):
/// its directory.
fn simulator(test: &str) -> Option<PathBuf> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let o = Command::new("sh").arg(workspace_root().join("tests/nvmlsim/build.sh")).output();
    match o {
        Ok(o) if o.status.success() => Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        Ok(o) => {
            skip(test, &format!("tests/nvmlsim/build.sh failed: {}", String::from_utf8_lossy(&o.stderr)));
            None
        }
        Err(e) => {
            skip(test, &format!("running tests/nvmlsim/build.sh: {e}"));
            None
        }
    }
}

/// Where libnvidia-ml.so.1 comes from in a run.
enum Lib<'a> {
    /// LD_LIBRARY_PATH=dir.
    Dir(&'a Path),
    /// No LD_LIBRARY_PATH; INFERTRACE_NVML_LIB=path when given.
    System(Option<&'a Path>),
}

/// `infertrace record -q --format json -o DIR/rec.itr ARGS -- sleep SECS`.
#[track_caller]
fn record(dir: &TempDir, lib: Lib, args: &[&str], secs: &str) -> (Run, Report) {
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).args(args).args(["--", "sleep", secs]);
    cmd.env_remove("LD_LIBRARY_PATH").env_remove("INFERTRACE_NVML_LIB");
    match lib {
        Lib::Dir(d) => {
            cmd.env("LD_LIBRARY_PATH", d);
        }
        Lib::System(Some(p)) => {
            cmd.env("INFERTRACE_NVML_LIB", p);
        }
        Lib::System(None) => {}
    }
    let r = run_cmd(&mut cmd, RUN_TIMEOUT);
    r.assert_ok();
    assert!(!r.stderr.contains("panicked"), "{}", r.describe());
    assert!(out.is_file(), "recording not written\n{}", r.describe());
    let rep = r.json();
    rep.check_invariants();
    (r, rep)
}

fn samples(rep: &Report) -> Vec<Value> {
    match rep.0["cuda"]["gpu_samples"].as_array() {
        Some(v) => v.clone(),
        None => Vec::new(),
    }
}

/// `notes` and `cuda.notes` together.
fn all_notes(rep: &Report) -> Vec<String> {
    [&rep.0["notes"], &rep.0["cuda"]["notes"]]
        .iter()
        .filter_map(|v| v.as_array())
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect()
}

fn nvml_lines(notes: &[String]) -> Vec<&String> {
    notes.iter().filter(|n| n.starts_with("NVML")).collect()
}

fn u(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} is not a u64: {v}"))
}

fn f(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or_else(|| panic!("{field} is not a number: {v}"))
}

/// The samples of `gpu`, in order.
fn of_gpu(all: &[Value], gpu: u64) -> Vec<&Value> {
    all.iter().filter(|s| s["gpu"] == gpu).collect()
}

#[test]
fn samples_the_simulated_gpus_at_10_hz() {
    let test = "samples_the_simulated_gpus_at_10_hz";
    let Some(sim) = simulator(test) else { return };
    let dir = TempDir::new("nvml-10hz");
    let (r, rep) = record(&dir, Lib::Dir(&sim), &["--gpu-sample-hz", "10"], "1");
    let window = u(&rep.0, "duration_ns");
    let all = samples(&rep);
    assert!(!all.is_empty(), "no gpu_samples\n{}", r.describe());
    let gpus: std::collections::BTreeSet<u64> = all.iter().map(|s| u(s, "gpu")).collect();
    assert_eq!(gpus.into_iter().collect::<Vec<_>>(), vec![0, 1], "{all:?}");

    // (gpu, util, mem util, used, total, tx, rx, name, uuid)
    let want = [
        (0, 37.0, 12.0, GIB, 16 * GIB, Some(1000 * 1024), Some(2000 * 1024), "nvmlsim GPU 0 (fake)", "GPU-00000000-0000-4000-8000-00000000a100"),
        (1, 81.0, 45.0, 3 * GIB, 80 * GIB, None, None, "nvmlsim GPU 1 (fake)", "GPU-00000000-0000-4000-8000-00000000a101"),
    ];
    for (gpu, util, mem_util, used, total, tx, rx, name, uuid) in want {
        let v = of_gpu(&all, gpu);
        // 10 Hz over the window: at least 5 in a second, never more than
        // one per 100 ms (+1 for the first round).
        let most = window / 100_000_000 + 1;
        assert!(v.len() >= 5 && v.len() as u64 <= most, "GPU {gpu}: {} samples in {window} ns (want 5..={most})", v.len());
        for (i, s) in v.iter().enumerate() {
            assert_eq!(f(s, "util_percent"), util, "{s}");
            assert_eq!(f(s, "mem_util_percent"), mem_util, "{s}");
            assert_eq!(u(s, "mem_used_bytes"), used, "{s}");
            assert_eq!(u(s, "mem_total_bytes"), total, "{s}");
            assert_eq!(s["pcie_tx_bytes_per_s"].as_u64(), tx, "{s}");
            assert_eq!(s["pcie_rx_bytes_per_s"].as_u64(), rx, "{s}");
            assert!(s.get("pcie_tx_bytes_per_s").is_some() && s.get("pcie_rx_bytes_per_s").is_some(), "fields always present: {s}");
            if i == 0 {
                assert_eq!((s["name"].as_str(), s["uuid"].as_str()), (Some(name), Some(uuid)), "first sample of GPU {gpu}: {s}");
            } else {
                assert!(s.get("name").is_none() && s.get("uuid").is_none(), "name/uuid on a later sample: {s}");
            }
            assert!(u(s, "ts_ns") <= window, "sample after the window ({window} ns): {s}");
        }
        let ts: Vec<u64> = v.iter().map(|s| u(s, "ts_ns")).collect();
        assert!(ts.windows(2).all(|w| w[0] < w[1]), "GPU {gpu}: timestamps not increasing: {ts:?}");
        // Spread over the window, not bunched: ~100 ms apart on average (a
        // round the scheduler delayed is followed by an on-time one).
        let mean_gap = (ts[ts.len() - 1] - ts[0]) / (ts.len() as u64 - 1);
        assert!(mean_gap >= 80_000_000, "GPU {gpu}: samples {mean_gap} ns apart on average: {ts:?}");
        assert!(ts[0] < 500_000_000 && ts[ts.len() - 1] > window / 2, "GPU {gpu}: samples do not cover the window ({window} ns): {ts:?}");
    }

    let notes = all_notes(&rep);
    let nvml = nvml_lines(&notes);
    let status = format!("NVML: 2 GPUs sampled at 10 Hz ({} samples)", all.len());
    assert_eq!(nvml, vec![&status], "one NVML status line: {notes:?}");
    assert!(
        notes.iter().any(|n| n.starts_with("GPU 1: PCIe throughput not available (not supported")),
        "GPU 1's PCIe note: {notes:?}"
    );

    // The recording holds the samples: `report` renders them again.
    let rec = dir.join("rec.itr");
    let again = run_infertrace([OsStr::new("report"), rec.as_os_str(), OsStr::new("--format"), OsStr::new("json")]);
    again.assert_ok();
    assert_eq!(samples(&again.json()), all, "report FILE differs from record");
    let text = run_infertrace([OsStr::new("report"), rec.as_os_str()]);
    text.assert_ok();
    let t = &text.stdout;
    assert!(t.contains(&format!("GPUs (NVML; whole devices, every process on them; {} samples in", all.len())), "{t}");
    for s in ["37 / 37 / 37", "81 / 81 / 81", "1.0 GiB (1.0 GiB) / 16.0 GiB", "1.02 MB/s", "2.05 MB/s", "nvmlsim GPU 1 (fake)", "util% over the window"] {
        assert!(t.contains(s), "text report lacks {s:?}:\n{t}");
    }

    // The HTML page charts the same samples: its data's points are the
    // recording's (utilisation, memory used, PCIe where reported).
    let page = run_infertrace([OsStr::new("report"), rec.as_os_str(), OsStr::new("--format"), OsStr::new("html")]);
    page.assert_ok();
    let data = &page.stdout[page.stdout.find("id=\"infertrace-data\"").expect("the page's data")..];
    let data: Value = serde_json::from_str(&data[data.find('>').unwrap() + 1..data.find("</script>").unwrap()]).unwrap();
    let series = |name: &str| -> Option<Vec<(f64, f64)>> {
        let s = data["series"].as_array().unwrap().iter().find(|s| s["name"] == name)?;
        Some(s["points"].as_array().unwrap().iter().map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap())).collect())
    };
    for gpu in [0, 1] {
        let v = of_gpu(&all, gpu);
        let at = |s: &Value| u(s, "ts_ns") as f64 / 1e9;
        assert_eq!(series(&format!("GPU {gpu} utilisation")), Some(v.iter().map(|s| (at(s), f(s, "util_percent"))).collect()), "GPU {gpu} utilisation chart");
        assert_eq!(series(&format!("GPU {gpu} memory used")), Some(v.iter().map(|s| (at(s), u(s, "mem_used_bytes") as f64)).collect()), "GPU {gpu} memory chart");
        let rx: Vec<(f64, f64)> = v.iter().filter_map(|s| s["pcie_rx_bytes_per_s"].as_u64().map(|b| (at(s), b as f64))).collect();
        assert_eq!(series(&format!("GPU {gpu} PCIe host to device")), (!rx.is_empty()).then_some(rx), "GPU {gpu} PCIe chart");
    }
}

#[test]
fn gpu_sample_hz_out_of_range_is_rejected() {
    require!("gpu_sample_hz_out_of_range_is_rejected", Binary);
    for bad in ["0", "11", "-3", "five"] {
        let dir = TempDir::new("nvml-hz");
        let r = run_cmd(
            infertrace(["record", "--gpu-sample-hz", bad, "--", "true"]).current_dir(dir.path()),
            Duration::from_secs(30),
        );
        assert!(r.code().is_some_and(|c| c != 0 && c != 101), "--gpu-sample-hz {bad}: want a usage error\n{}", r.describe());
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        // One error line, and clap's "For more information, try '--help'." after it.
        let errors: Vec<&&str> = lines.iter().filter(|l| !l.starts_with("For more information")).collect();
        assert_eq!(errors.len(), 1, "--gpu-sample-hz {bad}: one error line\n{}", r.describe());
        let e = errors[0];
        assert!(e.starts_with("error: ") && e.contains("--gpu-sample-hz") && e.contains(bad), "{e:?}");
        if bad == "0" || bad == "11" {
            assert!(e.contains("1..=10"), "the range is named: {e:?}");
        }
        assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind\n{}", r.describe());
    }
}

/// Whether the machine has a real libnvidia-ml.so.1 the loader would find:
/// asks the dynamic loader itself (no library directory assumed).
fn system_has_nvml() -> bool {
    // SAFETY: a NUL-terminated name; the handle is closed at once.
    unsafe {
        let h = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

#[test]
fn without_nvml_one_notice_and_no_samples() {
    let test = "without_nvml_one_notice_and_no_samples";
    let Some(sim) = simulator(test) else { return };
    let dir = TempDir::new("nvml-absent");
    let missing = dir.join("nowhere").join("libnvidia-ml.so.1");
    let (lib, want) = if system_has_nvml() {
        // The real one would be found: name a missing file instead.
        eprintln!("{test}: this machine has libnvidia-ml.so.1; using INFERTRACE_NVML_LIB={}", missing.display());
        (Lib::System(Some(&missing)), format!("NVML not available ({} not found): no GPU utilization samples", missing.display()))
    } else {
        (Lib::System(None), NOT_FOUND.to_owned())
    };
    let (r, rep) = record(&dir, lib, &["--gpu-sample-hz", "10"], "0.5");
    assert!(samples(&rep).is_empty(), "samples without NVML\n{}", r.describe());
    let notes = all_notes(&rep);
    assert_eq!(nvml_lines(&notes), vec![&want], "exactly one NVML notice: {notes:?}");
    assert!(rep.0["notes"].as_array().is_some_and(|n| n.iter().any(|x| x == &Value::from(want.clone()))), "in `notes`: {notes:?}");
    assert!(!want.contains('\n'));

    // --no-cuda: no NVML at all, even with the simulator on the path.
    let (r, rep) = record(&dir, Lib::Dir(&sim), &["--no-cuda"], "0.3");
    assert!(samples(&rep).is_empty(), "samples with --no-cuda\n{}", r.describe());
    assert!(rep.0["cuda"].is_null(), "cuda with --no-cuda: {}", rep.0["cuda"]);
    let notes = all_notes(&rep);
    assert!(nvml_lines(&notes).is_empty() && !notes.iter().any(|n| n.contains("GPU")), "NVML notes with --no-cuda: {notes:?}");
}

#[test]
fn old_and_incomplete_libraries() {
    let test = "old_and_incomplete_libraries";
    let Some(sim) = simulator(test) else { return };
    let dir = TempDir::new("nvml-old");

    // No nvmlDeviceGetMemoryInfo_v2, no PCIe throughput: v1 memory
    // (used + reserved), PCIe null and noted once per GPU. Default rate 5 Hz.
    let (r, rep) = record(&dir, Lib::Dir(&sim.join("old")), &[], "1");
    let all = samples(&rep);
    let window = u(&rep.0, "duration_ns");
    for (gpu, used) in [(0, GIB + 64 * MIB), (1, 3 * GIB + 64 * MIB)] {
        let v = of_gpu(&all, gpu);
        let most = window / 200_000_000 + 1;
        assert!(v.len() >= 3 && v.len() as u64 <= most, "GPU {gpu}: {} samples at 5 Hz in {window} ns\n{}", v.len(), r.describe());
        for s in v {
            assert_eq!(u(s, "mem_used_bytes"), used, "{s}");
            assert!(s["pcie_tx_bytes_per_s"].is_null() && s["pcie_rx_bytes_per_s"].is_null(), "{s}");
        }
    }
    let notes = all_notes(&rep);
    assert_eq!(nvml_lines(&notes), vec![&format!("NVML: 2 GPUs sampled at 5 Hz ({} samples)", all.len())], "{notes:?}");
    let pcie: Vec<&String> = notes.iter().filter(|n| n.contains("nvmlDeviceGetPcieThroughput missing")).collect();
    assert_eq!(pcie.len(), 2, "one PCIe note per GPU: {notes:?}");

    // No nvmlDeviceGetUtilizationRates and no nvmlShutdown: one notice, no
    // samples, no panic (nvml-wrapper-sys panics calling a missing function).
    let (r, rep) = record(&dir, Lib::Dir(&sim.join("broken")), &["--gpu-sample-hz", "10"], "0.3");
    assert!(samples(&rep).is_empty(), "{}", r.describe());
    let notes = all_notes(&rep);
    assert_eq!(
        nvml_lines(&notes),
        vec!["NVML not available (libnvidia-ml.so.1 has no nvmlDeviceGetUtilizationRates): no GPU utilization samples"],
        "{notes:?}"
    );
}

/// GPU 0 of the stand-in with 95% of its 16 GiB in use
/// (`NVMLSIM_GPU0_USED_PERCENT`): one `gpu_memory_near_capacity` finding,
/// for GPU 0 only, with the most in use, the capacity and every sample
/// counted; GPU 1 (4% in use) has none.
#[test]
fn a_gpu_near_capacity_is_a_finding() {
    let test = "a_gpu_near_capacity_is_a_finding";
    let Some(sim) = simulator(test) else { return };
    let dir = TempDir::new("nvml-near");
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).args(["--gpu-sample-hz", "10", "--", "sleep", "1"]);
    cmd.env("LD_LIBRARY_PATH", &sim).env_remove("INFERTRACE_NVML_LIB").env("NVMLSIM_GPU0_USED_PERCENT", "95");
    let r = run_cmd(&mut cmd, RUN_TIMEOUT);
    r.assert_ok();
    let rep = r.json();
    let near: Vec<&Value> =
        rep.0["findings"].as_array().map(|a| a.iter().filter(|f| f["kind"] == "gpu_memory_near_capacity").collect()).unwrap_or_default();
    assert_eq!(near.len(), 1, "{:#}", rep.0["findings"]);
    let f = near[0];
    let used = 16 * GIB / 100 * 95;
    assert_eq!((u(f, "gpu"), u(f, "bytes"), u(f, "capacity_bytes")), (0, used, 16 * GIB), "{f}");
    assert_eq!(u(f, "count"), of_gpu(&samples(&rep), 0).len() as u64, "{f}");
    assert_eq!(f["severity"], "medium", "{f}");
    let text = run_infertrace([std::ffi::OsString::from("report"), out.into()]);
    text.assert_ok();
    assert!(text.stdout.contains("GPU 0 had 15.2 GiB of its 16.0 GiB memory in use (95%)"), "{}", text.stdout);
}
