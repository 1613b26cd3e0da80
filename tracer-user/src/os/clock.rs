//! Clocks: CLOCK_MONOTONIC (the kernel's `bpf_ktime_get_ns`), wall time, and
//! a local timestamp for default file names (formatted by
//! `crate::system::local_time`).

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `YYYYmmdd-HHMMSS` in local time, now (`crate::system::local_time`).
pub fn local_timestamp() -> String {
    crate::system::local_time::stamp(unix_ms())
}
