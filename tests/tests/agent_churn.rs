//! `infertrace agent` under process churn: short processes matching the
//! selector start and exit all the time; the agent keeps running, writes
//! its windows, and whatever stops it (SIGTERM, or kill -9) its BPF
//! programs and links are gone afterwards (`bpftool`). Memory: 1,000
//! short matching processes over a minute, with /metrics scraped every
//! second as Prometheus would: the agent's resident and peak memory at the
//! end are within 10% of its peak over the first 100 (the resident size at
//! that moment varies with when the allocator last gave memory back).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::*;

fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:")
}

/// A `kB` field of /proc/PID/status (0 when unreadable).
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next()?.parse().ok()))
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

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn scrape(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    s.read_to_string(&mut body).is_ok() && body.starts_with("HTTP/1.1 200")
}

#[test]
fn agent_memory_stays_flat_over_1000_short_processes() {
    const TEST: &str = "agent_memory_stays_flat_over_1000_short_processes";
    require!(TEST, Root, Binary, Gcc);
    let dir = TempDir::new(TEST);
    let exe = workload("getppid_n");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut agent = Command::new(bin())
        .args(["agent", "-q", "--no-cuda", "--window", "2s", "--keep", "5", "--comm", "^getppid_n$", "--listen", &addr, "--out-dir"])
        .arg(dir.join("w"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    let apid = agent.id();
    let _guard = KillOnDrop::new(apid);
    assert!(poll(Duration::from_secs(60), || scrape(&addr).then_some(())).is_some(), "{TEST}: /metrics never answered on {addr}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let (stop, addr) = (stop.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += u32::from(scrape(&addr));
                std::thread::sleep(Duration::from_secs(1));
            }
            n
        })
    };
    let started = std::time::Instant::now();
    let (mut after_100, mut peak_100) = (0, 0);
    for i in 0..1000u32 {
        // 1,000 over about 60 s.
        let due = Duration::from_millis(60 * u64::from(i));
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        let st = Command::new(&exe).args(["100", "20"]).status().expect("getppid_n");
        assert!(st.success());
        if i == 99 {
            // Two windows for the first ones to be scraped and forgotten as they will be later.
            std::thread::sleep(Duration::from_secs(5));
            after_100 = rss_kb(apid);
            peak_100 = status_kb(apid, "VmHWM:");
        }
        if i % 100 == 99 {
            eprintln!("{TEST}: RSS after {} processes: {} kB", i + 1, rss_kb(apid));
        }
    }
    // The last ones' windows close and are scraped.
    std::thread::sleep(Duration::from_secs(5));
    let (end, peak_end) = (rss_kb(apid), status_kb(apid, "VmHWM:"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scrapes = scraper.join().expect("scraper");
    eprintln!(
        "{TEST}: agent RSS after 100 processes {after_100} kB (peak so far {peak_100} kB), after 1000: {end} kB (peak {peak_end} kB) ({scrapes} scrapes, {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(alive(apid), "{TEST}: the agent died");
    assert!(after_100 > 0 && peak_100 > 0 && scrapes > 30, "{TEST}: RSS {after_100} kB, peak {peak_100} kB, {scrapes} scrapes");
    // The resident size after 100 processes depends on when the allocator last gave memory back
    // (seen: 32 MB in one run, 41 MB in others, with the same 42 MB at the end); the peak does not.
    // Memory that grows with churn raises both the end's resident size and the peak.
    assert!(
        end as f64 <= peak_100 as f64 * 1.10 && peak_end as f64 <= peak_100 as f64 * 1.10,
        "{TEST}: agent memory grew from a peak of {peak_100} kB over the first 100 processes to {end} kB resident, \
         {peak_end} kB peak after 1000 (more than 10%)"
    );
    kill(apid, libc::SIGTERM);
    let status = poll(Duration::from_secs(60), || agent.try_wait().ok().flatten()).expect("the agent exits");
    assert!(status.success(), "{TEST}: exit {status:?}");
}
