//! The syscall sections of the text report: per process a `strace -c -S
//! time` style table (with the errno names of failed calls), then log2
//! latency histograms of each process's top syscalls by time.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::view::View;
use crate::{
    recording::{Origin, Recording, Target},
    report::{
        fmt::{fmt_duration, histogram_rows, printable, share},
        rows::{targets, totals, SyscallRow},
    },
};

/// How many syscalls per process get a latency histogram.
const HISTOGRAMS_PER_PROCESS: usize = 3;

/// One `== pid` heading and table per target, in pid order (`rows`: from
/// [`crate::report::rows::syscall_rows`]).
pub fn render_tables(out: &mut String, rec: &Recording, rows: &BTreeMap<u32, Vec<SyscallRow>>, view: &View) {
    for t in targets(rec).into_iter().filter(|t| view.shows(t.pid)) {
        let origin = match t.origin {
            Origin::Attached => "attached",
            Origin::Launched => "launched",
            Origin::Followed => "followed",
        };
        let exit = t.exit_code.map(|c| format!(", exit code {c}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "\n== pid {} ({}) [{}{}] {}",
            t.pid,
            printable(&t.comm),
            origin,
            exit,
            command_line(t)
        );
        if let Some(n) = view.group_of(t.pid) {
            let _ = writeln!(out, "(the busiest of {n} worker processes with this command: `--verbose` shows each)");
        }
        match rows.get(&t.pid) {
            Some(r) => table(out, r, view.limits.syscalls),
            None => out.push_str("(no syscalls in the window)\n"),
        }
    }
    if view.left_out() > 0 {
        let _ = writeln!(
            out,
            "\n({} more process{} with less thread time: `--verbose` shows each, `--format json` has all)",
            view.left_out(),
            if view.left_out() == 1 { "" } else { "es" }
        );
    }
}

/// What a target ran, as one line: its arguments (each escaped, so that
/// an argument holding a line break or an escape sequence stays one
/// visible argument), or its executable when they are unknown.
fn command_line(t: &Target) -> String {
    if t.cmdline.is_empty() {
        return printable(t.exe.as_deref().unwrap_or_default()).into_owned();
    }
    t.cmdline.iter().map(|a| printable(a)).collect::<Vec<_>>().join(" ")
}

/// Latency histograms of the top [`HISTOGRAMS_PER_PROCESS`] syscalls by
/// time of each target.
pub fn render_latency(out: &mut String, rec: &Recording, rows: &BTreeMap<u32, Vec<SyscallRow>>) {
    for t in targets(rec) {
        let Some(r) = rows.get(&t.pid) else { continue };
        let top: Vec<&SyscallRow> = r.iter().filter(|r| r.total_ns > 0).take(HISTOGRAMS_PER_PROCESS).collect();
        if top.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n== latency, pid {} ({}): top {} syscalls by time", t.pid, printable(&t.comm), top.len());
        for row in top {
            histogram(out, row);
        }
    }
}

/// The table of `rows` (sorted by time): the first `max`, a line for the
/// rest, and the total of all.
fn table(out: &mut String, rows: &[SyscallRow], max: usize) {
    let tot = totals(rows);
    let rule = "------ ----------- ----------- --------- --------- ----------------";
    out.push_str("% time     seconds  usecs/call     calls    errors syscall\n");
    out.push_str(rule);
    out.push('\n');
    for r in rows.iter().take(max) {
        let pct = share(r.total_ns, tot.total_ns).percent;
        let per_call = r.total_ns.checked_div(r.count).unwrap_or(0) / 1000;
        let errors = if r.errors > 0 { r.errors.to_string() } else { String::new() };
        let _ = writeln!(
            out,
            "{:>6.2} {:>11.6} {:>11} {:>9} {:>9} {}",
            pct,
            r.total_ns as f64 / 1e9,
            per_call,
            r.count,
            errors,
            r.name
        );
    }
    if rows.len() > max {
        let rest = totals(&rows[max..]);
        let _ = writeln!(
            out,
            "  ... {} more syscalls: {} calls, {:.6} s ({:.2}%)",
            rows.len() - max,
            rest.count,
            rest.total_ns as f64 / 1e9,
            share(rest.total_ns, tot.total_ns).percent
        );
    }
    out.push_str(rule);
    out.push('\n');
    let errors = if tot.errors > 0 { tot.errors.to_string() } else { String::new() };
    let per_call = tot.total_ns.checked_div(tot.count).unwrap_or(0) / 1000;
    let _ = writeln!(out, "{:>6.2} {:>11.6} {:>11} {:>9} {:>9} total", 100.0, tot.total_ns as f64 / 1e9, per_call, tot.count, errors);
    let failing: Vec<String> = rows
        .iter()
        .filter(|r| !r.errnos.is_empty())
        .map(|r| {
            let e: Vec<String> = r.errnos.iter().map(|(k, v)| format!("{k} x{v}")).collect();
            format!("{} ({})", r.name, e.join(", "))
        })
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(out, "errors: {}", failing.join("; "));
    }
}

fn histogram(out: &mut String, row: &SyscallRow) {
    let _ = writeln!(out, "{}: {} calls, avg {}, max {}", row.name, row.count, fmt_duration(row.total_ns / row.count.max(1)), fmt_duration(row.max_ns));
    histogram_rows(out, &row.hist_log2_ns);
}
