//! `infertrace agent --container ID` on the host traces a Python workload
//! in a real podman container (runc; the image and configuration come
//! from `cargo xtask setup`: `target/podman/`, image
//! `localhost/infertrace-pytest` imported from the debootstrap'd Debian root
//! with python3.14). Checked against the workload's own numbers: its
//! getppid count exactly (the agent's windows add up to it, and /metrics
//! holds it, labelled with the container id), its getppid time within the
//! time the workload itself spent in the calls, both PIDs (host, and 1 in
//! the container's namespace) and the container id in /targets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

const IMAGE: &str = "localhost/infertrace-pytest";

fn podman() -> Command {
    let dir = workspace_root().join("target/podman");
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", dir.join("containers.conf")).env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"));
    c
}

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
}

fn windows_written(addr: &str) -> u64 {
    get(addr, "/healthz").lines().find_map(|l| l.strip_prefix("windows_written ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn agent_traces_a_podman_container_by_id() {
    const TEST: &str = "agent_traces_a_podman_container_by_id";
    require!(TEST, Root, Binary);
    if !in_path("podman") || !in_path("runc") {
        return skip(TEST, "podman and runc (Debian packages; `cargo xtask setup` installs them)");
    }
    let image = podman().args(["image", "exists", IMAGE]).status();
    if !image.is_ok_and(|s| s.success()) {
        return skip(TEST, &format!("the podman image {IMAGE} (`cargo xtask setup` imports it)"));
    }
    let dir = TempDir::new("agent-container");
    let name = format!("itr-agent-{}", std::process::id());
    let workloads: PathBuf = workspace_root().join("tests/workloads");
    let mut ctr = podman()
        .args(["run", "--rm", "-i", "--name", &name, "-v"])
        .arg(format!("{}:/w:ro", workloads.display()))
        .args([IMAGE, "/usr/bin/python3.14", "/w/agent_getppid.py", "3", "20", "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let _ctr_guard = KillOnDrop::new(ctr.id());
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = podman().args(["rm", "-f", &self.0]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
    let _rm = Remove(name.clone());
    let lines = line_channel(ctr.stdout.take().expect("stdout"));
    let first = lines.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
        let mut err = String::new();
        let _ = ctr.stderr.take().map(|mut e| e.read_to_string(&mut err));
        panic!("the container did not start: {err}")
    });
    assert_eq!(first.trim(), "pid 1", "the workload is pid 1 of the container");
    let inspect = |f: &str| {
        let o = podman().args(["inspect", "-f", f, &name]).output().expect("podman inspect");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let id = inspect("{{.Id}}");
    let host_pid: u32 = inspect("{{.State.Pid}}").parse().unwrap_or_else(|_| panic!("host pid of {name}"));
    assert_eq!(id.len(), 64, "container id {id:?}");

    let mut agent = Command::new(bin())
        .args(["agent", "--no-cuda", "--window", "1s", "--listen", "127.0.0.1:0", "--container", &id[..12], "--out-dir"])
        .arg(dir.join("windows"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    let _agent_guard = KillOnDrop::new(agent.id());
    let err = line_channel(agent.stderr.take().expect("stderr"));
    let addr = loop {
        let line = err.recv_timeout(Duration::from_secs(60)).expect("the agent's listening line");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let targets: Value = serde_json::from_str(&get(&addr, "/targets")).expect("/targets JSON");
    let list = targets["targets"].as_array().expect("targets");
    let t = list.iter().find(|t| t["pid"] == host_pid).unwrap_or_else(|| panic!("host pid {host_pid} not in /targets: {targets}"));
    assert_eq!(t["ns_pid"], 1, "{t}");
    assert_eq!(t["container_id"], id.as_str(), "{t}");
    assert_eq!(t["runtime"], "podman", "{t}");
    assert!(list.iter().all(|t| t["container_id"] == id.as_str()), "only the container's processes: {targets}");

    ctr.stdin.take().expect("stdin").write_all(b"go\n").expect("release the workload");
    let line = lines.recv_timeout(Duration::from_secs(60)).expect("count line");
    let f: Vec<&str> = line.split_whitespace().collect();
    let field = |k: &str| -> u64 { f.iter().position(|w| *w == k).and_then(|i| f.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{k} in {line:?}")) };
    let (calls, batch_ns) = (field("calls"), field("batch_ns"));
    let _ = ctr.wait();
    let n = windows_written(&addr) + 1;
    assert!(poll(Duration::from_secs(30), || (windows_written(&addr) >= n).then_some(())).is_some(), "no window after the workload");
    let metrics = get(&addr, "/metrics");
    let series = metrics
        .lines()
        .find(|l| l.starts_with("infertrace_syscalls_total{") && l.contains(&format!("pid=\"{host_pid}\"")) && l.contains("syscall=\"getppid\""))
        .unwrap_or_else(|| panic!("no getppid series for pid {host_pid}:\n{metrics}"));
    assert!(series.contains(&format!("container_id=\"{id}\"")), "container_id label: {series}");
    let value: f64 = series.rsplit(' ').next().unwrap().parse().expect("value");
    assert_eq!(value, calls as f64, "getppid counter vs the workload's count: {series}");

    kill(agent.id(), libc::SIGTERM);
    let status = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("agent exits");
    assert!(status.success(), "{status:?}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("windows")).unwrap().filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "itr")).collect();
    files.sort();
    let (mut count, mut total_ns) = (0, 0);
    for f in &files {
        let r = run_infertrace(["report".as_ref(), "--format".as_ref(), "json".as_ref(), f.as_os_str()]);
        r.assert_ok();
        let rep = r.json();
        rep.check_invariants();
        count += rep.count(host_pid, "getppid");
        total_ns += rep.field(host_pid, "getppid", "total_ns");
        let window = rep.0["duration_ns"].as_u64().unwrap();
        let max = rep.field(host_pid, "getppid", "max_ns");
        assert!(max <= window, "{}: a getppid of {max} ns in a window of {window} ns", f.display());
    }
    assert_eq!(count, calls, "getppid over {} windows vs the workload's count", files.len());
    assert!(total_ns <= batch_ns, "getppid time {total_ns} ns exceeds the {batch_ns} ns the workload spent making the calls");
    eprintln!("container {}: {calls} getppid, {:.2} us/call traced, batches {:.2} us/call", &id[..12], total_ns as f64 / calls as f64 / 1e3, batch_ns as f64 / calls as f64 / 1e3);
}
