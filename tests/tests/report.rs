//! `infertrace report`: offline rendering of a recording, text and JSON.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::*;

/// Records the syscall_counts workload (1000 getppid, 700 read, 300 write,
/// 5 failing openat) into `dir/rec.itr`.
fn recording(dir: &TempDir) -> (std::path::PathBuf, Report) {
    let w = workload("syscall_counts");
    let out = dir.join("rec.itr");
    let (_, rep) = record_launch(
        &out,
        &[
            w.as_os_str(),
            "1000".as_ref(),
            "700".as_ref(),
            "300".as_ref(),
            "5".as_ref(),
        ],
    );
    (out, rep)
}

#[track_caller]
fn check_text(text: &str) {
    assert!(
        text.lines().any(|l| l.trim_end() == TEXT_HEADER),
        "no strace-like header in:\n{text}"
    );
    let t = parse_text_table(text);
    assert_eq!(
        t.get("getppid"),
        Some(&(1000, 0)),
        "getppid row in:\n{text}"
    );
    assert_eq!(t.get("read"), Some(&(700, 0)), "read row in:\n{text}");
    assert_eq!(t.get("write"), Some(&(300, 0)), "write row in:\n{text}");
    assert_eq!(t.get("openat"), Some(&(7, 5)), "openat row in:\n{text}");
}

#[test]
fn record_prints_text_report_by_default() {
    require!("record_prints_text_report_by_default", Root, Binary, Gcc);
    let dir = TempDir::new("report-default");
    let w = workload("syscall_counts");
    let r = run_cmd(
        infertrace(["record", "-q", "-v", "-o", "rec.itr", "--"])
            .arg(&w)
            .current_dir(dir.path()),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    check_text(&r.stdout);
    assert_eq!(
        r.stderr.trim(),
        "",
        "-q: nothing on stderr\n{}",
        r.describe()
    );
    assert!(dir.join("rec.itr").is_file());
}

#[test]
fn record_default_output_name() {
    require!("record_default_output_name", Root, Binary);
    let dir = TempDir::new("report-defname");
    let r = run_cmd(
        infertrace(["record", "-q", "--", "true"]).current_dir(dir.path()),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    let e = dir.entries();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("infertrace-") && e[0].ends_with(".itr"),
        "{e:?}"
    );
    let rep = run_infertrace([
        OsStr::new("report"),
        dir.join(&e[0]).as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    rep.assert_ok();
    rep.json().check_invariants();
}

#[test]
fn report_renders_text_and_json() {
    require!("report_renders_text_and_json", Root, Binary, Gcc);
    let dir = TempDir::new("report");
    let (rec, live) = recording(&dir);

    let text = run_infertrace([OsStr::new("report"), OsStr::new("--verbose"), rec.as_os_str()]);
    text.assert_ok();
    check_text(&text.stdout);

    let text_out = dir.join("report.txt");
    run_infertrace([
        OsStr::new("report"),
        rec.as_os_str(),
        "-v".as_ref(),
        "-o".as_ref(),
        text_out.as_os_str(),
    ])
    .assert_ok();
    check_text(&fs::read_to_string(&text_out).unwrap());

    let json_out = dir.join("report.json");
    let r = run_infertrace([
        OsStr::new("report"),
        rec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "-o".as_ref(),
        json_out.as_os_str(),
    ]);
    r.assert_ok();
    assert!(
        json_out.is_file(),
        "-o {} not written\n{}",
        json_out.display(),
        r.describe()
    );
    let offline = Report::read(&json_out);
    offline.check_invariants();
    // Offline rendering shows what the live report showed.
    for k in [
        "schema_version",
        "duration_ns",
        "targets",
        "syscalls",
        "totals",
        "lost_events",
    ] {
        assert_eq!(
            offline.0[k], live.0[k],
            "{k}: offline report differs from the live one"
        );
    }
}

#[test]
fn report_needs_no_privileges() {
    require!("report_needs_no_privileges", Root, Binary, Gcc, Setpriv);
    let dir = TempDir::new("report-nopriv");
    let (rec, live) = recording(&dir);
    fs::set_permissions(&rec, fs::Permissions::from_mode(0o644)).unwrap();
    let bindir = TempDir::new("report-nopriv-bin");
    let b = bindir.join("infertrace");
    fs::copy(bin(), &b).unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
    let r = run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&b)
            .arg("report")
            .arg(&rec)
            .args(["--format", "json"])
            .current_dir("/"),
        Duration::from_secs(30),
    );
    r.assert_ok();
    assert_eq!(r.json().0["syscalls"], live.0["syscalls"]);
}

#[track_caller]
fn report_fails(path: &Path) {
    let r = run_infertrace([OsStr::new("report"), path.as_os_str()]);
    assert!(
        !r.status.success(),
        "report of {} succeeded\n{}",
        path.display(),
        r.describe()
    );
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    let line = single_error_line(&r);
    assert!(
        line.contains(&*path.to_string_lossy()),
        "path not named: {line:?}"
    );
    assert_eq!(r.stdout, "", "nothing on stdout\n{}", r.describe());
}

#[test]
fn report_rejects_bad_files() {
    require!("report_rejects_bad_files", Binary);
    let dir = TempDir::new("report-bad");
    report_fails(&dir.join("does-not-exist.itr"));

    let garbage = dir.join("garbage.itr");
    // Deterministic pseudo-random bytes.
    let mut x: u32 = 0x1234_5678;
    let bytes: Vec<u8> = (0..8192)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    fs::write(&garbage, bytes).unwrap();
    report_fails(&garbage);

    let empty = dir.join("empty.itr");
    fs::write(&empty, b"").unwrap();
    report_fails(&empty);

    let text = dir.join("text.itr");
    fs::write(&text, b"{\"schema_version\": 1}\n").unwrap();
    report_fails(&text);

    report_fails(dir.path());
}
