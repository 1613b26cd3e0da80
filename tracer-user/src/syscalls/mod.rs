//! Syscall accounting, user side: attaches the `sys_enter`/`sys_exit`
//! programs, drains the in-kernel aggregates periodically (retiring threads
//! that exited so the maps stay small) and closes the window at the end,
//! accounting the calls still in flight.

use std::collections::{BTreeMap, HashMap, HashSet};

use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::BtfTracePoint,
    Btf, Ebpf,
};
use tracer_common::{
    python::{SlowKey, SlowStats},
    syscalls::{hist_bucket, ErrnoKey, SyscallKey, SyscallStart, SyscallStats},
};

use crate::{
    probe::ProbeError,
    procfs,
    recording::{StackKind, StackRecord, ThreadSyscall},
    stacks::StackResolver,
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

/// The syscall probe family.
pub struct SyscallAccounting {
    links: Vec<(&'static str, aya::programs::tp_btf::BtfTracePointLinkId)>,
    /// Threads that exited: final values, removed from the kernel maps.
    retired: HashMap<Key, Acc>,
    /// Latest snapshot of live threads.
    live: HashMap<Key, Acc>,
}

/// Program name and the BTF tracepoint it attaches to.
const PROGRAMS: [(&str, &str); 2] = [("sys_enter", "sys_enter"), ("sys_exit", "sys_exit")];

fn stats_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, SyscallKey, SyscallStats>, ProbeError> {
    crate::probe::hash_map(ebpf, "SYSCALL_STATS")
}

impl SyscallAccounting {
    pub fn attach(ebpf: &mut Ebpf, btf: &Btf) -> Result<Self, ProbeError> {
        let mut links = Vec::new();
        for (name, tracepoint) in PROGRAMS {
            let prog: &mut BtfTracePoint = crate::probe::program(ebpf, name)?;
            prog.load(tracepoint, btf).map_err(|e| ProbeError::load(name, e))?;
            links.push((name, prog.attach().map_err(|e| ProbeError::attach(name, e))?));
        }
        Ok(Self { links, retired: HashMap::new(), live: HashMap::new() })
    }

    /// Detaches both programs; the maps stay readable.
    pub fn detach(&mut self, ebpf: &mut Ebpf) {
        for (name, link) in self.links.drain(..) {
            if let Ok(prog) = crate::probe::program::<BtfTracePoint>(ebpf, name) {
                let _ = prog.detach(link);
            }
        }
    }

    /// Total calls counted so far (for the status line).
    pub fn total_calls(&self) -> u64 {
        self.retired.values().chain(self.live.values()).map(|a| a.stats.count).sum()
    }

    /// Copies the kernel aggregates; threads that exited are moved to the
    /// retired set and their entries deleted from the kernel maps.
    pub fn drain(&mut self, ebpf: &mut Ebpf, retire_dead: bool) -> Result<(), ProbeError> {
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

    /// Closes the window at `end_ns` (CLOCK_MONOTONIC): a final drain after
    /// the programs were detached, then the calls still in flight are
    /// accounted up to the end: those entered inside the window and, for
    /// attached processes, those of
    /// threads blocked in one syscall for the whole window (from
    /// /proc/PID/task/TID/syscall).
    pub fn finish(
        mut self,
        ebpf: &mut Ebpf,
        window: (u64, u64),
        live_pids: &[u32],
        attached_pids: &[u32],
    ) -> Result<Vec<ThreadSyscall>, ProbeError> {
        let (start_ns, end_ns) = window;
        self.detach(ebpf);
        self.drain(ebpf, false)?;
        let mut all = std::mem::take(&mut self.retired);
        for (k, v) in self.live.drain() {
            all.entry(k).or_default().merge(&v);
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

/// Syscalls slower than `--slow-syscall`, by thread, syscall and stack.
pub fn slow_syscall_stacks(
    ebpf: &mut Ebpf,
    arch: &str,
    target_pids: &[u32],
    resolver: &mut StackResolver<'_>,
) -> Result<Vec<StackRecord>, ProbeError> {
    let rows: Vec<(SlowKey, SlowStats)> = {
        let map: BpfHashMap<_, SlowKey, SlowStats> = crate::probe::hash_map(ebpf, "SLOW_SYSCALLS")?;
        map.iter().filter_map(Result::ok).collect()
    };
    let mut out: Vec<StackRecord> = rows
        .into_iter()
        .filter(|(k, _)| target_pids.contains(&k.pid))
        .map(|(k, v)| StackRecord {
            kind: StackKind::Syscall,
            reason: None,
            pid: k.pid,
            tid: k.tid,
            samples: v.count,
            weight_ns: v.total_ns,
            syscall: Some(syscall_name(arch, k.nr)),
            frames: resolver.frames(k.pid, k.user_stack, -1, k.py_stack),
        })
        .collect();
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
