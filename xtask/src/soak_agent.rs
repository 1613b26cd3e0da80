//! `cargo xtask soak --agent`: `infertrace agent --python` for N minutes
//! (30 by default) against two loads at once, both from
//! tests/workloads/agent_soak_load.py: 5 new Python processes per second,
//! each with an environment of its own (churn), and 50 busy Python
//! processes for the whole run. Prints the agent's RSS and open
//! descriptors at each minute, and the growth from minute 2 to the end
//! (the goal: at most 10%, descriptors flat). Not part of `test`.

use std::{
    fs,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::util;

/// New Python processes per second, each with its own environment.
const CHURN_PER_S: u32 = 5;
/// Python processes busy for the whole run.
const BUSY: u32 = 50;

pub struct AgentSoakArgs {
    pub minutes: u32,
    pub build: bool,
    /// The agent's `--window` (its default: 60s).
    pub window: String,
}


fn fds(pid: u32) -> Option<usize> {
    fs::read_dir(format!("/proc/{pid}/fd")).ok().map(|d| d.count())
}

fn stop(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        util::signal(child.id(), util::SIGKILL);
        let _ = child.wait();
    }
}

pub fn soak(args: AgentSoakArgs) -> Result<()> {
    if args.minutes < 3 {
        bail!("--minutes must be at least 3 with --agent (the growth is measured from minute 2)");
    }
    let bin = util::tracer_for("the agent soak", args.build)?;
    let python = util::python3()?;
    let load = util::workspace_root().join("tests/workloads/agent_soak_load.py");
    let dir = util::target_dir().join("soak-agent");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let seconds = u64::from(args.minutes) * 60;
    println!(
        "agent soak: {} minute(s), `infertrace agent --python --window {}`, {CHURN_PER_S} new Python processes/s (each its own environment) and {BUSY} busy ones",
        args.minutes, args.window
    );
    let mut agent = Command::new(&bin)
        .args(["agent", "-q", "--python", "--window", &args.window, "--listen", "127.0.0.1:0", "--out-dir"])
        .arg(dir.join("windows"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let apid = agent.id();
    // Let it load and attach before the load starts.
    thread::sleep(Duration::from_secs(5));
    let spawn_load = |mode: &str, n: u32| {
        Command::new(&python)
            .arg(&load)
            .args([mode, &(seconds + 10).to_string(), &n.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", load.display()))
    };
    let mut loads = Vec::new();
    for (mode, n) in [("busy", BUSY), ("churn", CHURN_PER_S)] {
        match spawn_load(mode, n) {
            Ok(c) => loads.push(c),
            Err(e) => {
                loads.iter_mut().for_each(stop);
                stop(&mut agent);
                return Err(e);
            }
        }
    }
    let t0 = Instant::now();
    println!("{:>6}  {:>10}  {:>5}  {:>7}", "minute", "agent RSS", "fds", "windows");
    let mut rows: Vec<(u32, u64, usize)> = Vec::new();
    let windows = || fs::read_dir(dir.join("windows")).map(|d| d.count()).unwrap_or(0);
    for minute in 1..=args.minutes {
        while t0.elapsed() < Duration::from_secs(u64::from(minute) * 60) {
            if !matches!(agent.try_wait(), Ok(None)) {
                break;
            }
            thread::sleep(Duration::from_millis(500));
        }
        let (Some(kb), Some(n)) = (util::status_kb(apid, "VmRSS:"), fds(apid)) else { break };
        // Windows written so far (up to the agent's --keep): a loop that
        // fell behind cuts fewer, and its memory says less.
        println!("{minute:>6}  {:>7} MB  {n:>5}  {:>7}", kb / 1024, windows());
        rows.push((minute, kb, n));
    }
    let alive = matches!(agent.try_wait(), Ok(None));
    util::signal(apid, util::SIGTERM);
    let status = agent.wait().context("waiting for the agent")?;
    loads.iter_mut().for_each(stop);
    if !alive {
        bail!("the agent exited during the soak ({status})");
    }
    let (Some(two), Some(last)) = (rows.iter().find(|r| r.0 == 2), rows.last()) else {
        bail!("too few readings");
    };
    let growth = (last.1 as f64 - two.1 as f64) / two.1 as f64 * 100.0;
    println!(
        "agent RSS from minute 2 to minute {}: {} -> {} MB ({growth:+.1}%, goal <= +10%); fds {} -> {}",
        last.0,
        two.1 / 1024,
        last.1 / 1024,
        two.2,
        last.2
    );
    println!("windows kept: {} in {}; the agent exited with {status}", windows(), dir.join("windows").display());
    Ok(())
}
