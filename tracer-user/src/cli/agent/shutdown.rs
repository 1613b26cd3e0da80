//! SIGTERM / SIGINT / SIGHUP end the agent within 2 s, whatever the
//! collection loop is doing. The signals are blocked in every thread of
//! the agent ([`install`] runs before any other thread starts, and threads
//! inherit the mask) and taken by a thread of their own (`sigwait`), which
//! asks the loop to stop ([`Shutdown::stop`]: the loop closes the current
//! window, writes it and calls [`Shutdown::finished`]; the probes are
//! released after, by the exit; a last window whose previous cut took
//! longer than the grace allows holds the counts only). If the loop has
//! not finished [`GRACE`] after the signal (it is stalled inside a turn),
//! the thread ends the process anyway: a line on stderr and exit code
//! [`EXIT_NO_LAST_WINDOW`].
//!
//! Exiting without the loop's cleanup leaves nothing behind in the kernel:
//! the agent pins no BPF object (no bpffs path), so every program, map, link
//! and perf event is held by a descriptor of this process and is released
//! with it; uprobes go through perf_event_open on kernels with the uprobe
//! PMU (since 4.17). A window being written when the process ends is a
//! temporary file, never a partial window under its final name.

use std::{
    io::Write as _,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// How long the loop has, after a signal, to write its last window.
pub const GRACE: Duration = Duration::from_millis(1500);
/// The exit code when the agent stopped without writing its last window.
pub const EXIT_NO_LAST_WINDOW: i32 = 4;

pub struct Shutdown {
    stop: Arc<Notify>,
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Shutdown {
    /// Resolves once a signal asked the agent to stop.
    pub async fn stop(&self) {
        self.stop.notified().await
    }

    /// The last window is written: the process may exit 0.
    pub fn finished(&self) {
        let (m, cv) = &*self.done;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill the set they are given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks the signals in the calling thread (and so in every thread it
/// starts later) and starts the thread that waits for them.
pub fn install() -> std::io::Result<Shutdown> {
    let set = signal_set();
    // SAFETY: a valid set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    let stop = Arc::new(Notify::new());
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let (stop2, done2) = (stop.clone(), done.clone());
    std::thread::Builder::new().name("infertrace-signals".into()).spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: a valid set and an out pointer to a c_int.
        while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
        let at = Instant::now();
        stop2.notify_one();
        let (m, cv) = &*done2;
        let mut finished = m.lock().unwrap_or_else(|p| p.into_inner());
        while !*finished {
            let left = GRACE.saturating_sub(at.elapsed());
            if left.is_zero() {
                break;
            }
            finished = cv.wait_timeout(finished, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if *finished {
            // The main thread exits 0 by itself; this is only a backstop
            // should it hang on its way out.
            drop(finished);
            std::thread::sleep(GRACE.saturating_sub(at.elapsed()) + Duration::from_millis(300));
            std::process::exit(0);
        }
        let name = if sig == libc::SIGINT { "SIGINT" } else if sig == libc::SIGHUP { "SIGHUP" } else { "SIGTERM" };
        let _ = writeln!(
            std::io::stderr(),
            "infertrace agent: the collection loop did not stop within {:.1}s of {name}; exiting without the last window (exit code {EXIT_NO_LAST_WINDOW})",
            GRACE.as_secs_f64()
        );
        std::process::exit(EXIT_NO_LAST_WINDOW);
    })?;
    Ok(Shutdown { stop, done })
}
