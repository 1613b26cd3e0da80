//! The tracer's own account of its cost (`tracer_overhead`, issue 14):
//! present in every recording; on a syscall-bound loop its estimate of the
//! time added agrees with the slowdown this test measures itself (untraced
//! and traced runs interleaved, the fastest of each, in the loop's CPU
//! time per iteration); and the kernel's `uretprobe`
//! syscall, which every uretprobe'd process makes at each probed return, is
//! reported there as tracer time, not in the target's syscall table.
//!
//! Needs root, the binary, the system's python3, gcc (the CUDA stand-in);
//! under CI=true a missing one fails the test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

/// Iterations of the syscall loop per run (two syscalls each).
const ITERATIONS: u64 = 300_000;
/// Rounds of (untraced, traced).
const ROUNDS: usize = 5;
/// Largest acceptable error of the estimate, relative to the measured slowdown.
const TOLERANCE: f64 = 0.30;

/// The workload's `cpu_ns_per_iter VALUE` line: its CPU time per
/// iteration (the probes run in its context), which other load on a
/// shared machine moves less than its wall time.
fn ns_per_iter(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("cpu_ns_per_iter ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cpu_ns_per_iter line in:\n{stdout}"))
}

/// At nice -20 (as root), like the benchmark: load from elsewhere on a
/// shared machine weighs less on both runs.
fn boosted(program: &Path) -> Command {
    let mut c = Command::new("nice");
    c.args(["-n", "-20"]).arg(program);
    c
}

/// The least disturbed of the runs: load from elsewhere on a shared
/// machine only ever adds time (the calibration takes its fastest rounds
/// for the same reason).
fn fastest(v: &[f64]) -> f64 {
    v.iter().copied().min_by(f64::total_cmp).unwrap_or(f64::NAN)
}

/// `tracer_overhead.targets[]` of `pid`.
fn overhead_of(report: &Value, pid: u64) -> &Value {
    report["tracer_overhead"]["targets"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["pid"].as_u64() == Some(pid)))
        .unwrap_or_else(|| panic!("no tracer_overhead.targets entry for pid {pid}: {}", report["tracer_overhead"]))
}

/// Records `cmd` launched (text report on stdout, the workload's lines
/// with it) and returns the run and the JSON report of the recording.
fn record(out: &Path, options: &[&str], cmd: &[&OsStr]) -> (Run, Value) {
    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "-q".as_ref(), "-o".as_ref(), out.as_os_str()];
    args.extend(options.iter().map(OsStr::new));
    args.push("--".as_ref());
    args.extend_from_slice(cmd);
    let mut c = boosted(&bin());
    c.args(&args);
    let r = run_cmd(&mut c, RUN_TIMEOUT);
    r.assert_ok();
    let rep = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    rep.assert_ok();
    let v: Value = infertrace_e2e::serde_json::from_str(&rep.stdout).expect("JSON report");
    (r, v)
}

#[test]
fn estimate_matches_the_measured_syscall_loop_slowdown() {
    let test = "estimate_matches_the_measured_syscall_loop_slowdown";
    require!(test, Root, Binary);
    let Some((python, _)) = system_python() else {
        return skip(test, "the system's python3 (not pyenv's)");
    };
    let script = workspace_root().join("tests/workloads/syscall_loop.py");
    let tmp = TempDir::new("overhead-syscalls");
    let n = ITERATIONS.to_string();
    let (mut untraced, mut traced, mut estimated) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let r = run_cmd(boosted(&python).arg(&script).arg(&n), RUN_TIMEOUT);
        r.assert_ok();
        untraced.push(ns_per_iter(&r.stdout));

        let out = tmp.join(format!("loop-{round}.itr"));
        // --no-sched: the scheduler and CPU-sampling programs run at every
        // context switch of the machine and are not in the per-target
        // estimate (docs/overhead.md); a loaded machine switches the loop
        // out often enough for them to matter.
        let (r, rep) = record(&out, &["--no-sched"], &[python.as_os_str(), script.as_os_str(), n.as_ref()]);
        traced.push(ns_per_iter(&r.stdout));
        let o = &rep["tracer_overhead"];
        assert_eq!(o["version"], 1, "{o}");
        let cal = &o["calibration"];
        for k in ["uprobe_ns", "syscall_tracepoints_ns"] {
            assert!(cal[k].as_f64().is_some_and(|v| v > 0.0), "calibration.{k} not measured: {o}");
        }
        // What a uretprobe adds (~1 us through the kernel's uretprobe
        // syscall) is measured as a difference of two uprobe timings, and a
        // uprobe hit's cost was seen to move by several us from one
        // attachment to the next on this VM (19-28 us): it can come out 0.
        assert!(cal["uretprobe_ns"].as_f64().is_some_and(|v| v >= 0.0), "calibration.uretprobe_ns missing: {o}");
        assert!(o["tracer"]["cpu_user_ns"].as_u64().unwrap_or(0) + o["tracer"]["cpu_system_ns"].as_u64().unwrap_or(0) > 0, "{o}");
        assert!(o["tracer"]["peak_rss_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{o}");
        let pid = rep["targets"].as_array().and_then(|t| t.iter().find(|t| t["origin"] == "launched")).expect("launched target")["pid"]
            .as_u64()
            .expect("pid");
        let t = overhead_of(&rep, pid);
        // Hits: enter and exit of every syscall the table counted.
        let syscalls: u64 = rep["syscalls"].as_array().expect("syscalls").iter().filter(|r| r["pid"].as_u64() == Some(pid)).map(|r| r["count"].as_u64().unwrap_or(0)).sum();
        assert!(syscalls >= 2 * ITERATIONS, "{syscalls} syscalls counted");
        assert_eq!(t["hits"]["syscalls"].as_u64(), Some(2 * syscalls), "{t}");
        let machine_hits = o["families"].as_array().and_then(|f| f.iter().find(|f| f["family"] == "syscalls")).expect("syscalls family")["hits"]
            .as_u64()
            .unwrap_or(0);
        assert!(machine_hits >= 2 * syscalls, "the kernel counted {machine_hits} runs of the syscall programs, fewer than the target's {syscalls} x 2");
        // Per loop iteration: two syscalls at the estimated cost of one.
        let per_syscall = t["added_ns"]["syscalls"].as_f64().expect("added_ns.syscalls") / syscalls as f64;
        estimated.push(2.0 * per_syscall);
        let share = t["share_percent"].as_f64().unwrap_or(0.0);
        assert!(share > 0.0 && share < 100.0, "share {share}%: {t}");
        eprintln!(
            "round {round}: untraced {:.1} CPU ns/iter, traced {:.1} CPU ns/iter, estimated +{:.1} ns/iter ({share:.1}% of the target's wall time); calibration {cal}",
            untraced[round], traced[round], estimated[round]
        );
    }
    let measured = fastest(&traced) - fastest(&untraced);
    let estimate = fastest(&estimated);
    eprintln!("measured +{measured:.1} ns/iter (fastest of {untraced:?} and {traced:?}), estimated +{estimate:.1} ns/iter (fastest of {estimated:?})");
    assert!(measured > 0.0, "tracing did not slow the loop down: untraced {untraced:?}, traced {traced:?}");
    let error = (estimate - measured).abs() / measured;
    assert!(
        error <= TOLERANCE,
        "estimate +{estimate:.1} ns/iter is {:.0}% off the measured +{measured:.1} ns/iter (untraced {untraced:?}, traced {traced:?})",
        error * 100.0
    );
}

/// The prerequisites of the tests on the CUDA stand-in: the system's
/// python3 and the stand-in's directory (None: skipped, or failed under CI).
fn standin_python(test: &str) -> Option<(PathBuf, PathBuf)> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let Some((python, _)) = system_python() else {
        skip(test, "the system's python3 (not pyenv's)");
        return None;
    };
    Some((python, cuda_standin_dir(test)?))
}

#[test]
fn uretprobe_syscalls_are_tracer_time() {
    let test = "uretprobe_syscalls_are_tracer_time";
    let Some((python, dir)) = standin_python(test) else { return };
    let tmp = TempDir::new("overhead-uretprobe");
    let out = tmp.join("copy.itr");
    let script = workspace_root().join("tests/workloads/bench_cuda.py");
    const COPIES: u64 = 2000;
    let n = COPIES.to_string();
    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "-q".as_ref(), "-o".as_ref(), out.as_os_str(), "--".as_ref()];
    let (cudart, kernels) = (dir.join("libcudart.so.12"), dir.join("libfakekernels.so"));
    // bench_cuda.py --probed: the loop starts once the return probe is in place.
    args.extend([python.as_os_str(), script.as_os_str(), "copy".as_ref(), n.as_ref(), "--probed".as_ref()]);
    let mut c = infertrace(&args);
    c.env("CUDART", &cudart).env("FAKE_KERNELS", &kernels);
    let r = run_cmd(&mut c, RUN_TIMEOUT);
    r.assert_ok();
    let rep = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    rep.assert_ok();
    let v: Value = infertrace_e2e::serde_json::from_str(&rep.stdout).expect("JSON report");
    let pid = v["targets"].as_array().and_then(|t| t.iter().find(|t| t["origin"] == "launched")).expect("launched target")["pid"]
        .as_u64()
        .expect("pid");
    let names: Vec<&str> = v["syscalls"].as_array().expect("syscalls").iter().filter_map(|r| r["name"].as_str()).collect();
    assert!(!names.contains(&"uretprobe"), "the uretprobe syscall is in the target's table: {names:?}");
    let t = overhead_of(&v, pid);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let (major, minor) = {
        let mut it = kernel.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    // The syscall exists on x86_64 from Linux 6.11.
    if cfg!(target_arch = "x86_64") && (major, minor) >= (6, 11) {
        let calls = t["uretprobe_syscalls"].as_u64().unwrap_or(0);
        assert!(calls >= COPIES, "{calls} uretprobe syscalls for at least {COPIES} probed returns: {t}");
    } else {
        eprintln!("note: {test}: kernel {} has no uretprobe syscall on this architecture; only its absence from the table is checked", kernel.trim());
    }
    // The CUDA probes' hits and cost are in the estimate.
    assert!(t["hits"]["cuda"].as_u64().unwrap_or(0) >= 2 * COPIES, "{t}");
    assert!(t["added_ns"]["cuda"].as_u64().unwrap_or(0) > 0, "{t}");
}

/// One `chunk START_UNIX_NS END_UNIX_NS LAUNCHES CPU_NS` line of
/// launch_budget.py --chunks.
struct Chunk {
    start: f64,
    end: f64,
    launches: f64,
    cpu_ns: f64,
}

fn chunks(lines: &[String]) -> Vec<Chunk> {
    lines
        .iter()
        .filter_map(|l| {
            let v: Vec<f64> = l.strip_prefix("chunk ")?.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (v.len() == 4 && v[1] > v[0] && v[2] > 0.0).then(|| Chunk { start: v[0], end: v[1], launches: v[2], cpu_ns: v[3] })
        })
        .collect()
}

/// `record --max-overhead 2` on a launch-heavy loop (the CUDA stand-in:
/// a launch and ~25-70 us of Python per iteration, where one uprobe trap
/// costs 9-28 us depending on the machine): the launch probes are sliced,
/// the counts marked as estimates and within 15% of the launches the loop
/// made in the span they stand for (issue 14), plus how far the machine
/// drifted (the chunks before and after the window differ); the probes' cost the tracer
/// accounts for stays within the budget (+50%); and the loop's own CPU time
/// per iteration over the window (slices and gaps together) is at most 2%
/// above the chunks before and after it, plus a noise margin: 4%, plus
/// twice how far the chunks before and after the window (both untraced)
/// differ from each other. Without the budget the same loop runs ~1.5x
/// slower (the probes take a third of its time while on).
#[test]
fn max_overhead_samples_launches_within_the_budget() {
    let test = "max_overhead_samples_launches_within_the_budget";
    let Some((python, dir)) = standin_python(test) else { return };
    let tmp = TempDir::new("overhead-budget");
    let out = tmp.join("budget.itr");
    let script = workspace_root().join("tests/workloads/launch_budget.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).args(["--chunks", "13", "2000"]);
    cmd.env("CUDART", dir.join("libcudart.so.12")).env("FAKE_KERNELS", dir.join("libfakekernels.so"));
    let mut child = spawn(&mut cmd);
    let _guard = KillOnDrop::new(child.id());
    let rx = line_channel(child.stdout.take().expect("stdout"));
    let first = rx.recv_timeout(Duration::from_secs(30)).expect("the workload's ready line");
    let pid: u32 = first.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()).expect("ready PID");
    std::thread::sleep(Duration::from_secs(3));
    let pid_s = pid.to_string();
    let r = run_infertrace([
        "record", "-q", "-p", &pid_s, "--duration", "6s", "--max-overhead", "2", "-o",
        out.to_str().expect("path"),
    ]);
    r.assert_ok();
    let lines: Vec<String> = rx.iter().collect();
    let _ = child.wait();
    let rep = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    rep.assert_ok();
    let v: Value = infertrace_e2e::serde_json::from_str(&rep.stdout).expect("JSON report");
    let cuda = &v["cuda"];
    let s = &cuda["launch_sampling"];
    assert_eq!(s["estimated"], true, "the launches were not sampled: {s}");
    let launches = cuda["launches"].as_array().expect("launches");
    assert!(!launches.is_empty(), "no launches: {cuda}");
    for l in launches {
        assert_eq!(l["estimated"], true, "a launch row not marked as an estimate: {l}");
        assert!(l["sampled"].as_u64().unwrap_or(u64::MAX) <= l["count"].as_u64().unwrap_or(0), "{l}");
    }
    let text = run_infertrace(["report".as_ref(), out.as_os_str()]);
    assert!(text.stdout.contains("ESTIMATES (--max-overhead 2%)"), "{}", text.stdout);

    // The truth: the loop's launches in the span the estimate stands for
    // (from the first slice to the window's end), chunks cut pro rata.
    let end = v["started_unix_ms"].as_f64().expect("start") * 1e6 + v["duration_ns"].as_f64().expect("duration");
    let span = s["span_ns"].as_f64().expect("span_ns");
    let (from, start) = (end - span, v["started_unix_ms"].as_f64().expect("start") * 1e6);
    let all = chunks(&lines);
    let truth: f64 = all.iter().map(|c| c.launches * ((c.end.min(end) - c.start.max(from)).max(0.0) / (c.end - c.start))).sum();
    let estimate: f64 = launches.iter().filter_map(|l| l["count"].as_f64()).sum();
    // CPU per iteration over whole spans (a mean, not a median of chunks:
    // the slices are a few chunks in each second).
    let per_iter = |pick: &dyn Fn(&Chunk) -> bool| {
        let (cpu, n) = all.iter().filter(|c| pick(c)).fold((0.0, 0.0), |(t, n), c| (t + c.cpu_ns, n + c.launches));
        cpu / n
    };
    let inside = per_iter(&|c| c.start >= from && c.end <= end);
    let before = per_iter(&|c| c.end < start - 1.5e9);
    let after = per_iter(&|c| c.start > end + 0.5e9);
    let outside = (before + after) / 2.0;
    let slowdown = inside / outside - 1.0;
    let noise = (before / after - 1.0).abs();
    let added = s["sampled_launches"].as_f64().unwrap_or(0.0) * s["per_launch_ns"].as_f64().unwrap_or(0.0) / span;
    eprintln!(
        "{test}: launches {estimate:.0} estimated, {truth:.0} made ({:+.1}%); probes on {:.1}% of the time, \
         {} slices, their cost {:.1} us per launch ({:.0}% of a thread's time while on), {:.2}% of its time in all; \
         loop CPU per iteration {:.2} us inside the window, {:.2} us before, {:.2} us after ({:+.1}%, noise {:.1}%)",
        100.0 * (estimate / truth - 1.0),
        100.0 * s["probed_ns"].as_f64().unwrap_or(0.0) / span,
        s["slices"],
        s["per_launch_ns"].as_f64().unwrap_or(0.0) / 1e3,
        100.0 * s["probe_share"].as_f64().unwrap_or(0.0),
        100.0 * added,
        inside / 1e3,
        before / 1e3,
        after / 1e3,
        100.0 * slowdown,
        100.0 * noise,
    );
    assert!(truth > 10_000.0, "the loop made {truth:.0} launches in the span: too few to judge");
    // The estimate extrapolates the loop's rate in the slices to the time
    // between them: where the machine itself drifts (the chunks before
    // and after the window, both untraced, differed by 40% in a loaded
    // run), so may the estimate, on top of its own 15%.
    assert!(
        (estimate / truth - 1.0).abs() <= 0.15 + noise,
        "launches estimated {estimate:.0}, made {truth:.0} (bound 15% + the {:.1}% between before and after)",
        100.0 * noise
    );
    assert!(added <= 0.02 * 1.5, "the probes took {:.2}% of the loop's time (budget 2%)", 100.0 * added);
    assert!(
        before.is_finite() && after.is_finite() && inside.is_finite(),
        "chunks missing before, inside or after the window: {before} {inside} {after}"
    );
    let bound = 0.02 + 0.04 + 2.0 * noise;
    assert!(
        slowdown <= bound,
        "the loop ran {:+.1}% slower in the window (bound {:.1}%: 2% + 4% + twice the {:.1}% between before and after)",
        100.0 * slowdown,
        100.0 * bound,
        100.0 * noise
    );
}

/// The calibration is kept per boot (`/run/infertrace/calibration.json`):
/// a second run reuses it (its start-up has no calibration phase and the
/// recording says `cached`), `INFERTRACE_RECALIBRATE=1` measures anew, and a
/// link planted at the file's name is not followed.
#[test]
fn the_calibration_is_kept_for_the_boot() {
    const TEST: &str = "the_calibration_is_kept_for_the_boot";
    require!(TEST, Root, Binary);
    let dir = TempDir::new("calibration-kept");
    let run = |env: &[(&str, &str)]| -> (Value, String) {
        let out = dir.join("rec.itr");
        let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
        cmd.arg(&out).args(["--", "true"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let r = run_cmd(&mut cmd, Duration::from_secs(60));
        r.assert_ok();
        let rep = r.json();
        let startup = rep.0["details"].as_array().into_iter().flatten().filter_map(Value::as_str).find(|d| d.starts_with("start-up")).unwrap_or_else(|| panic!("no start-up detail: {}", rep.0["details"])).to_owned();
        // The same start-up in JSON: the phases in order, adding up.
        let s = &rep.0["tracer_overhead"]["startup"];
        let phases: Vec<(&str, u64)> = s["phases"]
            .as_array()
            .unwrap_or_else(|| panic!("no tracer_overhead.startup.phases: {s}"))
            .iter()
            .map(|p| (p["phase"].as_str().unwrap_or(""), p["wall_ns"].as_u64().unwrap_or(0)))
            .collect();
        assert_eq!(phases.first().map(|p| p.0), Some("context"), "{s}");
        assert_eq!(phases.last().map(|p| p.0), Some("targets"), "{s}");
        let sum: u64 = phases.iter().map(|p| p.1).sum();
        assert!(s["wall_ns"].as_u64().is_some_and(|w| w >= sum && w > 0), "{s}");
        assert!(phases.iter().filter(|p| p.1 >= 1_000_000).all(|p| startup.contains(&format!(" {} ", p.0))), "{s} against {startup}");
        (rep.0["tracer_overhead"]["calibration"].clone(), startup)
    };
    let (fresh, startup) = run(&[("INFERTRACE_RECALIBRATE", "1")]);
    assert_eq!(fresh["cached"], false, "{fresh}");
    assert!(startup.contains("overhead calibration"), "a fresh calibration is a start-up phase: {startup}");
    let (kept, startup) = run(&[]);
    assert_eq!(kept["cached"], true, "the second run reuses it: {kept}");
    for k in ["uprobe_ns", "uretprobe_ns", "syscall_tracepoints_ns"] {
        assert_eq!(kept[k], fresh[k], "{k}: the kept value");
    }
    assert!(!startup.contains("overhead calibration"), "no calibration phase: {startup}");
    eprintln!("{TEST}: {startup}");
    // A link planted at the name: not followed, the calibration measured again.
    let file = Path::new("/run/infertrace/calibration.json");
    let decoy = dir.join("decoy.json");
    std::fs::copy(file, &decoy).expect("the kept calibration");
    std::fs::remove_file(file).unwrap();
    std::os::unix::fs::symlink(&decoy, file).unwrap();
    let (after_link, _) = run(&[]);
    let _ = std::fs::remove_file(file);
    assert_eq!(after_link["cached"], false, "a link at the file's name is not followed: {after_link}");
}
