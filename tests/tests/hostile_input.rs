//! Hostile values and inputs: out-of-range and negative option values,
//! crafted recordings (gzip bombs), targets whose names hold terminal
//! escapes, and the small messages (a directory, a thread id, one missing
//! capability, tracefs unreadable). Each is refused or shown in one safe,
//! exact line; nothing panics, hangs, or reaches the terminal raw.

use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::*;

/// `infertrace <args>` in an empty directory: a usage error (exit code 2)
/// in one `error: ... (hint: ...)` line naming `option`, fast (before any
/// probe), with nothing written.
#[track_caller]
fn usage_error(args: &[&str], option: &str) -> String {
    let dir = TempDir::new("hostile-values");
    let r = run_cmd(
        infertrace(args).current_dir(dir.path()),
        Duration::from_secs(30),
    );
    assert_ne!(r.code(), Some(101), "{args:?}: panicked\n{}", r.describe());
    assert_eq!(
        r.code(),
        Some(2),
        "{args:?}: want a usage error\n{}",
        r.describe()
    );
    let line = single_error_line(&r);
    assert!(
        line.contains(option),
        "{args:?}: {option} not named: {line:?}"
    );
    assert!(
        !line.contains("'-- "),
        "{args:?}: clap's `-- -1` tip: {line:?}"
    );
    assert!(
        r.elapsed < Duration::from_secs(5),
        "{args:?}: took {:?}",
        r.elapsed
    );
    assert_eq!(
        dir.entries(),
        Vec::<String>::new(),
        "{args:?}: files left behind"
    );
    line
}

#[test]
fn huge_and_negative_values_are_refused_at_parse_time() {
    require!("huge_and_negative_values_are_refused_at_parse_time", Binary);
    for (args, option, says) in [
        (
            &["record", "--duration", "3000000000000000h"][..],
            "--duration",
            "1ms to 365d",
        ),
        (
            &["record", "--duration", "6000000000000000h"],
            "--duration",
            "1ms to 365d",
        ),
        (
            &["record", "--duration", "366d"],
            "--duration",
            "1ms to 365d",
        ),
        (&["record", "--duration", "-1"], "--duration", "negative"),
        (&["record", "--duration", "0"], "--duration", "1ms to 365d"),
        (
            &["record", "--slow-syscall", "6000000000000000h"],
            "--slow-syscall",
            "1us to 24h",
        ),
        (
            &["record", "--slow-syscall", "-1ms"],
            "--slow-syscall",
            "negative",
        ),
        (
            &["record", "-F", "-1"],
            "--frequency",
            "0 (off) to 10000 Hz",
        ),
        (
            &["record", "-F", "18446744073709551616"],
            "--frequency",
            "0 (off) to 10000 Hz",
        ),
        (
            &["record", "-F", "10001"],
            "--frequency",
            "0 (off) to 10000 Hz",
        ),
        (
            &["record", "--gpu-sample-hz", "-3"],
            "--gpu-sample-hz",
            "1..=10",
        ),
        (&["record", "-p", "-1"], "--pid", "not a pid"),
        (&["record", "-p", "4294967296"], "--pid", "not a pid"),
        (&["dump", "-p", "-1"], "--pid", "not a pid"),
    ] {
        let mut full = args.to_vec();
        if full[0] == "record" {
            full.extend(["-q", "--", "true"]);
        }
        let line = usage_error(&full, option);
        assert!(
            line.contains(says),
            "{full:?}: does not say {says:?}: {line:?}"
        );
    }
    let line = usage_error(
        &["report", "x.itr", "--max-inflated", "-1"],
        "--max-inflated",
    );
    assert!(line.contains("invalid size"), "{line:?}");
}

/// Header and gzip (the `gzip` program) of `json`, written to `path`.
fn write_itr(path: &Path, json: &[u8]) {
    let mut child = Command::new("gzip")
        .args(["-9", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut stdin = child.stdin.take().unwrap();
    let input = json.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(out.status.success(), "gzip failed");
    let mut file = b"ITRACE\r\n".to_vec();
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&out.stdout);
    fs::write(path, file).unwrap();
}

/// A valid recording's JSON with `hostname`, `notes` and the run-queue
/// histogram of pid 1 spliced in (raw JSON), after `lead` (whitespace).
fn recording_json(lead: &[u8], hostname: &str, notes: &str, hist: &str) -> Vec<u8> {
    let mut j = lead.to_vec();
    j.extend_from_slice(
        format!(
            r#"{{"format_version":1,"tool_version":"t","host":{{"hostname":"{hostname}","kernel_release":"k","arch":"x86_64"}},"started_unix_ms":0,"duration_ns":1000,"argv":[],"targets":[],"syscalls":[],"runqueue_hist":{{"1":[{hist}]}},"lost":{{}},"notes":[{notes}]}}"#
        )
        .as_bytes(),
    );
    j
}

/// `report <file> <extra>`: fails in one line naming the file and saying
/// `says`, within `within`.
#[track_caller]
fn report_refuses(file: &Path, extra: &[&str], says: &str, within: Duration) {
    let t = Instant::now();
    let r = run_cmd(
        infertrace([OsStr::new("report"), file.as_os_str()])
            .args(extra)
            .args(["--format", "json"]),
        Duration::from_secs(120),
    );
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    assert_eq!(
        r.code(),
        Some(1),
        "{}: not refused\n{}",
        file.display(),
        r.describe()
    );
    let line = single_error_line(&r);
    assert!(
        line.contains(&*file.to_string_lossy()),
        "file not named: {line:?}"
    );
    assert!(line.contains(says), "does not say {says:?}: {line:?}");
    assert!(
        t.elapsed() < within,
        "{}: took {:?}",
        file.display(),
        t.elapsed()
    );
}

#[test]
fn report_bounds_what_it_inflates() {
    require!("report_bounds_what_it_inflates", Binary);
    let dir = TempDir::new("hostile-bombs");

    // A 20 MiB string (no recording holds one): refused at 16 MiB.
    let string = dir.join("string.itr");
    write_itr(
        &string,
        &recording_json(b"", &"a".repeat(20 << 20), "", "0"),
    );
    report_refuses(
        &string,
        &[],
        "a string longer than 16 MiB",
        Duration::from_secs(10),
    );

    // 8 MiB of whitespace before the recording: refused at 64 KiB.
    let spaces = dir.join("spaces.itr");
    write_itr(&spaces, &recording_json(&vec![b' '; 8 << 20], "h", "", "0"));
    report_refuses(
        &spaces,
        &[],
        "64 KiB of whitespace",
        Duration::from_secs(10),
    );

    // 72 MiB of notes, from under 1 MB of gzip: a bomb past 64 MiB by
    // default; read whole with an explicit limit.
    let bomb = dir.join("bomb.itr");
    let note = format!("\"{}\"", "a".repeat(1000));
    let notes = vec![note.as_str(); 72 << 10].join(",");
    write_itr(&bomb, &recording_json(b"", "h", &notes, "0"));
    assert!(fs::metadata(&bomb).unwrap().len() < 1 << 20);
    report_refuses(&bomb, &[], "a decompression bomb", Duration::from_secs(30));
    let r = run_cmd(
        infertrace([OsStr::new("report"), bomb.as_os_str()]).args([
            "--max-inflated",
            "1GiB",
            "--format",
            "folded",
        ]),
        Duration::from_secs(120),
    );
    r.assert_ok();

    // A plain limit below an honest recording's size, then the default.
    let notes = dir.join("notes.itr");
    let many: Vec<String> = (0..20_000).map(|i| format!("\"note {i:0>90}\"")).collect();
    write_itr(&notes, &recording_json(b"", "h", &many.join(","), "0"));
    report_refuses(
        &notes,
        &["--max-inflated", "1MiB"],
        "inflates to more than 1 MiB",
        Duration::from_secs(10),
    );
    let r = run_cmd(
        infertrace([OsStr::new("report"), notes.as_os_str()]).args(["--max-inflated", "1MiB"]),
        Duration::from_secs(30),
    );
    assert!(
        single_error_line(&r).contains("--max-inflated 4GiB"),
        "no way out named\n{}",
        r.describe()
    );
    let r = run_infertrace([OsStr::new("report"), notes.as_os_str()]);
    r.assert_ok();
    assert!(r.stdout.contains("note: note 0000"), "{}", r.describe());
}

#[test]
fn report_of_a_directory_says_so() {
    require!("report_of_a_directory_says_so", Binary);
    let dir = TempDir::new("hostile-dir");
    let r = run_infertrace([OsStr::new("report"), dir.path().as_os_str()]);
    assert_eq!(r.code(), Some(1), "{}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("is a directory"), "{line:?}");
    assert!(!line.contains("bad magic"), "{line:?}");

    let empty = dir.join("empty.itr");
    fs::write(&empty, b"").unwrap();
    let line = single_error_line(&run_infertrace([OsStr::new("report"), empty.as_os_str()]));
    assert!(line.contains("is empty"), "{line:?}");
}

/// Characters a terminal acts on: C0 controls but the line break, DEL, C1.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| (c < ' ' && c != '\n') || ('\u{7f}'..='\u{9f}').contains(&c))
        .collect()
}

const MAIN_NAME: &str = "\x1b]0;PWNED\x07\x1b[2J";
const WORKER_NAME: &str = "\u{9b}2J\x7f\tW\nX";
const ARG: &str = "arg\x1b[31mred\nline";

#[test]
fn hostile_names_do_not_reach_the_terminal() {
    require!("hostile_names_do_not_reach_the_terminal", Root, Binary, Gcc);
    let w = workload_with_flags("hostile_names", "pthread", &["-O2"]);
    let dir = TempDir::new("hostile-names");
    let mut child = Command::new(&w)
        .args([MAIN_NAME, WORKER_NAME, ARG])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = KillOnDrop::new(child.id());
    let lines = line_channel(child.stdout.take().unwrap());
    let ready = lines
        .recv_timeout(Duration::from_secs(10))
        .expect("workload ready");
    assert!(ready.starts_with("ready"), "{ready:?}");
    let pid = child.id().to_string();
    let out = dir.join("rec.itr");
    let r = run_infertrace([
        OsStr::new("record"),
        "-q".as_ref(),
        "-p".as_ref(),
        pid.as_ref(),
        "--duration".as_ref(),
        "2s".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    kill(child.id(), libc::SIGKILL);
    let _ = child.wait();
    guard.disarm();
    r.assert_ok();

    // The text report, live (compact) and offline (as bytes, from -o;
    // `--verbose`: every row and detail).
    let text_out = dir.join("report.txt");
    run_infertrace([
        OsStr::new("report"),
        out.as_os_str(),
        "--verbose".as_ref(),
        "-o".as_ref(),
        text_out.as_os_str(),
    ])
    .assert_ok();
    let offline =
        String::from_utf8(fs::read(&text_out).unwrap()).expect("the text report is UTF-8");
    for (what, text) in [("live", &r.stdout), ("offline", &offline)] {
        let bad = raw_controls(text);
        assert!(
            bad.is_empty(),
            "{what} text report: raw control characters {bad:?}\n{text}"
        );
        let main = r"\x1b]0;PWNED\x07\x1b[2J";
        assert!(
            text.contains(&format!("== pid {pid} ({main})")),
            "{what}: process name not shown escaped\n{text}"
        );
        assert!(
            text.contains(&format!("  tid {pid} {main} ")),
            "{what}: thread name not shown escaped\n{text}"
        );
        assert!(
            text.contains(r"\u{9b}2J\x7f\tW\nX"),
            "{what}: worker name not shown escaped\n{text}"
        );
        assert!(
            text.contains(&format!(
                r"{main} \u{{9b}}2J\x7f\tW\nX arg\x1b[31mred\nline"
            )),
            "{what}: argv not shown escaped\n{text}"
        );
    }
    // JSON keeps the names as they are, with what a terminal acts on
    // \u-escaped.
    let r = run_infertrace([
        OsStr::new("report"),
        out.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let bad = raw_controls(&r.stdout);
    assert!(
        bad.is_empty(),
        "JSON report: raw control characters {bad:?}"
    );
    let rep = r.json();
    assert_eq!(
        rep.0["targets"][0]["comm"], MAIN_NAME,
        "JSON: the name changed"
    );
    assert_eq!(
        rep.0["targets"][0]["cmdline"][3], ARG,
        "JSON: the argument changed"
    );
    // Folded stacks and the flame graph carry the process name too.
    for format in ["folded", "svg"] {
        let r = run_infertrace([
            OsStr::new("report"),
            out.as_os_str(),
            "--format".as_ref(),
            format.as_ref(),
            "--profile".as_ref(),
            "wall".as_ref(),
        ]);
        if r.status.success() {
            let bad: Vec<char> = raw_controls(&r.stdout)
                .into_iter()
                .filter(|&c| c != '\t' && c != '\r')
                .collect();
            assert!(bad.is_empty(), "{format}: raw control characters {bad:?}");
        }
    }
}

#[test]
fn pid_of_a_thread_names_its_process() {
    require!("pid_of_a_thread_names_its_process", Root, Binary, Gcc);
    let w = workload_with_flags("hostile_names", "pthread", &["-O2"]);
    let mut child = Command::new(&w)
        .args(["main", "worker"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = KillOnDrop::new(child.id());
    let lines = line_channel(child.stdout.take().unwrap());
    lines
        .recv_timeout(Duration::from_secs(10))
        .expect("workload ready");
    let pid = child.id();
    let tid: u32 = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .find(|&t| t != pid)
        .expect("a second thread");
    let dir = TempDir::new("hostile-tid");
    for sub in [
        &["record", "-q", "--duration", "1s", "-p"][..],
        &["dump", "-p"],
    ] {
        let r = run_cmd(
            infertrace(sub).arg(tid.to_string()).current_dir(dir.path()),
            Duration::from_secs(30),
        );
        assert_eq!(r.code(), Some(1), "{sub:?}\n{}", r.describe());
        let line = single_error_line(&r);
        assert!(
            line.contains(&format!("thread {tid} of process {pid}")),
            "{sub:?}: {line:?}"
        );
        assert!(
            line.contains(&format!("-p {pid}")),
            "{sub:?}: the process is not offered: {line:?}"
        );
        assert!(!line.contains("no process"), "{line:?}");
    }
    assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
    kill(pid, libc::SIGKILL);
    let _ = child.wait();
    guard.disarm();
}

/// A copy of the binary that user nobody can execute.
fn nobody_binary(dir: &TempDir) -> std::path::PathBuf {
    let b = dir.join("infertrace");
    fs::copy(bin(), &b).unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
    b
}

#[test]
fn one_missing_capability_is_named() {
    require!("one_missing_capability_is_named", Root, Binary, Setpriv);
    let bindir = TempDir::new("hostile-caps-bin");
    let b = nobody_binary(&bindir);
    let dir = TempDir::new("hostile-caps");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    for (cap, held, missing) in [
        ("+bpf", "CAP_BPF", "CAP_PERFMON"),
        ("+perfmon", "CAP_PERFMON", "CAP_BPF"),
    ] {
        let r = run_cmd(
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(format!("--inh-caps={cap}"))
                .arg(format!("--ambient-caps={cap}"))
                .arg(&b)
                .args(["record", "-q", "-o", "x.itr", "--", "true"])
                .current_dir(dir.path()),
            Duration::from_secs(30),
        );
        assert_eq!(r.code(), Some(1), "with {held} only\n{}", r.describe());
        let line = single_error_line(&r);
        assert!(
            line.contains(&format!("lacks {missing})")),
            "with {held} only: {line:?}"
        );
        assert!(!line.contains("neither"), "{line:?}");
    }
    assert_eq!(dir.entries(), Vec::<String>::new(), "files left behind");
}

#[test]
fn doctor_tells_unreadable_tracefs_from_unmounted() {
    require!(
        "doctor_tells_unreadable_tracefs_from_unmounted",
        Root,
        Binary,
        Setpriv
    );
    let mounted = || {
        fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some("tracefs"))
    };
    if !mounted() {
        let ok = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !mounted() {
            skip(
                "doctor_tells_unreadable_tracefs_from_unmounted",
                "tracefs cannot be mounted here",
            );
            return;
        }
    }
    let bindir = TempDir::new("hostile-doctor-bin");
    let b = nobody_binary(&bindir);
    let r = run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&b)
            .arg("doctor")
            .current_dir("/"),
        Duration::from_secs(30),
    );
    assert_ne!(r.code(), Some(101), "panicked\n{}", r.describe());
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("] tracefs"))
        .unwrap_or_else(|| panic!("no tracefs line\n{}", r.describe()));
    assert!(
        line.contains("mounted at") && line.contains("not readable by uid 65534"),
        "{line:?}"
    );
    assert!(!line.contains("not mounted"), "{line:?}");
}
