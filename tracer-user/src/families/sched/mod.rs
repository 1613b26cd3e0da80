//! Wall-time accounting, user side: attaches the scheduler programs, seeds
//! the state of threads that exist when the window opens, and turns the
//! kernel aggregates into per-thread breakdowns, off-CPU stacks and
//! run-queue histograms.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    Ebpf,
};
use tracer_common::{
    cpu_samples::SampleKey,
    sched::{
        Charge, GilHolder, GilHolderKey, GilHolderTime, OffCpuKey, ReusedKey, RunqKey, ThreadState, EXEC_UNKNOWN, REASONS, REASON_GIL, REASON_IO, REASON_LOCK,
        REASON_MEM_COMPACTION, REASON_MEM_FAULT, REASON_MEM_RECLAIM, REASON_MEM_THROTTLE, REASON_OTHER, REASON_POLL,
        REASON_SLEEP, REASON_TABLE_SIZE, NO_STACK, STACK_COLLIDED, STATE_DEAD, STATE_OFF_CPU,
        STATE_RUNNABLE, STATE_RUNNING, STATE_UNKNOWN,
    },
    syscalls::HIST_BUCKETS,
};

pub use crate::engine::SchedOptions;
use crate::{
    engine::{Part, 
        programs::Links, Collector, Cx, Handle, ExitedThreads, FamilyTable, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec,
        TargetEvent,
    },
    os::probe::{self, ProbeError},
    os::procfs,
    recording::{Frame, FrameKind, GilHold, MemoryWaits, OffCpuReason, OffCpuTimes, Origin, Recording, StackKind, StackRecord, ThreadSyscall, ThreadTimes},
    system::syscall_name,
};

/// Syscalls whose blocking counts as I/O, lock, poll or sleep time; every
/// other blocking in a syscall (wait4, ...) is `other`, and a wait in a page
/// fault, reclaim or compaction is `memory` (the kernel decides, see
/// `MEMORY_WAIT_PROGRAMS`). docs/wall-time.md shows this table to users.
pub const CLASSIFICATION: &[(OffCpuReason, &[&str])] = &[
    (
        OffCpuReason::Io,
        &[
            "read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
            "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "sendfile", "splice", "tee",
            "vmsplice", "copy_file_range", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "connect", "open", "openat", "openat2", "io_getevents", "io_pgetevents", "io_uring_enter",
            "msync", "fallocate", "ioctl",
        ],
    ),
    (OffCpuReason::Lock, &["futex", "futex_waitv", "flock"]),
    (
        OffCpuReason::Poll,
        // accept waits for a peer to connect, like a poll on a listening socket.
        &["poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "epoll_pwait2", "accept", "accept4"],
    ),
    (OffCpuReason::Sleep, &["nanosleep", "clock_nanosleep", "pause", "rt_sigsuspend", "rt_sigtimedwait"]),
];

fn reason_code(r: OffCpuReason) -> u32 {
    match r {
        OffCpuReason::Other => REASON_OTHER,
        OffCpuReason::Io => REASON_IO,
        OffCpuReason::Lock => REASON_LOCK,
        OffCpuReason::Poll => REASON_POLL,
        OffCpuReason::Sleep => REASON_SLEEP,
        OffCpuReason::Gil => REASON_GIL,
        OffCpuReason::Memory => REASON_MEM_FAULT,
    }
}


/// The reason for blocking in syscall `nr` on `arch`.
pub fn classify(arch: &str, nr: u32) -> OffCpuReason {
    let name = syscall_name(arch, nr);
    CLASSIFICATION
        .iter()
        .find(|(_, names)| names.contains(&name.as_str()))
        .map(|(r, _)| *r)
        .unwrap_or(OffCpuReason::Other)
}

/// The state machine's programs.
const SCHED_PROGRAMS: [ProgramSpec; 3] = [
    ProgramSpec { name: "sched_switch", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_switch" } },
    ProgramSpec { name: "sched_wakeup", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_wakeup" } },
    ProgramSpec { name: "sched_wakeup_new", kind: ProgramKind::BtfTracePoint { tracepoint: "sched_wakeup_new" } },
];

/// Mark a thread inside reclaim or compaction, so that a wait that begins
/// there is a `memory` wait: they fire only when the kernel reclaims or
/// compacts for the thread (docs/memory.md). A kernel without them keeps
/// the page-fault waits.
const MEMORY_WAIT_PROGRAMS: [ProgramSpec; 6] = [
    ProgramSpec { name: "sched_mem_reclaim_begin", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_vmscan_direct_reclaim_begin" } },
    ProgramSpec { name: "sched_mem_reclaim_end", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_vmscan_direct_reclaim_end" } },
    ProgramSpec { name: "sched_memcg_reclaim_begin", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_vmscan_memcg_reclaim_begin" } },
    ProgramSpec { name: "sched_memcg_reclaim_end", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_vmscan_memcg_reclaim_end" } },
    ProgramSpec { name: "sched_mem_compaction_begin", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_compaction_begin" } },
    ProgramSpec { name: "sched_mem_compaction_end", kind: ProgramKind::BtfTracePoint { tracepoint: "mm_compaction_end" } },
];

/// Kernel functions whose frame under a wait outside any syscall makes it a
/// page-fault wait: the fault entry and its handler, per architecture.
fn fault_entry_functions() -> [&'static str; 2] {
    match std::env::consts::ARCH {
        "aarch64" => ["do_page_fault", "do_translation_fault"],
        _ => ["asm_exc_page_fault", "exc_page_fault"],
    }
}

/// Same for memory.high throttling on the way back to user mode (renamed in 6.x).
const THROTTLE_FUNCTIONS: [&str; 2] = ["__mem_cgroup_handle_over_high", "mem_cgroup_handle_over_high"];

/// The kernel text ranges of `MEM_FAULT_*` and `MEM_THROTTLE_*`, read once,
/// and kept for the boot (`os::boot_cache`: reading /proc/kallsyms is a
/// good part of the start-up's system time).
fn memory_wait_ranges() -> &'static [(u64, u64); 3] {
    static RANGES: std::sync::OnceLock<[(u64, u64); 3]> = std::sync::OnceLock::new();
    const KEPT: &str = "memory-wait-ranges";
    RANGES.get_or_init(|| {
        let [f1, f2] = fault_entry_functions();
        if let Some(r) = crate::os::boot_cache::load::<[(u64, u64); 3]>(KEPT) {
            return r;
        }
        let found = crate::os::kallsyms::ranges(&[f1, f2, THROTTLE_FUNCTIONS[0], THROTTLE_FUNCTIONS[1]]);
        let get = |n: &str| found.get(n).copied().unwrap_or((0, 0));
        let throttle = found.get(THROTTLE_FUNCTIONS[0]).or_else(|| found.get(THROTTLE_FUNCTIONS[1])).copied().unwrap_or((0, 0));
        let r = [get(f1), get(f2), throttle];
        // Addresses hidden from us (kptr_restrict) are not kept.
        if r.iter().all(|(start, end)| start < end) {
            crate::os::boot_cache::store(KEPT, &r);
        }
        r
    })
}

pub static TABLE: FamilyTable = FamilyTable {
    family: "sched",
    programs: &[
        SCHED_PROGRAMS[0],
        SCHED_PROGRAMS[1],
        SCHED_PROGRAMS[2],
        MEMORY_WAIT_PROGRAMS[0],
        MEMORY_WAIT_PROGRAMS[1],
        MEMORY_WAIT_PROGRAMS[2],
        MEMORY_WAIT_PROGRAMS[3],
        MEMORY_WAIT_PROGRAMS[4],
        MEMORY_WAIT_PROGRAMS[5],
    ],
    globals: &[
        GlobalSpec { name: "MEM_FAULT_START", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[0].0)) },
        GlobalSpec { name: "MEM_FAULT_END", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[0].1)) },
        GlobalSpec { name: "MEM_FAULT2_START", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[1].0)) },
        GlobalSpec { name: "MEM_FAULT2_END", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[1].1)) },
        GlobalSpec { name: "MEM_THROTTLE_START", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[2].0)) },
        GlobalSpec { name: "MEM_THROTTLE_END", value: |_| Ok(GlobalValue::U64(memory_wait_ranges()[2].1)) },
        GlobalSpec { name: "TASK_PID_OFFSET", value: |i| i.task_member("pid").map(GlobalValue::U64) },
        GlobalSpec { name: "TASK_TGID_OFFSET", value: |i| i.task_member("tgid").map(GlobalValue::U64) },
        GlobalSpec {
            // Optional: without it (0), missed switch-ins are not repaired.
            name: "TASK_EXEC_OFFSET",
            value: |i| {
                let o = &i.btf.offsets;
                Ok(GlobalValue::U64(match (o.member_offset("task_struct", "se"), o.member_offset("sched_entity", "sum_exec_runtime")) {
                    (Ok(se), Ok(sum)) => u64::from(se) + u64::from(sum),
                    _ => 0,
                }))
            },
        },
        GlobalSpec {
            name: "OFFCPU_STACKS_ENABLED",
            value: |i| Ok(GlobalValue::U32(u32::from(i.opts.sched.enabled && i.opts.sched.offcpu_stacks))),
        },
    ],
};

/// How often threads that exited are moved out of the kernel map.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// Wall time and off-CPU stacks (the scheduler programs capture both).
#[derive(Default)]
pub struct SchedCollector {
    links: Links,
    /// Exited threads that keep rows of their own (`crate::engine::ExitedThreads`),
    /// by verdict id: their final state.
    kept: HashMap<u64, ThreadState>,
    /// pid -> the exited threads folded into one row.
    folded: BTreeMap<u32, Folded>,
    /// Off-CPU time and CPU samples of the folded threads, moved out of the
    /// kernel maps (whose keys name threads: churn would fill them) and
    /// kept by stack, tid 0.
    folded_offcpu: HashMap<OffCpuKey, u64>,
    folded_samples: HashMap<SampleKey, u64>,
}

/// Exited threads of one process, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Folded {
    threads: u64,
    wall_ns: u64,
    on_cpu_ns: u64,
    runqueue_ns: u64,
    off_cpu_ns: [u64; REASONS],
    blocked_in_syscall_ns: u64,
}

impl Folded {
    fn add(&mut self, t: &ThreadState, end_ns: u64) {
        self.threads += 1;
        self.wall_ns = self.wall_ns.saturating_add(lifetime(t, end_ns));
        self.on_cpu_ns = self.on_cpu_ns.saturating_add(t.on_cpu_ns);
        self.runqueue_ns = self.runqueue_ns.saturating_add(t.runqueue_ns);
        for (a, b) in self.off_cpu_ns.iter_mut().zip(t.off_cpu_ns) {
            *a = a.saturating_add(b);
        }
        self.blocked_in_syscall_ns = self.blocked_in_syscall_ns.saturating_add(t.blocked_in_syscall_ns);
    }
}

/// The wall time of an exited thread inside the window ending at `end_ns`.
fn lifetime(t: &ThreadState, end_ns: u64) -> u64 {
    let end = if t.end_ns != 0 { t.end_ns.min(end_ns) } else { end_ns };
    end.saturating_sub(t.first_ns)
}

fn comm_of(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(16);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn off_cpu_times(off: &[u64; REASONS]) -> OffCpuTimes {
    let memory = MemoryWaits {
        page_fault_ns: off[REASON_MEM_FAULT as usize],
        reclaim_ns: off[REASON_MEM_RECLAIM as usize],
        compaction_ns: off[REASON_MEM_COMPACTION as usize],
        throttle_ns: off[REASON_MEM_THROTTLE as usize],
    };
    OffCpuTimes {
        other_ns: off[REASON_OTHER as usize],
        io_ns: off[REASON_IO as usize],
        lock_ns: off[REASON_LOCK as usize],
        poll_ns: off[REASON_POLL as usize],
        sleep_ns: off[REASON_SLEEP as usize],
        gil_ns: off[REASON_GIL as usize],
        memory_ns: memory.total(),
        memory,
    }
}

/// Records the state of every thread of `pid` at `now` (the window
/// start), so that time before the first scheduler event is classified.
/// Entries the kernel already created are left alone.
fn seed_process(ebpf: &mut Ebpf, pid: u32, now: u64) -> Result<(), ProbeError> {
    let mut threads: BpfHashMap<_, u32, ThreadState> = probe::hash_map(ebpf, tracer_common::maps::THREADS)?;
    for tid in procfs::thread_ids(pid) {
        let Some(state) = procfs::thread_state(pid, tid) else { continue };
        let exec_ns = procfs::thread_exec_ns(pid, tid).unwrap_or(EXEC_UNKNOWN);
        let mut t = ThreadState::new(pid, tid, STATE_UNKNOWN, now, exec_ns);
        if let Some(c) = procfs::thread_comm(pid, tid) {
            let n = c.len().min(15);
            t.comm[..n].copy_from_slice(&c.as_bytes()[..n]);
        }
        if state == 'R' {
            t.state = STATE_RUNNING;
        } else {
            t.state = STATE_OFF_CPU;
            if let Some(nr) = procfs::blocked_syscall(pid, tid) {
                t.reason = reason_code(classify(std::env::consts::ARCH, nr));
                t.in_syscall = 1;
            }
        }
        // BPF_NOEXIST: never overwrite what the kernel already knows.
        let _ = threads.insert(tid, t, 1);
    }
    Ok(())
}

/// Moves the threads that exited out of the kernel maps: the dead entries
/// of `THREADS` and the earlier lives of reused ids (`REUSED_THREADS`),
/// in the order they exited.
fn take_exited(ebpf: &mut Ebpf) -> Result<Vec<ThreadState>, ProbeError> {
    let mut exited = Vec::new();
    {
        let mut threads: BpfHashMap<_, u32, ThreadState> = probe::hash_map(ebpf, tracer_common::maps::THREADS)?;
        let dead: Vec<(u32, ThreadState)> =
            threads.iter().filter_map(Result::ok).filter(|(_, t)| t.state == STATE_DEAD).collect();
        for (tid, t) in dead {
            // Still that dead thread (a new thread may have taken the id
            // since, moving the dead one to REUSED_THREADS): delete it.
            if threads.get(&tid, 0).is_ok_and(|now| now.state == STATE_DEAD && now.first_ns == t.first_ns) {
                let _ = threads.remove(&tid);
                exited.push(t);
            }
        }
    }
    {
        let mut reused: BpfHashMap<_, ReusedKey, ThreadState> = probe::hash_map(ebpf, tracer_common::maps::REUSED_THREADS)?;
        let lives: Vec<(ReusedKey, ThreadState)> = reused.iter().filter_map(Result::ok).collect();
        for (k, t) in lives {
            let _ = reused.remove(&k);
            exited.push(t);
        }
    }
    exited.sort_by_key(|t| (t.end_ns, t.tid));
    Ok(exited)
}

impl SchedCollector {
    /// Moves exited threads out of the kernel maps (keeps them small) and
    /// applies the policy: a row of their own, or summed per process.
    fn drain(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        // Exited threads end at their exit; only the window's end clips
        // them (never "now": a thread may exit while the maps are read).
        let end = cx.window.end.unwrap_or(u64::MAX);
        let mut folded_now = HashSet::new();
        for t in take_exited(&mut cx.kernel.ebpf)? {
            folded_now.extend(self.retire(&mut cx.targets.exited, t, end));
        }
        if !folded_now.is_empty() {
            self.fold_stacks(&mut cx.kernel.ebpf, &folded_now)?;
        }
        Ok(())
    }

    /// One exited thread (ended by `end_ns` at the latest): kept, or summed
    /// into its process's row, as `policy` decides. Returns the (pid, tid)
    /// of the threads summed: itself, or a kept one it pushed out.
    fn retire(&mut self, policy: &mut ExitedThreads, t: ThreadState, end_ns: u64) -> Vec<(u32, u32)> {
        let mut summed = Vec::new();
        let (verdict, evicted) = policy.exited(t.pid, t.tid, lifetime(&t, end_ns));
        if verdict.keep {
            self.kept.insert(verdict.id, t);
        } else {
            self.folded.entry(t.pid).or_default().add(&t, end_ns);
            summed.push((t.pid, t.tid));
        }
        if let Some(k) = evicted.and_then(|e| self.kept.remove(&e.id)) {
            self.folded.entry(k.pid).or_default().add(&k, end_ns);
            summed.push((k.pid, k.tid));
        }
        summed
    }

    /// Moves the off-CPU and CPU-sample entries of the threads just summed
    /// out of the kernel maps, into the per-process sums (tid 0).
    fn fold_stacks(&mut self, ebpf: &mut Ebpf, summed: &HashSet<(u32, u32)>) -> Result<(), ProbeError> {
        let mut offcpu: BpfHashMap<_, OffCpuKey, u64> = probe::hash_map(ebpf, tracer_common::maps::OFFCPU_STACKS)?;
        let taken: Vec<(OffCpuKey, u64)> =
            offcpu.iter().filter_map(Result::ok).filter(|(k, _)| summed.contains(&(k.pid, k.tid))).collect();
        for (k, ns) in taken {
            let _ = offcpu.remove(&k);
            let v = self.folded_offcpu.entry(OffCpuKey { tid: 0, ..k }).or_default();
            *v = v.saturating_add(ns);
        }
        let mut samples: BpfHashMap<_, SampleKey, u64> = probe::hash_map(ebpf, tracer_common::maps::CPU_SAMPLES)?;
        let taken: Vec<(SampleKey, u64)> =
            samples.iter().filter_map(Result::ok).filter(|(k, _)| summed.contains(&(k.pid, k.tid))).collect();
        for (k, n) in taken {
            let _ = samples.remove(&k);
            let v = self.folded_samples.entry(SampleKey { tid: 0, ..k }).or_default();
            *v = v.saturating_add(n);
        }
        Ok(())
    }

    /// The per-thread breakdown up to `end_ns`; `syscalls` gives each
    /// thread's syscall time (for `syscall_ns`). Also returns the off-CPU
    /// intervals still open at `end_ns`, for the stacks. Exited threads
    /// are those drained by the polls (the last one runs after the window
    /// closed), so that the thread and syscall tables keep and fold the
    /// same threads.
    fn threads(
        &mut self,
        ebpf: &mut Ebpf,
        end_ns: u64,
        target_pids: &[u32],
        syscalls: &[ThreadSyscall],
    ) -> Result<(Vec<ThreadTimes>, HashMap<OffCpuKey, u64>), ProbeError> {
        let mut states: Vec<ThreadState> = self.kept.values().copied().collect();
        {
            let threads: BpfHashMap<_, u32, ThreadState> = probe::hash_map(ebpf, tracer_common::maps::THREADS)?;
            states.extend(threads.iter().filter_map(Result::ok).map(|(_, t)| t));
        }
        let mut open_offcpu: HashMap<OffCpuKey, u64> = HashMap::new();
        let mut syscall_time: HashMap<(u32, u32), u64> = HashMap::new();
        for s in syscalls {
            let v = syscall_time.entry((s.pid, s.tid)).or_default();
            *v = v.saturating_add(s.total_ns);
        }
        let mut threads = Vec::new();
        // A thread born after the end (while the programs were being
        // detached) is not in the window.
        for mut t in states.into_iter().filter(|t| target_pids.contains(&t.pid) && t.first_ns < end_ns) {
            let end = if t.state == STATE_DEAD && t.end_ns != 0 { t.end_ns.min(end_ns) } else { end_ns };
            let mut open = end.saturating_sub(t.since_ns);
            if t.waiting() {
                // Still waiting at the end, or running since a switch-in the
                // tracepoint never reported: the scheduler's CPU-time counter
                // (read just after the window) tells.
                let now_exec = procfs::thread_exec_ns(t.pid, t.tid).unwrap_or(EXEC_UNKNOWN);
                open = t.take_missed_run(open, now_exec);
            }
            // The interval still open, counted as the kernel counts the
            // intervals that end (`ThreadState::charge`).
            if t.charge(open) == Charge::OffCpu {
                *open_offcpu.entry(t.offcpu_key()).or_default() += open;
            }
            let sys_total = syscall_time.get(&(t.pid, t.tid)).copied().unwrap_or(0);
            // A live thread's current name; the kernel's copy (from its last
            // switch-out) for the others.
            let comm = match procfs::thread_comm(t.pid, t.tid) {
                Some(c) if t.state != STATE_DEAD => c,
                _ => comm_of(&t.comm),
            };
            threads.push(ThreadTimes {
                pid: t.pid,
                tid: t.tid,
                comm,
                wall_ns: end.saturating_sub(t.first_ns),
                on_cpu_ns: t.on_cpu_ns,
                syscall_ns: sys_total.saturating_sub(t.blocked_in_syscall_ns).min(t.on_cpu_ns),
                off_cpu: off_cpu_times(&t.off_cpu_ns),
                runqueue_ns: t.runqueue_ns,
                aggregated_threads: 0,
            });
        }
        for (&pid, f) in self.folded.iter().filter(|(pid, _)| target_pids.contains(pid)) {
            let sys_total = syscall_time.get(&(pid, 0)).copied().unwrap_or(0);
            threads.push(ThreadTimes {
                pid,
                tid: 0,
                comm: EXITED_THREADS_COMM.to_owned(),
                wall_ns: f.wall_ns,
                on_cpu_ns: f.on_cpu_ns,
                syscall_ns: sys_total.saturating_sub(f.blocked_in_syscall_ns).min(f.on_cpu_ns),
                off_cpu: off_cpu_times(&f.off_cpu_ns),
                runqueue_ns: f.runqueue_ns,
                aggregated_threads: f.threads,
            });
        }
        threads.sort_by_key(|t| (t.pid, t.tid == 0, t.tid));
        Ok((threads, open_offcpu))
    }
}

/// `comm` of the row that sums a process's folded exited threads.
pub const EXITED_THREADS_COMM: &str = "(exited threads)";

/// Off-CPU stacks: the kernel's aggregates plus the intervals still open.
fn offcpu_stacks(cx: &mut Cx<'_>, target_pids: &[u32], mut offcpu: HashMap<OffCpuKey, u64>) -> Result<Vec<StackRecord>, ProbeError> {
    {
        let map: BpfHashMap<_, OffCpuKey, u64> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::OFFCPU_STACKS)?;
        for (k, ns) in map.iter().filter_map(Result::ok) {
            *offcpu.entry(k).or_default() += ns;
        }
    }
    let mut out = Vec::new();
    for (k, ns) in offcpu {
        if !target_pids.contains(&k.pid) || ns == 0 {
            continue;
        }
        let reason = OffCpuReason::from_code(k.reason);
        out.push(StackRecord {
            kind: if reason == OffCpuReason::Gil { StackKind::Gil } else { StackKind::OffCpu },
            reason: Some(reason),
            pid: k.pid,
            tid: k.tid,
            samples: 0,
            weight_ns: ns,
            syscall: None,
            frames: cx.frames(k.pid, k.user_stack, k.kernel_stack, k.py_stack)?,
        });
    }
    Ok(out)
}

/// GIL waits by holder (the kernel's `GIL_HOLDERS`), with the holder's
/// stack resolved, largest first.
fn gil_holders(cx: &mut Cx<'_>, target_pids: &[u32]) -> Result<Vec<GilHold>, ProbeError> {
    let rows: Vec<(GilHolderKey, GilHolderTime)> = {
        let map: BpfHashMap<_, GilHolderKey, GilHolderTime> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::GIL_HOLDERS)?;
        map.iter().filter_map(Result::ok).filter(|(k, v)| target_pids.contains(&k.pid) && v.ns > 0).collect()
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let h = k.holder;
        let holder_state = match h.state {
            STATE_RUNNING => "running",
            STATE_RUNNABLE => "runnable",
            STATE_OFF_CPU => "blocked",
            _ => "unknown",
        };
        out.push(GilHold {
            pid: k.pid,
            tid: k.tid,
            holder_tid: h.tid,
            holder_state: holder_state.to_owned(),
            syscall: (h.nr != u32::MAX && h.state == STATE_OFF_CPU).then(|| syscall_name(std::env::consts::ARCH, h.nr)),
            frames: if h.tid == 0 { Vec::new() } else { holder_frames(cx, k.pid, &h)? },
            wait_ns: v.ns,
            waits: v.waits,
        });
    }
    out.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then((a.pid, a.tid, a.holder_tid).cmp(&(b.pid, b.tid, b.holder_tid))));
    Ok(out)
}

/// A GIL holder's stack. A blocked holder whose native stack the kernel
/// could not store keeps the `[stack lost]` frame under its Python frames:
/// blocked with the GIL held, it is in native code (CPython releases the
/// GIL around its own blocking calls), and that is what the verdict says.
fn holder_frames(cx: &mut Cx<'_>, pid: u32, h: &GilHolder) -> Result<Vec<Frame>, ProbeError> {
    let frames = cx.frames(pid, h.user_stack, NO_STACK, h.py_stack)?;
    Ok(keep_lost_native(frames, h))
}

/// [`holder_frames`]' rule, on frames already resolved.
fn keep_lost_native(mut frames: Vec<Frame>, h: &GilHolder) -> Vec<Frame> {
    if h.user_stack == STACK_COLLIDED && h.state == STATE_OFF_CPU && !frames.iter().any(|f| f.kind == FrameKind::Native) {
        frames.insert(0, crate::engine::stacks::stack_lost(FrameKind::Native));
    }
    frames
}

fn runqueue_hist(ebpf: &mut Ebpf, target_pids: &[u32]) -> Result<BTreeMap<u32, Vec<u64>>, ProbeError> {
    let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let hist: BpfHashMap<_, RunqKey, u64> = probe::hash_map(ebpf, tracer_common::maps::RUNQ_HIST)?;
    for (k, n) in hist.iter().filter_map(Result::ok) {
        if target_pids.contains(&k.pid) {
            let h = out.entry(k.pid).or_insert_with(|| vec![0; HIST_BUCKETS]);
            if let Some(b) = h.get_mut(k.bucket as usize) {
                *b += n;
            }
        }
    }
    Ok(out)
}

impl Collector for SchedCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Window, Handle::Targets, Handle::Stacks]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Threads, Part::Stacks]
    }

    /// Reads them: wall time splits each thread's on-CPU time with its syscall time.
    fn needs(&self) -> &'static [Part] {
        &[Part::Syscalls]
    }

    fn name(&self) -> &'static str {
        "sched"
    }

    fn forget(&mut self, cx: &mut Cx<'_>, pids: &std::collections::HashSet<u32>) {
        // Their run-queue histograms leave the kernel map (it would fill).
        if let Ok(mut hist) = probe::hash_map::<RunqKey, u64>(&mut cx.kernel.ebpf, tracer_common::maps::RUNQ_HIST) {
            let gone: Vec<RunqKey> = hist.keys().filter_map(Result::ok).filter(|k| pids.contains(&k.pid)).collect();
            for k in gone {
                let _ = hist.remove(&k);
            }
        }
        self.kept.retain(|_, t| !pids.contains(&t.pid));
        self.folded.retain(|pid, _| !pids.contains(pid));
        self.folded_offcpu.retain(|k, _| !pids.contains(&k.pid));
        self.folded_samples.retain(|k, _| !pids.contains(&k.pid));
    }

    /// Fills the classification table and attaches the scheduler programs.
    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        {
            let map = cx.kernel.ebpf.map_mut(tracer_common::maps::REASON_OF_NR).ok_or(ProbeError::MissingMap(tracer_common::maps::REASON_OF_NR))?;
            let mut table: Array<&mut MapData, u32> = Array::try_from(map).map_err(|e| ProbeError::map(tracer_common::maps::REASON_OF_NR, e))?;
            for nr in 0..REASON_TABLE_SIZE {
                let r = classify(std::env::consts::ARCH, nr);
                if r != OffCpuReason::Other {
                    table.set(nr, reason_code(r), 0).map_err(|e| ProbeError::map(tracer_common::maps::REASON_OF_NR, e))?;
                }
            }
        }
        let (sched, memory_waits) = TABLE.programs.split_at(SCHED_PROGRAMS.len());
        for spec in sched {
            self.links.attach(&mut cx.kernel, spec)?;
        }
        // Memory waits are a refinement: a kernel without these tracepoints
        // (or without kernel symbols) counts such waits as `other`, noted.
        // Per (begin, end) pair, the end first: a begin without its end
        // would mark the thread for good.
        for pair in memory_waits.chunks(2) {
            let attached = self.links.attach(&mut cx.kernel, &pair[1]).and_then(|()| self.links.attach(&mut cx.kernel, &pair[0]));
            if let Err(e) = attached {
                cx.sink.note(format!("some waits in reclaim or compaction count as `other`, not `memory`: attaching {} failed: {e}", pair[0].name));
            }
        }
        if memory_wait_ranges()[0].1 == 0 && memory_wait_ranges()[1].1 == 0 {
            cx.sink.note("waits in page faults count as `other`, not `memory`: the page-fault entry is not in /proc/kallsyms (kernel symbols hidden?)");
        }
        Ok(())
    }

    fn target(&mut self, cx: &mut Cx<'_>, ev: &TargetEvent) -> Result<(), ProbeError> {
        if let TargetEvent::Appeared { pid, origin: Origin::Attached } = ev {
            seed_process(&mut cx.kernel.ebpf, *pid, cx.window.start)?;
        }
        Ok(())
    }

    fn poll_every(&self) -> Duration {
        DRAIN_EVERY
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        self.drain(cx)
    }

    /// Needs `rec.syscalls` (the syscall collector's snapshot runs first).
    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        let pids = cx.targets.all_pids();
        let end = cx.window.now_or_end();
        let (threads, open) = self.threads(&mut cx.kernel.ebpf, end, &pids, &rec.syscalls)?;
        rec.threads = threads;
        if cx.counts_only {
            return Ok(());
        }
        let mut offcpu = open;
        for (k, ns) in &self.folded_offcpu {
            *offcpu.entry(*k).or_default() += ns;
        }
        rec.stacks.extend(offcpu_stacks(cx, &pids, offcpu)?);
        // CPU samples of summed threads (the CPU-sample collector reads
        // those still in the kernel map).
        for (k, n) in self.folded_samples.iter().filter(|(k, _)| pids.contains(&k.pid)) {
            rec.stacks.push(StackRecord {
                kind: StackKind::Cpu,
                reason: None,
                pid: k.pid,
                tid: 0,
                samples: *n,
                weight_ns: 0,
                syscall: None,
                frames: cx.frames(k.pid, k.user_stack, k.kernel_stack, k.py_stack)?,
            });
        }
        rec.runqueue_hist = runqueue_hist(&mut cx.kernel.ebpf, &pids)?;
        rec.gil_holders = gil_holders(cx, &pids)?;
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        self.links.detach(&mut cx.kernel.ebpf);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_blocked_gil_holder_keeps_its_lost_native_stack_and_only_it() {
        use crate::recording::STACK_LOST;
        let py = vec![Frame { function: "holder".into(), file: Some("h.py".into()), line: Some(3), kind: FrameKind::Python, module: None }];
        let holder = |user_stack, state| GilHolder { tid: 2, state, nr: 230, user_stack, py_stack: 1 };
        let kept = keep_lost_native(py.clone(), &holder(STACK_COLLIDED, STATE_OFF_CPU));
        assert_eq!((kept.len(), kept[0].function.as_str(), kept[0].kind), (2, STACK_LOST, FrameKind::Native));
        // Running, or with no native stack taken at all: as resolved.
        assert_eq!(keep_lost_native(py.clone(), &holder(STACK_COLLIDED, STATE_RUNNING)), py);
        assert_eq!(keep_lost_native(py.clone(), &holder(NO_STACK, STATE_OFF_CPU)), py);
    }

    use super::*;

    /// An exited thread of pid 1: alive from `first` to `end`, on CPU
    /// `on` of it, off CPU (sleep) the rest.
    fn exited(tid: u32, first: u64, end: u64, on: u64) -> ThreadState {
        let mut t = ThreadState { pid: 1, tid, state: STATE_DEAD, first_ns: first, since_ns: end, end_ns: end, on_cpu_ns: on, ..Default::default() };
        t.off_cpu_ns[REASON_SLEEP as usize] = end - first - on;
        t
    }

    /// Two lives of one thread id are two threads: each decided and
    /// accounted on its own; the summed row adds up like the others.
    #[test]
    fn reused_ids_and_summed_threads_add_up() {
        let mut policy = ExitedThreads::new(2);
        let mut c = SchedCollector::default();
        // tid 7 lives twice (100 ns, then 1000 ns); tids 8 and 9 are short.
        c.retire(&mut policy, exited(7, 0, 100, 40), 10_000);
        c.retire(&mut policy, exited(8, 50, 80, 10), 10_000);
        c.retire(&mut policy, exited(7, 200, 1_200, 300), 10_000);
        c.retire(&mut policy, exited(9, 300, 310, 5), 10_000);
        // Kept: the 1000 ns and 100 ns lives of tid 7; summed: 8 and 9.
        let mut kept: Vec<(u32, u64)> = c.kept.values().map(|t| (t.tid, lifetime(t, u64::MAX))).collect();
        kept.sort();
        assert_eq!(kept, [(7, 100), (7, 1_000)]);
        let f = c.folded[&1];
        assert_eq!((f.threads, f.wall_ns, f.on_cpu_ns), (2, 40, 15));
        assert_eq!(f.on_cpu_ns + f.off_cpu_ns.iter().sum::<u64>() + f.runqueue_ns, f.wall_ns);
        // A third, longer life pushes the 100 ns one into the sum.
        c.retire(&mut policy, exited(7, 2_000, 2_500, 100), 10_000);
        let f = c.folded[&1];
        assert_eq!((f.threads, f.wall_ns, f.on_cpu_ns), (3, 140, 55));
        assert_eq!(policy.folded(1), 3);
        // Clipped to the window's end: a thread cannot outlive it.
        c.retire(&mut policy, exited(9, 9_000, 12_000, 0), 10_000);
        assert_eq!(c.kept.values().map(|t| lifetime(t, 10_000)).max(), Some(1_000));
    }

    #[test]
    fn classification() {
        assert_eq!(classify("x86_64", 0), OffCpuReason::Io); // read
        assert_eq!(classify("x86_64", 202), OffCpuReason::Lock); // futex
        assert_eq!(classify("x86_64", 232), OffCpuReason::Poll); // epoll_wait
        assert_eq!(classify("x86_64", 230), OffCpuReason::Sleep); // clock_nanosleep
        assert_eq!(classify("x86_64", 61), OffCpuReason::Other); // wait4
    }
}
