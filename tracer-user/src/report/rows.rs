//! The report's data shaping, shared by every output format: per-process
//! syscall rows summed over threads ([`syscall_rows`], [`totals`]), targets
//! in report order ([`targets`]), and the weight of a stack record
//! ([`stack_weight`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    recording::{Recording, StackKind, StackRecord, Target},
    system::{errno_name, syscall_name},
};

/// One syscall of one process, all threads summed.
#[derive(Clone, Debug, Serialize)]
pub struct SyscallRow {
    pub pid: u32,
    pub name: String,
    pub nr: u32,
    pub count: u64,
    pub errors: u64,
    /// errno name -> failures.
    pub errnos: BTreeMap<String, u64>,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist_log2_ns: Vec<u64>,
    /// Calls that were still in flight when the window closed.
    pub in_flight: u64,
}

/// Per-process rows, sorted by total time (then calls, then name), like `strace -c -S time`.
pub fn syscall_rows(rec: &Recording) -> BTreeMap<u32, Vec<SyscallRow>> {
    let mut by_key: BTreeMap<(u32, u32), SyscallRow> = BTreeMap::new();
    for t in &rec.syscalls {
        let row = by_key.entry((t.pid, t.nr)).or_insert_with(|| SyscallRow {
            pid: t.pid,
            name: syscall_name(&rec.host.arch, t.nr),
            nr: t.nr,
            count: 0,
            errors: 0,
            errnos: BTreeMap::new(),
            total_ns: 0,
            max_ns: 0,
            hist_log2_ns: vec![0; t.hist_log2_ns.len()],
            in_flight: 0,
        });
        // Saturating: a recording is outside data, its counters may be anything.
        row.count = row.count.saturating_add(t.count);
        row.errors = row.errors.saturating_add(t.errors);
        row.total_ns = row.total_ns.saturating_add(t.total_ns);
        row.max_ns = row.max_ns.max(t.max_ns);
        row.in_flight = row.in_flight.saturating_add(t.in_flight);
        if row.hist_log2_ns.len() < t.hist_log2_ns.len() {
            row.hist_log2_ns.resize(t.hist_log2_ns.len(), 0);
        }
        for (a, b) in row.hist_log2_ns.iter_mut().zip(&t.hist_log2_ns) {
            *a = a.saturating_add(*b);
        }
        for (e, n) in &t.errnos {
            let v = row.errnos.entry(errno_name(*e)).or_default();
            *v = v.saturating_add(*n);
        }
    }
    let mut out: BTreeMap<u32, Vec<SyscallRow>> = BTreeMap::new();
    for ((pid, _), row) in by_key {
        out.entry(pid).or_default().push(row);
    }
    for rows in out.values_mut() {
        rows.sort_by(|a, b| {
            b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)).then(a.name.cmp(&b.name))
        });
    }
    out
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Totals {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
}

pub fn totals<'a>(rows: impl IntoIterator<Item = &'a SyscallRow>) -> Totals {
    rows.into_iter().fold(Totals::default(), |t, r| Totals {
        count: t.count.saturating_add(r.count),
        errors: t.errors.saturating_add(r.errors),
        total_ns: t.total_ns.saturating_add(r.total_ns),
    })
}

/// Targets in report order; processes without syscalls are kept.
pub fn targets(rec: &Recording) -> Vec<&Target> {
    let mut t: Vec<&Target> = rec.targets.iter().collect();
    t.sort_by_key(|t| t.pid);
    t
}

/// What a stack record weighs: CPU samples for on-CPU stacks, nanoseconds
/// for the others.
pub fn stack_weight(s: &StackRecord) -> u64 {
    match s.kind {
        StackKind::Cpu => s.samples,
        StackKind::OffCpu | StackKind::Gil | StackKind::Syscall => s.weight_ns,
    }
}
