//! Bad input and a hostile environment: one `error: ... (hint: ...)` line on
//! stderr, a non-zero exit code, and no recording left behind.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::*;

/// Runs `infertrace record <args>` in an empty temp dir, expects failure with
/// a single error line and no file left in the dir; returns (run, line).
#[track_caller]
fn record_fails(dir: &TempDir, args: &[&OsStr]) -> (Run, String) {
    let r = run_cmd(
        infertrace([OsStr::new("record")].iter().chain(args)).current_dir(dir.path()),
        Duration::from_secs(30),
    );
    assert!(!r.status.success(), "expected failure\n{}", r.describe());
    assert!(r.code().is_some(), "killed by a signal\n{}", r.describe());
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    let line = single_error_line(&r);
    assert_eq!(
        dir.entries(),
        Vec::<String>::new(),
        "files left behind\n{}",
        r.describe()
    );
    (r, line)
}

#[test]
fn nonexistent_pid() {
    require!("nonexistent_pid", Root, Binary);
    let dir = TempDir::new("bad-pid");
    let pid = unused_pid().to_string();
    let (r, line) = record_fails(
        &dir,
        &[
            "-q".as_ref(),
            "-p".as_ref(),
            pid.as_ref(),
            "--duration".as_ref(),
            "2s".as_ref(),
        ],
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    assert!(mentions_word(&line, &pid), "pid {pid} not named: {line:?}");
}

#[test]
fn kernel_thread_pid() {
    require!("kernel_thread_pid", Root, Binary);
    let dir = TempDir::new("bad-kthread");
    let pid = infertrace_e2e::kernel_thread_pid().to_string();
    let (r, line) = record_fails(
        &dir,
        &[
            "-q".as_ref(),
            "-p".as_ref(),
            pid.as_ref(),
            "--duration".as_ref(),
            "2s".as_ref(),
        ],
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    assert!(line.to_lowercase().contains("kernel thread"), "{line:?}");
    assert!(mentions_word(&line, &pid), "pid {pid} not named: {line:?}");
}

#[test]
fn kthreadd_pid_2() {
    require!("kthreadd_pid_2", Root, Binary);
    let dir = TempDir::new("bad-kthreadd");
    let (r, line) = record_fails(
        &dir,
        &[
            "-q".as_ref(),
            "-p".as_ref(),
            "2".as_ref(),
            "--duration".as_ref(),
            "2s".as_ref(),
        ],
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    assert!(line.to_lowercase().contains("kernel thread"), "{line:?}");
}

#[test]
fn own_pid() {
    require!("own_pid", Root, Binary);
    let dir = TempDir::new("bad-self");
    // After exec, $$ is infertrace's own pid.
    let r = run_cmd(
        Command::new("sh")
            .args(["-c", r#"exec "$0" record -q -p $$ --duration 2s"#])
            .arg(bin())
            .current_dir(dir.path()),
        Duration::from_secs(30),
    );
    assert!(
        !r.status.success(),
        "tracing itself must be refused\n{}",
        r.describe()
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(
        mentions_word(&line, "own") || mentions_word(&line, "itself"),
        "does not say it is its own pid: {line:?}"
    );
    assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
}

#[test]
fn no_privileges() {
    require!("no_privileges", Root, Binary, Setpriv);
    // A copy of the binary that user nobody can execute, and an output dir
    // nobody can write to: the only thing missing is privilege.
    let bindir = TempDir::new("nopriv-bin");
    let b = bindir.join("infertrace");
    fs::copy(bin(), &b).unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
    let dir = TempDir::new("nopriv");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let out = dir.join("x.itr");
    let r = run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&b)
            .args(["record", "-q", "-o"])
            .arg(&out)
            .args(["--", "true"])
            .current_dir(dir.path()),
        Duration::from_secs(30),
    );
    assert!(
        !r.status.success(),
        "must fail without privileges\n{}",
        r.describe()
    );
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    let line = single_error_line(&r);
    assert!(
        [
            "privilege",
            "privileges",
            "root",
            "capability",
            "capabilities",
            "CAP_BPF"
        ]
        .iter()
        .any(|w| mentions_word(&line, w)),
        "does not mention privileges/root: {line:?}"
    );
    assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
}

#[test]
fn no_btf() {
    require!("no_btf", Root, Binary);
    let dir = TempDir::new("nobtf");
    let r = run_cmd(
        infertrace(["record", "-q", "-o", "x.itr", "--", "true"])
            .env("INFERTRACE_BTF", "/nonexistent/vmlinux")
            .current_dir(dir.path()),
        Duration::from_secs(30),
    );
    assert!(
        !r.status.success(),
        "must fail without BTF\n{}",
        r.describe()
    );
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("BTF"), "does not mention BTF: {line:?}");
    assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
}

#[test]
fn output_in_missing_directory() {
    require!("output_in_missing_directory", Root, Binary);
    let dir = TempDir::new("bad-out");
    let (r, line) = record_fails(
        &dir,
        &[
            "-q".as_ref(),
            "-o".as_ref(),
            "/nonexistent-dir/x.itr".as_ref(),
            "--".as_ref(),
            "true".as_ref(),
        ],
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    assert!(
        line.contains("/nonexistent-dir"),
        "path not named: {line:?}"
    );
    assert!(!std::path::Path::new("/nonexistent-dir").exists());
}

#[test]
fn output_unwritable_proc_file() {
    require!("output_unwritable_proc_file", Root, Binary);
    let dir = TempDir::new("bad-out-proc");
    let before = fs::read_to_string("/proc/version").unwrap();
    let (r, line) = record_fails(
        &dir,
        &[
            "-q".as_ref(),
            "-o".as_ref(),
            "/proc/version".as_ref(),
            "--".as_ref(),
            "true".as_ref(),
        ],
    );
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    assert!(line.contains("/proc/version"), "path not named: {line:?}");
    assert_eq!(fs::read_to_string("/proc/version").unwrap(), before);
}

#[test]
fn invalid_duration() {
    require!("invalid_duration", Binary);
    let dir = TempDir::new("bad-dur");
    for bad in ["abc", "10x", ""] {
        let r = run_cmd(
            infertrace(["record", "-q", "--duration", bad, "--", "true"]).current_dir(dir.path()),
            Duration::from_secs(30),
        );
        assert!(
            !r.status.success(),
            "--duration {bad:?} accepted\n{}",
            r.describe()
        );
        assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
        assert!(r.stderr.contains("error"), "{}", r.describe());
        assert!(
            r.stderr.contains("duration") || (!bad.is_empty() && r.stderr.contains(bad)),
            "does not say what is wrong\n{}",
            r.describe()
        );
        assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
    }
}
