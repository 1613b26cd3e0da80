//! However infertrace is stopped, its BPF programs go away with it; on
//! SIGINT/SIGTERM it still writes a readable recording.

use std::ffi::OsStr;
use std::fs;
use std::time::{Duration, Instant};

use infertrace_e2e::*;

fn stop_and_check(test: &str, sig: i32) {
    let dir = TempDir::new(test);
    let out = dir.join("rec.itr");
    let before = bpf_prog_ids();
    let tracer = spawn(
        infertrace(["record", "-q", "-o"])
            .arg(&out)
            .args(["--", "sleep", "30"])
            .current_dir(dir.path()),
    );
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    let ids = wait_for_tracer_progs(tpid, &before, Duration::from_secs(10)).unwrap_or_else(|| {
        panic!("{test}: infertrace's sys_enter/sys_exit never showed up in bpftool")
    });
    // The launched `sleep`, to clean up whatever infertrace does with it.
    let kids = poll(Duration::from_secs(5), || {
        let k = children_of(tpid);
        (!k.is_empty()).then_some(k)
    })
    .unwrap_or_default();
    let _kid_guards: Vec<KillOnDrop> = kids.iter().map(|k| KillOnDrop::new(*k)).collect();

    let sent = Instant::now();
    kill(tpid, sig);
    let r = wait_child(
        tracer,
        Duration::from_secs(10),
        &format!("{test}: infertrace after signal {sig}"),
    );
    guard.disarm();
    let exited = sent.elapsed();

    let left = poll(Duration::from_secs(2), || {
        let now = bpf_prog_ids();
        let left: Vec<u64> = ids.iter().copied().filter(|i| now.contains(i)).collect();
        left.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "{test}: programs {ids:?} still loaded 2 s after infertrace exited ({:?} after the signal); now: {:?}\n{}",
        exited,
        bpf_progs().into_iter().filter(|p| ids.contains(&p.id)).collect::<Vec<_>>(),
        r.describe()
    );

    if sig == libc::SIGKILL {
        return;
    }
    r.assert_ok();
    assert!(
        out.is_file(),
        "{test}: no recording written\n{}",
        r.describe()
    );
    let rep = run_infertrace([
        OsStr::new("report"),
        out.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("json"),
    ]);
    rep.assert_ok();
    let rep = rep.json();
    rep.check_invariants();
    let t = rep.one_target("launched");
    assert_eq!(t["comm"], "sleep", "{t}");
    assert!(
        kids.contains(&(t["pid"].as_u64().unwrap() as u32)),
        "launched pid {t} not among children {kids:?}"
    );
    // The report on stdout at exit was the text report.
    assert!(
        r.stdout.contains(TEXT_HEADER),
        "{test}: no text report on stdout\n{}",
        r.describe()
    );
    // No temporary file left next to the recording.
    assert_eq!(dir.entries(), vec!["rec.itr".to_string()]);
    let _ = fs::remove_file(&out);
}

#[test]
fn sigint_unloads_programs_and_writes_recording() {
    require!(
        "sigint_unloads_programs_and_writes_recording",
        Root,
        Binary,
        Bpftool
    );
    stop_and_check("cleanup-sigint", libc::SIGINT);
}

#[test]
fn sigterm_unloads_programs_and_writes_recording() {
    require!(
        "sigterm_unloads_programs_and_writes_recording",
        Root,
        Binary,
        Bpftool
    );
    stop_and_check("cleanup-sigterm", libc::SIGTERM);
}

#[test]
fn sigkill_unloads_programs() {
    require!("sigkill_unloads_programs", Root, Binary, Bpftool);
    stop_and_check("cleanup-sigkill", libc::SIGKILL);
}
