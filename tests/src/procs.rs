//! Processes by pid: signals, liveness, /proc lookups, polling.

use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Whether a process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_fields(&s)
            .map(|f| f[0] != "Z" && f[0] != "X")
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The fields of /proc/PID/stat after the `(comm)`: index 0 is the state
/// (field 3), index 6 the flags (field 9).
fn stat_fields(stat: &str) -> Option<Vec<String>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Direct children of `pid` (all threads).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("children")) {
                v.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    v
}

/// A pid of a kernel thread (PF_KTHREAD set in /proc/PID/stat flags), other
/// than pid 0/1.
pub fn kernel_thread_pid() -> u32 {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort();
    for pid in pids {
        let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(f) = stat_fields(&s) else { continue };
        let flags: u64 = f.get(6).and_then(|x| x.parse().ok()).unwrap_or(0);
        if pid > 1 && flags & PF_KTHREAD != 0 {
            return pid;
        }
    }
    panic!("no kernel thread found in /proc");
}

/// A pid number that no process or thread currently has.
pub fn unused_pid() -> u32 {
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (1..1000)
        .map(|i| max - i)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("no free pid near pid_max")
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `timeout`.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs process `pid` on drop unless disarmed (cleanup when a test
/// panics while a tracer or workload is still running).
pub struct KillOnDrop(pub Option<u32>);

impl KillOnDrop {
    pub fn new(pid: u32) -> KillOnDrop {
        KillOnDrop(Some(pid))
    }
    /// Call once the process has been reaped.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            if alive(pid) {
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// Waits (up to 5 s) until the main thread of `pid` is blocked in syscall
/// `nr` (from /proc/PID/syscall). Panics on timeout.
#[track_caller]
pub fn wait_blocked_in(pid: u32, nr: u64) {
    let ok = poll(Duration::from_secs(5), || {
        let s = fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
        (s.split_whitespace().next()? == nr.to_string()).then_some(())
    });
    assert!(ok.is_some(), "pid {pid} not blocked in syscall {nr}");
}

/// The lines of `out` (a child's stdout, say), read on a thread of their
/// own and sent as they come; the channel closes at end of file.
pub fn line_channel(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}
