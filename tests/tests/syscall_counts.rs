//! Exact syscall counts of a deterministic workload, launched by infertrace,
//! against the workload's known numbers and against strace.

use std::ffi::OsStr;

use infertrace_e2e::*;

const GETPPID: u64 = 1000;
const READS: u64 = 700;
const WRITES: u64 = 300;
const ENOENT: u64 = 5;

fn args() -> [String; 4] {
    [GETPPID, READS, WRITES, ENOENT].map(|n| n.to_string())
}

#[test]
fn launched_workload_counts_are_exact() {
    require!(
        "launched_workload_counts_are_exact",
        Root,
        Binary,
        Gcc,
        Strace
    );
    let w = workload("syscall_counts");
    let a = args();
    let mut cmd: Vec<&OsStr> = vec![w.as_os_str()];
    cmd.extend(a.iter().map(OsStr::new));

    let dir = TempDir::new("counts");
    let (_, rep) = record_launch(&dir.join("rec.itr"), &cmd);
    let t = rep.one_target("launched");
    let pid = t["pid"].as_u64().unwrap() as u32;
    assert_eq!(t["exit_code"], 0, "launched target: {t}");
    assert_eq!(t["comm"], "syscall_counts", "launched target: {t}");
    assert_eq!(
        rep.targets().len(),
        1,
        "only the launched process: {}",
        rep.0
    );

    let counts = rep.counts_for(pid);
    let ctx = format!("counts for pid {pid}: {counts:?}");
    assert_eq!(rep.count(pid, "getppid"), GETPPID, "{ctx}");
    assert_eq!(rep.count(pid, "read"), READS, "{ctx}");
    assert_eq!(rep.count(pid, "write"), WRITES, "{ctx}");
    // /dev/zero and /dev/null succeed, the ENOENT ones fail.
    assert_eq!(rep.count(pid, "openat"), ENOENT + 2, "{ctx}");
    assert_eq!(rep.errors(pid, "openat"), ENOENT, "{ctx}");
    let openat = rep.row(pid, "openat").unwrap();
    assert_eq!(
        openat["errnos"],
        serde_json::json!({ "ENOENT": ENOENT }),
        "{openat}"
    );
    for name in ["getppid", "read", "write"] {
        let row = rep.row(pid, name).unwrap();
        assert_eq!(row["errors"], 0, "{row}");
        assert_eq!(row["errnos"], serde_json::json!({}), "{row}");
    }
    assert_eq!(rep.count(pid, "exit_group"), 1, "{ctx}");
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(rep.row(pid, "getppid").unwrap()["nr"], 110);
        assert_eq!(rep.row(pid, "openat").unwrap()["nr"], 257);
    }

    // Same counts as strace for the workload's own syscalls.
    let st = strace_counts(&cmd);
    for name in ["getppid", "read", "write", "openat"] {
        let (calls, errors) = st.get(name).copied().unwrap_or((0, 0));
        assert_eq!(
            rep.count(pid, name),
            calls,
            "{name}: infertrace vs strace {st:?}\n{ctx}"
        );
        assert_eq!(
            rep.errors(pid, name),
            errors,
            "{name} errors: infertrace vs strace {st:?}"
        );
    }
}

/// Everything strace sees from the workload after its execve, infertrace
/// sees too, with the same counts.
#[test]
fn launched_workload_matches_strace_for_every_syscall() {
    require!(
        "launched_workload_matches_strace_for_every_syscall",
        Root,
        Binary,
        Gcc,
        Strace
    );
    let w = workload("syscall_counts");
    let a = args();
    let mut cmd: Vec<&OsStr> = vec![w.as_os_str()];
    cmd.extend(a.iter().map(OsStr::new));

    let dir = TempDir::new("counts-all");
    let (_, rep) = record_launch(&dir.join("rec.itr"), &cmd);
    let pid = rep.one_target("launched")["pid"].as_u64().unwrap() as u32;
    let st = strace_counts(&cmd);
    let mut ours = rep.counts_for(pid);
    // strace -c does not list exit_group/execve consistently with a tracer
    // that starts counting before the exec: compare the rest.
    for skip in ["execve", "exit_group"] {
        ours.remove(skip);
    }
    let theirs: std::collections::BTreeMap<String, u64> = st
        .iter()
        .filter(|(k, _)| !["execve", "exit_group"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.0))
        .collect();
    assert_eq!(ours, theirs, "infertrace (left) vs strace -c -f (right)");
}

/// The launched target of a short-lived command is described fully: its
/// command line is the one infertrace launched (it knows it even if the
/// process is gone before /proc can be read); exe, when given, is the
/// program's path.
#[test]
fn short_lived_launched_target_is_described() {
    require!(
        "short_lived_launched_target_is_described",
        Root,
        Binary,
        Gcc
    );
    let w = workload("syscall_counts");
    let cmd: Vec<&OsStr> = vec![
        w.as_os_str(),
        "10".as_ref(),
        "1".as_ref(),
        "1".as_ref(),
        "1".as_ref(),
    ];
    let dir = TempDir::new("counts-meta");
    let (_, rep) = record_launch(&dir.join("rec.itr"), &cmd);
    let t = rep.one_target("launched");
    assert_eq!(t["comm"], "syscall_counts", "{t}");
    assert_eq!(t["exit_code"], 0, "{t}");
    assert_eq!(
        t["cmdline"],
        serde_json::json!([w.to_str().unwrap(), "10", "1", "1", "1"]),
        "{t}"
    );
    assert!(t["exe"].is_null() || t["exe"] == w.to_str().unwrap(), "{t}");
}

/// Threads of one process: one row per (pid, syscall), summing all threads;
/// fast calls interleaved with blocking ones on several CPUs are all counted
/// and the blocking ones timed at least as long as they slept.
#[test]
fn threaded_workload_counts_are_exact() {
    require!("threaded_workload_counts_are_exact", Root, Binary, Gcc);
    const T: u64 = 4;
    const N: u64 = 20_000;
    let w = workload("threads");
    let (t, n) = (T.to_string(), N.to_string());
    let dir = TempDir::new("threads");
    let (_, rep) = record_launch(
        &dir.join("rec.itr"),
        &[w.as_os_str(), t.as_ref(), n.as_ref()],
    );
    let pid = rep.one_target("launched")["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        rep.targets().len(),
        1,
        "threads are not separate targets: {}",
        rep.0
    );
    let counts = rep.counts_for(pid);
    assert_eq!(rep.count(pid, "getppid"), T * N, "{counts:?}");
    let sleeps = T * (N / 100);
    let row = rep
        .row(pid, "clock_nanosleep")
        .unwrap_or_else(|| panic!("{counts:?}"));
    assert_eq!(row["count"], sleeps, "{row}");
    assert_eq!(row["errors"], 0, "{row}");
    assert!(
        row["total_ns"].as_u64().unwrap() >= sleeps * 1_000_000,
        "{row}"
    );
    let hist: Vec<u64> = row["hist_log2_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    // 1 ms is in bucket 19 ([524 us, 1.05 ms)): nothing may be below.
    assert_eq!(
        hist[..19].iter().sum::<u64>(),
        0,
        "sleeps shorter than 1 ms: {hist:?}"
    );
    assert_eq!(rep.count(pid, "exit_group"), 1, "{counts:?}");
}
