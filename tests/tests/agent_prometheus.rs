//! A real Prometheus (Debian's `prometheus` package, started here on
//! loopback) scrapes `infertrace agent`; after at least two scrapes, its
//! HTTP API (`/api/v1/query`) must return the workload's own getppid count
//! for the agent's `infertrace_syscalls_total` counter.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    // Prometheus answers chunked without Content-Length for some requests.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_owned() };
    Some((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The single value of an instant query, if there is exactly one series.
fn query(prom: &str, q: &str) -> Option<f64> {
    let (status, body) = get(prom, &format!("/api/v1/query?query={}", urlencode(q)))?;
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_the_agent_and_reads_the_exact_getppid_count() {
    const TEST: &str = "prometheus_scrapes_the_agent_and_reads_the_exact_getppid_count";
    require!(TEST, Root, Binary);
    if !in_path("prometheus") {
        return skip(TEST, "prometheus (Debian package `prometheus`; `cargo xtask setup` installs it)");
    }
    let Some((python, _)) = system_python() else {
        return skip(TEST, "a python3 on PATH");
    };
    let dir = TempDir::new("agent-prometheus");
    // The workload, held until the agent traces it.
    let mut wl = Command::new(&python)
        .arg(workspace_root().join("tests/workloads/agent_getppid.py"))
        .args(["3", "20", "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("workload");
    let _wl_guard = KillOnDrop::new(wl.id());
    let lines = line_channel(wl.stdout.take().expect("stdout"));
    let first = lines.recv_timeout(Duration::from_secs(30)).expect("pid line");
    let pid: u32 = first.strip_prefix("pid ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{first:?}"));

    let agent_port = free_port();
    let agent_addr = format!("127.0.0.1:{agent_port}");
    let mut agent = Command::new(bin())
        .args(["agent", "--no-cuda", "-q", "--window", "1s", "--pid", &pid.to_string(), "--listen", &agent_addr, "--out-dir"])
        .arg(dir.join("windows"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    let _agent_guard = KillOnDrop::new(agent.id());
    let up = poll(Duration::from_secs(60), || {
        let (_, body) = get(&agent_addr, "/targets")?;
        body.contains(&format!("\"pid\": {pid}")).then_some(())
    });
    assert!(up.is_some(), "the agent does not trace pid {pid} on {agent_addr}");
    wl.stdin.take().expect("stdin").write_all(b"go\n").expect("release the workload");
    let line = lines.recv_timeout(Duration::from_secs(60)).expect("count line");
    let calls: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    let _ = wl.wait();

    let prom_port = free_port();
    let prom_addr = format!("127.0.0.1:{prom_port}");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: infertrace\n    static_configs:\n      - targets: ['{agent_addr}']\n"),
    )
    .expect("config");
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus");
    let _prom_guard = KillOnDrop::new(prom.id());
    let series = format!("infertrace_syscalls_total{{pid=\"{pid}\",syscall=\"getppid\"}}");
    let start = Instant::now();
    let (scrapes, value) = poll(Duration::from_secs(90), || {
        // At least two scrapes of the series, and the counter at its final value.
        let scrapes = query(&prom_addr, &format!("count_over_time({series}[5m])"))?;
        let value = query(&prom_addr, &series)?;
        (scrapes >= 2.0 && value >= calls as f64).then_some((scrapes, value))
    })
    .unwrap_or_else(|| {
        panic!(
            "Prometheus on {prom_addr} has no 2 scrapes of {series} = {calls} after {:?}: now {:?}",
            start.elapsed(),
            query(&prom_addr, &series)
        )
    });
    assert_eq!(value, calls as f64, "Prometheus's {series} after {scrapes} scrapes vs the workload's count");
    kill(agent.id(), libc::SIGTERM);
    let status = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("agent exits");
    assert!(status.success(), "agent exit {status:?}");
    kill(prom.id(), libc::SIGTERM);
    let _ = prom.wait();
}
