//! Issue 15, item 1: thread rows whose parts exceed their wall time (as a
//! churning target once recorded, or as crafted by hand) render quickly, in
//! bounded memory, clamped and flagged; before, `wall_ns: 1, on_cpu_ns: 2e9`
//! made the text report allocate 100 GB and abort, and `u64::MAX` panicked.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use infertrace_e2e::*;

/// Address-space limit for `report` (bounded memory: the bar of a crafted
/// row once asked for 10 to 100 GB).
const MEMORY_LIMIT: &str = "--as=2147483648";

/// `infertrace report FILE --format FORMAT` under [`MEMORY_LIMIT`], which
/// must succeed within 20 s.
#[track_caller]
fn report_bounded(path: &Path, format: &str) -> Run {
    let r = run_cmd(
        Command::new("prlimit")
            .arg(MEMORY_LIMIT)
            .arg("--")
            .arg(bin())
            .arg("report")
            .arg(path)
            .args(["--format", format]),
        Duration::from_secs(20),
    );
    r.assert_ok();
    assert!(
        r.elapsed < Duration::from_secs(10),
        "report took {:?}",
        r.elapsed
    );
    r
}

#[test]
fn parts_beyond_wall_are_clamped_and_flagged() {
    require!("parts_beyond_wall_are_clamped_and_flagged", Binary);
    assert!(
        Command::new("prlimit").arg("--version").output().is_ok(),
        "prlimit (util-linux) is needed"
    );
    let dir = TempDir::new("hostile-rows");
    let cases: [(&str, serde_json::Value); 4] = [
        ("wall 1 on-cpu 2e9", thread_row(11, 1, 2_000_000_000, 0)),
        ("wall 1 on-cpu 2e8", thread_row(12, 1, 200_000_000, 0)),
        ("on-cpu u64::MAX", thread_row(13, 1_000, u64::MAX, u64::MAX)),
        ("wall 0, parts", thread_row(14, 0, 104_695, 5_000)),
    ];
    for (what, row) in cases {
        let path = dir.join("crafted.itr");
        write_itr(
            &path,
            &crafted_recording(serde_json::Value::Array(vec![
                row,
                thread_row(10, 1_000_000, 500_000, 0),
            ])),
        );
        let text = report_bounded(&path, "text");
        let rows: Vec<&str> = text
            .stdout
            .lines()
            .filter(|l| l.contains("  tid "))
            .collect();
        assert_eq!(rows.len(), 2, "{what}: thread rows\n{}", text.stdout);
        for l in &rows {
            assert!(l.len() < 300, "{what}: unbounded row {l:?}");
        }
        let crafted = rows
            .iter()
            .find(|l| l.contains("crafted") && l.contains("|!"))
            .unwrap_or_else(|| {
                panic!(
                    "{what}: the crafted row is not flagged with `|!`\n{}",
                    text.stdout
                )
            });
        assert!(
            !crafted.contains("10469500") && crafted.contains("100.0%!"),
            "{what}: shares are not capped and flagged: {crafted}"
        );
        assert!(
            text.stdout.contains("whose parts exceed the wall time"),
            "{what}: no note under the section\n{}",
            text.stdout
        );
        // The healthy row is untouched.
        assert!(
            rows.iter()
                .any(|l| l.contains("tid 10 ") && l.contains("cpu  50.0% ") && !l.contains('!')),
            "{what}: healthy row\n{}",
            text.stdout
        );
        let json = report_bounded(&path, "json").json();
        assert_eq!(json.threads().len(), 2, "{what}");
        for format in ["folded", "svg"] {
            // No stacks: a one-line error, never a crash.
            let r = run_infertrace([
                OsStr::new("report"),
                path.as_os_str(),
                "--format".as_ref(),
                format.as_ref(),
            ]);
            assert_ne!(
                r.code(),
                Some(101),
                "{what}: {format} panicked\n{}",
                r.describe()
            );
            assert_ne!(
                r.code(),
                Some(134),
                "{what}: {format} aborted\n{}",
                r.describe()
            );
        }
    }
}
