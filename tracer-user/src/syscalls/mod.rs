//! Syscall accounting, user side: attaches the `sys_enter`/`sys_exit`
//! programs, drains the in-kernel aggregates periodically (retiring threads
//! that exited so the maps stay small) and closes the window at the end,
//! accounting the calls still in flight.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    Ebpf,
};
use tracer_common::{
    python::{SlowKey, SlowStats},
    syscalls::{hist_bucket, ErrnoKey, SyscallKey, SyscallStart, SyscallStats},
};

use crate::{
    collect::{programs::Links, Collector, Context, FamilyTable, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec},
    probe::ProbeError,
    procfs,
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
        GlobalSpec { name: "PT_REGS_ARG2_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_arg2_offset)) },
        GlobalSpec { name: "PT_REGS_ARG4_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_arg4_offset)) },
        GlobalSpec {
            name: "SLOW_SYSCALL_NS",
            value: |i| Ok(GlobalValue::U64(i.opts.slow_syscall.map(|d| d.as_nanos() as u64).unwrap_or(0))),
        },
    ],
};

/// How often the kernel aggregates are copied and dead threads retired.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// The syscall probe family.
#[derive(Default)]
pub struct SyscallCollector {
    links: Links,
    /// Threads that exited: final values, removed from the kernel maps.
    retired: HashMap<Key, Acc>,
    /// Latest snapshot of live threads.
    live: HashMap<Key, Acc>,
}

fn stats_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, SyscallKey, SyscallStats>, ProbeError> {
    crate::probe::hash_map(ebpf, "SYSCALL_STATS")
}

impl SyscallCollector {
    /// Total calls counted so far (for the status line).
    fn total_calls(&self) -> u64 {
        self.retired.values().chain(self.live.values()).map(|a| a.stats.count).sum()
    }

    /// Copies the kernel aggregates; threads that exited are moved to the
    /// retired set and their entries deleted from the kernel maps.
    fn drain(&mut self, ebpf: &mut Ebpf, retire_dead: bool) -> Result<(), ProbeError> {
        let mut alive_cache: HashMap<(u32, u32), bool> = HashMap::new();
        let mut alive = |pid: u32, tid: u32| {
            !retire_dead || *alive_cache.entry((pid, tid)).or_insert_with(|| procfs::thread_alive(pid, tid))
        };
        let mut live: HashMap<Key, Acc> = HashMap::new();
        let mut dead_keys = Vec::new();
        {
            let map = stats_map(ebpf)?;
            for item in map.iter() {
                let (k, v) = item.map_err(|e| ProbeError::map("SYSCALL_STATS", e))?;
                let key = (k.pid, k.tid, k.nr);
                let acc = Acc { stats: v, ..Acc::default() };
                if alive(k.pid, k.tid) {
                    live.insert(key, acc);
                } else {
                    self.retired.entry(key).or_default().merge(&acc);
                    dead_keys.push(k);
                }
            }
        }
        let mut dead_errno = Vec::new();
        {
            let map: BpfHashMap<_, ErrnoKey, u64> = crate::probe::hash_map(ebpf, "SYSCALL_ERRNO")?;
            for item in map.iter() {
                let (k, n) = item.map_err(|e| ProbeError::map("SYSCALL_ERRNO", e))?;
                let key = (k.pid, k.tid, k.nr);
                if alive(k.pid, k.tid) {
                    live.entry(key).or_default().errnos.insert(k.errno, n);
                } else {
                    *self.retired.entry(key).or_default().errnos.entry(k.errno).or_default() += n;
                    dead_errno.push(k);
                }
            }
        }
        // Delete after iterating: deleting while walking a hash map restarts the walk.
        let mut map = stats_map(ebpf)?;
        for k in &dead_keys {
            let _ = map.remove(k);
        }
        let mut emap: BpfHashMap<_, ErrnoKey, u64> = crate::probe::hash_map(ebpf, "SYSCALL_ERRNO")?;
        for k in &dead_errno {
            let _ = emap.remove(k);
        }
        if retire_dead {
            let mut smap: BpfHashMap<_, u32, SyscallStart> = crate::probe::hash_map(ebpf, "SYSCALL_START")?;
            let stale: Vec<u32> = smap.keys().filter_map(Result::ok).filter(|tid| procfs::tgid_of(*tid).is_none()).collect();
            for tid in stale {
                let _ = smap.remove(&tid);
            }
        }
        self.live = live;
        Ok(())
    }

    /// Every thread's table up to `end_ns` (CLOCK_MONOTONIC): the counted
    /// calls, plus the calls still in flight accounted up to the end: those
    /// entered inside the window and, for attached processes, those of
    /// threads blocked in one syscall for the whole window (from
    /// /proc/PID/task/TID/syscall).
    fn table(&self, ebpf: &mut Ebpf, window: (u64, u64), live_pids: &[u32], attached_pids: &[u32]) -> Result<Vec<ThreadSyscall>, ProbeError> {
        let (start_ns, end_ns) = window;
        let mut all = self.retired.clone();
        for (k, v) in &self.live {
            all.entry(*k).or_default().merge(v);
        }
        let mut active: HashSet<u32> = all.keys().map(|&(_, tid, _)| tid).collect();
        let mut in_flight: Vec<SyscallStart> = Vec::new();
        {
            let starts: BpfHashMap<_, u32, SyscallStart> = crate::probe::hash_map(ebpf, "SYSCALL_START")?;
            in_flight.extend(starts.iter().filter_map(Result::ok).map(|(_, s)| s));
        }
        for start in in_flight.into_iter().filter(|s| s.ts != 0 && s.ts < end_ns) {
            let Some(pid) = procfs::tgid_of(start.tid) else { continue };
            if live_pids.contains(&pid) {
                active.insert(start.tid);
                add_in_flight(&mut all, (pid, start.tid, start.nr), end_ns - start.ts);
            }
        }
        // Threads of attached processes with no syscall activity at all in the
        // window, sitting in a syscall now: blocked in it the whole window.
        for &pid in attached_pids.iter().filter(|p| live_pids.contains(p)) {
            for tid in procfs::thread_ids(pid) {
                if active.contains(&tid) {
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
            })
            .collect();
        out.sort_by_key(|t| (t.pid, t.tid, t.nr));
        Ok(out)
    }
}

impl Collector for SyscallCollector {
    fn name(&self) -> &'static str {
        "syscalls"
    }

    fn attach(&mut self, cx: &mut Context) -> Result<(), ProbeError> {
        for spec in TABLE.programs {
            self.links.attach(cx, spec)?;
        }
        Ok(())
    }

    fn poll_every(&self) -> Duration {
        DRAIN_EVERY
    }

    fn poll(&mut self, cx: &mut Context) -> Result<(), ProbeError> {
        self.drain(&mut cx.ebpf, true)
    }

    fn snapshot(&mut self, cx: &mut Context, rec: &mut Recording) -> Result<(), ProbeError> {
        self.drain(&mut cx.ebpf, cx.window_end.is_none())?;
        let window = (cx.window_start, cx.now_or_end());
        let syscalls = self.table(&mut cx.ebpf, window, &cx.targets.live_pids(), &cx.targets.attached_pids())?;
        // Processes seen only through their syscalls (a fork event lost).
        for s in &syscalls {
            cx.targets.entry(s.pid, Origin::Followed);
        }
        rec.syscalls = syscalls;
        let pids = cx.targets.all_pids();
        let stacks = slow_syscall_stacks(cx, &pids)?;
        rec.stacks.extend(stacks);
        Ok(())
    }

    fn detach(&mut self, cx: &mut Context) {
        self.links.detach(&mut cx.ebpf);
    }

    fn status(&self) -> Option<String> {
        Some(format!("{} syscalls", self.total_calls()))
    }
}

/// Syscalls slower than `--slow-syscall`, by thread, syscall and stack.
fn slow_syscall_stacks(cx: &mut Context, target_pids: &[u32]) -> Result<Vec<StackRecord>, ProbeError> {
    let rows: Vec<(SlowKey, SlowStats)> = {
        let map: BpfHashMap<_, SlowKey, SlowStats> = crate::probe::hash_map(&mut cx.ebpf, "SLOW_SYSCALLS")?;
        map.iter().filter_map(Result::ok).collect()
    };
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
