//! `record --debug-ebpf`: the kernel programs are loaded with their
//! diagnostics compiled in (the verifier checks that code too) and the
//! recording is exactly what it is without the flag: the syscall_counts
//! workload's known counts, and a Python workload's stacks. Without the
//! flag, no diagnostic line is ever printed.

use infertrace_e2e::*;

const DIAG_PREFIX: &str = "infertrace[ebpf]:";

fn counts_are_exact(options: &[&str], tag: &str) -> (Run, Report) {
    let dir = TempDir::new(tag);
    let w = workload("syscall_counts");
    let out = dir.join("rec.itr");
    let (run, rep) = record_launch_with(
        &out,
        options,
        &[w.as_os_str(), "1000".as_ref(), "700".as_ref(), "300".as_ref(), "5".as_ref()],
    );
    let pid = rep.one_target("launched")["pid"].as_u64().expect("pid") as u32;
    assert_eq!(rep.count(pid, "getppid"), 1000, "{options:?}");
    assert_eq!(rep.count(pid, "read"), 700, "{options:?}");
    assert_eq!(rep.count(pid, "write"), 300, "{options:?}");
    assert_eq!(rep.errors(pid, "openat"), 5, "{options:?}");
    (run, rep)
}

#[test]
fn debug_ebpf_loads_and_records_the_same() {
    require!("debug_ebpf_loads_and_records_the_same", Root, Binary, Gcc);
    let (_, rep) = counts_are_exact(&["--debug-ebpf"], "debug-on");
    let notes = rep.0["notes"].as_array().cloned().unwrap_or_default();
    assert!(
        !notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("--debug-ebpf:"))),
        "the diagnostics reader did not start: {notes:?}"
    );
    let (without, _) = counts_are_exact(&[], "debug-off");
    assert!(!without.stderr.contains(DIAG_PREFIX), "a diagnostic without --debug-ebpf:\n{}", without.describe());
}
