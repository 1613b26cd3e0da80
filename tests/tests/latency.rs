//! Syscall latency: 100 sleeps of 10 ms must be timed as such.
//!
//! Ground truth is twofold: the requested 10 ms (a sleep never returns
//! earlier) and the workload's own timing of each call (CLOCK_MONOTONIC
//! around it, which contains the tracer's sys_enter..sys_exit interval).
//! On a quiet machine every call lands in bucket 23 ([8.39, 16.78) ms) and
//! the total is within 5 % of 1 s; on a loaded one, sleeps that really
//! overshot (as the workload itself saw) may land higher.

use std::ffi::OsStr;
use std::fs;

use infertrace_e2e::*;

const N: u64 = 100;
const MS: u64 = 10;

#[test]
fn sleep_latency_is_measured() {
    require!("sleep_latency_is_measured", Root, Binary, Gcc, Strace);
    let w = workload("sleeper");
    let (n, ms) = (N.to_string(), MS.to_string());
    let dir = TempDir::new("latency");
    let truth_file = dir.join("durations.txt");
    let cmd: Vec<&OsStr> = vec![
        w.as_os_str(),
        n.as_ref(),
        ms.as_ref(),
        truth_file.as_os_str(),
    ];

    // glibc's nanosleep() may be nanosleep or clock_nanosleep: ask strace.
    let st = strace_counts(&cmd);
    let name = ["clock_nanosleep", "nanosleep"]
        .into_iter()
        .find(|s| st.get(*s).map(|c| c.0) == Some(N))
        .unwrap_or_else(|| panic!("strace shows no sleep syscall with {N} calls: {st:?}"));

    let (_, rep) = record_launch(&dir.join("rec.itr"), &cmd);
    let truth: Vec<u64> = fs::read_to_string(&truth_file)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(truth.len() as u64, N);
    let truth_total: u64 = truth.iter().sum();
    let truth_max = *truth.iter().max().unwrap();
    let truth_in_23 = truth.iter().filter(|&&d| d < 1 << 24).count() as u64;

    let pid = rep.one_target("launched")["pid"].as_u64().unwrap() as u32;
    let row = rep
        .row(pid, name)
        .unwrap_or_else(|| panic!("no {name} row for pid {pid}: {:?}", rep.counts_for(pid)));
    let ctx = format!("{row}\nworkload's own timings: total {truth_total} ns, max {truth_max} ns");
    assert_eq!(row["count"], N, "{ctx}");
    assert_eq!(row["errors"], 0, "{ctx}");

    let total = row["total_ns"].as_u64().unwrap();
    let lo = N * MS * 1_000_000;
    assert!(
        total >= lo,
        "total_ns {total} < {lo}: sleeps cannot be shorter than asked\n{ctx}"
    );
    assert!(
        total <= truth_total,
        "total_ns {total} > the workload's own timing\n{ctx}"
    );
    // The difference is only syscall entry/exit around the probes (µs).
    assert!(
        truth_total - total < N * 200_000,
        "total_ns {total} far below the workload's own timing\n{ctx}"
    );
    if truth_total <= lo + lo / 20 {
        // Quiet machine: timer slack and wakeup latency within 5 %.
        assert!(
            total <= lo + lo / 20,
            "total_ns {total} more than 5 % over {lo}\n{ctx}"
        );
    }

    let max = row["max_ns"].as_u64().unwrap();
    assert!(max >= MS * 1_000_000, "max_ns {max} < {MS} ms\n{ctx}");
    assert!(
        max <= truth_max,
        "max_ns {max} > the workload's own max\n{ctx}"
    );

    // Bucket 23 is [2^23, 2^24) ns = [8.39 ms, 16.78 ms). Every call the
    // workload itself saw under 2^24 ns must be there (all 100 when quiet).
    let hist: Vec<u64> = row["hist_log2_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        hist[..23].iter().sum::<u64>(),
        0,
        "calls under 8.39 ms: {hist:?}\n{ctx}"
    );
    assert!(
        hist[23] >= truth_in_23,
        "bucket 23 has {} < {truth_in_23}: {hist:?}\n{ctx}",
        hist[23]
    );
    if truth_in_23 == N {
        assert_eq!(hist[23], N, "{ctx}");
    }

    // The text report's usecs/call and calls columns agree (every row:
    // `--verbose`).
    let text = run_infertrace([OsStr::new("report"), OsStr::new("--verbose"), dir.join("rec.itr").as_os_str()]);
    text.assert_ok();
    let line = text
        .stdout
        .lines()
        .find(|l| l.split_whitespace().last() == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in text report\n{}", text.stdout));
    let cols: Vec<&str> = line.split_whitespace().collect();
    let usecs: u64 = cols[2]
        .parse()
        .unwrap_or_else(|_| panic!("usecs/call in {line:?}"));
    let want = total / N / 1000;
    assert!(
        usecs.abs_diff(want) <= 1,
        "usecs/call {usecs}, expected {want}: {line:?}"
    );
    assert_eq!(cols[3], N.to_string(), "calls column: {line:?}");
}
