//! A family its options turn off costs nothing: none of its kernel
//! programs is loaded (issue 31). The programs a running `record` loaded
//! are the BPF programs that appeared after it started (`bpftool prog
//! list`; the tests run one at a time), tracepoint and perf-event programs
//! included (they hold no fd a `/proc/PID/fdinfo` walk would show).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::*;

/// Programs of the families that cannot be turned off: syscall counting,
/// process tracking (forks, execs, exits) and the overhead calibration.
const ALWAYS: [&str; 7] = ["sys_enter", "sys_exit", "task_newtask", "sched_process_exec", "sched_process_exit", "overhead_calib_enter", "overhead_calib_exit"];

/// The names of the programs loaded while `record -p TARGET FLAGS` runs.
fn loaded_by_record(target: u32, flags: &[&str]) -> BTreeSet<String> {
    let before = bpf_prog_ids();
    let dir = TempDir::new("families-off");
    let pid = target.to_string();
    let mut args = vec!["record", "-q", "-p", &pid, "--duration", "4s", "-o"];
    let out = dir.join("rec.itr");
    args.push(out.to_str().unwrap());
    args.extend_from_slice(flags);
    let tracer = spawn(&mut infertrace(args));
    let tracer_pid = tracer.id();
    wait_for_tracer_progs(tracer_pid, &before, Duration::from_secs(20)).expect("the tracer's syscall programs within 20 s");
    // Families that attach after the first programs (memory, sampling) have had time.
    std::thread::sleep(Duration::from_millis(1500));
    let names: BTreeSet<String> = bpf_progs().into_iter().filter(|p| !before.contains(&p.id)).map(|p| p.name).collect();
    wait_child(tracer, Duration::from_secs(30), "record").assert_ok();
    names
}

#[test]
fn families_turned_off_load_no_program() {
    const TEST: &str = "families_turned_off_load_no_program";
    require!(TEST, Root, Binary, Bpftool);
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    // A Python target that computes: every family has something to do.
    let mut target = spawn(Command::new(&python).args(["-c", "import time\nend = time.time() + 30\nwhile time.time() < end: sum(range(1000))"]));
    let _kill = KillOnDrop::new(target.id());
    std::thread::sleep(Duration::from_millis(300));

    // Control: by default the scheduler, sampling and memory families load
    // theirs (so that the check below can fail).
    let all = loaded_by_record(target.id(), &[]);
    for want in ["sched_switch", "cpu_sample", "mem_rss_stat"] {
        assert!(all.contains(want), "by default {want} is loaded: {all:?}");
    }

    let off = loaded_by_record(target.id(), &["--no-sched", "--no-cuda", "--no-python", "--no-memory", "-F", "0"]);
    let extra: Vec<&String> = off.iter().filter(|n| !ALWAYS.contains(&n.as_str())).collect();
    assert!(extra.is_empty(), "programs of families turned off were loaded: {extra:?} (all: {off:?})");
    assert!(off.contains("sys_enter") && off.contains("sys_exit"), "the syscall family runs: {off:?}");
    let _ = target.kill();
    let _ = target.wait();
}
