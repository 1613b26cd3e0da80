//! Wall-time accounting (`infertrace record` with scheduler tracing and CPU
//! sampling): per-thread breakdowns against workloads whose time is known,
//! run-queue share under a pinned overload, CPU stacks / folded / SVG, the
//! on-CPU syscall share, and the flags that turn parts off.
//!
//! Workload: tests/workloads/walltime.c, built with frame pointers and debug
//! info so that its CPU samples resolve to `spin_until` (walltime.c).

use std::ffi::OsStr;
use std::fs;
use std::path::PathBuf;

use infertrace_e2e::*;

/// The function where the spinning threads' CPU samples land.
const SPIN_FN: &str = "spin_until";
/// The tolerance on the parts adding up to wall time.
const SUM_TOLERANCE: f64 = 0.02;

fn walltime_bin() -> PathBuf {
    workload_with_flags(
        "walltime",
        "O1g-fp",
        &["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline"],
    )
}

/// Launches `walltime <args>` under `infertrace record <extra> --format json`
/// and returns the run (its stderr holds the workload's `thread ...` lines),
/// the report, and the recording's path (inside `dir`).
#[track_caller]
fn record_walltime(dir: &TempDir, extra: &[&str], args: &[&str]) -> (Run, Report, PathBuf) {
    let w = walltime_bin();
    let out = dir.join("rec.itr");
    let mut cmd: Vec<&OsStr> = vec![w.as_os_str()];
    cmd.extend(args.iter().map(|a| OsStr::new(*a)));
    let (r, rep) = record_launch_with(&out, extra, &cmd);
    (r, rep, out)
}

/// |got - want| <= frac * want.
fn within(got: u64, want: u64, frac: f64) -> bool {
    (got as f64 - want as f64).abs() <= frac * want as f64
}

const MS: u64 = 1_000_000;

/// The off-CPU stacks of each thread, summed by reason, carry that thread's
/// off-CPU time for the reason (within 1%).
#[track_caller]
fn check_offcpu_stacks_match_threads(rep: &Report) {
    let mut by: std::collections::BTreeMap<(u64, String), u64> = Default::default();
    for s in rep.stacks_of_kind("off_cpu") {
        *by.entry((
            s["tid"].as_u64().unwrap(),
            s["reason"].as_str().unwrap().to_string(),
        ))
        .or_default() += s["weight_ns"].as_u64().unwrap();
    }
    let mut problems = Vec::new();
    for t in rep.thread_times() {
        let mut reasons: Vec<(String, u64)> = vec![
            ("io".into(), t.io_ns),
            ("lock".into(), t.lock_ns),
            ("poll".into(), t.poll_ns),
            ("sleep".into(), t.sleep_ns),
            ("other".into(), t.other_ns),
        ];
        for (k, v) in &t.extra_off_cpu {
            reasons.push((k.trim_end_matches("_ns").to_string(), *v));
        }
        for (reason, ns) in reasons {
            let stacked = by.get(&(t.tid, reason.clone())).copied().unwrap_or(0);
            if (stacked as f64 - ns as f64).abs() > 0.01 * ns as f64 + 1000.0 {
                problems.push(format!(
                    "{} tid {}: off_cpu.{reason}_ns {ns} but its {reason} stacks weigh {stacked}",
                    t.comm, t.tid
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "off-CPU stacks vs threads[]:\n  {}\n{}",
        problems.join("\n  "),
        rep.describe_threads()
    );
}

/// Issue: three named threads (spin 0.5 s, sleep 0.5 s, block 0.5 s reading a
/// pipe until the main thread writes): each thread's dominant category within
/// 10% of 0.5 s, every thread's parts sum to its wall time within 2%.
#[test]
fn three_threads_dominant_category() {
    require!("three_threads_dominant_category", Root, Binary, Gcc);
    let dir = TempDir::new("wt-three");
    let (run, rep, rec) = record_walltime(&dir, &[], &["three", "500"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    let truth = parse_thread_lines(&run.stderr);
    let all = rep.describe_threads();

    // Every thread of the workload is there, including the main thread, and
    // (checked by check_walltime_invariants) adds up.
    for comm in ["wt-main", "spinner", "sleeper", "reader"] {
        let t = rep.thread_named(comm);
        if let Some((tid, _)) = truth.get(comm) {
            assert_eq!(t.tid, *tid, "tid of {comm}\n{all}");
        }
    }

    // The spinner burns 0.5 s of CPU time (measured by itself with
    // CLOCK_THREAD_CPUTIME_ID, so a busy machine cannot stretch it). The
    // dominant category is taken among what the thread does (on CPU, or off
    // CPU by reason): its run-queue time depends on the machine's load (the
    // spinner can wait longer for a CPU than it runs when the 2 CPUs are
    // busy); run-queue accounting is checked in pinned_threads_runqueue_share.
    for (comm, want) in [
        ("spinner", "on_cpu"),
        ("sleeper", "sleep"),
        ("reader", "io"),
    ] {
        let t = rep.thread_named(comm);
        let (name, ns) = t
            .categories()
            .into_iter()
            .filter(|(k, _)| k != "runqueue")
            .fold(
                (String::new(), 0),
                |best, x| if x.1 > best.1 { x } else { best },
            );
        assert_eq!(
            name.as_str(),
            want,
            "{comm}: dominant category is {name} ({ns} ns), expected {want}\n{all}\nworkload: {}",
            run.stderr
        );
        assert!(
            within(ns, 500 * MS, 0.10),
            "{comm}: {want} = {:.3} ms, expected 500 ms +-10%\n{all}\nworkload: {}",
            ns as f64 / 1e6,
            run.stderr
        );
    }
    check_offcpu_stacks_match_threads(&rep);
    // The spinner's on-CPU time against its own CPU clock.
    if let Some((_, cpu)) = truth.get("spinner") {
        let t = rep.thread_named("spinner");
        assert!(
            within(t.on_cpu_ns, *cpu, 0.05),
            "spinner on_cpu {} ns vs its own CPU clock {cpu} ns\n{all}",
            t.on_cpu_ns
        );
    }

    // `infertrace report FILE --format json` renders the same breakdown.
    let r2 = run_infertrace([
        OsStr::new("report"),
        rec.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("json"),
    ]);
    r2.assert_ok();
    let rep2 = r2.json();
    assert_eq!(
        rep2.thread_times(),
        rep.thread_times(),
        "report --format json differs from record's report"
    );
    assert_eq!(rep2.0["stacks"], rep.0["stacks"], "stacks differ");
}

/// Issue: four spinning threads pinned to one CPU for 1 s: run-queue share
/// about 75% (+-10 points). The threads run at nice -20 so that other load
/// on that CPU barely takes a share; each thread's on-CPU time is also
/// checked against its own CPU clock.
#[test]
fn pinned_threads_runqueue_share() {
    require!("pinned_threads_runqueue_share", Root, Binary, Gcc);
    let dir = TempDir::new("wt-pinned");
    let (run, rep, _) = record_walltime(&dir, &[], &["pinned", "4", "1000"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    let all = rep.describe_threads();
    let truth = parse_thread_lines(&run.stderr);
    let (mut rq, mut wall) = (0u64, 0u64);
    for i in 0..4 {
        let t = rep.thread_named(&format!("pinned{i}"));
        let share = t.runqueue_ns as f64 / t.wall_ns as f64;
        assert!(
            (0.65..=0.85).contains(&share),
            "pinned{i}: run-queue share {:.1}%, expected 75% +-10 points\n{all}\nworkload: {}",
            share * 100.0,
            run.stderr
        );
        assert!(
            within(t.wall_ns, 1000 * MS, 0.10),
            "pinned{i}: wall {} ns, expected about 1 s\n{all}",
            t.wall_ns
        );
        if let Some((_, cpu)) = truth.get(&format!("pinned{i}")) {
            assert!(
                within(t.on_cpu_ns, *cpu, 0.05),
                "pinned{i}: on_cpu {} ns vs its own CPU clock {cpu} ns\n{all}",
                t.on_cpu_ns
            );
        }
        rq += t.runqueue_ns;
        wall += t.wall_ns;
    }
    let share = rq as f64 / wall as f64;
    assert!(
        (0.65..=0.85).contains(&share),
        "aggregate run-queue share {:.1}%\n{all}",
        share * 100.0
    );
    // The waits also land in the process's run-queue histogram.
    let pid = rep.thread_named("pinned0").pid;
    let hist = &rep.0["runqueue_hist_log2_ns"][pid.to_string()];
    let n: u64 = hist
        .as_array()
        .unwrap_or_else(|| {
            panic!(
                "no run-queue histogram for pid {pid}: {}",
                rep.0["runqueue_hist_log2_ns"]
            )
        })
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(n > 0, "empty run-queue histogram for pid {pid}: {hist}");
}

/// Issue: the spinning function's symbol tops the on-CPU stacks; the folded
/// and SVG outputs contain it.
#[test]
fn spin_function_tops_cpu_stacks() {
    require!("spin_function_tops_cpu_stacks", Root, Binary, Gcc);
    let dir = TempDir::new("wt-stacks");
    let (_, rep, rec) = record_walltime(&dir, &[], &["three", "500"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    assert_eq!(rep.0["sample_hz"], 99, "default sampling frequency");

    let by_leaf = rep.cpu_samples_by_leaf();
    let total: u64 = by_leaf.values().sum();
    let (top, n) = by_leaf
        .iter()
        .max_by_key(|(_, n)| **n)
        .unwrap_or_else(|| panic!("no CPU stacks at all: {}", rep.0["stacks"]));
    assert_eq!(
        top, SPIN_FN,
        "top leaf function; samples by leaf: {by_leaf:?}"
    );
    // 0.5 s of spinning at 99 Hz is about 50 samples.
    assert!(
        (35..=65).contains(n),
        "{n} samples in {SPIN_FN}, expected about 50 (0.5 s at 99 Hz); by leaf: {by_leaf:?}"
    );
    assert!(total >= *n);
    // DWARF: the leaf frame names its source file and a line.
    let spin_stack = rep
        .stacks_of_kind("cpu")
        .into_iter()
        .find(|s| s["frames"][0]["function"] == SPIN_FN)
        .unwrap();
    let leaf = &spin_stack["frames"][0];
    assert!(
        leaf["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("walltime.c"))
            && leaf["line"].is_u64(),
        "leaf frame without file/line: {leaf}"
    );
    assert_eq!(leaf["kind"], "native", "{leaf}");
    let spinner_tid = rep.thread_named("spinner").tid;
    assert_eq!(spin_stack["tid"], spinner_tid, "{spin_stack}");

    // Folded (root first: the process comm, then ...; leaf last).
    let r = run_infertrace([
        OsStr::new("report"),
        rec.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("folded"),
        OsStr::new("--profile"),
        OsStr::new("cpu"),
    ]);
    r.assert_ok();
    let lines: Vec<&str> = r.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "empty folded output\n{}", r.describe());
    let mut spin_count = 0u64;
    for l in &lines {
        let (stack, count) = l
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("folded line without a count: {l:?}"));
        let count: u64 = count
            .parse()
            .unwrap_or_else(|_| panic!("folded count not a number: {l:?}"));
        let frames: Vec<&str> = stack.split(';').collect();
        assert_eq!(
            frames[0], "wt-main",
            "first folded frame is the comm: {l:?}"
        );
        if frames.last() == Some(&SPIN_FN) {
            spin_count += count;
        }
    }
    assert_eq!(
        spin_count, *n,
        "folded samples ending in {SPIN_FN} vs JSON\n{}",
        r.stdout
    );

    // SVG, to a file.
    let svg = dir.join("cpu.svg");
    let r = run_infertrace([
        OsStr::new("report"),
        rec.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("svg"),
        OsStr::new("--profile"),
        OsStr::new("cpu"),
        OsStr::new("-o"),
        svg.as_os_str(),
    ]);
    r.assert_ok();
    let text = fs::read_to_string(&svg)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", svg.display(), r.describe()));
    assert!(
        text.contains("<svg"),
        "not an SVG: {}",
        &text[..text.len().min(300)]
    );
    assert!(text.contains(SPIN_FN), "SVG lacks {SPIN_FN}");
    assert!(text.trim_end().ends_with("</svg>"), "SVG truncated");
}

/// The text report's wall-time sections (all of them: `--verbose`).
#[test]
fn text_report_walltime_sections() {
    require!("text_report_walltime_sections", Root, Binary, Gcc);
    let dir = TempDir::new("wt-text");
    let (_, rep, rec) = record_walltime(&dir, &[], &["three", "300"]);
    let r = run_infertrace([OsStr::new("report"), OsStr::new("--verbose"), rec.as_os_str()]);
    r.assert_ok();
    for section in [
        "== wall time per thread",
        "== top on-CPU stacks",
        "== top off-CPU stacks: io",
        "== top off-CPU stacks: sleep",
        "== run-queue delay",
    ] {
        assert!(
            r.stdout.contains(section),
            "text report lacks {section:?}\n{}",
            r.stdout
        );
    }
    for t in rep.thread_times() {
        assert!(
            r.stdout.contains(&format!("tid {}", t.tid)),
            "text report lacks tid {}\n{}",
            t.tid,
            r.stdout
        );
    }
    assert!(
        r.stdout.contains(SPIN_FN),
        "text report lacks {SPIN_FN}\n{}",
        r.stdout
    );
}

/// syscall_ns sanity: a thread making 200k fast getppid calls has
/// 0 < syscall_ns <= on_cpu_ns, and its syscall_ns is its syscall time minus
/// what of it was spent off CPU or waiting for one.
#[test]
fn syscall_ns_within_on_cpu() {
    require!("syscall_ns_within_on_cpu", Root, Binary, Gcc);
    let dir = TempDir::new("wt-getppid");
    let (_, rep, _) = record_walltime(&dir, &[], &["getppid", "200000"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    let all = rep.describe_threads();
    let t = rep.thread_named("getppider");
    assert_eq!(rep.count(t.pid as u32, "getppid"), 200_000, "getppid count");
    assert!(t.syscall_ns > 0, "syscall_ns is 0: {}\n{all}", t.describe());
    assert!(
        t.syscall_ns <= t.on_cpu_ns,
        "syscall_ns > on_cpu_ns: {}\n{all}",
        t.describe()
    );
    // Only this thread calls getppid: its on-CPU syscall time is at least
    // the getppid time minus everything it spent not running.
    let getppid_ns = rep.field(t.pid as u32, "getppid", "total_ns");
    let not_running = t.runqueue_ns + t.off_cpu_ns();
    let floor = getppid_ns.saturating_sub(not_running);
    assert!(
        t.syscall_ns as f64 >= floor as f64 * 0.98,
        "syscall_ns {} < getppid total {getppid_ns} - not running {not_running}: {}\n{all}",
        t.syscall_ns,
        t.describe()
    );
    // ... and at most all syscall time of the process.
    let pid_total: u64 = rep
        .syscalls()
        .iter()
        .filter(|s| s["pid"] == t.pid)
        .map(|s| s["total_ns"].as_u64().unwrap())
        .sum();
    assert!(
        t.syscall_ns <= pid_total,
        "syscall_ns {} > all syscall time of the process {pid_total}\n{all}",
        t.syscall_ns
    );
}

/// `--no-sched`: no threads, no stacks, no sampling; syscall counts exact.
#[test]
fn no_sched_keeps_exact_counts_only() {
    require!("no_sched_keeps_exact_counts_only", Root, Binary, Gcc);
    let dir = TempDir::new("wt-nosched");
    let (_, rep, _) = record_walltime(&dir, &["--no-sched"], &["getppid", "200000"]);
    assert_eq!(
        rep.threads().len(),
        0,
        "threads with --no-sched: {}",
        rep.0["threads"]
    );
    // docs/report-schema.md: with --no-sched `stacks` holds only the
    // slow-syscall stacks (a syscall-accounting feature): no cpu, off_cpu
    // or gil stacks.
    let kinds: Vec<&str> = rep
        .stacks()
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert!(
        kinds.iter().all(|k| *k == "syscall"),
        "stacks with --no-sched (kinds {kinds:?}): {}",
        rep.0["stacks"]
    );
    assert_eq!(rep.0["sample_hz"], 0, "sample_hz with --no-sched");
    let hists = rep.0["runqueue_hist_log2_ns"]
        .as_object()
        .expect("runqueue hist object");
    assert!(
        hists.is_empty(),
        "run-queue histograms with --no-sched: {hists:?}"
    );
    let pid = rep.one_target("launched")["pid"].as_u64().unwrap() as u32;
    assert_eq!(rep.count(pid, "getppid"), 200_000, "getppid count");
    assert_eq!(rep.errors(pid, "getppid"), 0);
}

/// `-F 0`: scheduler tracing without sampling: breakdowns, off-CPU stacks,
/// no CPU stacks, sample_hz 0.
#[test]
fn frequency_zero_turns_sampling_off() {
    require!("frequency_zero_turns_sampling_off", Root, Binary, Gcc);
    let dir = TempDir::new("wt-f0");
    let (_, rep, _) = record_walltime(&dir, &["-F", "0"], &["three", "300"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    assert_eq!(rep.0["sample_hz"], 0);
    assert!(
        rep.stacks_of_kind("cpu").is_empty(),
        "CPU stacks with -F 0: {:?}",
        rep.stacks_of_kind("cpu")
    );
    assert!(
        !rep.stacks_of_kind("off_cpu").is_empty(),
        "no off-CPU stacks"
    );
    let s = rep.thread_named("sleeper");
    assert!(within(s.sleep_ns, 300 * MS, 0.10), "{}", s.describe());
}

/// `-F 199`: sample_hz follows, and 0.5 s of spinning gets about 100 samples.
#[test]
fn frequency_sets_sample_rate() {
    require!("frequency_sets_sample_rate", Root, Binary, Gcc);
    let dir = TempDir::new("wt-f199");
    let (_, rep, _) = record_walltime(&dir, &["-F", "199"], &["three", "500"]);
    assert_eq!(rep.0["sample_hz"], 199);
    let by_leaf = rep.cpu_samples_by_leaf();
    let n = by_leaf.get(SPIN_FN).copied().unwrap_or(0);
    assert!(
        (75..=125).contains(&n),
        "{n} samples in {SPIN_FN} at 199 Hz over 0.5 s of CPU; by leaf: {by_leaf:?}"
    );
}

/// `--no-offcpu-stacks`: off-CPU time is still accounted by reason (and
/// still reported per thread and reason in `stacks`, with no frames); CPU
/// stacks keep theirs.
#[test]
fn no_offcpu_stacks_keeps_breakdown() {
    require!("no_offcpu_stacks_keeps_breakdown", Root, Binary, Gcc);
    let dir = TempDir::new("wt-nooff");
    let (_, rep, _) = record_walltime(&dir, &["--no-offcpu-stacks"], &["three", "300"]);
    rep.check_walltime_invariants(SUM_TOLERANCE);
    let with_frames: Vec<&serde_json::Value> = rep
        .stacks_of_kind("off_cpu")
        .into_iter()
        .filter(|s| s["frames"].as_array().is_some_and(|f| !f.is_empty()))
        .collect();
    assert!(
        with_frames.is_empty(),
        "off-CPU stacks with frames under --no-offcpu-stacks: {with_frames:?}"
    );
    check_offcpu_stacks_match_threads(&rep);
    let cpu = rep.stacks_of_kind("cpu");
    assert!(
        cpu.iter().any(|s| s["frames"][0]["function"] == SPIN_FN),
        "CPU stacks lost their frames: {cpu:?}"
    );
    let all = rep.describe_threads();
    let s = rep.thread_named("sleeper");
    assert!(within(s.sleep_ns, 300 * MS, 0.10), "{all}");
    let r = rep.thread_named("reader");
    assert!(within(r.io_ns, 300 * MS, 0.10), "{all}");
}
