//! Clocks: CLOCK_MONOTONIC (the kernel's `bpf_ktime_get_ns`), wall time, and
//! a local timestamp for default file names.

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

/// `YYYYmmdd-HHMMSS` in local time.
pub fn local_timestamp() -> String {
    fmt_local(unix_ms(), "", "-", "")
}

/// `YYYY-mm-dd HH:MM:SS` in local time, of a Unix time in ms.
pub fn local_time(unix_ms: u64) -> String {
    fmt_local(unix_ms, "-", " ", ":")
}

/// Local date and time of `unix_ms`, the date's, middle and time's separators given.
fn fmt_local(unix_ms: u64, date: &str, mid: &str, time: &str) -> String {
    let tm = local_tm(unix_ms);
    format!(
        "{:04}{date}{:02}{date}{:02}{mid}{:02}{time}{:02}{time}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn local_tm(unix_ms: u64) -> libc::tm {
    let secs = libc::time_t::try_from(unix_ms / 1000).unwrap_or(libc::time_t::MAX);
    // SAFETY: zeroed tm is valid; localtime_r fills it (and leaves it zeroed
    // for a time it cannot represent).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    tm
}
