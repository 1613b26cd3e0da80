//! The tracer's own threads' scheduling.

/// Puts the calling thread in `SCHED_FIFO` at priority 1, the lowest
/// real-time one: it then runs as soon as it wakes, ahead of every ordinary
/// (CFS/EEVDF) task. For a userspace sampler this is what keeps its samples
/// unbiased on saturated CPUs: at an ordinary priority it waits on the run
/// queue while the target computes and runs once the target sleeps, so it
/// sees the target idle far more often than it is. Needs CAP_SYS_NICE (root
/// has it); the caller decides what to do without it.
pub fn realtime_self() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; `param` lives across the call.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_goes_realtime_or_says_why() {
        let r = std::thread::spawn(|| {
            let r = super::realtime_self();
            // SAFETY: querying the calling thread's policy.
            (r.map_err(|e| e.kind()), unsafe { libc::sched_getscheduler(0) })
        })
        .join()
        .unwrap_or_else(|_| panic!("thread panicked"));
        match r {
            (Ok(()), policy) => assert_eq!(policy, libc::SCHED_FIFO),
            (Err(k), policy) => {
                assert_eq!(k, std::io::ErrorKind::PermissionDenied);
                assert_eq!(policy, libc::SCHED_OTHER);
            }
        }
    }
}
