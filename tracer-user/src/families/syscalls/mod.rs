//! Syscall accounting, user side: attaches the `sys_enter`/`sys_exit`
//! programs, drains the in-kernel aggregates periodically (retiring threads
//! that exited so the maps stay small) and closes the window at the end,
//! accounting the calls still in flight.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    Ebpf,
};
use tracer_common::{
    python::{SlowKey, SlowStats},
    syscalls::{hist_bucket, ErrnoKey, SyscallKey, SyscallPending, SyscallStart, SyscallStats},
};

mod slots;

use crate::{
    engine::{Part, programs::Links, Collector, Cx, Handle, FamilyTable, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec, TargetEvent},
    os::probe::ProbeError,
    os::procfs,
    recording::{Origin, Recording, StackKind, StackRecord, ThreadSyscall},
    system::syscall_name,
};

#[derive(Clone, Debug, Default)]
struct Acc {
    stats: SyscallStats,
    errnos: BTreeMap<u32, u64>,
    in_flight: u64,
}

impl Acc {
    fn merge(&mut self, other: &Acc) {
        self.stats.merge(&other.stats);
        for (e, n) in &other.errnos {
            *self.errnos.entry(*e).or_default() += n;
        }
        self.in_flight += other.in_flight;
    }
}

type Key = (u32, u32, u32); // pid, tid, nr

pub static TABLE: FamilyTable = FamilyTable {
    family: "syscalls",
    programs: &[
        ProgramSpec { name: "sys_enter", kind: ProgramKind::BtfTracePoint { tracepoint: "sys_enter" } },
        ProgramSpec { name: "sys_exit", kind: ProgramKind::BtfTracePoint { tracepoint: "sys_exit" } },
    ],
    globals: &[
        GlobalSpec { name: "NR_EXIT", value: |i| Ok(GlobalValue::U32(i.arch.nr_exit)) },
        GlobalSpec { name: "NR_EXIT_GROUP", value: |i| Ok(GlobalValue::U32(i.arch.nr_exit_group)) },
        GlobalSpec { name: "NR_FUTEX", value: |i| Ok(GlobalValue::U32(i.arch.nr_futex)) },
        GlobalSpec { name: "NR_CLONE", value: |i| Ok(GlobalValue::U32(i.arch.nr_clone_family.0)) },
        GlobalSpec { name: "NR_FORK", value: |i| Ok(GlobalValue::U32(i.arch.nr_clone_family.1)) },
        GlobalSpec { name: "NR_VFORK", value: |i| Ok(GlobalValue::U32(i.arch.nr_clone_family.2)) },
        GlobalSpec { name: "NR_CLONE3", value: |i| Ok(GlobalValue::U32(i.arch.nr_clone_family.3)) },
        GlobalSpec { name: "PT_REGS_NR_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_nr_offset)) },
        GlobalSpec { name: "PT_REGS_ARG0_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_arg0_offset)) },
        GlobalSpec { name: "NR_MMAP", value: |i| Ok(GlobalValue::U32(i.arch.nr_mmap)) },
        GlobalSpec { name: "TASK_START_TIME_OFFSET", value: |i| i.task_member("start_time").map(GlobalValue::U64) },
        GlobalSpec { name: "PT_REGS_ARG2_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_arg2_offset)) },
        GlobalSpec { name: "PT_REGS_ARG4_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_arg4_offset)) },
        // Pending calls per CPU need the scheduler programs to empty them.
        GlobalSpec { name: "SYSCALL_PENDING_ON", value: |i| Ok(GlobalValue::U32(u32::from(i.opts.sched.enabled))) },
        GlobalSpec {
            name: "SLOW_SYSCALL_NS",
            value: |i| Ok(GlobalValue::U64(i.opts.slow_syscall.map(|d| d.as_nanos() as u64).unwrap_or(0))),
        },
    ],
};

/// How often the kernel aggregates are copied and dead threads retired.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// Drains an exited thread's rows wait for the scheduler collector's
/// verdict before they are folded without one (a thread whose exit the
/// scheduler programs missed).
const VERDICT_WAIT_DRAINS: u32 = 5;

/// The syscall probe family.
#[derive(Default)]
pub struct SyscallCollector {
    /// Whether the scheduler family runs (`record --no-sched` turns it off).
    sched_on: bool,
    links: Links,
    /// Latest snapshot of live threads.
    live: HashMap<Key, Acc>,
    /// Rows of threads that exited, by (pid, tid), waiting for the verdict
    /// of `cx.targets.exited` (with the drains waited so far).
    pending: HashMap<(u32, u32), (BTreeMap<u32, Acc>, u32)>,
    /// Exited threads that keep rows of their own, by verdict id:
    /// (pid, tid, rows by syscall number). A boxed slice, not a map: a
    /// B-tree node for 11 rows would be allocated for the 3 rows of a
    /// short-lived child process.
    kept: HashMap<u64, KeptRows>,
    /// (pid, nr) -> the rows of the exited threads folded together (tid 0).
    folded: BTreeMap<(u32, u32), Acc>,
    /// Slow syscalls of the folded threads, moved out of the kernel map
    /// (whose keys name threads), by stack, tid 0.
    folded_slow: HashMap<SlowKey, SlowStats>,
    /// The threads of attached processes when the window opened: only
    /// they can have been blocked in one syscall for the whole window.
    initial_threads: HashSet<(u32, u32)>,
}

/// The syscall rows of an exited thread that keeps them: (pid, tid, rows).
type KeptRows = (u32, u32, Box<[(u32, Acc)]>);

fn stats_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, SyscallKey, SyscallStats>, ProbeError> {
    crate::os::probe::hash_map(ebpf, tracer_common::maps::SYSCALL_STATS)
}

/// Every CPU's pending calls (`SYSCALL_PENDING`), the empty ones left out.
fn pending_rows(ebpf: &mut Ebpf) -> Result<Vec<SyscallPending>, ProbeError> {
    let map = ebpf.map_mut(tracer_common::maps::SYSCALL_PENDING).ok_or(ProbeError::MissingMap(tracer_common::maps::SYSCALL_PENDING))?;
    let arr: PerCpuArray<&mut MapData, SyscallPending> =
        PerCpuArray::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::SYSCALL_PENDING, e))?;
    let values = arr.get(&0, 0).map_err(|e| ProbeError::map(tracer_common::maps::SYSCALL_PENDING, e))?;
    Ok(values.iter().filter(|p| p.tid != 0).copied().collect())
}

/// Deletes the kernel entries (counts and errnos) of `rows`.
fn forget_kernel_rows(ebpf: &mut Ebpf, rows: &[(Key, Acc)]) -> Result<(), ProbeError> {
    let mut map = stats_map(ebpf)?;
    for &((pid, tid, nr), _) in rows {
        let _ = map.remove(&SyscallKey { pid, tid, nr, _pad: 0 });
    }
    let mut emap: BpfHashMap<_, ErrnoKey, u64> = crate::os::probe::hash_map(ebpf, tracer_common::maps::SYSCALL_ERRNO)?;
    for ((pid, tid, nr), a) in rows {
        for &errno in a.errnos.keys() {
            let _ = emap.remove(&ErrnoKey { pid: *pid, tid: *tid, nr: *nr, errno });
        }
    }
    Ok(())
}

fn fold_into<'a>(folded: &mut BTreeMap<(u32, u32), Acc>, pid: u32, rows: impl IntoIterator<Item = (&'a u32, &'a Acc)>) {
    for (nr, a) in rows {
        folded.entry((pid, *nr)).or_default().merge(a);
    }
}

impl SyscallCollector {
    /// Total calls counted so far (for the status line).
    fn total_calls(&self) -> u64 {
        let rows = self.live.values().chain(self.folded.values());
        let pending = self.pending.values().flat_map(|(r, _)| r.values());
        let kept = self.kept.values().flat_map(|(_, _, r)| r.iter().map(|(_, a)| a));
        rows.chain(pending).chain(kept).map(|a| a.stats.count).fold(0, u64::saturating_add)
    }

    /// Copies the kernel aggregates; threads that exited are moved out of
    /// the kernel maps, then kept or folded as `cx.targets.exited` decides.
    /// `retire_dead`: ask /proc which threads exited (not after the window).
    fn drain(&mut self, cx: &mut Cx<'_>, retire_dead: bool) -> Result<(), ProbeError> {
        let ebpf = &mut cx.kernel.ebpf;
        let mut alive_cache: HashMap<(u32, u32), bool> = HashMap::new();
        let mut alive = |pid: u32, tid: u32| {
            !retire_dead || *alive_cache.entry((pid, tid)).or_insert_with(|| procfs::thread_alive(pid, tid))
        };
        let mut live: HashMap<Key, Acc> = HashMap::new();
        let mut dead_keys = Vec::new();
        let mut newly_dead: Vec<(u32, u32)> = Vec::new();
        {
            let map = stats_map(ebpf)?;
            for item in map.iter() {
                let (k, v) = item.map_err(|e| ProbeError::map(tracer_common::maps::SYSCALL_STATS, e))?;
                let key = (k.pid, k.tid, k.nr);
                let acc = Acc { stats: v, ..Acc::default() };
                if alive(k.pid, k.tid) {
                    live.insert(key, acc);
                } else {
                    let (rows, waited) = self.pending.entry((k.pid, k.tid)).or_default();
                    if rows.is_empty() && *waited == 0 {
                        newly_dead.push((k.pid, k.tid));
                    }
                    rows.entry(k.nr).or_default().merge(&acc);
                    dead_keys.push(k);
                }
            }
        }
        // The calls still summed per CPU (after the table: a call moving
        // between the two meanwhile is missed by this read, never counted
        // twice). A thread that exited has none left there.
        for p in pending_rows(ebpf)? {
            for row in p.rows.iter().filter(|r| r.stats.count != 0) {
                if alive(p.pid, p.tid) {
                    live.entry((p.pid, p.tid, row.nr)).or_default().stats.merge(&row.stats);
                }
            }
        }
        // A read that missed calls in transit is never below the last one.
        for (key, acc) in live.iter_mut() {
            if let Some(last) = self.live.get(key) {
                acc.stats.max_with(&last.stats);
            }
        }
        let mut dead_errno = Vec::new();
        {
            let map: BpfHashMap<_, ErrnoKey, u64> = crate::os::probe::hash_map(ebpf, tracer_common::maps::SYSCALL_ERRNO)?;
            for item in map.iter() {
                let (k, n) = item.map_err(|e| ProbeError::map(tracer_common::maps::SYSCALL_ERRNO, e))?;
                let key = (k.pid, k.tid, k.nr);
                if alive(k.pid, k.tid) {
                    live.entry(key).or_default().errnos.insert(k.errno, n);
                } else {
                    let (rows, _) = self.pending.entry((k.pid, k.tid)).or_default();
                    *rows.entry(k.nr).or_default().errnos.entry(k.errno).or_default() += n;
                    dead_errno.push(k);
                }
            }
        }
        // Delete after iterating: deleting while walking a hash map restarts the walk.
        let mut map = stats_map(ebpf)?;
        for k in &dead_keys {
            let _ = map.remove(k);
        }
        let mut emap: BpfHashMap<_, ErrnoKey, u64> = crate::os::probe::hash_map(ebpf, tracer_common::maps::SYSCALL_ERRNO)?;
        for k in &dead_errno {
            let _ = emap.remove(k);
        }
        if retire_dead {
            let mut smap: BpfHashMap<_, u32, SyscallStart> = crate::os::probe::hash_map(ebpf, tracer_common::maps::SYSCALL_START)?;
            let stale: Vec<u32> = smap.keys().filter_map(Result::ok).filter(|tid| procfs::tgid_of(*tid).is_none()).collect();
            for tid in stale {
                let _ = smap.remove(&tid);
            }
            slots::retire_dead(ebpf)?;
        }
        self.live = live;
        if !self.sched_on {
            // No scheduler collector: this one sees the exits, and decides
            // by syscall time.
            for (pid, tid) in newly_dead {
                let weight = self.pending.get(&(pid, tid)).map(|(rows, _)| rows.values().map(|a| a.stats.total_ns).fold(0, u64::saturating_add));
                cx.targets.exited.exited(pid, tid, weight.unwrap_or(0));
            }
        }
        self.apply_verdicts(cx)
    }

    /// Keeps or folds the rows of the threads `cx.targets.exited` decided about.
    fn apply_verdicts(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        let verdicts = cx.targets.exited.take_verdicts();
        if verdicts.is_empty() {
            self.age_pending(cx);
            return Ok(());
        }
        // The rows of a thread still counted as live (no /proc check after
        // the window): by (pid, tid).
        let mut live_by_thread: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        for &(pid, tid, nr) in self.live.keys() {
            live_by_thread.entry((pid, tid)).or_default().push(nr);
        }
        let mut taken_live: Vec<(Key, Acc)> = Vec::new();
        let summed: HashSet<(u32, u32)> = verdicts.iter().filter(|v| !v.keep).map(|v| (v.pid, v.tid)).collect();
        for v in verdicts {
            let rows: BTreeMap<u32, Acc> = match self.kept.remove(&v.id) {
                // A kept thread pushed out of the top.
                Some((_, _, rows)) => rows.into_vec().into_iter().collect(),
                None => match self.pending.remove(&(v.pid, v.tid)) {
                    Some((rows, _)) => rows,
                    // Still in /proc (a zombie main thread), or no /proc
                    // check after the window: its rows are taken out of the
                    // live ones, and of the kernel maps below.
                    None => live_by_thread
                        .remove(&(v.pid, v.tid))
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|nr| self.live.remove(&(v.pid, v.tid, nr)).map(|a| (nr, a)))
                        .inspect(|(nr, a)| taken_live.push(((v.pid, v.tid, *nr), a.clone())))
                        .collect(),
                },
            };
            if v.keep {
                if !rows.is_empty() {
                    self.kept.insert(v.id, (v.pid, v.tid, rows.into_iter().collect()));
                }
            } else {
                fold_into(&mut self.folded, v.pid, &rows);
            }
        }
        if !taken_live.is_empty() {
            forget_kernel_rows(&mut cx.kernel.ebpf, &taken_live)?;
        }
        if !summed.is_empty() {
            let mut slow: BpfHashMap<_, SlowKey, SlowStats> = crate::os::probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::SLOW_SYSCALLS)?;
            let taken: Vec<(SlowKey, SlowStats)> =
                slow.iter().filter_map(Result::ok).filter(|(k, _)| summed.contains(&(k.pid, k.tid))).collect();
            for (k, v) in taken {
                let _ = slow.remove(&k);
                let sum = self.folded_slow.entry(SlowKey { tid: 0, ..k }).or_default();
                sum.count = sum.count.saturating_add(v.count);
                sum.total_ns = sum.total_ns.saturating_add(v.total_ns);
            }
        }
        self.age_pending(cx);
        Ok(())
    }

    /// Rows that waited too long for a verdict are folded: the scheduler
    /// programs missed that thread's exit.
    fn age_pending(&mut self, cx: &mut Cx<'_>) {
        let mut stale = Vec::new();
        for (&(pid, tid), (_, waited)) in self.pending.iter_mut() {
            *waited += 1;
            if *waited > VERDICT_WAIT_DRAINS {
                stale.push((pid, tid));
            }
        }
        for (pid, tid) in stale {
            if let Some((rows, _)) = self.pending.remove(&(pid, tid)) {
                fold_into(&mut self.folded, pid, &rows);
                cx.targets.exited.folded_unseen(pid);
            }
        }
    }

    /// Every thread's table up to `end_ns` (CLOCK_MONOTONIC): the counted
    /// calls, plus the calls still in flight accounted up to the end: those
    /// entered inside the window and, for attached processes, those of
    /// threads blocked in one syscall for the whole window (from
    /// /proc/PID/task/TID/syscall). Exited threads folded together are the
    /// rows of tid 0.
    fn table(&self, cx: &mut Cx<'_>, window: (u64, u64)) -> Result<Vec<ThreadSyscall>, ProbeError> {
        let (start_ns, end_ns) = window;
        let (live_pids, attached_pids) = (cx.targets.live_pids(), cx.targets.attached_pids());
        let mut all: HashMap<Key, Acc> = self.live.clone();
        let pending = self.pending.iter().flat_map(|(&(pid, tid), (rows, _))| rows.iter().map(move |(nr, a)| ((pid, tid, *nr), a)));
        let kept = self.kept.values().flat_map(|(pid, tid, rows)| rows.iter().map(move |(nr, a)| ((*pid, *tid, *nr), a)));
        for (key, a) in pending.chain(kept) {
            all.entry(key).or_default().merge(a);
        }
        for (&(pid, nr), a) in &self.folded {
            all.entry((pid, 0, nr)).or_default().merge(a);
        }
        let mut active: HashSet<u32> = all.keys().map(|&(_, tid, _)| tid).collect();
        let mut in_flight: Vec<SyscallStart> = Vec::new();
        {
            let starts: BpfHashMap<_, u32, SyscallStart> = crate::os::probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::SYSCALL_START)?;
            in_flight.extend(starts.iter().filter_map(Result::ok).map(|(_, s)| s));
        }
        // A thread that owns a slot keeps its calls there: its entry in
        // SYSCALL_START, if any, is an older one (before the claim).
        let slotted = slots::entries(&mut cx.kernel.ebpf)?;
        let owners: HashSet<u32> = slotted.iter().map(|s| s.tid).collect();
        in_flight.retain(|s| !owners.contains(&s.tid));
        in_flight.extend(slotted);
        for start in in_flight.into_iter().filter(|s| s.ts != 0 && s.ts < end_ns) {
            let Some(pid) = procfs::tgid_of(start.tid) else { continue };
            if live_pids.contains(&pid) {
                active.insert(start.tid);
                add_in_flight(&mut all, (pid, start.tid, start.nr), end_ns - start.ts);
            }
        }
        // Threads of attached processes with no syscall activity at all in the
        // window, sitting in a syscall now: blocked in it the whole window
        // (if they were there when it opened: a thread started since,
        // after the window closed say, was not).
        for &pid in attached_pids.iter().filter(|p| live_pids.contains(p)) {
            for tid in procfs::thread_ids(pid) {
                if active.contains(&tid) || !self.initial_threads.contains(&(pid, tid)) {
                    continue;
                }
                if let Some(nr) = procfs::blocked_syscall(pid, tid) {
                    add_in_flight(&mut all, (pid, tid, nr), end_ns.saturating_sub(start_ns));
                }
            }
        }
        let mut out: Vec<ThreadSyscall> = all
            .into_iter()
            .filter(|(_, a)| a.stats.count > 0)
            .map(|((pid, tid, nr), a)| ThreadSyscall {
                pid,
                tid,
                nr,
                count: a.stats.count,
                errors: a.stats.errors,
                errnos: a.errnos,
                total_ns: a.stats.total_ns,
                max_ns: a.stats.max_ns,
                hist_log2_ns: a.stats.hist.to_vec(),
                in_flight: a.in_flight,
                aggregated_threads: if tid == 0 { cx.targets.exited.folded(pid) } else { 0 },
            })
            .collect();
        out.sort_by_key(|t| (t.pid, t.tid, t.nr));
        Ok(out)
    }
}

impl SyscallCollector {
    /// `sched_on`: the scheduler family runs too (its switches flush the
    /// per-CPU pending rows).
    pub fn new(sched_on: bool) -> Self {
        SyscallCollector { sched_on, ..Default::default() }
    }
}

impl Collector for SyscallCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Targets, Handle::Stacks]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Syscalls, Part::Stacks]
    }

    fn name(&self) -> &'static str {
        "syscalls"
    }

    fn forget(&mut self, _cx: &mut Cx<'_>, pids: &HashSet<u32>) {
        self.live.retain(|k, _| !pids.contains(&k.0));
        self.pending.retain(|k, _| !pids.contains(&k.0));
        self.kept.retain(|_, v| !pids.contains(&v.0));
        self.folded.retain(|k, _| !pids.contains(&k.0));
        self.folded_slow.retain(|k, _| !pids.contains(&k.pid));
        self.initial_threads.retain(|k| !pids.contains(&k.0));
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        for spec in TABLE.programs {
            self.links.attach(&mut cx.kernel, spec)?;
        }
        Ok(())
    }

    fn target(&mut self, _cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        if let TargetEvent::Appeared { pid, origin: Origin::Attached } = ev {
            self.initial_threads.extend(procfs::thread_ids(*pid).into_iter().map(|tid| (*pid, tid)));
        }
        Ok(())
    }

    fn poll_every(&self) -> Duration {
        DRAIN_EVERY
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.drain(cx, true)
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        self.drain(cx, cx.window.end.is_none())?;
        let window = (cx.window.start, cx.window.now_or_end());
        let syscalls = self.table(cx, window)?;
        if let Some(note) = cx.targets.exited.note() {
            cx.sink.state_note("exited_threads", note);
        }
        let unseen = crate::os::probe::counter(&mut cx.kernel.ebpf, tracer_common::counters::SYSCALL_ENTER_UNSEEN)?;
        if unseen > 0 {
            cx.sink.state_note(
                "syscall_enter_unseen",
                format!("{unseen} syscalls returned without their entry being seen (refused by a seccomp filter, as in containers, or a skipped probe): counted, with no time"),
            );
        }
        // Processes seen only through their syscalls (a fork event lost).
        for s in &syscalls {
            cx.targets.entry(s.pid, Origin::Followed);
        }
        rec.syscalls = syscalls;
        if cx.counts_only {
            return Ok(());
        }
        let pids = cx.targets.all_pids();
        let stacks = slow_syscall_stacks(cx, &pids, &self.folded_slow)?;
        rec.stacks.extend(stacks);
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        self.links.detach(&mut cx.kernel.ebpf);
    }

    fn status(&self) -> Option<String> {
        Some(format!("{} syscalls", self.total_calls()))
    }
}

/// Syscalls slower than `--slow-syscall`, by thread, syscall and stack.
/// `folded`: those of summed exited threads (tid 0), out of the kernel map.
fn slow_syscall_stacks(cx: &mut Cx<'_>, target_pids: &[u32], folded: &HashMap<SlowKey, SlowStats>) -> Result<Vec<StackRecord>, ProbeError> {
    let mut rows: Vec<(SlowKey, SlowStats)> = {
        let map: BpfHashMap<_, SlowKey, SlowStats> = crate::os::probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::SLOW_SYSCALLS)?;
        map.iter().filter_map(Result::ok).collect()
    };
    rows.extend(folded.iter().map(|(k, v)| (*k, *v)));
    let arch = std::env::consts::ARCH;
    let mut out = Vec::new();
    for (k, v) in rows.into_iter().filter(|(k, _)| target_pids.contains(&k.pid)) {
        out.push(StackRecord {
            kind: StackKind::Syscall,
            reason: None,
            pid: k.pid,
            tid: k.tid,
            samples: v.count,
            weight_ns: v.total_ns,
            syscall: Some(syscall_name(arch, k.nr)),
            frames: cx.frames(k.pid, k.user_stack, -1, k.py_stack)?,
        });
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.weight_ns));
    Ok(out)
}

fn add_in_flight(all: &mut HashMap<Key, Acc>, key: Key, ns: u64) {
    let acc = all.entry(key).or_default();
    acc.stats.count += 1;
    acc.stats.total_ns += ns;
    acc.stats.max_ns = acc.stats.max_ns.max(ns);
    acc.stats.hist[hist_bucket(ns)] += 1;
    acc.in_flight += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_is_counted_once() {
        let mut all = HashMap::new();
        add_in_flight(&mut all, (1, 1, 0), 1_000);
        let a = &all[&(1, 1, 0)];
        assert_eq!((a.stats.count, a.in_flight, a.stats.total_ns), (1, 1, 1_000));
    }
}
