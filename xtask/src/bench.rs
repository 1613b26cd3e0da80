//! `cargo xtask bench`: slowdown of a syscall-bound Python loop under
//! infertrace and under the usual alternatives.
//!
//! The workload (tests/workloads/syscall_loop.py) runs
//! `os.write(out, os.read(fd, 64))` N times and prints ns/iter. Each traced
//! mode starts the workload first, attaches the tracer to its pid while the
//! workload waits on stdin, then releases the loop, so that start-up costs of
//! the tracers are never measured. Slow tracers get fewer iterations: ns/iter
//! is what is compared.
use std::{
    fs::{self, File},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{tasks, util};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Untraced,
    Infertrace,
    Bpftrace,
    Strace,
    Perf,
}

struct Mode {
    kind: Kind,
    label: &'static str,
    /// The program that must be on PATH (None: nothing needed).
    tool: Option<&'static str>,
    iterations: u64,
}

const MODES: &[Mode] = &[
    Mode {
        kind: Kind::Untraced,
        label: "untraced",
        tool: None,
        iterations: 1_000_000,
    },
    Mode {
        kind: Kind::Infertrace,
        label: "infertrace record -p",
        tool: None,
        iterations: 500_000,
    },
    Mode {
        kind: Kind::Bpftrace,
        label: "bpftrace enter/exit hist",
        tool: Some("bpftrace"),
        iterations: 200_000,
    },
    Mode {
        kind: Kind::Strace,
        label: "strace -c -f",
        tool: Some("strace"),
        iterations: 20_000,
    },
    Mode {
        kind: Kind::Perf,
        label: "perf trace -s",
        tool: Some("perf"),
        iterations: 20_000,
    },
];

/// Untraced runs; the median is the baseline.
const UNTRACED_RUNS: usize = 3;
/// Longest a single measured loop may take.
const LOOP_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest a tracer may take to attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a tracer may take to exit after SIGINT.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

enum Outcome {
    Measured {
        ns_per_iter: f64,
        note: Option<String>,
    },
    Missing,
    Failed(String),
}

pub fn bench(build: bool) -> Result<()> {
    if build {
        tasks::build()?;
    }
    let ctx = Ctx::new()?;
    if !util::is_root() {
        eprintln!("WARNING: not root: the tracers below need root and will fail");
    }
    ensure_tracefs();
    let started = Instant::now();

    let mut rows: Vec<(&Mode, Outcome)> = Vec::new();
    for mode in MODES {
        // Progress on stderr; stdout gets the table only.
        eprint!("bench: {:<26} ", mode.label);
        let outcome = if mode.kind == Kind::Untraced {
            untraced_median(&ctx, mode)
        } else if mode.tool.is_some_and(|t| util::which(t).is_none())
            || (mode.kind == Kind::Infertrace && !util::infertrace_bin().is_file())
        {
            Outcome::Missing
        } else {
            match traced(&ctx, mode) {
                Ok(o) => o,
                Err(e) => Outcome::Failed(format!("{e:#}")),
            }
        };
        match &outcome {
            Outcome::Measured { ns_per_iter, .. } => eprintln!("{ns_per_iter:.1} ns/iter"),
            Outcome::Missing => eprintln!("n/a (tool missing)"),
            Outcome::Failed(_) => eprintln!("failed"),
        }
        rows.push((mode, outcome));
    }

    let baseline = match &rows[0].1 {
        Outcome::Measured { ns_per_iter, .. } => Some(*ns_per_iter),
        _ => None,
    };
    eprintln!();
    println!("Python loop `os.write(out, os.read(fd, 64))`, 2 syscalls per iteration");
    println!(
        "{:<26} {:>10} {:>12} {:>12}",
        "mode", "iterations", "ns/iter", "vs untraced"
    );
    println!("{}", "-".repeat(26 + 1 + 10 + 1 + 12 + 1 + 12));
    let mut notes = Vec::new();
    for (mode, outcome) in &rows {
        let (ns, ratio) = match outcome {
            Outcome::Measured { ns_per_iter, note } => {
                if let Some(n) = note {
                    notes.push(format!("{}: {n}", mode.label));
                }
                let ratio =
                    baseline.map_or("n/a".to_string(), |b| format!("{:.2}x", ns_per_iter / b));
                (format!("{ns_per_iter:.1}"), ratio)
            }
            Outcome::Missing => {
                println!(
                    "{:<26} {:>10}   n/a (tool missing)",
                    mode.label, mode.iterations
                );
                continue;
            }
            Outcome::Failed(why) => {
                notes.push(format!("{}: FAILED: {why}", mode.label));
                ("failed".to_string(), String::new())
            }
        };
        println!(
            "{:<26} {:>10} {:>12} {:>12}",
            mode.label, mode.iterations, ns, ratio
        );
    }
    for n in &notes {
        println!("  note: {n}");
    }
    println!(
        "(total {:.0}s; tracer logs in {})",
        started.elapsed().as_secs_f64(),
        ctx.out_dir.display()
    );
    if baseline.is_none() {
        bail!("the untraced baseline could not be measured");
    }
    if rows
        .iter()
        .any(|(m, o)| m.kind == Kind::Infertrace && matches!(o, Outcome::Failed(_)))
    {
        bail!("infertrace failed in the benchmark (see the note above)");
    }
    Ok(())
}

struct Ctx {
    python: PathBuf,
    script: PathBuf,
    out_dir: PathBuf,
}

impl Ctx {
    fn new() -> Result<Self> {
        let script = util::workspace_root().join("tests/workloads/syscall_loop.py");
        if !script.is_file() {
            bail!("{} is missing", script.display());
        }
        let out_dir = util::target_dir().join("bench");
        fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
        Ok(Self {
            python: util::python3()?,
            script,
            out_dir,
        })
    }
}

/// perf trace (and aya) need tracefs; a fresh machine does not mount it.
fn ensure_tracefs() {
    if Path::new("/sys/kernel/tracing/events").is_dir() || !util::is_root() {
        return;
    }
    let _ = Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .stderr(Stdio::null())
        .status();
}

fn untraced_median(ctx: &Ctx, mode: &Mode) -> Outcome {
    let mut samples = Vec::new();
    for _ in 0..UNTRACED_RUNS {
        match run_untraced(ctx, mode.iterations) {
            Ok(ns) => samples.push(ns),
            Err(e) => return Outcome::Failed(format!("{e:#}")),
        }
    }
    samples.sort_by(f64::total_cmp);
    let note = format!(
        "median of {UNTRACED_RUNS} runs: {}",
        samples
            .iter()
            .map(|s| format!("{s:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Outcome::Measured {
        ns_per_iter: samples[samples.len() / 2],
        note: Some(note),
    }
}

fn run_untraced(ctx: &Ctx, iterations: u64) -> Result<f64> {
    let mut w = Workload::start(ctx, iterations)?;
    let ns = w.release_and_measure()?;
    w.finish()?;
    Ok(ns)
}

/// The workload process, waiting for "go" on its stdin.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pid: u32,
}

impl Workload {
    fn start(ctx: &Ctx, iterations: u64) -> Result<Self> {
        let mut child = Command::new(&ctx.python)
            .arg(&ctx.script)
            .arg(iterations.to_string())
            .arg("--wait")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", ctx.script.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut w = Self {
            child,
            stdin,
            lines,
            pid: 0,
        };
        let ready = w
            .next_line(Duration::from_secs(20))
            .context("workload did not start")?;
        w.pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| anyhow!("unexpected line from the workload: {ready:?}"))?;
        if w.pid != w.child.id() {
            bail!(
                "workload reports pid {} but we started {}",
                w.pid,
                w.child.id()
            );
        }
        Ok(w)
    }

    fn next_line(&mut self, timeout: Duration) -> Result<String> {
        self.lines.recv_timeout(timeout).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => {
                anyhow!("no output from the workload within {timeout:?}")
            }
            mpsc::RecvTimeoutError::Disconnected => anyhow!("the workload exited early"),
        })
    }

    fn release_and_measure(&mut self) -> Result<f64> {
        let stdin = self.stdin.as_mut().context("workload already finished")?;
        stdin.write_all(b"go\n").context("releasing the workload")?;
        stdin.flush()?;
        let line = self.next_line(LOOP_TIMEOUT)?;
        line.strip_prefix("ns_per_iter ")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("unexpected line from the workload: {line:?}"))
    }

    /// Closes the workload's stdin (it exits then) and checks its status.
    fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for the workload")?;
        if !status.success() {
            bail!("the workload exited with {status}");
        }
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A tracer process attached to the workload; killed if dropped early.
struct Tracer {
    child: Child,
    log: PathBuf,
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            util::signal(self.child.id(), util::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

impl Tracer {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let line = util::display(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting `{line}`"))?;
        Ok(Self { child, log })
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            format!("(no output; log {})", self.log.display())
        } else {
            format!("{tail} (log {})", self.log.display())
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "tracer exited before the loop ran ({status}): {}",
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Waits until the log contains `needle`.
    fn wait_for_output(&mut self, needle: &str) -> Result<()> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            self.check_alive()?;
            if fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains(needle)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tracer did not print {needle:?} within {ATTACH_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the tracer holds BPF-link or perf-event file descriptors and
    /// their number has been stable for a second: attachment is done.
    fn wait_for_probes(&mut self) -> Result<()> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let mut last = 0usize;
        let mut stable_since = Instant::now();
        loop {
            self.check_alive()?;
            let n = probe_fds(self.child.id());
            if n != last {
                last = n;
                stable_since = Instant::now();
            } else if n > 0 && stable_since.elapsed() >= Duration::from_secs(1) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tracer did not attach within {ATTACH_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGINT and waits for the tracer to exit. Returns a note when
    /// it did not exit cleanly.
    fn stop(mut self) -> Result<Option<String>> {
        util::signal(self.child.id(), util::SIGINT);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // strace detaches, then re-raises SIGINT on itself: clean.
                use std::os::unix::process::ExitStatusExt as _;
                let clean = status.success() || status.signal() == Some(util::SIGINT);
                return Ok((!clean).then(|| {
                    format!(
                        "tracer exited with {status} after SIGINT: {}",
                        self.log_tail()
                    )
                }));
            }
            if Instant::now() > deadline {
                util::signal(self.child.id(), util::SIGKILL);
                let _ = self.child.wait();
                return Ok(Some(format!(
                    "tracer ignored SIGINT for {EXIT_TIMEOUT:?} and was killed"
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Number of BPF-link / perf-event fds a process holds.
fn probe_fds(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            // Attachments only: programs and maps exist before attaching.
            t.starts_with("anon_inode:")
                && (t.contains("bpf_link") || t.contains("bpf-link") || t.contains("perf_event"))
        })
        .count()
}

/// True once a ptrace tracer is attached to `pid`.
fn ptraced(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .is_some_and(|p| p != 0)
}

fn traced(ctx: &Ctx, mode: &Mode) -> Result<Outcome> {
    let mut w = Workload::start(ctx, mode.iterations)?;
    let pid = w.pid;
    let slug = mode.label.split_whitespace().next().unwrap_or("tracer");
    let log = ctx.out_dir.join(format!("{slug}.log"));

    let tracer = match mode.kind {
        Kind::Infertrace => {
            let bin = util::infertrace_bin();
            let recording = ctx.out_dir.join("bench.itr");
            let _ = fs::remove_file(&recording);
            let mut cmd = Command::new(&bin);
            cmd.args(["record", "-q", "-p", &pid.to_string(), "-o"])
                .arg(&recording);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_probes()?;
            t
        }
        Kind::Bpftrace => {
            let program = format!(
                "tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{ @s[tid] = nsecs; }} \
                 tracepoint:raw_syscalls:sys_exit /@s[tid]/ {{ @h[args->id] = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
            );
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-e", &program]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_output("Attaching")?;
            t.wait_for_probes()?;
            t
        }
        Kind::Strace => {
            let mut cmd = Command::new("strace");
            cmd.args(["-c", "-f", "-p", &pid.to_string(), "-o", "/dev/null"]);
            let mut t = Tracer::spawn(cmd, log)?;
            let deadline = Instant::now() + ATTACH_TIMEOUT;
            while !ptraced(pid) {
                t.check_alive()?;
                if Instant::now() > deadline {
                    bail!(
                        "strace did not attach within {ATTACH_TIMEOUT:?}: {}",
                        t.log_tail()
                    );
                }
                thread::sleep(Duration::from_millis(50));
            }
            thread::sleep(Duration::from_secs(1));
            t
        }
        Kind::Perf => {
            let mut cmd = Command::new("perf");
            cmd.args(["trace", "-s", "-p", &pid.to_string(), "-o", "/dev/null"]);
            let mut t = Tracer::spawn(cmd, log)?;
            t.wait_for_probes()?;
            t
        }
        Kind::Untraced => unreachable!("untraced runs do not come here"),
    };

    let measured = w.release_and_measure();
    // Stop the tracer while its target still runs (infertrace, strace and
    // perf would otherwise end on their own when it exits), then let the
    // workload exit.
    let note = tracer.stop()?;
    let finished = w.finish();
    let ns_per_iter = measured?;
    if let Err(e) = finished {
        return Ok(Outcome::Failed(format!("{e:#}")));
    }
    Ok(Outcome::Measured { ns_per_iter, note })
}
