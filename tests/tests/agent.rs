//! `infertrace agent`: selection, rolling windows, the HTTP endpoints.
//! Ground truth: `tests/workloads/agent_getppid.py`, which makes getppid
//! calls spread over seconds and prints its own count.
//!
//! - windows: with `--window 2s` over ~9 s, every window file is a complete
//!   recording `report` reads, and their getppid counts add up to the
//!   workload's own count exactly; /metrics (parsed as exposition text)
//!   holds the same count; SIGTERM mid-window writes a last, shorter window
//!   and exits 0.
//! - selection: a process matching `--cmdline`, started after the agent, is
//!   picked up at its exec (traced from its first second); one that does
//!   not match never appears in /targets or /metrics.
//! - CUDA: `tests/workloads/cuda_patterns.py patterns` on NVIDIA's real
//!   libcudart (the counts its own table gives, as in tests/tests/cuda.rs):
//!   the windows' CUDA calls add up to them exactly, and so do the
//!   `infertrace_cuda_calls_total` and `infertrace_cuda_launches_total` counters; sync seconds and findings are
//!   exported with the call site.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

type Agent = AgentProc;

fn start_agent(args: &[&str]) -> Agent {
    start_agent_with(&["--no-cuda"], args)
}

/// [`start_agent`] with `base` arguments instead of `--no-cuda`.
fn start_agent_with(base: &[&str], args: &[&str]) -> Agent {
    spawn_agent(base.iter().chain(args))
}

/// GET `path`: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let (status, _, body) = http_get(addr, path).unwrap_or_else(|| panic!("GET {path} from {addr} failed"));
    (status, body)
}

/// One sample of the exposition text: (name, labels, value).
type Sample = (String, Vec<(String, String)>, f64);

/// Parses Prometheus / OpenMetrics exposition text, strictly: every line is
/// a comment (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) or `name{labels} value`.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    assert!(text.trim_end().ends_with("# EOF"), "no `# EOF` at the end:\n{text}");
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                let mut labels = Vec::new();
                let mut rest = inner;
                while !rest.is_empty() {
                    let (k, v) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line:?}"));
                    let end = v.find('"').unwrap_or_else(|| panic!("unterminated label in {line:?}"));
                    labels.push((k.to_owned(), v[..end].to_owned()));
                    rest = v[end + 1..].trim_start_matches(',');
                }
                (n.to_owned(), labels)
            }
            None => (series.to_owned(), Vec::new()),
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        out.push((name, labels, value));
    }
    out
}

fn label<'a>(s: &'a Sample, k: &str) -> Option<&'a str> {
    s.1.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

/// The `infertrace_syscalls_total` value of (pid, syscall), None if absent.
fn syscall_counter(samples: &[Sample], pid: u32, syscall: &str) -> Option<f64> {
    let pid = pid.to_string();
    samples
        .iter()
        .find(|s| s.0 == "infertrace_syscalls_total" && label(s, "pid") == Some(&pid) && label(s, "syscall") == Some(syscall))
        .map(|s| s.2)
}

fn windows_written(addr: &str) -> u64 {
    let (_, body) = get(addr, "/healthz");
    body.lines().find_map(|l| l.strip_prefix("windows_written ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Waits until the agent has written `n` windows.
fn wait_windows(addr: &str, n: u64, timeout: Duration) {
    let ok = poll(timeout, || (windows_written(addr) >= n).then_some(()));
    assert!(ok.is_some(), "the agent wrote {} windows, not {n}, in {timeout:?}", windows_written(addr));
}

/// Starts the workload: (child, pid, stdin, stdout lines).
fn workload(seconds: &str, batch: &str, extra: &[&str]) -> (Child, u32, Option<ChildStdin>, Receiver<String>) {
    let (python, _) = system_python().expect("python3");
    let mut child = Command::new(python)
        .arg(workspace_root().join("tests/workloads/agent_getppid.py"))
        .args([seconds, batch])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the workload");
    let stdin = child.stdin.take();
    let lines = line_channel(child.stdout.take().expect("stdout"));
    let first = lines.recv_timeout(Duration::from_secs(30)).expect("the workload's pid line");
    let pid = first.strip_prefix("pid ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("pid line: {first:?}"));
    (child, pid, stdin, lines)
}

/// `calls N first_second M batch_ns T` of the workload: (N, M).
fn workload_counts(lines: &Receiver<String>) -> (u64, u64) {
    let line = lines.recv_timeout(Duration::from_secs(60)).expect("the workload's count line");
    let f: Vec<&str> = line.split_whitespace().collect();
    let field = |k: &str| f.iter().position(|w| *w == k).and_then(|i| f.get(i + 1)).and_then(|v| v.parse().ok());
    match (field("calls"), field("first_second")) {
        (Some(n), Some(m)) => (n, m),
        _ => panic!("count line: {line:?}"),
    }
}

fn window_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("out dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("infertrace-agent-") && n.ends_with(".itr")))
        .collect();
    v.sort();
    v
}

fn targets_json(addr: &str) -> Value {
    let (status, body) = get(addr, "/targets");
    assert_eq!(status, 200, "{body}");
    infertrace_e2e::serde_json::from_str(&body).unwrap_or_else(|e| panic!("/targets is not JSON: {e}\n{body}"))
}

fn target_pids(t: &Value) -> Vec<u64> {
    t["targets"].as_array().map(|a| a.iter().filter_map(|t| t["pid"].as_u64()).collect()).unwrap_or_default()
}

#[test]
fn agent_windows_add_up_exactly_and_sigterm_writes_the_last_one() {
    const TEST: &str = "agent_windows_add_up_exactly_and_sigterm_writes_the_last_one";
    require!(TEST, Root, Binary);
    if system_python().is_none() {
        return skip(TEST, "a python3 on PATH");
    }
    let dir = TempDir::new("agent-windows");
    let out = dir.join("windows");
    let (mut wl, pid, stdin, lines) = workload("8", "20", &["wait"]);
    let _wl_guard = KillOnDrop::new(wl.id());
    let pid_s = pid.to_string();
    let mut agent = start_agent(&["--pid", &pid_s, "--window", "2s", "--out-dir", out.to_str().unwrap()]);
    let t = targets_json(&agent.addr);
    assert_eq!(target_pids(&t), [u64::from(pid)], "/targets: {t}");
    assert_eq!(t["targets"][0]["ns_pid"].as_u64(), Some(u64::from(pid)), "a host process's own pid: {t}");
    stdin.expect("stdin").write_all(b"go\n").expect("release the workload");
    let (calls, _) = workload_counts(&lines);
    let _ = wl.wait();
    // A window that closed after the workload's last call.
    let after = windows_written(&agent.addr) + 1;
    wait_windows(&agent.addr, after, Duration::from_secs(30));
    let (status, text) = get(&agent.addr, "/metrics");
    assert_eq!(status, 200);
    let samples = parse_exposition(&text);
    assert_eq!(syscall_counter(&samples, pid, "getppid"), Some(calls as f64), "getppid counter of pid {pid}:\n{text}");
    for s in samples.iter().filter(|s| s.0 == "infertrace_syscalls_total") {
        for l in ["pid", "comm", "container_id", "pod_uid", "container_name", "syscall"] {
            assert!(label(s, l).is_some(), "label {l} missing on {s:?}");
        }
    }
    let (status, latest) = get(&agent.addr, "/report/latest");
    assert_eq!(status, 200);
    Report::parse(&latest).unwrap_or_else(|e| panic!("/report/latest: {e}")).check_invariants();

    // Mid-window: 0.5 s after a window closed.
    let n = windows_written(&agent.addr);
    wait_windows(&agent.addr, n + 1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    kill(agent.child.id(), libc::SIGTERM);
    let status = poll(Duration::from_secs(60), || agent.child.try_wait().ok().flatten()).expect("the agent exits after SIGTERM");
    let err: Vec<String> = agent.stderr.try_iter().collect();
    assert!(status.success(), "agent exit {status:?}: {err:?}");

    let files = window_files(&out);
    assert!(files.len() >= 5, "windows of 2s over >9s: {files:?}");
    let mut sum = 0;
    for f in &files {
        let r = run_infertrace(["report".as_ref(), "--format".as_ref(), "json".as_ref(), f.as_os_str()]);
        r.assert_ok();
        let rep = r.json();
        rep.check_invariants();
        let n = rep.count(pid, "getppid");
        sum += n;
        // `window N written to FILE (K targets)`: K counts the targets the
        // window covers, the workload included in a window with its calls
        // (even the one it exited in), not those alive at its end.
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let line = err.iter().find(|l| l.contains(&name)).unwrap_or_else(|| panic!("no line for {name}: {err:?}"));
        if n > 0 {
            assert!(line.ends_with("(1 targets)"), "{name} holds {n} getppid calls of pid {pid}: {line}");
        }
    }
    assert_eq!(sum, calls, "getppid over {} windows vs the workload's own count", files.len());
    let last = Report::parse(&run_infertrace(["report".as_ref(), "--format".as_ref(), "json".as_ref(), files.last().unwrap().as_os_str()]).stdout)
        .expect("last window");
    let dur = last.0["duration_ns"].as_u64().unwrap_or(0);
    assert!(dur > 0 && dur < 2_000_000_000, "the last window was cut by SIGTERM mid-window: {dur} ns");
    assert!(!out.read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(".tmp-")), "temporary files left");
}

#[test]
fn agent_selects_new_processes_at_exec_and_nothing_else() {
    const TEST: &str = "agent_selects_new_processes_at_exec_and_nothing_else";
    require!(TEST, Root, Binary);
    if system_python().is_none() {
        return skip(TEST, "a python3 on PATH");
    }
    let dir = TempDir::new("agent-select");
    let token = format!("agent_sel_{}", std::process::id());
    let re = format!("{token} match$");
    let agent = start_agent(&["--cmdline", &re, "--window", "1s", "--out-dir", dir.join("w").to_str().unwrap()]);
    let (mut m, mpid, _, mlines) = workload("4", "20", &["-", &token, "match"]);
    let _mg = KillOnDrop::new(m.id());
    let (mut o, opid, _, olines) = workload("4", "20", &["-", &token, "other"]);
    let _og = KillOnDrop::new(o.id());
    // Picked up at its exec, quickly; the other never.
    let seen = poll(Duration::from_secs(3), || {
        let t = targets_json(&agent.addr);
        let pids = target_pids(&t);
        assert!(!pids.contains(&u64::from(opid)), "non-matching pid {opid} in /targets: {t}");
        pids.contains(&u64::from(mpid)).then_some(t)
    })
    .unwrap_or_else(|| panic!("pid {mpid} not in /targets within 3 s"));
    let entry = seen["targets"].as_array().unwrap().iter().find(|t| t["pid"] == mpid).unwrap();
    assert_eq!(entry["found_by"], "exec", "{entry}");
    assert!(entry["why"].to_string().contains("cmdline"), "{entry}");
    let (calls, first_second) = workload_counts(&mlines);
    let _ = workload_counts(&olines);
    let _ = (m.wait(), o.wait());
    let after = windows_written(&agent.addr) + 1;
    wait_windows(&agent.addr, after, Duration::from_secs(30));
    let (_, text) = get(&agent.addr, "/metrics");
    let samples = parse_exposition(&text);
    let got = syscall_counter(&samples, mpid, "getppid").unwrap_or_else(|| panic!("no getppid counter for pid {mpid}:\n{text}")) as u64;
    assert!(got <= calls && got >= calls - first_second, "getppid of pid {mpid}: {got}, the workload made {calls} ({first_second} in its first second)");
    let opid_s = opid.to_string();
    assert!(!samples.iter().any(|s| label(s, "pid") == Some(&opid_s)), "non-matching pid {opid} in /metrics");
    let t = targets_json(&agent.addr);
    assert!(!target_pids(&t).contains(&u64::from(mpid)), "an exited target stays in /targets: {t}");
    // The agent is still running.
    let (status, _) = get(&agent.addr, "/healthz");
    assert_eq!(status, 200);
}

/// Arguments carry secrets: `/targets`, `/report/latest` and the windows
/// show the program and the script, and a marker for the rest, unless
/// `--show-args`.
#[test]
fn agent_redacts_command_line_arguments_unless_show_args() {
    const TEST: &str = "agent_redacts_command_line_arguments_unless_show_args";
    require!(TEST, Root, Binary);
    if system_python().is_none() {
        return skip(TEST, "a python3 on PATH");
    }
    let secret = format!("sk-live-{}", std::process::id());
    let api_key = format!("--api-key={secret}");
    for show in [false, true] {
        let dir = TempDir::new("agent-redact");
        let out = dir.join("w");
        let (mut wl, pid, _, lines) = workload("3", "5", &["-", &api_key]);
        let _g = KillOnDrop::new(wl.id());
        let pid_s = pid.to_string();
        let mut args = vec!["--pid", &pid_s, "--window", "1s", "--out-dir", out.to_str().unwrap()];
        if show {
            args.push("--show-args");
        }
        let agent = start_agent(&args);
        let t = poll(Duration::from_secs(10), || {
            let t = targets_json(&agent.addr);
            target_pids(&t).contains(&u64::from(pid)).then_some(t)
        })
        .unwrap_or_else(|| panic!("pid {pid} not in /targets within 10 s"));
        wait_windows(&agent.addr, 1, Duration::from_secs(30));
        let (status, latest) = get(&agent.addr, "/report/latest");
        assert_eq!(status, 200, "{latest}");
        let (status, page) = get(&agent.addr, "/report/latest.html");
        assert_eq!(status, 200, "{page}");
        assert!(page.starts_with("<!DOCTYPE html>"), "/report/latest.html is not a page: {page}");
        let _ = workload_counts(&lines);
        let _ = wl.wait();
        let windows = window_files(&out);
        assert!(!windows.is_empty(), "no window written");
        let window = run_infertrace([std::ffi::OsStr::new("report"), "--format".as_ref(), "json".as_ref(), windows[0].as_os_str()]);
        window.assert_ok();
        let entry = t["targets"].as_array().unwrap().iter().find(|e| e["pid"] == pid).unwrap().to_string();
        // The script stays, in every view.
        for (what, text) in [("/targets", &entry), ("/report/latest", &latest), ("/report/latest.html", &page), ("the window", &window.stdout)] {
            assert!(text.contains("agent_getppid.py"), "{what} lost the script path: {text}");
            assert_eq!(text.contains(&secret), show, "{what} (--show-args {show}): {text}");
            if !show {
                // `<2 arguments redacted>`; HTML-escaped in the page.
                assert!(text.contains("arguments redacted"), "{what} has no redaction marker: {text}");
            }
        }
    }
}

/// The sum of `name` over the samples of `pid` whose labels include `with`.
fn counter_sum(samples: &[Sample], name: &str, pid: u32, with: &[(&str, &str)]) -> f64 {
    let pid = pid.to_string();
    samples
        .iter()
        .filter(|s| s.0 == name && label(s, "pid") == Some(&pid) && with.iter().all(|(k, v)| label(s, k) == Some(v)))
        .map(|s| s.2)
        .sum()
}

#[test]
fn agent_exports_exact_cuda_counters_per_window() {
    const TEST: &str = "agent_exports_exact_cuda_counters_per_window";
    require!(TEST, Root, Binary, Gcc);
    let Some(real) = real_cudart(TEST) else { return };
    let Some(sim) = cuda_standin_dir(TEST) else { return };
    let Some(python) = python3_executable(TEST) else { return };
    let dir = TempDir::new("agent-cuda");
    // A copy of our own: the workload waits for int3 on its functions.
    let lib = dir.join("libcudart.so.12");
    std::fs::copy(&real, &lib).expect("copy libcudart");
    let token = format!("agent_cuda_{}", std::process::id());
    let out = dir.join("w");
    let agent = start_agent_with(&[], &["--cmdline", &format!("{token}$"), "--window", "1s", "--out-dir", out.to_str().unwrap()]);
    let mut wl = Command::new(&python)
        .arg(workspace_root().join("tests/workloads/cuda_patterns.py"))
        .args(["patterns", &token])
        .env("CUDART", &lib)
        .env("FAKE_KERNELS", sim.join("libfakekernels.so"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cuda_patterns.py");
    let pid = wl.id();
    let _g = KillOnDrop::new(pid);
    let status = poll(Duration::from_secs(120), || wl.try_wait().ok().flatten()).expect("the workload ends");
    assert!(status.success(), "cuda_patterns.py patterns exited {status:?} (exit 3: the agent never probed its libcudart)");
    let after = windows_written(&agent.addr) + 1;
    wait_windows(&agent.addr, after, Duration::from_secs(30));
    let (_, text) = get(&agent.addr, "/metrics");
    let samples = parse_exposition(&text);
    // The workload's own table (tests/tests/cuda.rs): calls per (api, kind).
    let expected: &[(&str, &str, f64)] = &[
        ("cudaStreamSynchronize", "", (200 + 100 + 1 + 16 + 1) as f64),
        ("cudaMemcpyAsync", "HtoD", (200 + 64 + 1) as f64),
        ("cudaMemcpyAsync", "DtoH", 100.0),
        ("cudaMemcpy", "HtoD", 21.0),
        ("cudaMalloc", "", 4.0),
        ("cudaDeviceSynchronize", "", 3.0),
    ];
    for &(api, kind, n) in expected {
        let got = counter_sum(&samples, "infertrace_cuda_calls_total", pid, &[("api", api), ("kind", kind)]);
        assert_eq!(got, n, "infertrace_cuda_calls_total of {api} {kind:?}, pid {pid}:\n{text}");
        let errors = counter_sum(&samples, "infertrace_cuda_errors_total", pid, &[("api", api), ("kind", kind)]);
        assert_eq!(errors, n, "every call fails without a driver: {api} {kind:?}");
    }
    // Kernel launches by API, as the workload made them (tests/tests/cuda.rs).
    for (api, n) in [("cudaLaunchKernel", 300.0), ("cudaLaunchKernel_ptsz", 100.0)] {
        let got = counter_sum(&samples, "infertrace_cuda_launches_total", pid, &[("api", api)]);
        assert_eq!(got, n, "infertrace_cuda_launches_total of {api}, pid {pid}:\n{text}");
    }
    let bytes = counter_sum(&samples, "infertrace_cuda_bytes_total", pid, &[("api", "cudaMemcpy"), ("kind", "HtoD")]);
    assert_eq!(bytes, ((20u64 << 23) + (64 << 20)) as f64, "cudaMemcpy HtoD bytes");
    assert!(samples.iter().any(|s| s.0 == "infertrace_cuda_sync_seconds_total" && label(s, "pid") == Some(&pid.to_string())), "no sync seconds:\n{text}");
    let findings: Vec<&Sample> = samples.iter().filter(|s| s.0 == "infertrace_cuda_findings_total").collect();
    assert!(
        findings.iter().any(|s| label(s, "site").is_some_and(|v| v.contains("cuda_patterns.py:")) && s.2 >= 1.0),
        "no finding with its site:\n{text}"
    );
    // The windows hold per-window CUDA sections that add up to the same counts.
    let mut sync = 0;
    for f in window_files(&out) {
        let r = run_infertrace(["report".as_ref(), "--format".as_ref(), "json".as_ref(), f.as_os_str()]);
        r.assert_ok();
        let rep = r.json();
        for c in rep.0["cuda"]["calls"].as_array().into_iter().flatten() {
            if c["pid"].as_u64() == Some(u64::from(pid)) && c["api"] == "cudaStreamSynchronize" {
                sync += c["count"].as_u64().unwrap_or(0);
            }
        }
    }
    assert_eq!(sync, 318, "cudaStreamSynchronize calls over the windows");
}

/// GPU memory held by line in the agent (issue 25): a process that holds
/// tensors from the stand-in of PyTorch's allocator (tests/cudasim/torchsim.c,
/// NOT PyTorch; tests/workloads/torch_alloc.py `hold`): the gauges
/// `infertrace_gpu_memory_held_bytes{kind="tensors",site}` at its lines
/// and `infertrace_gpu_memory_target_bytes{kind="tensors"}` are what it
/// holds (its own table: 10 x 1 MiB kept at `keep`, 2 x 4 MiB of 5 at
/// `churn`), while it runs.
#[test]
fn agent_exports_gpu_memory_held_by_line() {
    const TEST: &str = "agent_exports_gpu_memory_held_by_line";
    require!(TEST, Root, Binary, Gcc);
    let Some(sim) = cuda_standin_dir(TEST) else { return };
    let Some(python) = python3_executable(TEST) else { return };
    let dir = TempDir::new("agent-torch");
    let lib = dir.join("libc10_cuda.so");
    std::fs::copy(sim.join("torch/libc10_cuda.so"), &lib).expect("copy the allocator stand-in");
    let token = format!("agent_torch_{}", std::process::id());
    let agent = start_agent_with(&[], &["--cmdline", &format!("{token}$"), "--window", "1s"]);
    let source = workspace_root().join("tests/workloads/torch_alloc.py");
    let mut wl = Command::new(&python)
        .arg(&source)
        .args(["hold", &token])
        .env("TORCHSIM", &lib)
        .env("RESULT", dir.join("result.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn torch_alloc.py");
    let pid = wl.id();
    let _g = KillOnDrop::new(pid);
    let mut lines = BufReader::new(wl.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("held"), "the workload did not hold its blocks");
    let m = markers_of(&source);
    const MIB: f64 = 1048576.0;
    let want = [(m["keep"], 10.0 * MIB), (m["churn"], 8.0 * MIB), (m["transient"], 0.0)];
    let held = |samples: &[Sample], line: u64| {
        samples
            .iter()
            .find(|s| s.0 == "infertrace_gpu_memory_held_bytes" && label(s, "pid") == Some(&pid.to_string()) && label(s, "kind") == Some("tensors") && label(s, "site") == Some(&format!("torch_alloc.py:{line} pattern")))
            .map(|s| s.2)
    };
    let total = |samples: &[Sample]| {
        samples.iter().find(|s| s.0 == "infertrace_gpu_memory_target_bytes" && label(s, "pid") == Some(&pid.to_string()) && label(s, "kind") == Some("tensors")).map(|s| s.2)
    };
    let text = poll(Duration::from_secs(30), || {
        let (_, text) = get(&agent.addr, "/metrics");
        let samples = parse_exposition(&text);
        let ok = want.iter().all(|&(line, bytes)| held(&samples, line) == Some(bytes)) && total(&samples) == Some(18.0 * MIB);
        ok.then_some(text)
    });
    let Some(_) = text else {
        let (_, text) = get(&agent.addr, "/metrics");
        panic!("{TEST}: gauges never matched {want:?} and 18 MiB in all:\n{}", text.lines().filter(|l| l.contains("gpu_memory")).collect::<Vec<_>>().join("\n"));
    };
    if let Some(mut stdin) = wl.stdin.take() {
        let _ = writeln!(stdin);
    }
    let _ = poll(Duration::from_secs(10), || wl.try_wait().ok().flatten());
}

/// Resident growth by line and OOM kills in the agent (issue 25): a
/// target growing 1 MiB every 10 ms at one line in a 150 MiB memory cgroup
/// until the OOM killer ends it (tests/workloads/mem_oom.py): its
/// `infertrace_resident_growth_bytes_total` at that line is about what it
/// kept before the kill (what its stderr counted, to the limit), and
/// `infertrace_oom_kills_total` is 1.
#[test]
fn agent_exports_growth_by_line_and_oom_kills() {
    const TEST: &str = "agent_exports_growth_by_line_and_oom_kills";
    require!(TEST, Root, Binary);
    let Some(python) = python3_executable(TEST) else { return };
    let limit: u64 = 150 << 20;
    let cg = match MemCgroup::new("agent-oom", limit) {
        Ok(c) => c,
        Err(why) => return skip(TEST, &format!("a memory cgroup to limit the workload ({why})")),
    };
    let token = format!("agent_oom_{}", std::process::id());
    let agent = start_agent(&["--cmdline", &format!("{token}$"), "--window", "1s"]);
    let source = workspace_root().join("tests/workloads/mem_oom.py");
    let mut cmd = cg.command(&python, &[source.as_os_str(), token.as_ref()]);
    let mut child = cmd.env("OOM_SLEEP_S", "0.01").stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn mem_oom.py");
    let pid = child.id();
    let _g = KillOnDrop::new(pid);
    let errs = line_channel(child.stderr.take().expect("stderr"));
    let status = poll(Duration::from_secs(120), || child.try_wait().ok().flatten()).expect("the workload ends");
    let grown: Vec<String> = errs.try_iter().collect();
    assert!(!grown.iter().any(|l| l.contains("not killed")), "{TEST}: not OOM-killed ({status:?}): {grown:?}");
    let kept_mib: u64 = grown.iter().filter_map(|l| l.strip_prefix("grown ")?.trim().parse().ok()).max().unwrap_or(0);
    let line = markers_of(&source)["oom_grow"];
    let site = format!("mem_oom.py:{line} main");
    let mut last = String::new();
    let got = poll(Duration::from_secs(30), || {
        let (_, text) = get(&agent.addr, "/metrics");
        let s = parse_exposition(&text);
        let kills = counter_sum(&s, "infertrace_oom_kills_total", pid, &[]);
        let at_line = counter_sum(&s, "infertrace_resident_growth_bytes_total", pid, &[("site", &site)]);
        last = text.lines().filter(|l| l.contains("oom_kills") || l.contains("resident_growth")).collect::<Vec<_>>().join("\n");
        (kills == 1.0 && at_line > 0.0).then_some(at_line)
    });
    let Some(at_line) = got else { panic!("{TEST}: pid {pid}: no OOM kill and growth at {site}:\n{last}") };
    let mib = at_line / 1048576.0;
    eprintln!("{TEST}: {mib:.1} MiB grown at {site}, the workload counted {kept_mib} MiB kept before the kill (limit 150 MiB)");
    // Sampled every 512 KiB grown; the workload's last count is at most
    // 16 MiB behind its kill, and the interpreter's own growth is elsewhere.
    assert!(mib >= kept_mib as f64 * 0.8 && mib <= 160.0, "{TEST}: {mib:.1} MiB at the line, {kept_mib} MiB kept");
}

/// A Python process that renames itself (`prctl(PR_SET_NAME)`, its comm)
/// to argv[1], then, at each line on stdin, to the next argument.
const RENAMER: &str = "import ctypes, os, sys
libc = ctypes.CDLL(None)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)
print('pid', os.getpid(), flush=True)
for name in sys.argv[2:]:
    sys.stdin.readline()
    libc.prctl(15, name.encode(), 0, 0, 0)
    print('renamed', name, flush=True)
sys.stdin.readline()
";

#[test]
fn agent_drops_a_process_that_stops_matching_without_an_exec() {
    const TEST: &str = "agent_drops_a_process_that_stops_matching_without_an_exec";
    require!(TEST, Root, Binary);
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    let dir = TempDir::new("agent-rename");
    let token = std::process::id() % 100_000;
    let (matching, other) = (format!("itrsel{token}"), format!("itroth{token}"));
    let agent = start_agent(&["--comm", &format!("^{matching}$"), "--window", "1s", "--out-dir", dir.join("w").to_str().unwrap()]);
    let mut wl = Command::new(python)
        .args(["-c", RENAMER, &matching, &other])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the renamer");
    let _g = KillOnDrop::new(wl.id());
    let mut stdin = wl.stdin.take().expect("stdin");
    let lines = line_channel(wl.stdout.take().expect("stdout"));
    let pid: u64 = lines.recv_timeout(Duration::from_secs(30)).ok().and_then(|l| l.strip_prefix("pid ")?.trim().parse().ok()).expect("pid line");
    // Renamed into the selection without an exec: found by the scan (every 5 s).
    let found = poll(Duration::from_secs(15), || target_pids(&targets_json(&agent.addr)).contains(&pid).then_some(()));
    assert!(found.is_some(), "pid {pid} (comm {matching}) not in /targets within 15 s: {}", targets_json(&agent.addr));
    stdin.write_all(b"\n").expect("rename");
    let renamed = lines.recv_timeout(Duration::from_secs(10)).expect("renamed line");
    assert!(renamed.contains(&other), "{renamed}");
    // Out of the selection without an exec: dropped by the next scan.
    let dropped = poll(Duration::from_secs(15), || (!target_pids(&targets_json(&agent.addr)).contains(&pid)).then_some(()));
    assert!(dropped.is_some(), "pid {pid}, renamed {other}, still in /targets 15 s later: {}", targets_json(&agent.addr));
    let _ = stdin.write_all(b"\n");
    let _ = wl.wait();
}

/// `/metrics` is live: with a 10-minute window, the workload's exact
/// getppid count is served within seconds of its end (the loop publishes
/// at least every 5 s), long before any window is cut.
#[test]
fn agent_metrics_are_live_whatever_the_window() {
    const TEST: &str = "agent_metrics_are_live_whatever_the_window";
    require!(TEST, Root, Binary);
    if system_python().is_none() {
        return skip(TEST, "a python3 on PATH");
    }
    let dir = TempDir::new("agent-live");
    let (mut wl, pid, stdin, lines) = workload("2", "20", &["wait"]);
    let _wl_guard = KillOnDrop::new(wl.id());
    let agent = start_agent(&["--pid", &pid.to_string(), "--window", "10m", "--out-dir", dir.join("w").to_str().unwrap()]);
    assert_eq!(target_pids(&targets_json(&agent.addr)), [u64::from(pid)]);
    stdin.expect("stdin").write_all(b"go\n").expect("release the workload");
    let (calls, _) = workload_counts(&lines);
    let _ = wl.wait();
    let t = Instant::now();
    let mut last = None;
    let seen = poll(Duration::from_secs(20), || {
        let (_, text) = get(&agent.addr, "/metrics");
        last = syscall_counter(&parse_exposition(&text), pid, "getppid");
        (last == Some(calls as f64)).then(|| t.elapsed())
    });
    let Some(after) = seen else { panic!("{TEST}: /metrics says {last:?} getppid calls of pid {pid}, not {calls}, 20 s after it ended") };
    eprintln!("{TEST}: the exact count ({calls}) was served {after:?} after the workload ended");
    // 5 s between publishes, and slack for a loaded machine.
    assert!(after <= Duration::from_secs(10), "{TEST}: served only {after:?} after the end");
    assert_eq!(windows_written(&agent.addr), 0, "{TEST}: a window was cut: the count did not come from a window");
}

/// A scrape copies text rendered when the counters were published: with
/// 200 targets (each with syscall and wall-time series) a scrape takes
/// well under 100 ms.
#[test]
fn agent_scrape_with_200_targets_is_fast() {
    const TEST: &str = "agent_scrape_with_200_targets_is_fast";
    require!(TEST, Root, Binary, Gcc);
    let exe = infertrace_e2e::workload("sleeper");
    let dir = TempDir::new("agent-200");
    let mut kids = Vec::new();
    let mut guards = Vec::new();
    let agent = start_agent(&["--comm", "^sleeper$", "--window", "10m", "--out-dir", dir.join("w").to_str().unwrap()]);
    for _ in 0..200 {
        // 4000 sleeps of 20 ms: about 80 s of nanosleep calls.
        let c = Command::new(&exe).args(["4000", "20"]).stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect("sleeper");
        guards.push(KillOnDrop::new(c.id()));
        kids.push(c);
    }
    let pids_in = |text: &str| -> std::collections::HashSet<String> {
        parse_exposition(text)
            .iter()
            .filter(|s| s.0 == "infertrace_syscalls_total")
            .filter_map(|s| label(s, "pid").map(str::to_owned))
            .filter(|p| p != "other")
            .collect()
    };
    let all = poll(Duration::from_secs(60), || {
        let (_, text) = get(&agent.addr, "/metrics");
        (pids_in(&text).len() >= 200).then_some(text.len())
    });
    let Some(bytes) = all else {
        let (_, text) = get(&agent.addr, "/metrics");
        panic!("{TEST}: /metrics has series of {} targets, not 200", pids_in(&text).len())
    };
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (status, _) = get(&agent.addr, "/metrics");
        times.push(t.elapsed());
        assert_eq!(status, 200);
        std::thread::sleep(Duration::from_millis(200));
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!("{TEST}: {bytes} bytes; scrape median {median:?}, max {:?}", times.last());
    assert!(median < Duration::from_millis(100), "{TEST}: a scrape took {median:?} (median of 20)");
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// Memory metrics of a target against `/proc` and the workload's own
/// clocks: a process that reads a 64 MiB file through a mapping after the
/// page cache dropped it (`tests/workloads/mem_stall.py pagein`), then
/// idles. `/metrics` serves its resident bytes by kind and its peak as
/// `/proc/PID/status` says, its minor and major page faults as
/// `/proc/PID/stat` says, and the loop's page-in waits as
/// `memory_stall_seconds_total{cause="page_fault"}`.
#[test]
fn agent_exports_memory_metrics_that_match_proc() {
    const TEST: &str = "agent_exports_memory_metrics_that_match_proc";
    require!(TEST, Root, Binary);
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    let dir = TempDir::new("agent-memory");
    let data = workspace_root().join(format!("target/e2e-data/agent-pagein-{}.bin", std::process::id()));
    let _ = std::fs::create_dir_all(data.parent().unwrap());
    let script = format!(
        "import os, runpy, sys\nprint('pid', os.getpid(), flush=True)\ninput()\nsys.argv = ['mem_stall.py', 'pagein', {:?}, '64']\nrunpy.run_path({:?}, run_name='__main__')\nprint('done', flush=True)\ninput()\n",
        data.to_str().unwrap(),
        workspace_root().join("tests/workloads/mem_stall.py").to_str().unwrap()
    );
    let mut child = Command::new(python).args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn the workload");
    let _guard = KillOnDrop::new(child.id());
    let mut stdin = child.stdin.take().expect("stdin");
    let lines = line_channel(child.stdout.take().expect("stdout"));
    let errs = line_channel(child.stderr.take().expect("stderr"));
    let first = lines.recv_timeout(Duration::from_secs(30)).expect("the workload's pid line");
    let pid: u32 = first.strip_prefix("pid ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("pid line: {first:?}"));
    let agent = start_agent(&["--pid", &pid.to_string(), "--window", "10m", "--out-dir", dir.join("w").to_str().unwrap()]);
    assert_eq!(target_pids(&targets_json(&agent.addr)), [u64::from(pid)]);
    stdin.write_all(b"go\n").expect("release the workload");
    let done = lines.recv_timeout(Duration::from_secs(120));
    let _ = std::fs::remove_file(&data);
    assert_eq!(done.as_deref().ok(), Some("done"), "{TEST}: the workload did not finish");
    let loop_line = errs.try_iter().find(|l| l.starts_with("loop ")).unwrap_or_else(|| panic!("{TEST}: no loop line on the workload's stderr"));
    let f: Vec<u64> = loop_line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let blocked = f[0].saturating_sub(f[1]).saturating_sub(f.get(3).copied().unwrap_or(0));
    // The truth, read now that the workload idles.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok()).unwrap_or(-1.0) * 1024.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let sf: Vec<f64> = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().map(|v| v.parse().unwrap_or(-1.0)).collect();
    let (minor, major) = (sf[7], sf[9]);
    let mut last = String::new();
    let got = poll(Duration::from_secs(20), || {
        let (_, text) = get(&agent.addr, "/metrics");
        let s = parse_exposition(&text);
        let v = |name: &str, with: &[(&str, &str)]| counter_sum(&s, name, pid, with);
        let row = (
            v("infertrace_resident_bytes", &[("kind", "anon")]),
            v("infertrace_resident_peak_bytes", &[]),
            v("infertrace_page_faults_total", &[("kind", "minor")]),
            v("infertrace_page_faults_total", &[("kind", "major")]),
            v("infertrace_memory_stall_seconds_total", &[("cause", "page_fault")]),
        );
        last = format!("{row:?}");
        (row.2 == minor && row.3 == major && row.4 > 0.0).then_some(row)
    });
    let Some((anon, peak, _, _, stall)) = got else {
        panic!("{TEST}: /metrics (anon, peak, minor, major, page-fault stall) {last}, /proc: minor {minor} major {major}")
    };
    eprintln!("{TEST}: anon {anon} (/proc {}), peak {peak} (VmHWM {}), faults {minor}/{major}, page-fault stall {stall:.4} s (loop blocked {:.4} s)", kb("RssAnon"), kb("VmHWM"), blocked as f64 / 1e9);
    assert!((anon - kb("RssAnon")).abs() <= (1u64 << 20) as f64, "{TEST}: resident anon {anon}, /proc {}", kb("RssAnon"));
    assert_eq!(peak, kb("VmHWM"), "{TEST}: peak");
    assert!(major > 0.0, "{TEST}: no major faults: the page cache was not dropped");
    let b = blocked as f64 / 1e9;
    assert!(stall >= 0.85 * b - 0.005 && stall <= 1.15 * b + 0.02, "{TEST}: page-fault stall {stall} s, the loop blocked {b} s");
    drop(stdin);
    let _ = child.wait();
}
