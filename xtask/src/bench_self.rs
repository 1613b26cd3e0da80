//! `cargo xtask bench --self`: what the tracer process itself costs, per
//! way of running it, in one table (issue 31; docs/overhead.md "The
//! tracer's own cost"):
//!
//! - `record -p` for a 4 s window on an idle Python process, a busy one (3
//!   threads of Python arithmetic and getppid), a process calling the CUDA
//!   stand-in (tests/cudasim, NOT CUDA: its libcudart probed) in a loop,
//!   and 50 idle Python processes at once;
//! - launch mode, `record -- python3 tests/workloads/demo.py`, against the
//!   demo untraced;
//! - `top -p` on the busy process, in a detached tmux session (it needs a
//!   terminal), 6 s;
//! - `agent` on 4 busy processes, 10 s windows, 45 s (steady: 15-45 s, after
//!   the first window's cut).
//!
//! Columns: start-up (wall and CPU from the tracer's first step to its
//! targets traced: the recording's `tracer_overhead.startup`), the tracer's
//! CPU time over its whole life (user, system; `wait4`'s rusage where it is
//! our child), its steady CPU share (a core's %, measured between two
//! readings after start-up), peak memory (VmHWM / ru_maxrss), the time from
//! the signal that ends it to its exit, and `report --format json` on what
//! it wrote (time, peak memory). Under the table: each `record -p` row's
//! start-up, phase by phase. Timings, not asserted anywhere: run it on an
//! idle machine, and compare runs of the same machine only.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::Value;

use crate::util;

/// The window of each `record -p` row.
const WINDOW: Duration = Duration::from_secs(4);
/// Python processes of the many-targets row.
const MANY: usize = 50;
/// Busy processes under the agent (issue 31's steady-state case).
const AGENT_TARGETS: usize = 4;

const IDLE: &str = "import time\ntime.sleep(3600)\n";
/// Three threads of Python arithmetic with a getppid now and then.
const BUSY: &str = "import os, threading\n\
def spin():\n    x = 0\n    while True:\n        x += 1\n        if x % 20000 == 0:\n            os.getppid()\n\
for _ in range(2):\n    threading.Thread(target=spin, daemon=True).start()\nspin()\n";
/// 0-byte device-to-device copies on the stand-in, 100 every 10 ms.
const CUDA: &str = "import ctypes, sys, time\nrt = ctypes.CDLL(sys.argv[1])\n\
dst, src, zero = ctypes.c_void_p(0x7E0000000000), ctypes.c_void_p(0x7E0000100000), ctypes.c_size_t(0)\n\
while True:\n    for _ in range(100):\n        rt.cudaMemcpyAsync(dst, src, zero, ctypes.c_int(3), None)\n    time.sleep(0.01)\n";

/// One way of running the tracer, measured.
#[derive(Default)]
struct Row {
    name: String,
    /// From the recording's `tracer_overhead.startup`.
    startup: Option<Startup>,
    /// CPU seconds over the tracer's life (user, system).
    cpu: Option<(f64, f64)>,
    /// Steady CPU, % of one core.
    steady_pct: Option<f64>,
    peak_mib: Option<f64>,
    /// RSS at the two steady readings (MiB).
    rss: Option<(f64, f64)>,
    /// Signal to exit, ms.
    stop_ms: Option<f64>,
    /// `report --format json`: seconds, peak MiB.
    report: Option<(f64, f64)>,
    /// Anything else worth a word (launch mode: traced vs untraced wall).
    note: String,
}

struct Startup {
    wall_ms: f64,
    cpu_ms: f64,
    phases: Vec<(String, f64, f64)>,
}

pub fn bench_self(build: bool) -> Result<()> {
    let bin = util::tracer_for("`cargo xtask bench --self`", build)?;
    let dir = util::target_dir().join("bench").join("self");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ctx = Ctx { bin, python: util::python3()?, dir };
    println!("infertrace's own cost ({}), {} CPUs; tracer logs and recordings in {}", util::display(&Command::new(&ctx.bin)), cpus(), ctx.dir.display());
    let mut rows = Vec::new();
    let mut run = |name: &str, f: &dyn Fn(&Ctx) -> Result<Row>| {
        eprint!("  {name} ... ");
        match f(&ctx) {
            Ok(mut r) => {
                eprintln!("done");
                r.name = name.to_string();
                rows.push(r);
            }
            Err(e) => {
                eprintln!("FAILED: {e:#}");
                rows.push(Row { name: name.to_string(), note: format!("FAILED: {e:#}"), ..Row::default() });
            }
        }
    };
    run("record -p, idle Python", &|c| record_targets(c, "idle", &[Target::Py(IDLE)]));
    run("record -p, busy Python (3 threads)", &|c| record_targets(c, "busy", &[Target::Py(BUSY)]));
    run("record -p, CUDA stand-in calls", &|c| {
        let sim = cudasim(c)?;
        record_targets(c, "cuda", &[Target::PyArg(CUDA, sim.join("libcudart.so.12"))])
    });
    run("record -p, 50 idle Python", &|c| record_targets(c, "many", &vec![Target::Py(IDLE); MANY]));
    run("record (launch), demo.py", &launch_demo);
    run("top -p, busy Python", &top_busy);
    run("agent, 4 busy Python, 10s windows", &agent_busy);
    print_table(&rows);
    Ok(())
}

struct Ctx {
    bin: PathBuf,
    python: PathBuf,
    dir: PathBuf,
}

#[derive(Clone)]
enum Target {
    Py(&'static str),
    /// A script with one argument.
    PyArg(&'static str, PathBuf),
}

/// Target processes, killed when dropped.
struct Targets(Vec<Child>);

impl Targets {
    fn start(ctx: &Ctx, which: &[Target]) -> Result<Targets> {
        let mut t = Targets(Vec::new());
        for w in which {
            let mut cmd = Command::new(&ctx.python);
            match w {
                Target::Py(code) => cmd.args(["-c", code]),
                Target::PyArg(code, arg) => cmd.args(["-c", code]).arg(arg),
            };
            let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().context("starting a target")?;
            t.0.push(child);
        }
        // Let the interpreters start (imports done, threads running).
        thread::sleep(Duration::from_millis(500 + 10 * which.len() as u64));
        for c in &mut t.0 {
            if let Some(st) = c.try_wait()? {
                bail!("a target exited at start ({st})");
            }
        }
        Ok(t)
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `record -p` on fresh targets for [`WINDOW`], ended by SIGINT.
fn record_targets(ctx: &Ctx, slug: &str, which: &[Target]) -> Result<Row> {
    let targets = Targets::start(ctx, which)?;
    let out = ctx.dir.join(format!("{slug}.itr"));
    let mut cmd = Command::new(&ctx.bin);
    cmd.args(["record", "-q"]);
    for pid in targets.pids() {
        cmd.args(["-p", &pid.to_string()]);
    }
    cmd.arg("-o").arg(&out);
    let child = spawn_logged(cmd, &ctx.dir.join(format!("{slug}.log")))?;
    let pid = child.id();
    thread::sleep(WINDOW);
    let sent = Instant::now();
    util::signal(pid, util::SIGINT);
    let (status, usage) = wait4(child)?;
    let stop_ms = sent.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        bail!("record exited with {status}; log {}", ctx.dir.join(format!("{slug}.log")).display());
    }
    drop(targets);
    Ok(Row { stop_ms: Some(stop_ms), ..recorded(ctx, &out, &usage)? })
}

/// What a finished `record` run shows: its start-up (from the recording),
/// its CPU and peak memory, and `report` on what it wrote.
fn recorded(ctx: &Ctx, out: &Path, usage: &Usage) -> Result<Row> {
    let (report, json) = report(ctx, out)?;
    Ok(Row {
        startup: startup_of(&json),
        cpu: Some((usage.user_s, usage.system_s)),
        peak_mib: Some(usage.maxrss_mib),
        report: Some(report),
        ..Row::default()
    })
}

/// `record -- python3 demo.py` against the demo alone.
fn launch_demo(ctx: &Ctx) -> Result<Row> {
    let demo = util::workspace_root().join("tests/workloads/demo.py");
    let t = Instant::now();
    let st = Command::new(&ctx.python).arg(&demo).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    let untraced = t.elapsed().as_secs_f64();
    if !st.success() {
        bail!("demo.py exited with {st} untraced");
    }
    let out = ctx.dir.join("launch.itr");
    let mut cmd = Command::new(&ctx.bin);
    cmd.args(["record", "-q", "-o"]).arg(&out).arg("--").arg(&ctx.python).arg(&demo);
    let t = Instant::now();
    let child = spawn_logged(cmd, &ctx.dir.join("launch.log"))?;
    let (status, usage) = wait4(child)?;
    let traced = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("record -- demo.py exited with {status}; log {}", ctx.dir.join("launch.log").display());
    }
    Ok(Row { note: format!("command {traced:.2} s traced, {untraced:.2} s untraced"), ..recorded(ctx, &out, &usage)? })
}

/// `top -p` in a detached tmux session: CPU and memory read from /proc
/// (it is tmux's child, not ours), quit with `q`.
fn top_busy(ctx: &Ctx) -> Result<Row> {
    if util::which("tmux").is_none() {
        bail!("tmux is needed (top needs a terminal)");
    }
    let targets = Targets::start(ctx, &[Target::Py(BUSY)])?;
    let session = format!("infertrace-bench-self-{}", std::process::id());
    let line = format!("exec {} top -p {}", sh_quote(&ctx.bin), targets.pids()[0]);
    util::run(Command::new("tmux").args(["new-session", "-d", "-s", &session, "-x", "160", "-y", "50", &line]))?;
    let kill_session = || {
        let _ = Command::new("tmux").args(["kill-session", "-t", &session]).stderr(Stdio::null()).status();
    };
    let result = (|| -> Result<Row> {
        let pane = util::output(Command::new("tmux").args(["list-panes", "-t", &session, "-F", "#{pane_pid}"]))?;
        let pid: u32 = pane.trim().parse().map_err(|_| anyhow!("no pane pid from tmux: {pane:?}"))?;
        let (steady_pct, rss) = steady(pid, Duration::from_secs(2), Duration::from_secs(4))?;
        let cpu = proc_cpu(pid).ok_or_else(|| anyhow!("top (pid {pid}) is gone"))?;
        let peak = util::status_kb(pid, "VmHWM:").map(|kb| kb as f64 / 1024.0);
        let sent = Instant::now();
        util::run(Command::new("tmux").args(["send-keys", "-t", &session, "q"]))?;
        while Path::new(&format!("/proc/{pid}")).exists() && sent.elapsed() < Duration::from_secs(30) {
            thread::sleep(Duration::from_millis(2));
        }
        Ok(Row {
            cpu: Some(cpu),
            steady_pct: Some(steady_pct),
            peak_mib: peak,
            rss: Some(rss),
            stop_ms: Some(sent.elapsed().as_secs_f64() * 1e3),
            note: "CPU up to the quit key".into(),
            ..Row::default()
        })
    })();
    kill_session();
    result
}

/// `agent` on busy targets: steady CPU and memory between 15 s and 45 s
/// (after its first window's cut, which symbolizes the kernel and the
/// libraries for the first time).
fn agent_busy(ctx: &Ctx) -> Result<Row> {
    let targets = Targets::start(ctx, &vec![Target::Py(BUSY); AGENT_TARGETS])?;
    let mut cmd = Command::new(&ctx.bin);
    cmd.args(["agent", "-q", "--window", "10s", "--listen", "127.0.0.1:0", "--out-dir"]).arg(ctx.dir.join("agent-windows"));
    for pid in targets.pids() {
        cmd.args(["-p", &pid.to_string()]);
    }
    let child = spawn_logged(cmd, &ctx.dir.join("agent.log"))?;
    let pid = child.id();
    let (steady_pct, rss) = steady(pid, Duration::from_secs(15), Duration::from_secs(30))?;
    let sent = Instant::now();
    util::signal(pid, util::SIGTERM);
    let (status, usage) = wait4(child)?;
    let stop_ms = sent.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        bail!("the agent exited with {status}; log {}", ctx.dir.join("agent.log").display());
    }
    let windows = fs::read_dir(ctx.dir.join("agent-windows")).map(|d| d.count()).unwrap_or(0);
    Ok(Row {
        cpu: Some((usage.user_s, usage.system_s)),
        steady_pct: Some(steady_pct),
        peak_mib: Some(usage.maxrss_mib),
        rss: Some(rss),
        stop_ms: Some(stop_ms),
        note: format!("{windows} windows written"),
        ..Row::default()
    })
}

/// Waits `warm`, then measures CPU and RSS over `span`: (% of a core,
/// (RSS MiB at the start, at the end)).
fn steady(pid: u32, warm: Duration, span: Duration) -> Result<(f64, (f64, f64))> {
    thread::sleep(warm);
    let read = || -> Result<(Instant, f64, f64)> {
        let (u, s) = proc_cpu(pid).ok_or_else(|| anyhow!("pid {pid} exited"))?;
        let kb = util::status_kb(pid, "VmRSS:").ok_or_else(|| anyhow!("pid {pid} exited"))?;
        Ok((Instant::now(), u + s, kb as f64 / 1024.0))
    };
    let a = read()?;
    thread::sleep(span);
    let b = read()?;
    Ok(((b.1 - a.1) / b.0.duration_since(a.0).as_secs_f64() * 100.0, (a.2, b.2)))
}

/// `report FILE --format json`: (seconds, peak MiB) and the JSON.
fn report(ctx: &Ctx, file: &Path) -> Result<((f64, f64), Value)> {
    let out = file.with_extension("json");
    let t = Instant::now();
    let child = Command::new(&ctx.bin)
        .arg("report")
        .arg(file)
        .args(["--format", "json", "-o"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting infertrace report")?;
    let (status, usage) = wait4(child)?;
    let secs = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("report {} exited with {status}", file.display());
    }
    let text = fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", out.display()))?;
    Ok(((secs, usage.maxrss_mib), json))
}

fn startup_of(json: &Value) -> Option<Startup> {
    let s = json.get("tracer_overhead")?.get("startup")?;
    let ms = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as f64 / 1e6);
    Some(Startup {
        wall_ms: ms(s, "wall_ns")?,
        cpu_ms: ms(s, "cpu_ns")?,
        phases: s
            .get("phases")?
            .as_array()?
            .iter()
            .filter_map(|p| Some((p.get("phase")?.as_str()?.to_string(), ms(p, "wall_ns")?, ms(p, "cpu_ns")?)))
            .collect(),
    })
}

fn spawn_logged(mut cmd: Command, log: &Path) -> Result<Child> {
    let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let line = util::display(&cmd);
    cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().with_context(|| format!("starting `{line}`"))
}

struct Usage {
    user_s: f64,
    system_s: f64,
    maxrss_mib: f64,
}

/// Waits for `child` with wait4(2): its exit status and resource usage
/// (std's `wait` gives no rusage).
fn wait4(child: Child) -> Result<(std::process::ExitStatus, Usage)> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = child.id() as libc::pid_t;
    // The std handle must not reap it too: forget it (it holds no fds here:
    // stdin was null, stdout/stderr went to files).
    std::mem::forget(child);
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: plain pointers to locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("wait4");
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        std::process::ExitStatus::from_raw(status),
        Usage { user_s: secs(ru.ru_utime), system_s: secs(ru.ru_stime), maxrss_mib: ru.ru_maxrss as f64 / 1024.0 },
    ))
}

/// utime and stime of `pid` in seconds.
fn proc_cpu(pid: u32) -> Option<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is field 3,
    // utime 14 and stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((f.get(11)?.parse::<f64>().ok()? / hz, f.get(12)?.parse::<f64>().ok()? / hz))
}


fn cpus() -> usize {
    thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// tests/cudasim/build.sh into target/bench/self/cudasim (the stand-in,
/// NOT CUDA).
fn cudasim(ctx: &Ctx) -> Result<PathBuf> {
    let dir = ctx.dir.join("cudasim");
    util::output(Command::new("sh").arg(util::workspace_root().join("tests/cudasim/build.sh")).arg(&dir))
        .context("building the CUDA stand-in (gcc)")?;
    Ok(dir)
}

fn print_table(rows: &[Row]) {
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    println!();
    println!(
        "{:<36} {:>13} {:>13} {:>8} {:>8} {:>7} {:>7} {:>13} {:>8} {:>13}",
        "how", "start-up ms", "start-up CPU", "user s", "sys s", "steady", "peak", "RSS steady", "stop ms", "report s/MiB"
    );
    for r in rows {
        let (su_wall, su_cpu) = match &r.startup {
            Some(s) => (format!("{:.0}", s.wall_ms), format!("{:.0}", s.cpu_ms)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<36} {:>13} {:>13} {:>8} {:>8} {:>7} {:>7} {:>13} {:>8} {:>13}{}",
            r.name,
            su_wall,
            su_cpu,
            opt(r.cpu.map(|c| c.0), 2),
            opt(r.cpu.map(|c| c.1), 2),
            r.steady_pct.map_or("-".into(), |p| format!("{p:.1}%")),
            r.peak_mib.map_or("-".into(), |m| format!("{m:.0}M")),
            r.rss.map_or("-".into(), |(a, b)| format!("{a:.0}->{b:.0}M")),
            opt(r.stop_ms, 0),
            r.report.map_or("-".into(), |(s, m)| format!("{s:.2}/{m:.0}")),
            if r.note.is_empty() { String::new() } else { format!("  ({})", r.note) },
        );
    }
    println!();
    println!("start-up by phase, wall/CPU ms (context: the kernel object and its maps; a family: its programs loaded, verified, attached; overhead: the calibration; targets: the named targets attached):");
    for r in rows {
        if let Some(s) = &r.startup {
            let phases: Vec<String> = s
                .phases
                .iter()
                .filter(|p| p.1 >= 0.5 || p.2 >= 0.5)
                .map(|(n, w, c)| format!("{n} {w:.0}/{c:.0}"))
                .collect();
            println!("  {}: {}", r.name, phases.join(", "));
        }
    }
    println!("steady: the tracer's CPU between two readings after start-up (top 2-6 s, agent 15-45 s: its first window cut at 10 s), % of one core; peak: VmHWM/ru_maxrss; stop: SIGINT (record), q (top), SIGTERM (agent) to exit");
}
