//! The `--format json` report and its invariants.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::Path;

use serde_json::Value;

/// A parsed `--format json` report (schema_version 1).
#[derive(Clone, Debug)]
pub struct Report(pub Value);

impl Report {
    pub fn parse(s: &str) -> Result<Report, serde_json::Error> {
        serde_json::from_str(s).map(Report)
    }

    pub fn read(path: &Path) -> Report {
        let s = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Report::parse(&s).unwrap_or_else(|e| panic!("{}: not a JSON report: {e}", path.display()))
    }

    pub fn targets(&self) -> &Vec<Value> {
        self.0["targets"].as_array().expect("targets array")
    }

    pub fn syscalls(&self) -> &Vec<Value> {
        self.0["syscalls"].as_array().expect("syscalls array")
    }

    /// The targets with `origin`.
    pub fn targets_with_origin(&self, origin: &str) -> Vec<&Value> {
        self.targets()
            .iter()
            .filter(|t| t["origin"] == origin)
            .collect()
    }

    /// The only target with `origin`.
    #[track_caller]
    pub fn one_target(&self, origin: &str) -> &Value {
        let v = self.targets_with_origin(origin);
        assert_eq!(
            v.len(),
            1,
            "expected one {origin} target, got {v:?}\nreport: {}",
            self.0
        );
        v[0]
    }

    pub fn target(&self, pid: u32) -> Option<&Value> {
        self.targets().iter().find(|t| t["pid"] == pid)
    }

    /// The row for (`pid`, `name`).
    pub fn row(&self, pid: u32, name: &str) -> Option<&Value> {
        self.syscalls()
            .iter()
            .find(|s| s["pid"] == pid && s["name"] == name)
    }

    /// A u64 field of the (`pid`, `name`) row, 0 when the row is absent.
    pub fn field(&self, pid: u32, name: &str, field: &str) -> u64 {
        self.row(pid, name)
            .map(|r| r[field].as_u64().expect("u64 field"))
            .unwrap_or(0)
    }

    pub fn count(&self, pid: u32, name: &str) -> u64 {
        self.field(pid, name, "count")
    }

    pub fn errors(&self, pid: u32, name: &str) -> u64 {
        self.field(pid, name, "errors")
    }

    /// Syscall name -> count for `pid`.
    pub fn counts_for(&self, pid: u32) -> BTreeMap<String, u64> {
        self.syscalls()
            .iter()
            .filter(|s| s["pid"] == pid)
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_string(),
                    s["count"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// Checks the schema and internal consistency: schema_version 1, each
    /// row's histogram sums to its count, errnos sum to errors, totals are
    /// the sums of the rows, no lost events.
    #[track_caller]
    pub fn check_invariants(&self) {
        let r = &self.0;
        assert_eq!(r["schema_version"], 1, "schema_version\n{r}");
        assert!(r["tool_version"].is_string(), "tool_version\n{r}");
        assert!(r["duration_ns"].is_u64(), "duration_ns\n{r}");
        assert!(r["notes"].is_array(), "notes\n{r}");
        assert!(r["lost_detail"].is_object(), "lost_detail\n{r}");
        assert_eq!(r["lost_events"], 0, "lost events\n{r}");
        for t in self.targets() {
            assert!(t["pid"].is_u64(), "target pid: {t}");
            assert!(t["comm"].is_string(), "target comm: {t}");
            assert!(t["cmdline"].is_array(), "target cmdline: {t}");
            assert!(
                ["attached", "launched", "followed"].contains(&t["origin"].as_str().unwrap_or("")),
                "target origin: {t}"
            );
            assert!(
                t["ppid"].is_u64() || t["ppid"].is_null(),
                "target ppid: {t}"
            );
            assert!(
                t["exe"].is_string() || t["exe"].is_null(),
                "target exe: {t}"
            );
            assert!(
                t["exit_code"].is_i64() || t["exit_code"].is_null(),
                "target exit_code: {t}"
            );
        }
        let (mut count, mut errors, mut total) = (0u64, 0u64, 0u64);
        let mut seen = HashSet::new();
        for s in self.syscalls() {
            let pid = s["pid"].as_u64().unwrap_or_else(|| panic!("row pid: {s}"));
            let name = s["name"]
                .as_str()
                .unwrap_or_else(|| panic!("row name: {s}"));
            assert!(
                seen.insert((pid, name.to_string())),
                "duplicate row {pid}/{name}"
            );
            assert!(s["nr"].is_u64(), "row nr: {s}");
            let c = s["count"].as_u64().unwrap();
            let e = s["errors"].as_u64().unwrap();
            let t = s["total_ns"].as_u64().unwrap();
            let m = s["max_ns"].as_u64().unwrap();
            let hist = s["hist_log2_ns"]
                .as_array()
                .unwrap_or_else(|| panic!("hist: {s}"));
            assert_eq!(hist.len(), 40, "hist length: {s}");
            let hsum: u64 = hist.iter().map(|h| h.as_u64().unwrap()).sum();
            assert_eq!(hsum, c, "histogram does not sum to count: {s}");
            assert!(e <= c, "errors > count: {s}");
            assert!(m <= t, "max_ns > total_ns: {s}");
            let esum: u64 = s["errnos"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(esum, e, "errnos do not sum to errors: {s}");
            count += c;
            errors += e;
            total += t;
        }
        assert_eq!(r["totals"]["count"], count, "totals.count\n{r}");
        assert_eq!(r["totals"]["errors"], errors, "totals.errors\n{r}");
        assert_eq!(r["totals"]["total_ns"], total, "totals.total_ns\n{r}");
    }
}

/// The Python frames of a recorded stack (or a `dump` thread), leaf first:
/// (function, file, line), "" / 0 where absent.
pub fn python_frames_of(s: &Value) -> Vec<(String, String, u64)> {
    s["frames"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or(&[])
        .iter()
        .filter(|f| f["kind"] == "python")
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}
