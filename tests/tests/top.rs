//! `infertrace top`: the live view in a real terminal (a tmux pane) on a
//! running CPU-bound Python workload whose answer is known (all its time
//! in `fib`, on CPU); `q` quits with exit code 0 and leaves no BPF program
//! behind. Without a terminal it refuses in one line.

use std::fs;
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::*;

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().expect("running tmux");
        assert!(o.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().args(["kill-server"]).output();
    }
}

fn python3(test: &str) -> Option<std::path::PathBuf> {
    let p = which("python3");
    if p.is_none() {
        skip(test, "python3");
    }
    p
}

#[test]
fn top_in_tmux_shows_the_hot_function_and_detaches_on_q() {
    watch_fib("top_in_tmux_shows_the_hot_function_and_detaches_on_q", |wpid| format!("-p {wpid}"));
}

/// `--python` finds the workload by itself (and maybe other Pythons of
/// the machine: the screen must show this one).
#[test]
fn top_python_finds_the_running_interpreter() {
    watch_fib("top_python_finds_the_running_interpreter", |_| "--python".to_owned());
}

/// Runs `top ARGS` in a tmux pane on `pyattr_cpu.py fib`, checks the
/// screen after 3 s, quits with `q`.
fn watch_fib(test: &str, args: impl Fn(u32) -> String) {
    if !require(test, &[Need::Root, Need::Binary, Need::Bpftool]) {
        return;
    }
    if !in_path("tmux") {
        skip(test, "tmux (cargo xtask setup installs it)");
        return;
    }
    let Some(py) = python3(test) else { return };
    let dir = TempDir::new(test);
    let script = workspace_root().join("tests/workloads/pyattr_cpu.py");
    // Known answer: one thread, on CPU all along, in fib.
    let mut workload = Command::new(&py)
        .arg(&script)
        .args(["fib", "120"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting the fib workload");
    let wpid = workload.id();
    let _wguard = KillOnDrop::new(wpid);
    // Until its exec, the child is a copy of this test: `--python` would not see it.
    let exec_done = poll(Duration::from_secs(10), || {
        let exe = fs::read_link(format!("/proc/{wpid}/exe")).ok()?;
        exe.file_name()?.to_str()?.starts_with("python").then_some(())
    });
    assert!(exec_done.is_some(), "{test}: the workload never exec'd {}", py.display());

    let before = bpf_prog_ids();
    let tmux = Tmux { socket: format!("infertrace-test-{}-{wpid}", std::process::id()) };
    let code_file = dir.join("code");
    let err_file = dir.join("stderr");
    let shell = format!(
        "{} top {} 2>{}; echo $? >{}",
        bin().display(),
        args(wpid),
        err_file.display(),
        code_file.display()
    );
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "160", "-y", "48", "sh", "-c", &shell]);
    let sh_pid: u32 = tmux.run(&["display-message", "-p", "-t", "top", "#{pane_pid}"]).trim().parse().expect("pane pid");
    let tracer = poll(Duration::from_secs(10), || children_of(sh_pid).into_iter().next())
        .unwrap_or_else(|| panic!("{test}: `infertrace top` did not start in the pane: {}", tmux.capture()));
    let mut tguard = KillOnDrop::new(tracer);
    let ids = wait_for_tracer_progs(tracer, &before, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{test}: infertrace top's programs never showed up in bpftool; pane:\n{}", tmux.capture()));

    // Three seconds of watching, then the screen must hold the answer
    // (a loaded machine may need a few more refreshes to symbolize).
    std::thread::sleep(Duration::from_secs(3));
    let hot = "fib (pyattr_cpu.py:";
    let mut screen = tmux.capture();
    let shown = poll(Duration::from_secs(15), || {
        screen = tmux.capture();
        // The workload never waits: its bottleneck is Python compute (at
        // fib), or CPU starvation on a machine busy with other work.
        let verdict = screen.lines().any(|l| {
            l.contains(&format!("pid {wpid} ")) && (l.contains("bottleneck Python compute") || l.contains("bottleneck CPU starvation") || l.contains("too close to call"))
        });
        (screen.contains(&format!("pid {wpid}")) && screen.contains(hot) && screen.contains("verdict so far") && verdict).then_some(())
    });
    assert!(shown.is_some(), "{test}: the pid, `{hot}` and the verdict are not all on screen:\n{screen}");
    // The hot function is the top on-CPU function: the first row under its title.
    let lines: Vec<&str> = screen.lines().collect();
    let title = lines.iter().position(|l| l.contains("top Python functions by on-CPU")).expect("on-CPU section");
    assert!(lines[title + 1].contains(hot), "{test}: fib is not the top on-CPU function:\n{screen}");
    // The workload's thread has a bar with on-CPU time (`#`); the rest is
    // run-queue (`r`), never a wait.
    let row = lines.iter().find(|l| l.contains(&format!("{wpid} python3")) && l.contains('|')).unwrap_or_else(|| panic!("no thread row:\n{screen}"));
    assert!(row.contains('#'), "{test}: the thread's bar shows no on-CPU time: {row}");
    let bar = row.split('|').nth(1).unwrap_or_default();
    assert!(bar.chars().all(|c| matches!(c, '#' | 's' | 'r' | ' ')), "{test}: the thread's bar shows waits: {row}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let code = poll(Duration::from_secs(20), || fs::read_to_string(&code_file).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| panic!("{test}: infertrace top did not exit 20 s after `q`; pane:\n{}", tmux.capture()));
    tguard.disarm();
    let stderr = fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(code.trim(), "0", "{test}: exit code after `q`; stderr:\n{stderr}");
    assert!(stderr.contains("every probe detached"), "{test}: stderr:\n{stderr}");
    let left = poll(Duration::from_secs(2), || {
        let now = bpf_prog_ids();
        ids.iter().all(|i| !now.contains(i)).then_some(())
    });
    assert!(left.is_some(), "{test}: programs {ids:?} still loaded after `top` quit");
    assert!(alive(wpid), "{test}: the watched workload did not survive");
    let _ = workload.kill();
    let _ = workload.wait();
}

#[test]
fn top_without_a_terminal_refuses_in_one_line() {
    let test = "top_without_a_terminal_refuses_in_one_line";
    if !require(test, &[Need::Binary]) {
        return;
    }
    // stdout is a pipe here.
    let r = run_infertrace(["top", "-p", &std::process::id().to_string()]);
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("stdout is not one"), "{line}");
    assert!(r.stdout.is_empty(), "{}", r.describe());
    let r = run_infertrace(["top"]);
    assert_ne!(r.code(), Some(0), "{}", r.describe());
    assert!(single_error_line(&r).contains("nothing to watch"), "{}", r.describe());
}
