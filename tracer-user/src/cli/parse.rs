//! Parsers of the command line's values: durations, percentages, pids, sizes, frequencies.

use std::time::Duration;

use crate::{engine, recording::limits};

/// `diff --fail-if-slower`: a percentage, 0 or more.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        Ok(_) => Err(format!("`{s}` is not a percentage of 0 or more (e.g. 10)")),
        Err(_) => Err(format!("`{s}` is not a number (a percentage, e.g. 10)")),
    }
}

/// `500ms`, `10s`, `2m`, `1h`, `1d`, or a bare number of seconds, from
/// `min` to `max` (inclusive); out-of-range values are refused here, before
/// anything is attached, and never reach a `Duration` conversion.
pub fn parse_span(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!("`{s}` is negative (a duration is positive, e.g. 10s)"));
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("invalid duration `{s}` (examples: 500ms, 10s, 2m)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        _ => return Err(format!("invalid duration unit `{unit}` in `{s}` (use us, ms, s, m, h or d)")),
    };
    let range = || format!("{} to {}", fmt_span(min), fmt_span(max));
    if !(secs > 0.0 && secs.is_finite()) || secs < min.as_secs_f64() {
        return Err(format!("`{s}` is too short (use {})", range()));
    }
    if secs > max.as_secs_f64() {
        return Err(format!("`{s}` is too long (use {})", range()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `1us`, `24h`, `365d`: the bounds in [`parse_span`]'s messages.
pub fn fmt_span(d: Duration) -> String {
    match d.as_secs() {
        0 if d.as_micros() < 1000 => format!("{}us", d.as_micros()),
        0 => format!("{}ms", d.as_millis()),
        s if s % 86400 == 0 && s > 86400 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s => format!("{s}s"),
    }
}

/// `record --duration`: 1 ms to [`engine::MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(1), engine::MAX_DURATION)
}

/// `record --slow-syscall`: 0 (off), or [`engine::MIN_SLOW_SYSCALL`] to
/// [`engine::MAX_SLOW_SYSCALL`].
pub fn parse_slow_syscall(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_span(s, engine::MIN_SLOW_SYSCALL, engine::MAX_SLOW_SYSCALL).map_err(|e| format!("{e}, or 0 to turn it off"))
}

/// `record --max-overhead`: a percentage, 0.1 to 100.
pub fn parse_max_overhead(s: &str) -> Result<f64, String> {
    let p = parse_pct(s)?;
    if !(engine::MIN_MAX_OVERHEAD..=engine::MAX_MAX_OVERHEAD).contains(&p) {
        return Err(format!(
            "`{s}` is out of range: the budget is {} to {} (percent of a target's time)",
            engine::MIN_MAX_OVERHEAD,
            engine::MAX_MAX_OVERHEAD
        ));
    }
    Ok(p)
}

/// `record --blocked-loop`: 1 ms to 1 h.
pub fn parse_blocked_loop(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(1), Duration::from_secs(3600))
}

/// `record --checkpoint-every`: 0 (off), or 10 ms to 24 h.
pub fn parse_checkpoint_every(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_span(s, Duration::from_millis(10), Duration::from_secs(24 * 3600)).map_err(|e| format!("{e}, or 0 to turn it off"))
}

/// `top --refresh`: 100 ms to 1 min.
pub fn parse_refresh(s: &str) -> Result<Duration, String> {
    parse_span(s, Duration::from_millis(100), Duration::from_secs(60))
}

/// `record -F`: 0 (off) to [`engine::MAX_FREQUENCY`] Hz.
pub fn parse_frequency(s: &str) -> Result<u64, String> {
    let max = engine::MAX_FREQUENCY;
    let range = format!("use 0 (off) to {max} Hz; {} is the default", engine::DEFAULT_FREQUENCY);
    match s.trim().parse::<i128>() {
        Ok(hz) if (0..=i128::from(max)).contains(&hz) => Ok(hz as u64),
        Ok(_) => Err(format!("{s} Hz is out of range ({range})")),
        Err(_) => Err(format!("`{s}` is not a whole number of Hz ({range})")),
    }
}

/// `-p`: a process id, 1 or more.
pub fn parse_pid(s: &str) -> Result<u32, String> {
    match s.trim().parse::<i128>() {
        Ok(pid) if pid >= 1 && pid <= i128::from(u32::MAX) => Ok(pid as u32),
        Ok(_) => Err(format!("{s} is not a pid (pids are positive numbers; `ps -e` lists them)")),
        Err(_) => Err(format!("`{s}` is not a pid (a number, e.g. -p 1234)")),
    }
}

/// `report --max-inflated`: a size of at least 1 MiB.
pub fn parse_max_inflated(s: &str) -> Result<u64, String> {
    let v = limits::parse_size(s)?;
    if v < 1 << 20 {
        return Err(format!("`{s}` is too small (at least 1MiB; the default is 1GiB)"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{engine::checkpoint, families::nvml};

    #[test]
    fn flag_defaults_are_the_options_defaults() {
        let d = engine::RecordOptions::default();
        assert_eq!(parse_slow_syscall(engine::DEFAULT_SLOW_SYSCALL).unwrap(), d.slow_syscall.unwrap());
        assert_eq!((d.sched.frequency, d.gpu_sample_hz), (engine::DEFAULT_FREQUENCY, nvml::DEFAULT_HZ));
        assert_eq!(parse_checkpoint_every(checkpoint::DEFAULT_EVERY).ok(), d.checkpoint_every);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("365d").unwrap(), engine::MAX_DURATION);
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn huge_and_negative_values_are_refused_in_one_line() {
        for bad in ["3000000000000000h", "6000000000000000h", "366d", "1e400", "99999999999999999999999999999", "-1", "-5s", "inf", "NaN"] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(parse_duration("3000000000000000h").unwrap_err().contains("too long (use 1ms to 365d)"));
        assert!(parse_duration("-1").unwrap_err().contains("negative"));
        assert_eq!(parse_slow_syscall("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_slow_syscall("24h").unwrap(), engine::MAX_SLOW_SYSCALL);
        for bad in ["6000000000000000h", "25h", "100ns", "0.0000001", "-1ms"] {
            let e = parse_slow_syscall(bad).expect_err(bad);
            assert!(e.ends_with("or 0 to turn it off") || e.contains("negative"), "{e}");
        }
        assert_eq!(parse_frequency("0"), Ok(0));
        assert_eq!(parse_frequency("10000"), Ok(10_000));
        for bad in ["10001", "-1", "18446744073709551616", "1.5", "x"] {
            assert!(parse_frequency(bad).expect_err(bad).contains("0 (off) to 10000 Hz"));
        }
        assert_eq!(parse_pid("1"), Ok(1));
        for bad in ["0", "-1", "4294967296", "x"] {
            assert!(parse_pid(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_max_inflated("4GiB"), Ok(4 << 30));
        assert!(parse_max_inflated("1K").is_err());
    }
}
