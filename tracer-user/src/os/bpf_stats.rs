//! The kernel's run statistics of our BPF programs, and the tracer
//! process's own CPU time and peak memory.
//!
//! `BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)` turns on, for as long as its
//! descriptor is open, the per-program `run_cnt` and `run_time_ns` that the
//! kernel keeps (the same as `sysctl kernel.bpf_stats_enabled=1`, undone when
//! the tracer exits, even if it is killed). Each program's counters are read
//! from `/proc/self/fdinfo` of the program descriptors this process holds:
//! every program we loaded, through aya or not (`uprobe_multi`), and only
//! ours, whatever else runs on the machine.

use std::{collections::BTreeMap, fs, os::fd::OwnedFd};

/// One program's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    pub runs: u64,
    pub run_ns: u64,
}

/// Turns the run statistics on; `None` (with the reason) where the kernel
/// refuses (before Linux 5.8, or without the privilege).
pub fn enable() -> Result<OwnedFd, String> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| format!("BPF run statistics unavailable: {e}"))
}

/// Counters of every BPF program this process holds, by program id.
pub fn own_programs() -> BTreeMap<u32, Runs> {
    let mut out = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/proc/self/fd") else { return out };
    for e in dir.flatten() {
        let Ok(target) = fs::read_link(e.path()) else { continue };
        if !target.to_string_lossy().contains("bpf-prog") {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/self/fdinfo/{}", e.file_name().to_string_lossy())) else { continue };
        if let Some((id, runs)) = parse_fdinfo(&info) {
            out.insert(id, runs);
        }
    }
    out
}

/// The counters of one program descriptor of ours.
pub fn of_fd(fd: std::os::fd::BorrowedFd<'_>) -> Option<Runs> {
    use std::os::fd::AsRawFd;
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    parse_fdinfo(&info).map(|(_, r)| r)
}

/// `prog_id`, `run_cnt` and `run_time_ns` of a program descriptor's fdinfo.
fn parse_fdinfo(text: &str) -> Option<(u32, Runs)> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok())
    };
    let id = u32::try_from(field("prog_id")?).ok()?;
    Some((id, Runs { runs: field("run_cnt").unwrap_or(0), run_ns: field("run_time_ns").unwrap_or(0) }))
}

/// Names of the programs with these ids (the kernel keeps 15 bytes).
pub fn names(ids: &BTreeMap<u32, Runs>) -> BTreeMap<u32, String> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| ids.contains_key(&p.id()))
        .filter_map(|p| Some((p.id(), p.name_as_str()?.to_owned())))
        .collect()
}

/// The tracer's user and system CPU time (ns), and its peak resident size
/// (bytes; VmHWM).
pub fn own_usage() -> (u64, u64, u64) {
    // SAFETY: getrusage writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0;
    let ns = |t: libc::timeval| (t.tv_sec.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_usec.max(0) as u64 * 1000);
    let (user, system) = if ok { (ns(ru.ru_utime), ns(ru.ru_stime)) } else { (0, 0) };
    let hwm = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()))
        .unwrap_or(0);
    (user, system, hwm * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_program_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t26\nprog_jited:\t1\n\
                    prog_tag:\tabc\nmemlock:\t4096\nprog_id:\t812\nrun_time_ns:\t123456\nrun_cnt:\t789\n";
        assert_eq!(parse_fdinfo(text), Some((812, Runs { runs: 789, run_ns: 123456 })));
        assert_eq!(parse_fdinfo("pos:\t0\n"), None);
    }

    #[test]
    fn own_usage_is_nonzero() {
        let (user, system, hwm) = own_usage();
        assert!(user + system > 0 && hwm > 0);
    }
}
