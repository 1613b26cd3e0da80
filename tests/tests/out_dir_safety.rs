//! Files the tracer writes, next to hostile neighbours (issue 30, item 1,
//! and "a deleted out-dir fails every later window"). Built the way the
//! attacks were found: links and FIFOs planted as `nobody` (setpriv) at the
//! names the agent will use next, in a sticky world-writable directory.
//!
//! - a link planted at the agent's next window names, pointing at a
//!   root-owned 0600 file: the file is unchanged, the windows are written
//!   under other names (regular files of root, 0640 at most, readable
//!   recordings) and the agent says so;
//! - FIFOs planted there do not block the agent: SIGTERM ends it within a
//!   few seconds, exit 0, its windows written;
//! - a world-writable out-dir without the sticky bit is refused: one line
//!   with the reason and a hint, non-zero exit, nothing written;
//! - a deleted out-dir is created again at the next window (a line says
//!   so) and later windows are written;
//! - `record -o` at a link planted by nobody in a sticky shared directory
//!   is refused without following it; one planted while recording is
//!   replaced, never written through.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::*;

const SECRET: &[u8] = b"root's secret, mode 0600\n";

/// A root-owned 0600 file in `dir` (not shared), as an attacker's target.
fn victim(dir: &TempDir) -> PathBuf {
    let v = dir.join("victim");
    fs::write(&v, SECRET).unwrap();
    fs::set_permissions(&v, fs::Permissions::from_mode(0o600)).unwrap();
    v
}

/// A sticky world-writable directory (like /tmp) inside `dir`.
fn shared_dir(dir: &TempDir, name: &str) -> PathBuf {
    let s = dir.join(name);
    fs::create_dir(&s).unwrap();
    fs::set_permissions(&s, fs::Permissions::from_mode(0o1777)).unwrap();
    s
}

/// Runs `script` (sh) as nobody, with `args` as $1...
fn as_nobody(script: &str, args: &[String]) {
    let r = run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script, "sh"])
            .args(args),
        Duration::from_secs(30),
    );
    r.assert_ok();
}

/// `YYYYmmdd-HHMMSS` in local time, `ahead` seconds from now (the agent's
/// window names).
fn stamp(ahead: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 + ahead;
    let t: libc::time_t = now as libc::time_t;
    // SAFETY: a zeroed tm is a valid value; localtime_r fills it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to a time_t and a tm of our own.
    assert!(!unsafe { libc::localtime_r(&t, &mut tm) }.is_null());
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Every name windows 1..=`seqs` could get in the next `secs` seconds.
fn next_names(dir: &Path, secs: i64, seqs: u64) -> Vec<String> {
    let mut v = Vec::new();
    for s in 0..secs {
        let ts = stamp(s);
        for q in 1..=seqs {
            v.push(dir.join(format!("infertrace-agent-{ts}-{q:06}.itr")).to_string_lossy().into_owned());
        }
    }
    v.sort();
    v.dedup();
    v
}

/// A process to select with `--pid`.
fn sleeper() -> (Child, KillOnDrop) {
    let c = Command::new("sleep").arg("120").stdin(Stdio::null()).spawn().expect("spawn sleep");
    let g = KillOnDrop::new(c.id());
    (c, g)
}

struct Agent(AgentProc);

impl std::ops::Deref for Agent {
    type Target = AgentProc;
    fn deref(&self) -> &AgentProc {
        &self.0
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut AgentProc {
        &mut self.0
    }
}

/// `agent --no-cuda --no-sched --pid PID --window 1s --out-dir OUT`.
fn start_agent(pid: u32, out: &Path) -> Agent {
    let pid = pid.to_string();
    let args = ["--no-cuda", "--no-sched", "--window", "1s", "--pid", &pid, "--out-dir"].map(std::ffi::OsStr::new);
    Agent(spawn_agent(args.into_iter().chain([out.as_os_str()])))
}

impl Agent {
    /// SIGTERM; asserts it exits 0 within `within`.
    fn stop(&mut self, within: Duration) {
        let t0 = Instant::now();
        kill(self.child.id(), libc::SIGTERM);
        let status = poll(within, || self.child.try_wait().ok().flatten());
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.lines.push(l);
        }
        let status = status.unwrap_or_else(|| panic!("still running {within:?} after SIGTERM\n{}", self.lines.join("\n")));
        assert!(status.success(), "{status:?}\n{}", self.lines.join("\n"));
        eprintln!("the agent exited {:.2}s after SIGTERM", t0.elapsed().as_secs_f64());
    }
}

/// The windows the agent wrote: regular files of root named like one.
fn windows(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        n.starts_with("infertrace-agent-")
            && n.ends_with(".itr")
            && fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file() && m.uid() == 0)
    });
    v.sort();
    v
}

/// Checks a window: a readable recording, 0640 at most.
fn check_window(p: &Path) {
    let m = fs::symlink_metadata(p).unwrap();
    assert_eq!(m.mode() & 0o037, 0, "{} has mode {:o}", p.display(), m.mode() & 0o7777);
    let r = run_infertrace([std::ffi::OsStr::new("report"), p.as_os_str(), std::ffi::OsStr::new("--format"), std::ffi::OsStr::new("json")]);
    r.assert_ok();
}

#[test]
fn a_link_planted_at_the_next_window_name_is_never_followed() {
    require!("a_link_planted_at_the_next_window_name_is_never_followed", Root, Binary, Setpriv);
    let dir = TempDir::new("outdir-link");
    let v = victim(&dir);
    let out = shared_dir(&dir, "shared");
    // The names of windows 1-8 over the next 40 seconds (the agent's
    // start takes a few), each a link to the victim.
    let planted = next_names(&out, 40, 8);
    as_nobody(r#"v="$1"; shift; for n in "$@"; do ln -s "$v" "$n" || exit 1; done"#, &[vec![v.to_string_lossy().into_owned()], planted.clone()].concat());
    assert!(fs::symlink_metadata(&planted[0]).unwrap().file_type().is_symlink());
    let (_sleep, _g) = sleeper();
    let mut agent = start_agent(_sleep.id(), &out);
    let written = poll(Duration::from_secs(30), || (windows(&out).len() >= 3).then_some(()));
    agent.stop(Duration::from_secs(10));
    assert_eq!(fs::read(&v).unwrap(), SECRET, "the victim was written through a planted link");
    assert_eq!(fs::metadata(&v).unwrap().mode() & 0o7777, 0o600, "the victim's mode changed");
    assert!(written.is_some(), "fewer than 3 windows\n{}", agent.lines.join("\n"));
    let note = agent.wait_line(|l| l.contains("was already there: left alone"), Duration::from_secs(1), "no line about the planted name");
    for p in &planted {
        let m = fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_symlink() && m.uid() == 65534, "{p}: the planted link was replaced or removed");
    }
    let ws = windows(&out);
    assert!(ws.iter().any(|p| p.to_string_lossy().ends_with("-1.itr")), "no window under another name: {ws:?}\n{note}");
    for w in &ws {
        check_window(w);
    }
}

#[test]
fn a_fifo_planted_at_the_next_window_name_does_not_block_the_agent() {
    require!("a_fifo_planted_at_the_next_window_name_does_not_block_the_agent", Root, Binary, Setpriv);
    let dir = TempDir::new("outdir-fifo");
    let out = shared_dir(&dir, "shared");
    let planted = next_names(&out, 40, 8);
    as_nobody(r#"for n in "$@"; do mkfifo -m 666 "$n" || exit 1; done"#, &planted);
    let (_sleep, _g) = sleeper();
    let mut agent = start_agent(_sleep.id(), &out);
    let written = poll(Duration::from_secs(30), || (windows(&out).len() >= 3).then_some(()));
    assert!(written.is_some(), "fewer than 3 windows\n{}", agent.lines.join("\n"));
    agent.wait_line(|l| l.contains("was already there: left alone"), Duration::from_secs(5), "no line about the planted FIFO");
    agent.stop(Duration::from_secs(10));
    for p in &planted {
        assert!(fs::symlink_metadata(p).unwrap().file_type().is_fifo(), "{p}: the planted FIFO was replaced");
    }
    let ws = windows(&out);
    assert!(ws.len() >= 4, "the last window (SIGTERM) is written too: {ws:?}");
    for w in &ws {
        check_window(w);
    }
}

#[test]
fn a_world_writable_out_dir_without_the_sticky_bit_is_refused() {
    require!("a_world_writable_out_dir_without_the_sticky_bit_is_refused", Root, Binary);
    let dir = TempDir::new("outdir-open");
    let out = dir.join("open");
    fs::create_dir(&out).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
    let (_sleep, _g) = sleeper();
    let run_agent = || {
        run_cmd(
            infertrace(["agent", "--no-cuda", "--listen", "127.0.0.1:0", "--window", "1s", "--pid"])
                .arg(_sleep.id().to_string())
                .arg("--out-dir")
                .arg(&out),
            Duration::from_secs(30),
        )
    };
    let r = run_agent();
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains(&*out.to_string_lossy()), "{line:?}");
    assert!(line.contains("world-writable (mode 0777) without the sticky bit"), "{line:?}");
    assert!(line.contains("--out-dir"), "the hint names the option: {line:?}");
    assert_eq!(fs::read_dir(&out).unwrap().count(), 0, "something was written");
    // Owned by another user: refused too, even 0755.
    fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&out, Some(65534), Some(65534)).unwrap();
    let r = run_agent();
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("owned by uid 65534"), "{line:?}");
}

#[test]
fn a_deleted_out_dir_is_created_again() {
    require!("a_deleted_out_dir_is_created_again", Root, Binary);
    let dir = TempDir::new("outdir-deleted");
    let out = dir.join("windows");
    let (_sleep, _g) = sleeper();
    let mut agent = start_agent(_sleep.id(), &out);
    let mode = fs::metadata(&out).unwrap().mode() & 0o7777;
    assert_eq!(mode & 0o027, 0, "created 0750 at most: {mode:o}");
    let first = poll(Duration::from_secs(30), || (!windows(&out).is_empty()).then_some(()));
    assert!(first.is_some(), "no first window\n{}", agent.lines.join("\n"));
    fs::remove_dir_all(&out).unwrap();
    agent.wait_line(|l| l.contains("was removed: created again"), Duration::from_secs(30), "no line about the directory");
    let later = poll(Duration::from_secs(30), || (windows(&out).len() >= 2).then_some(()));
    agent.stop(Duration::from_secs(10));
    assert!(later.is_some(), "no windows after the directory came back\n{}", agent.lines.join("\n"));
    assert!(!agent.lines.iter().any(|l| l.contains("not written")), "{}", agent.lines.join("\n"));
    for w in windows(&out) {
        check_window(&w);
    }
}

#[test]
fn record_does_not_follow_a_link_planted_in_a_shared_directory() {
    require!("record_does_not_follow_a_link_planted_in_a_shared_directory", Root, Binary, Setpriv);
    let dir = TempDir::new("record-planted");
    let v = victim(&dir);
    let shared = shared_dir(&dir, "shared");
    let out = shared.join("rec.itr");
    as_nobody(r#"ln -s "$1" "$2""#, &[v.to_string_lossy().into_owned(), out.to_string_lossy().into_owned()]);
    let r = run_cmd(infertrace(["record", "-q", "--no-cuda", "-o"]).arg(&out).args(["--", "true"]), Duration::from_secs(60));
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("owned by uid 65534") && line.contains("not followed"), "{line:?}");
    assert_eq!(fs::read(&v).unwrap(), SECRET);
    assert!(fs::symlink_metadata(&out).unwrap().file_type().is_symlink(), "the planted link is left alone");

    // Planted while recording (after the output was checked): replaced by
    // the recording, never written through.
    let out2 = shared.join("rec2.itr");
    let tracer = spawn(infertrace(["record", "-q", "--no-cuda", "--format", "json", "-o"]).arg(&out2).args(["--", "sleep", "3"]));
    let mut guard = KillOnDrop::new(tracer.id());
    // The output is checked before the command is launched: wait for it.
    let launched = poll(Duration::from_secs(30), || children_of(tracer.id()).into_iter().next());
    assert!(launched.is_some(), "the command was not launched");
    as_nobody(r#"ln -s "$1" "$2""#, &[v.to_string_lossy().into_owned(), out2.to_string_lossy().into_owned()]);
    let r = wait_child(tracer, Duration::from_secs(60), "infertrace record -- sleep 3");
    guard.disarm();
    r.assert_ok();
    assert_eq!(fs::read(&v).unwrap(), SECRET, "the victim was written through a link planted while recording");
    let m = fs::symlink_metadata(&out2).unwrap();
    assert!(m.file_type().is_file() && m.uid() == 0, "the output is the tracer's file");
    run_infertrace([std::ffi::OsStr::new("report"), out2.as_os_str()]).assert_ok();
}
