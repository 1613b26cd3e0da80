//! Local date and time of a Unix time, as the report and default file
//! names print them (the host's time zone, `localtime_r`).

/// `YYYYmmdd-HHMMSS` in local time, of a Unix time in ms (file names).
pub fn stamp(unix_ms: u64) -> String {
    fmt_local(unix_ms, "", "-", "")
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
