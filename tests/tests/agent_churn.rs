//! `infertrace agent` under process churn: short processes matching the
//! selector start and exit all the time; the agent keeps running, writes
//! its windows, and whatever stops it (SIGTERM, or kill -9) its BPF
//! programs and links are gone afterwards (`bpftool`). The agent's RSS
//! after the first 100 processes and at the end is printed (not asserted:
//! see docs/deploy.md, "Limits").

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()))
        .unwrap_or(0)
}

fn churn_then_stop(test: &str, sig: i32, processes: usize) {
    let dir = TempDir::new(test);
    let exe = workload("getppid_n");
    let mut agent = Command::new(bin())
        .args(["agent", "-q", "--no-cuda", "--window", "2s", "--listen", "127.0.0.1:0", "--comm", "^getppid_n$", "--out-dir"])
        .arg(dir.join("w"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    let apid = agent.id();
    let mut guard = KillOnDrop::new(apid);
    let progs = poll(Duration::from_secs(60), || {
        let p = held_prog_ids(apid);
        (p.len() >= 3).then_some(p)
    })
    .unwrap_or_else(|| panic!("{test}: the agent holds no BPF programs"));
    let links: HashSet<u64> = held_link_ids(apid);
    let mut after_100 = 0;
    for i in 0..processes {
        let st = Command::new(&exe).args(["100", "20"]).status().expect("getppid_n");
        assert!(st.success());
        if i == 99 {
            after_100 = rss_kb(apid);
        }
        assert!(alive(apid), "{test}: the agent died after {i} processes");
    }
    let end = rss_kb(apid);
    eprintln!("{test}: agent RSS after 100 processes {after_100} kB, after {processes}: {end} kB");
    let files = std::fs::read_dir(dir.join("w")).map(|d| d.count()).unwrap_or(0);
    assert!(files >= 1, "{test}: no window written");
    kill(apid, sig);
    let status = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("the agent exits");
    guard.disarm();
    if sig == libc::SIGTERM {
        assert!(status.success(), "{test}: exit {status:?}");
    }
    let gone = poll(Duration::from_secs(5), || {
        let now = bpf_prog_ids();
        let left: Vec<u64> = progs.iter().copied().filter(|p| now.contains(p)).collect();
        let links_now: HashSet<u64> = bpf_links().unwrap_or_default().into_iter().map(|(l, _)| l).collect();
        let links_left: Vec<u64> = links.iter().copied().filter(|l| links_now.contains(l)).collect();
        (left.is_empty() && links_left.is_empty()).then_some(())
    });
    assert!(gone.is_some(), "{test}: programs {progs:?} or links {links:?} still there after the agent exited");
}

#[test]
fn agent_churn_then_sigterm_leaves_no_bpf_programs() {
    const TEST: &str = "agent_churn_then_sigterm_leaves_no_bpf_programs";
    require!(TEST, Root, Binary, Gcc, Bpftool);
    churn_then_stop(TEST, libc::SIGTERM, 300);
}

#[test]
fn agent_churn_then_kill_9_leaves_no_bpf_programs() {
    const TEST: &str = "agent_churn_then_kill_9_leaves_no_bpf_programs";
    require!(TEST, Root, Binary, Gcc, Bpftool);
    churn_then_stop(TEST, libc::SIGKILL, 150);
}
