//! `cargo xtask soak`: thread and process churn under `infertrace record`
//! for N minutes (10 by default), the tracer's resident memory printed at
//! each minute, then the recording's size and what `report` takes on it.
//! Not part of `test`: it is long, and its figures are for people to read.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::util;

/// The workload's pace: the rate at which issue 15 saw memory grow.
const THREADS_PER_S: u32 = 850;
/// Short threads started, then joined, per batch; a child process is
/// forked and reaped every `FORK_EVERY` batches (about 10 processes/s).
const BATCH: u32 = 8;
const FORK_EVERY: u32 = 10;

pub struct SoakArgs {
    pub minutes: u32,
    pub build: bool,
}

fn mb(kb: u64) -> String {
    format!("{:.0} MB", kb as f64 / 1024.0)
}

/// Compiles tests/workloads/churn.c (static, like the e2e workloads).
fn build_churn(dir: &Path) -> Result<PathBuf> {
    let src = util::workspace_root().join("tests/workloads/churn.c");
    let out = dir.join("churn");
    util::run(
        Command::new("gcc")
            .args(["-O2", "-static", "-Wall", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-lpthread"),
    )
    .context("building the churn workload (needs gcc)")?;
    Ok(out)
}

/// Kills and reaps `child` if it is still running.
fn stop(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        util::signal(child.id(), util::SIGKILL);
        let _ = child.wait();
    }
}

pub fn soak(args: SoakArgs) -> Result<()> {
    if args.minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    let bin = util::tracer_for("the soak", args.build)?;
    let dir = util::target_dir().join("soak");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let churn = build_churn(&dir)?;
    let recording = dir.join("soak.itr");
    let window = Duration::from_secs(u64::from(args.minutes) * 60);
    // The workload outlives the window by a minute.
    let workload_ms = (window + Duration::from_secs(60)).as_millis().to_string();
    println!(
        "soak: {} minute(s) of churn ({THREADS_PER_S} threads/s in batches of {BATCH}, a process every {FORK_EVERY} batches) under `infertrace record -p`",
        args.minutes
    );
    let mut workload = Command::new(&churn)
        .args([workload_ms, BATCH.to_string(), FORK_EVERY.to_string(), THREADS_PER_S.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", churn.display()))?;
    let mut tracer = match Command::new(&bin)
        .args(["record", "-q", "-p", &workload.id().to_string(), "--duration", &format!("{}s", window.as_secs()), "-o"])
        .arg(&recording)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
    {
        Ok(t) => t,
        Err(e) => {
            stop(&mut workload);
            return Err(e).with_context(|| format!("starting {}", bin.display()));
        }
    };
    let t0 = Instant::now();
    let tracer_pid = tracer.id();
    println!("{:>6}  {:>10}", "minute", "tracer RSS");
    let mut rss = Vec::new();
    // The first reading 5 s in; the last 3 s before the window ends (at
    // the end itself the final snapshot is being built: the peak says that).
    for minute in 0..=args.minutes {
        let due = match minute {
            0 => Duration::from_secs(5),
            m if m == args.minutes => Duration::from_secs(u64::from(m) * 60 - 3),
            m => Duration::from_secs(u64::from(m) * 60),
        };
        while t0.elapsed() < due {
            if !matches!(tracer.try_wait(), Ok(None)) {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let Some(kb) = util::status_kb(tracer_pid, "VmRSS:") else { break };
        rss.push(kb);
        let label = match minute {
            0 => "0 (+5s)".to_string(),
            m if m == args.minutes => format!("{m} (-3s)"),
            m => m.to_string(),
        };
        println!("{label:>6}  {:>10}", mb(kb));
    }
    // The peak, final snapshot included: read until it exits.
    let mut peak = None;
    while matches!(tracer.try_wait(), Ok(None)) {
        peak = util::status_kb(tracer_pid, "VmHWM:").or(peak);
        thread::sleep(Duration::from_millis(50));
    }
    let status = tracer.wait().context("waiting for infertrace")?;
    let finished = t0.elapsed();
    stop(&mut workload);
    if !status.success() {
        bail!("infertrace record failed ({status})");
    }
    if let Some(p) = peak {
        println!("tracer peak RSS (VmHWM, with the final snapshot): {}", mb(p));
    }
    let growth = |from: u64, to: u64| format!("{} -> {} ({:+.1} MB)", mb(from), mb(to), (to as f64 - from as f64) / 1024.0);
    if let (Some(first), Some(last)) = (rss.first(), rss.last()) {
        println!("tracer RSS from 5 s to the end: {}", growth(*first, *last));
    }
    if let (true, Some(one), Some(last)) = (rss.len() > 2, rss.get(1), rss.last()) {
        println!("tracer RSS from minute 1 to the end: {}", growth(*one, *last));
    }
    println!("record took {:.1} s for a {} s window", finished.as_secs_f64(), window.as_secs());
    let size = fs::metadata(&recording).with_context(|| format!("{}", recording.display()))?.len();
    println!(
        "recording: {} bytes ({:.2} MB/min) at {}",
        size,
        size as f64 / 1e6 / f64::from(args.minutes),
        recording.display()
    );
    // `report` on it: time and peak memory.
    let text = dir.join("soak.txt");
    let out = fs::File::create(&text).with_context(|| format!("creating {}", text.display()))?;
    let t = Instant::now();
    let mut report = Command::new(&bin).arg("report").arg(&recording).stdout(out).spawn().context("starting infertrace report")?;
    let mut report_peak = 0;
    while matches!(report.try_wait(), Ok(None)) {
        report_peak = report_peak.max(util::status_kb(report.id(), "VmHWM:").unwrap_or(0));
        thread::sleep(Duration::from_millis(20));
    }
    let st = report.wait().context("waiting for infertrace report")?;
    println!("report: {:.2} s, peak RSS about {} ({st}), text at {}", t.elapsed().as_secs_f64(), mb(report_peak), text.display());
    let text = fs::read_to_string(&text).unwrap_or_default();
    let rows = text.lines().filter(|l| l.starts_with("  tid ") || l.starts_with("  exited threads (")).count();
    println!("report: {rows} thread rows");
    for note in text.lines().filter(|l| l.starts_with("note:") && l.contains("exited thread")) {
        println!("report {note}");
    }
    Ok(())
}
