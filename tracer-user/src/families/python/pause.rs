//! Holding a process still for a one-shot read (`dump --async`): every
//! thread is seized with ptrace and interrupted, and let go again when the
//! [`Paused`] guard drops. A loop that creates and finishes thousands of
//! tasks a second changes its task lists faster than they can be read
//! while it runs; py-spy pauses its target for `dump` the same way.
//!
//! Seizing leaves no trace in the target (no signal is delivered, unlike
//! SIGSTOP); a thread that cannot be seized (already traced, exited) is
//! left running, and the read falls back to retrying.

use std::time::{Duration, Instant};

/// The threads seized; released on drop.
pub struct Paused {
    tids: Vec<i32>,
}

impl Paused {
    /// Seizes and stops every thread of `pid` (waits at most ~100 ms per
    /// thread for the stop). Returns how many threads could not be held.
    pub fn pause(pid: u32) -> (Self, usize) {
        let mut held = Vec::new();
        let mut missed = 0;
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (Self { tids: held }, 1) };
        for entry in dir.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            // SAFETY: plain ptrace requests on a tid; no memory is passed.
            let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) } == 0;
            if !seized {
                missed += 1;
                continue;
            }
            // SAFETY: as above.
            if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) } != 0 || !wait_stopped(tid) {
                missed += 1;
            }
            held.push(tid);
        }
        (Self { tids: held }, missed)
    }
}

/// Waits for `tid`'s group-stop or event stop after PTRACE_INTERRUPT.
fn wait_stopped(tid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_millis(100);
    loop {
        let mut status = 0;
        // SAFETY: waitpid on a tracee we seized; status is a valid out pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            return libc::WIFSTOPPED(status);
        }
        if r < 0 || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &tid in &self.tids {
            // SAFETY: detaching a tracee we seized; it resumes.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, 0usize) };
        }
    }
}
