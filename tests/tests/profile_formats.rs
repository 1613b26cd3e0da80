//! `report --format speedscope|pprof|perfetto` and `record --timeline`,
//! each checked by an independent reader installed by `cargo xtask setup`:
//! the JSON schema shipped in the `speedscope` npm package (validated with
//! the `jsonschema` PyPI package), `go tool pprof` (Debian `golang-go`),
//! and the Python classes of the `perfetto` PyPI package
//! (tests/readers/*.py).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// The speedscope schema of the global npm package, if installed.
fn speedscope_schema() -> Option<PathBuf> {
    let root = Command::new("npm").args(["root", "-g"]).output().ok().filter(|o| o.status.success())?;
    let p = PathBuf::from(String::from_utf8_lossy(&root.stdout).trim()).join("speedscope/dist/release/file-format-schema.json");
    p.is_file().then_some(p)
}

fn python_has(module: &str) -> bool {
    Command::new("python3").args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
}

fn reader(name: &str) -> PathBuf {
    workspace_root().join("tests/readers").join(name)
}

/// The line of `def fib` + 1 (its body) in bench_fib.py.
fn fib_body_line() -> u64 {
    let text = std::fs::read_to_string(workspace_root().join("tests/workloads/bench_fib.py")).unwrap();
    let i = text.lines().position(|l| l.starts_with("def fib(")).expect("def fib in bench_fib.py");
    i as u64 + 2
}

/// Records the fib workload (about a second of CPU) into DIR/rec.itr at 499 Hz.
fn record_fib(test: &str, dir: &TempDir) -> Option<(PathBuf, Report)> {
    let python = python3_executable(test)?;
    let out = dir.join("rec.itr");
    let w = workspace_root().join("tests/workloads/bench_fib.py");
    // The workload prints its own result on stdout: the report is read back from the recording.
    let r = run_cmd(infertrace(["record", "-q", "-F", "499", "-o"]).arg(&out).arg("--").arg(&python).arg(&w).arg("4000"), RUN_TIMEOUT);
    r.assert_ok();
    let json = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    json.assert_ok();
    Some((out, json.json()))
}

fn report_to(rec: &Path, format: &str, profile: &str, out: &Path) {
    let r = run_infertrace([
        "report".as_ref(),
        rec.as_os_str(),
        "--format".as_ref(),
        format.as_ref(),
        "--profile".as_ref(),
        profile.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    r.assert_ok();
}

fn cpu_samples(rep: &Report) -> u64 {
    rep.0["stacks"].as_array().unwrap().iter().filter(|s| s["kind"] == "cpu").map(|s| s["samples"].as_u64().unwrap()).sum()
}

#[test]
fn speedscope_validates_and_names_fib_with_file_and_line() {
    let test = "speedscope_validates_and_names_fib_with_file_and_line";
    require!(test, Root, Binary);
    let Some(schema) = speedscope_schema() else {
        return skip(test, "the speedscope npm package (npm install -g speedscope; cargo xtask setup)");
    };
    if !python_has("jsonschema") {
        return skip(test, "the jsonschema PyPI package (cargo xtask setup)");
    }
    let dir = TempDir::new("speedscope");
    let Some((rec, rep)) = record_fib(test, &dir) else { return };
    let samples = cpu_samples(&rep);
    assert!(samples > 50, "too few CPU samples: {samples}");
    for profile in ["cpu", "off-cpu", "wall"] {
        let out = dir.join(format!("{profile}.speedscope.json"));
        report_to(&rec, "speedscope", profile, &out);
        let v = Command::new("python3").arg(reader("speedscope_validate.py")).arg(&schema).arg(&out).output().unwrap();
        assert!(v.status.success(), "{profile}: {}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr));
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cpu.speedscope.json")).unwrap()).unwrap();
    let frames = doc["shared"]["frames"].as_array().unwrap();
    let fib: Vec<&Value> = frames.iter().filter(|f| f["name"] == "fib").collect();
    assert!(!fib.is_empty(), "no fib frame in {frames:?}");
    let line = fib_body_line();
    assert!(
        fib.iter().any(|f| f["file"].as_str().is_some_and(|p| p.ends_with("bench_fib.py")) && f["line"] == line),
        "no fib frame at bench_fib.py:{line}: {fib:?}"
    );
    // The weights: every CPU sample once, at the sampling period (499 Hz).
    let total: u64 = doc["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["weights"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()))
        .sum();
    assert_eq!(total, samples * (1_000_000_000 / 499));
}

/// `go tool pprof -top` output: (total, first row's function).
fn pprof_top(file: &Path, index: &str) -> (String, String) {
    let o = Command::new("go")
        .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
        .arg(file)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "go tool pprof failed: {text}{}", String::from_utf8_lossy(&o.stderr));
    let total = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1).and_then(|r| r.split(" total").next()))
        .unwrap_or_else(|| panic!("no total in:\n{text}"))
        .trim()
        .to_owned();
    let mut rows = text.lines().skip_while(|l| !l.trim_start().starts_with("flat")).skip(1);
    let first = rows.next().and_then(|l| l.split_whitespace().last()).unwrap_or_else(|| panic!("no rows in:\n{text}")).to_owned();
    (total, first)
}

#[test]
fn pprof_reads_with_go_tool_and_lists_fib_first() {
    let test = "pprof_reads_with_go_tool_and_lists_fib_first";
    require!(test, Root, Binary);
    if !prereq::in_path("go") {
        return skip(test, "go (Debian golang-go; cargo xtask setup)");
    }
    let dir = TempDir::new("pprof");
    let Some((rec, rep)) = record_fib(test, &dir) else { return };
    let out = dir.join("cpu.pb.gz");
    report_to(&rec, "pprof", "cpu", &out);
    let samples = cpu_samples(&rep);
    let (total, first) = pprof_top(&out, "samples");
    assert_eq!(total, samples.to_string(), "pprof sample total vs the JSON report's CPU samples");
    assert_eq!(first, "fib", "top function");
    let (_, first_cpu) = pprof_top(&out, "cpu");
    assert_eq!(first_cpu, "fib");
}

/// `report --format pprof --profile memory` read by `go tool pprof`:
/// `resident_growth` is the default sample type, and the line that grew
/// most in `tests/workloads/mem_growth.py` (300 MiB at @mem_b) comes first.
#[test]
fn pprof_memory_profile_reads_with_go_tool_and_lists_the_largest_line_first() {
    let test = "pprof_memory_profile_reads_with_go_tool_and_lists_the_largest_line_first";
    require!(test, Root, Binary);
    if !prereq::in_path("go") {
        return skip(test, "go (Debian golang-go; cargo xtask setup)");
    }
    let Some(python) = python3_executable(test) else { return };
    let dir = TempDir::new("pprof-memory");
    let rec = dir.join("rec.itr");
    let w = workspace_root().join("tests/workloads/mem_growth.py");
    run_cmd(infertrace(["record", "-q", "-o"]).arg(&rec).arg("--").arg(&python).arg(&w), RUN_TIMEOUT).assert_ok();
    let out = dir.join("memory.pb.gz");
    report_to(&rec, "pprof", "memory", &out);
    let o = Command::new("go").args(["tool", "pprof", "-top", "-lines"]).arg(&out).env("HOME", std::env::temp_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "go tool pprof failed: {text}{}", String::from_utf8_lossy(&o.stderr));
    let first = text.lines().skip_while(|l| !l.trim_start().starts_with("flat")).nth(1).unwrap_or_else(|| panic!("no rows in:\n{text}"));
    let line_b = markers_of(&w)["mem_b"];
    assert!(first.trim_end().ends_with(&format!("mem_growth.py:{line_b}")), "first row {first:?} is not line {line_b}:\n{text}");
    assert!(text.contains("Type: resident_growth"), "{text}");
    // The folded form weighs the same stacks in bytes.
    let folded = run_infertrace(["report".as_ref(), rec.as_os_str(), "--format".as_ref(), "folded".as_ref(), "--profile".as_ref(), "memory".as_ref()]);
    folded.assert_ok();
    let total: u64 = folded.stdout.lines().filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).sum();
    assert!(total >= 600 << 20, "folded memory profile totals {total} bytes; the workload grows by over 600 MiB");
}

#[test]
fn perfetto_needs_a_timeline() {
    require!("perfetto_needs_a_timeline", Root, Binary);
    let dir = TempDir::new("perfetto-none");
    let out = dir.join("rec.itr");
    record_launch_with(&out, &[], &["true".as_ref()]);
    let r = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "perfetto".as_ref()]);
    assert_ne!(r.code(), Some(0));
    let line = single_error_line(&r);
    assert!(line.contains("--timeline"), "{line}");
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// `function (file:line)` as the report's site and the trace's `site` arg.
fn site_text(site: &Value) -> String {
    let f = site["function"].as_str().unwrap();
    match (site["file"].as_str(), site["line"].as_u64()) {
        (Some(file), Some(line)) => format!("{f} ({file}:{line})"),
        (Some(file), None) => format!("{f} ({file})"),
        _ => f.to_owned(),
    }
}

#[test]
fn perfetto_timeline_of_the_cuda_simulator() {
    let test = "perfetto_timeline_of_the_cuda_simulator";
    require!(test, Root, Binary, Gcc);
    if !python_has("perfetto.protos.perfetto.trace.perfetto_trace_pb2") {
        return skip(test, "the perfetto and protobuf PyPI packages (cargo xtask setup)");
    }
    let Some(sim) = cuda_standin_dir(test) else { return };
    let Some(python) = python3_executable(test) else { return };
    let dir = TempDir::new("perfetto-sim");
    let rec = dir.join("rec.itr");
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    let run = run_cmd(
        infertrace(["record", "-q", "--timeline", "--format", "json", "-o"])
            .arg(&rec)
            .arg("--")
            .arg(&python)
            .arg(&source)
            .arg("sim")
            .env("CUDART", sim.join("libcudart.so.12"))
            .env("FAKE_KERNELS", sim.join("libfakekernels.so"))
            .env("END_SLEEP_S", "0.2"),
        Duration::from_secs(120),
    );
    run.assert_ok();
    let rep = run.json();
    let tl = &rep.0["timeline"];
    assert_eq!(u(&tl["dropped"]), 0, "{tl}");
    assert!(u(&tl["states"]) > 0 && u(&tl["cuda_calls"]) > 0, "{tl}");
    let trace = dir.join("trace.pftrace");
    report_to(&rec, "perfetto", "cpu", &trace);
    let o = Command::new("python3").arg(reader("perfetto_summary.py")).arg(&trace).output().unwrap();
    assert!(o.status.success(), "perfetto_summary.py: {}", String::from_utf8_lossy(&o.stderr));
    let sum: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(sum["unclosed"], 0);
    let tracks = sum["tracks"].as_array().unwrap();
    let slices = sum["slices"].as_array().unwrap();
    let track = |uuid: u64| tracks.iter().find(|t| u(&t["uuid"]) == uuid).unwrap_or_else(|| panic!("no track {uuid}"));
    // The thread track of a slice (itself, or the parent of CUDA / syscalls).
    let thread_of = |uuid: u64| -> &Value {
        let t = track(uuid);
        if t.get("tid").is_some() { t } else { track(u(&t["parent"])) }
    };
    let pid = u(&rep.one_target("launched")["pid"]);

    // Copy slices per (API, site) == the report's exact call counts; durations sum to its totals within 1%.
    let calls = rep.0["cuda"]["calls"].as_array().unwrap();
    let copies: Vec<&Value> = calls.iter().filter(|c| c["pid"] == pid && !c["kind"].is_null()).collect();
    assert!(copies.len() >= 3, "{copies:?}");
    for c in &copies {
        let (api, site) = (c["api"].as_str().unwrap(), site_text(&c["site"]));
        let kind = c["kind"].as_str().unwrap();
        let mine: Vec<&Value> = slices
            .iter()
            .filter(|s| {
                s["name"] == api && s["args"]["site"].as_str() == Some(site.as_str()) && s["args"]["kind"].as_str() == Some(kind)
            })
            .collect();
        assert_eq!(mine.len() as u64, u(&c["count"]), "{api} at {site} ({kind})");
        let ns: u64 = mine.iter().map(|s| u(&s["end"]) - u(&s["begin"])).sum();
        let total = u(&c["total_ns"]);
        assert!(ns.abs_diff(total) * 100 <= total.max(1), "{api} at {site}: slices {ns} ns, report {total} ns");
        let bytes: u64 = mine.iter().map(|s| u(&s["args"]["bytes"])).sum();
        assert_eq!(bytes, u(&c["bytes"]), "{api} at {site}");
    }

    // Every slice inside its thread's lifetime (start and exit instants where seen).
    let instants = sum["instants"].as_array().unwrap();
    let mut life: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in instants {
        let e = life.entry(u(&i["track"])).or_insert((0, u64::MAX));
        match i["name"].as_str() {
            Some("thread start") => e.0 = u(&i["ts"]),
            Some("thread exit") => e.1 = u(&i["ts"]),
            _ => {}
        }
    }
    assert!(life.values().any(|(_, end)| *end != u64::MAX), "no thread exit seen: {life:?}");
    for s in slices {
        let t = thread_of(u(&s["track"]));
        let (start, end) = life.get(&u(&t["uuid"])).copied().unwrap_or((0, u64::MAX));
        assert!(u(&s["begin"]) >= start && u(&s["end"]) <= end, "slice {s} outside its thread's life [{start}, {end}] ({t})");
        assert!(u(&s["begin"]) <= u(&s["end"]), "{s}");
    }

    // Each thread's state slices add up to the report's wall-time breakdown (the same
    // intervals, summed in the kernel): within 1% + 1 ms per state.
    let threads = rep.0["threads"].as_array().unwrap();
    let mut checked = 0;
    for th in threads.iter().filter(|t| t["pid"] == pid && u(&t["tid"]) != 0) {
        let tid = u(&th["tid"]);
        let Some(tt) = tracks.iter().find(|t| t.get("tid").is_some_and(|x| u(x) == tid)) else { continue };
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for s in slices.iter().filter(|s| s["track"] == tt["uuid"]) {
            *by.entry(s["name"].as_str().unwrap()).or_default() += u(&s["end"]) - u(&s["begin"]);
        }
        let off = &th["off_cpu"];
        for (name, want) in [
            ("on-cpu", u(&th["on_cpu_ns"])),
            ("runqueue", u(&th["runqueue_ns"])),
            ("off-cpu: io", u(&off["io_ns"])),
            ("off-cpu: sleep", u(&off["sleep_ns"])),
            ("off-cpu: lock", u(&off["lock_ns"])),
            ("off-cpu: poll", u(&off["poll_ns"])),
            ("off-cpu: gil", u(&off["gil_ns"])),
        ] {
            let got = by.get(name).copied().unwrap_or(0);
            assert!(got.abs_diff(want) <= want / 100 + 1_000_000, "tid {tid} {name}: slices {got} ns, report {want} ns");
        }
        checked += 1;
    }
    assert!(checked >= 1, "no thread of pid {pid} compared");

    // time.sleep(0.2) at the end: one 200 ms clock_nanosleep at that line, and one
    // 200 ms `off-cpu: sleep` slice on the same thread (the main one) inside it.
    let text = std::fs::read_to_string(&source).unwrap();
    let line = text.lines().position(|l| l.contains("END_SLEEP_S")).unwrap() + 1;
    let at_line = format!("cuda_patterns.py:{line})");
    let naps: Vec<&Value> = slices
        .iter()
        .filter(|s| s["name"] == "clock_nanosleep" && s["args"]["site"].as_str().is_some_and(|x| x.ends_with(&at_line)))
        .collect();
    assert_eq!(naps.len(), 1, "clock_nanosleep at line {line}: {naps:?}");
    let nap = naps[0];
    let dur = u(&nap["end"]) - u(&nap["begin"]);
    assert!((199_000_000..400_000_000).contains(&dur), "sleep syscall {dur} ns");
    let thread = thread_of(u(&nap["track"]));
    assert_eq!((u(&thread["pid"]), u(&thread["tid"])), (pid, pid), "{thread}");
    let sleeps: Vec<&Value> = slices
        .iter()
        .filter(|s| {
            s["name"] == "off-cpu: sleep"
                && s["track"] == thread["uuid"]
                && u(&s["begin"]) + 1_000_000 >= u(&nap["begin"])
                && u(&s["end"]) <= u(&nap["end"]) + 1_000_000
                && u(&s["end"]) - u(&s["begin"]) >= 150_000_000
        })
        .collect();
    assert_eq!(sleeps.len(), 1, "off-cpu: sleep slices inside the 200 ms sleep: {sleeps:?}");
    let d = u(&sleeps[0]["end"]) - u(&sleeps[0]["begin"]);
    assert!((195_000_000..=dur).contains(&d), "sleep slice {d} ns, syscall {dur} ns");
}

/// `--timeline-limit`: the kernel events kept stop at the limit, the rest
/// are counted as dropped, in the JSON (`timeline.dropped`, a note) and in
/// the text report.
#[test]
fn timeline_limit_keeps_at_most_the_limit_and_counts_the_rest() {
    let test = "timeline_limit_keeps_at_most_the_limit_and_counts_the_rest";
    require!(test, Root, Binary);
    let Some(python) = python3_executable(test) else { return };
    let dir = TempDir::new("timeline-limit");
    let out = dir.join("rec.itr");
    // 3000 short sleeps: at least 6000 state intervals (off-CPU, then on-CPU).
    let script = "import time\nfor _ in range(3000): time.sleep(0.0001)\n";
    let (_, rep) = record_launch_with(&out, &["--timeline", "--timeline-limit", "1000"], &[python.as_os_str(), "-c".as_ref(), script.as_ref()]);
    let tl = &rep.0["timeline"];
    let kept = u(&tl["states"]) + u(&tl["samples"]) + u(&tl["syscalls"]);
    let threads = tl["lifecycle"].as_u64().unwrap();
    assert!(kept <= 1000 && kept + threads >= 900, "kept {kept} (+{threads} lifecycle) of limit 1000: {tl}");
    let dropped = u(&tl["dropped"]);
    assert!(dropped >= 5000, "dropped {dropped}: {tl}");
    assert_eq!(u(&tl["limit"]), 1000);
    // Not a lost event (the aggregates are exact): a note.
    assert!(rep.0["lost_detail"].as_object().unwrap().is_empty(), "{}", rep.0["lost_detail"]);
    assert!(
        rep.0["notes"].as_array().unwrap().iter().any(|n| n.as_str().is_some_and(|n| n.contains(&format!("timeline: {dropped} events not kept")))),
        "{}",
        rep.0["notes"]
    );
    let text = run_infertrace(["report".as_ref(), out.as_os_str()]);
    text.assert_ok();
    assert!(text.stdout.contains(&format!("{dropped} dropped (limit 1000 per source")), "{}", text.stdout);
    // Without --timeline: no timeline at all.
    let plain = dir.join("plain.itr");
    let (_, rep) = record_launch_with(&plain, &[], &["true".as_ref()]);
    assert!(rep.0.get("timeline").is_none(), "{}", rep.0);
}
