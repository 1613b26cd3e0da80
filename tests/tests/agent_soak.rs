//! The agent's memory, over time and under a memory limit.
//!
//! - flat: `infertrace agent --python --window 10s` for 3 minutes under 2
//!   new Python processes per second, each with an environment of its own,
//!   and 20 busy Python processes (tests/workloads/agent_soak_load.py, the
//!   load of `cargo xtask soak --agent` at a pace a loaded 2-core CI
//!   machine keeps up with; the load runs at nice 10, as a pod's CPU
//!   request keeps the agent a share of the CPU). Its resident memory over the third minute
//!   stays within 10% (plus 8 MiB for the allocator's and the page
//!   cache's moods) of the first minute's, and its open descriptors within
//!   8; and it did trace the load (its windows hold getppid calls of most
//!   of the churned processes). The readings are the peaks of each
//!   stretch, so a reading taken while a window is being cut does not
//!   make a growth out of nothing.
//! - 128 MiB: started inside a memory cgroup limited to 128 MiB (created
//!   here, cgroup v2 or v1), the agent loads with its defaults, serves
//!   /metrics, writes its windows and is not OOM-killed; in a 40 MiB one it
//!   exits non-zero at once with a one-line error that names memory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::*;

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok().map(|d| d.count())
}

fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get(addr, path).map(|(status, _, body)| (status, body))
}

/// The address from the agent's `listening on http://ADDR` line.
fn listen_addr(lines: &std::sync::mpsc::Receiver<String>, seen: &mut Vec<String>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push(line.clone());
        if let Some(rest) = line.split("listening on http://").nth(1) {
            return rest.split_whitespace().next().map(str::to_owned);
        }
    }
    None
}

#[test]
fn agent_memory_and_descriptors_stay_flat_under_churn_and_busy_targets() {
    const TEST: &str = "agent_memory_and_descriptors_stay_flat_under_churn_and_busy_targets";
    require!(TEST, Root, Binary);
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    let dir = TempDir::new(TEST);
    let load = workspace_root().join("tests/workloads/agent_soak_load.py");
    let mut agent = Command::new(bin())
        .args(["agent", "--python", "--no-cuda", "--window", "10s", "--listen", "127.0.0.1:0", "--cmdline", "SOAKLOAD", "--out-dir"])
        .arg(dir.join("w"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent");
    let apid = agent.id();
    let _guard = KillOnDrop::new(apid);
    let lines = line_channel(agent.stderr.take().expect("stderr"));
    let mut said = Vec::new();
    let addr = listen_addr(&lines, &mut said).unwrap_or_else(|| panic!("{TEST}: the agent did not start: {said:?}"));
    const SECONDS: u64 = 180;
    // The token on each command line selects them (and nothing else).
    let spawn = |mode: &str, n: &str| {
        Command::new(&python)
            .arg(&load)
            .args([mode, &SECONDS.to_string(), n, "SOAKLOAD"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the load")
    };
    let mut busy = spawn("busy", "20");
    let churn = spawn("churn", "2");
    let _busy_guard = KillOnDrop::new(busy.id());
    let _churn_guard = KillOnDrop::new(churn.id());
    let t0 = Instant::now();
    let mut readings: Vec<(f64, u64, usize)> = Vec::new();
    while t0.elapsed() < Duration::from_secs(SECONDS) {
        std::thread::sleep(Duration::from_secs(2));
        assert!(alive(apid), "{TEST}: the agent died after {:?}", t0.elapsed());
        if let (Some(kb), Some(n)) = (status_kb(apid, "VmRSS:"), fds(apid)) {
            readings.push((t0.elapsed().as_secs_f64(), kb, n));
        }
        // Scraped as Prometheus would.
        let _ = get(&addr, "/metrics");
    }
    let peak = |from: f64, to: f64| {
        let r: Vec<&(f64, u64, usize)> = readings.iter().filter(|r| r.0 >= from && r.0 < to).collect();
        assert!(!r.is_empty(), "{TEST}: no reading between {from} s and {to} s");
        (r.iter().map(|r| r.1).max().unwrap_or(0), r.iter().map(|r| r.2).max().unwrap_or(0))
    };
    let (rss1, fds1) = peak(45.0, 75.0);
    let (rss3, fds3) = peak(150.0, 180.0);
    let started = |c: std::process::Child| -> u64 {
        let out = c.wait_with_output().expect("the load's count");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
    };
    kill(apid, libc::SIGTERM);
    let st = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("the agent exits after SIGTERM");
    assert!(st.success(), "{TEST}: the agent exited with {st:?}");
    let _ = busy.try_wait();
    let churned = started(churn);
    let _ = started(busy);
    eprintln!(
        "{TEST}: agent RSS peak minute 1 {rss1} kB, minute 3 {rss3} kB ({:+.1}%); fds {fds1} -> {fds3}; {churned} processes churned",
        (rss3 as f64 - rss1 as f64) / rss1 as f64 * 100.0
    );
    // The agent did trace the load: getppid calls of most churned processes.
    let mut pids = std::collections::HashSet::new();
    for f in std::fs::read_dir(dir.join("w")).expect("windows").filter_map(|e| e.ok()) {
        if !f.file_name().to_string_lossy().ends_with(".itr") {
            continue;
        }
        let rec = read_itr(&f.path());
        for s in rec["syscalls"].as_array().into_iter().flatten() {
            if s["nr"].as_u64() == Some(110) || s["nr"].as_u64() == Some(173) {
                pids.insert(s["pid"].as_u64().unwrap_or(0));
            }
        }
    }
    assert!(churned >= 200, "{TEST}: the load started only {churned} processes");
    assert!(pids.len() as u64 >= churned / 2, "{TEST}: getppid calls of only {} pids in the windows, {churned} processes churned", pids.len());
    let bound = rss1 + rss1 / 10 + 8 * 1024;
    assert!(rss3 <= bound, "{TEST}: RSS grew from {rss1} kB (minute 1) to {rss3} kB (minute 3), over {bound} kB");
    assert!(fds3 <= fds1 + 8, "{TEST}: open descriptors grew from {fds1} to {fds3}");
}

/// A memory cgroup of its own, removed on drop (its processes killed first).
struct MemCgroup {
    dir: PathBuf,
    /// Where a pid is written to move it in.
    procs: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// Under our own memory cgroup (v2, else v1's memory hierarchy).
    fn new(tag: &str, bytes: u64) -> Result<MemCgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let v1 = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',').any(|c| c == "memory").then(|| p.to_owned())
        });
        let (base, v2) = match v1 {
            Some(p) => (Path::new("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')), false),
            None => {
                let p = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("no cgroup v2 line")?;
                let base = Path::new("/sys/fs/cgroup").join(p.trim_start_matches('/'));
                let ctl = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
                if !ctl.split_whitespace().any(|c| c == "memory") {
                    return Err(format!("no memory controller in {}", base.display()));
                }
                (base, true)
            }
        };
        let dir = base.join(format!("itr-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let (limit, swap) = if v2 { ("memory.max", "memory.swap.max") } else { ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") };
        std::fs::write(dir.join(limit), bytes.to_string()).map_err(|e| format!("{limit}: {e}"))?;
        // No swap to escape to, where the knob exists.
        let _ = std::fs::write(dir.join(swap), if v2 { "0".to_string() } else { bytes.to_string() });
        Ok(MemCgroup { procs: dir.join("cgroup.procs"), dir, v2 })
    }

    /// OOM kills in it so far.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `cmd` started inside the cgroup (moved in before its exec).
    fn spawn(&self, cmd: &mut Command) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let procs = self.procs.clone();
        // SAFETY: the closure only writes a file (open/write/close), which
        // is async-signal-safe enough for a fresh child of a test.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, b"0"));
        }
        cmd.spawn().expect("spawn in the cgroup")
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(&self.procs).unwrap_or_default().lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            kill(pid, libc::SIGKILL);
        }
        let _ = poll(Duration::from_secs(10), || std::fs::remove_dir(&self.dir).ok());
    }
}

#[test]
fn agent_starts_and_runs_in_a_128_mib_memory_cgroup() {
    const TEST: &str = "agent_starts_and_runs_in_a_128_mib_memory_cgroup";
    require!(TEST, Root, Binary);
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    let cg = match MemCgroup::new("128", 128 << 20) {
        Ok(c) => c,
        Err(e) => return skip(TEST, &format!("a memory cgroup of our own ({e})")),
    };
    let dir = TempDir::new(TEST);
    let mut agent = cg.spawn(
        Command::new(bin())
            .args(["agent", "--python", "--window", "3s", "--listen", "127.0.0.1:0", "--cmdline", "CGLOAD", "--out-dir"])
            .arg(dir.join("w"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let apid = agent.id();
    let _guard = KillOnDrop::new(apid);
    let lines = line_channel(agent.stderr.take().expect("stderr"));
    let mut said = Vec::new();
    let addr = listen_addr(&lines, &mut said);
    let exited = agent.try_wait().ok().flatten();
    let Some(addr) = addr else {
        panic!("{TEST}: the agent did not start in 128 MiB (exit {exited:?}, OOM kills {}): {said:?}", cg.oom_kills());
    };
    let load = workspace_root().join("tests/workloads/agent_soak_load.py");
    let mut busy = Command::new(&python)
        .arg(&load)
        .args(["busy", "15", "5", "CGLOAD"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the load");
    let _busy_guard = KillOnDrop::new(busy.id());
    let mut peak = 0;
    let t0 = Instant::now();
    let mut getppid_seen = false;
    while t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_secs(1));
        assert!(alive(apid), "{TEST}: the agent died in 128 MiB (OOM kills {}): {said:?}", cg.oom_kills());
        peak = peak.max(status_kb(apid, "VmRSS:").unwrap_or(0));
        if let Some((200, body)) = get(&addr, "/metrics") {
            getppid_seen |= body.lines().any(|l| l.starts_with("infertrace_syscalls_total{") && l.contains("syscall=\"getppid\""));
        }
    }
    let _ = busy.wait();
    kill(apid, libc::SIGTERM);
    let st = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("the agent exits after SIGTERM");
    while let Ok(l) = lines.try_recv() {
        said.push(l);
    }
    eprintln!("{TEST}: agent peak RSS {peak} kB in 128 MiB; said {said:?}");
    assert!(st.success(), "{TEST}: exit {st:?}: {said:?}");
    assert_eq!(cg.oom_kills(), 0, "{TEST}: OOM kills in the cgroup");
    assert!(getppid_seen, "{TEST}: /metrics never showed the load's getppid calls");
    let windows = std::fs::read_dir(dir.join("w")).map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".itr")).count()).unwrap_or(0);
    assert!(windows >= 3, "{TEST}: {windows} windows written in ~15 s of 3 s windows");
    assert!(said.iter().any(|l| l.contains("window")), "{TEST}: no window line: {said:?}");

    // Too little: refused at once, in one line that names memory.
    let small = match MemCgroup::new("40", 40 << 20) {
        Ok(c) => c,
        Err(e) => panic!("{TEST}: a second cgroup: {e}"),
    };
    let child = small.spawn(
        Command::new(bin())
            .args(["agent", "--python", "--listen", "127.0.0.1:0", "--cmdline", "CGLOAD", "--out-dir"])
            .arg(dir.join("w2"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let out = wait_child(child, Duration::from_secs(60), "agent in 40 MiB");
    let err = out.stderr.clone();
    assert!(out.code().is_some_and(|c| c != 0), "{TEST}: in 40 MiB: {}", out.describe());
    assert!(err.contains("memory"), "{TEST}: the error does not name memory: {err}");
    assert!(!err.contains("eBPF support"), "{TEST}: the error blames eBPF support: {err}");
}
