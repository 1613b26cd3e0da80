//! `strace -c` as ground truth for syscall counts.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::process::Command;

use crate::{run_cmd, TempDir, RUN_TIMEOUT};

/// (calls, errors) per syscall from an strace `-c` table.
pub fn parse_strace_table(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 5 || t[0].starts_with('%') || t[0].starts_with('-') {
            continue;
        }
        let name = *t.last().unwrap();
        if name == "total" {
            continue;
        }
        let Ok(calls) = t[3].parse::<u64>() else {
            continue;
        };
        let errors = if t.len() >= 6 {
            t[4].parse().unwrap_or(0)
        } else {
            0
        };
        m.insert(name.to_string(), (calls, errors));
    }
    m
}

/// Runs `cmd` under `strace -c -f` and returns its per-syscall table.
#[track_caller]
pub fn strace_counts(cmd: &[&OsStr]) -> BTreeMap<String, (u64, u64)> {
    let dir = TempDir::new("strace");
    let out = dir.join("strace.txt");
    let r = run_cmd(
        Command::new("strace")
            .args(["-c", "-f", "-o"])
            .arg(&out)
            .arg("--")
            .args(cmd),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    parse_strace_table(&fs::read_to_string(&out).unwrap())
}
