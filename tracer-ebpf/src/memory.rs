//! Resident memory: the `kmem/rss_stat` tracepoint (every change of a
//! process's `MM_*` counters) keeps each target's counters in the kernel,
//! sends a point of its series only when its resident size moved by
//! `SERIES_BYTES` or `SERIES_NS` passed (no per-page event reaches
//! userspace), and samples the stack of the thread that made it grow (or
//! shrink) by another `MEM_GROWTH_SAMPLE_BYTES`, weighted by those bytes.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, RingBuf},
    programs::TracePointContext,
};
use tracer_common::{
    counters,
    memory::{GrowthKey, GrowthStats, MemSample, MemState, OomKill, MEMBERS, MEMBER_SWAP, SERIES_BYTES, SERIES_NS},
};

use crate::{count_drop, global, is_target, python, user_stack_id};

/// Per target process: its counters (`tracer_common::memory::MemState`).
#[map]
pub static MEM_STATE: HashMap<u32, MemState> = HashMap::with_max_entries(4096, 0);

/// `rss_stat`'s `mm_id` (a hash of the mm) -> the process it belongs to,
/// learned from the events a process's own threads cause: what names the
/// events caused by others (reclaim, a process's exit).
#[map]
pub static MEM_MM: LruHashMap<u32, u32> = LruHashMap::with_max_entries(8192, 0);

#[map]
pub static MEM_SAMPLES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Growth and release per (process, stack), in bytes.
#[map]
pub static MEM_GROWTH: HashMap<GrowthKey, GrowthStats> = HashMap::with_max_entries(16384, 0);

/// Per target process the OOM killer chose: when, and what it held.
#[map]
pub static MEM_OOM: HashMap<u32, OomKill> = HashMap::with_max_entries(1024, 0);

/// Field offsets in the `oom/mark_victim` record, from tracefs before load.
#[unsafe(no_mangle)]
static OOM_PID_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static OOM_ANON_OFFSET: u32 = 24;
#[unsafe(no_mangle)]
static OOM_FILE_OFFSET: u32 = 32;
#[unsafe(no_mangle)]
static OOM_SHMEM_OFFSET: u32 = 40;

/// The OOM killer chose a victim (a global or a memory cgroup's OOM).
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn mem_oom_victim(ctx: TracePointContext) -> u32 {
    // SAFETY: reads of the tracepoint's record at offsets tracefs gave.
    let pid = unsafe { ctx.read_at::<i32>(global(&OOM_PID_OFFSET) as usize) }.unwrap_or(0);
    if pid <= 0 || !is_target(pid as u32) {
        return 0;
    }
    let read = |off: &u32| unsafe { ctx.read_at::<u64>(global(off) as usize) }.unwrap_or(0);
    let kill = OomKill {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        anon_kb: read(&OOM_ANON_OFFSET),
        file_kb: read(&OOM_FILE_OFFSET),
        shmem_kb: read(&OOM_SHMEM_OFFSET),
    };
    if MEM_OOM.insert(&(pid as u32), &kill, 0).is_err() {
        count_drop(counters::MEM_LOST);
    }
    0
}

/// Field offsets in the `kmem/rss_stat` record, from tracefs before load.
#[unsafe(no_mangle)]
static RSS_MM_ID_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static RSS_CURR_OFFSET: u32 = 12;
#[unsafe(no_mangle)]
static RSS_MEMBER_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static RSS_SIZE_OFFSET: u32 = 24;
/// Bytes of growth (or release) between two stack samples of a process.
#[unsafe(no_mangle)]
static MEM_GROWTH_SAMPLE_BYTES: u64 = tracer_common::memory::GROWTH_SAMPLE_BYTES;

static STATE_ZERO: MemState = unsafe { core::mem::zeroed() };

/// Counters whose first value a series point waits for: file and anon
/// (every process has both; shmem and swap may never change).
const RSS_SEEN: u32 = 1 << tracer_common::memory::MEMBER_FILE | 1 << tracer_common::memory::MEMBER_ANON;

/// Fires at every change of any process's memory counters (each page
/// fault of the machine): a non-target's own event costs one `TARGETS`
/// lookup, another task's (reclaim) one `MEM_MM` lookup.
#[tracepoint(category = "kmem", name = "rss_stat")]
pub fn mem_rss_stat(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: reads of the tracepoint's record at offsets tracefs gave.
    let curr = unsafe { ctx.read_at::<u32>(global(&RSS_CURR_OFFSET) as usize) }.unwrap_or(0);
    let own = curr != 0;
    if own && !is_target(tgid) {
        return 0;
    }
    let mm_id = unsafe { ctx.read_at::<u32>(global(&RSS_MM_ID_OFFSET) as usize) }.unwrap_or(0);
    let pid = if own {
        tgid
    } else {
        // Another task on this mm: a target's only when the mm is known.
        match unsafe { MEM_MM.get(&mm_id) } {
            Some(p) => *p,
            None => return 0,
        }
    };
    if !own && (tgid == pid || !is_target(pid)) {
        // tgid == pid: the process's own thread on an mm that is no longer
        // its current one, its exit tearing the memory down: the series
        // keeps what it held before.
        return 0;
    }
    let (member, size) = unsafe {
        (
            ctx.read_at::<i32>(global(&RSS_MEMBER_OFFSET) as usize).unwrap_or(-1),
            ctx.read_at::<i64>(global(&RSS_SIZE_OFFSET) as usize).unwrap_or(0),
        )
    };
    if member < 0 || member as usize >= MEMBERS {
        return 0;
    }
    let member = member as usize & (MEMBERS - 1);
    let size = if size > 0 { size as u64 } else { 0 };
    let Some(st) = state(pid) else { return 0 };
    // SAFETY: a map value; a process's threads share it: a lost update is
    // a counter set again by its next event (or, for `events`, one event).
    let st = unsafe { &mut *st };
    st.events += 1;
    if st.mm_id != mm_id {
        if !own {
            return 0;
        }
        // A new program (exec), or the first event: its counters start
        // over, and the mm is the process's from now on.
        let _ = MEM_MM.insert(&mm_id, &pid, 0);
        st.cur = [0; MEMBERS];
        st.seen = 0;
        st.peak = 0;
        st.grown = 0;
        st.released = 0;
        st.mm_id = mm_id;
    }
    let bit = 1u32 << member;
    let old = st.cur[member];
    st.cur[member] = size;
    let first = st.seen & bit == 0;
    st.seen |= bit;
    if st.seen & RSS_SEEN != RSS_SEEN {
        // Not all of the resident size is known yet (just after an exec).
        return 0;
    }
    let rss = st.cur[0] + st.cur[1] + st.cur[3];
    if rss > st.peak {
        st.peak = rss;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if own && !first && member != MEMBER_SWAP {
        let step = global(&MEM_GROWTH_SAMPLE_BYTES);
        if size > old {
            st.grown += size - old;
            if st.grown >= step {
                let grown = st.grown;
                st.grown = 0;
                sample_stack(&ctx, pid, pid_tgid as u32, grown, 0);
            }
        } else {
            st.released += old - size;
            if st.released >= step {
                let released = st.released;
                st.released = 0;
                sample_stack(&ctx, pid, pid_tgid as u32, 0, released);
            }
        }
    }
    let moved = if rss > st.last_rss { rss - st.last_rss } else { st.last_rss - rss };
    if moved >= SERIES_BYTES || (moved > 0 && now.saturating_sub(st.last_ns) >= SERIES_NS) {
        st.last_rss = rss;
        st.last_ns = now;
        send(pid, now, st);
    }
    0
}

/// The process's state, created empty on its first event.
#[inline(always)]
fn state(pid: u32) -> Option<*mut MemState> {
    if let Some(p) = MEM_STATE.get_ptr_mut(&pid) {
        return Some(p);
    }
    if MEM_STATE.insert(&pid, &STATE_ZERO, 0).is_err() {
        count_drop(counters::MEM_LOST);
        return None;
    }
    MEM_STATE.get_ptr_mut(&pid)
}

/// One series point.
#[inline(never)]
fn send(pid: u32, now: u64, st: &MemState) {
    let Some(mut entry) = MEM_SAMPLES.reserve::<MemSample>(0) else {
        count_drop(counters::MEM_LOST);
        return;
    };
    entry.write(MemSample { pid, _pad: 0, ts_ns: now, cur: st.cur, peak: st.peak });
    entry.submit(0);
}

/// The stack of thread `tid` stands for `grown` (or `released`) bytes.
#[inline(never)]
fn sample_stack(ctx: &TracePointContext, pid: u32, tid: u32, grown: u64, released: u64) {
    let py_stack = python::capture_reusing(pid, tid, python::SCRATCH_MEMORY);
    let user_stack = if py_stack == 0 { user_stack_id(ctx) } else { -1 };
    let key = GrowthKey { pid, user_stack, py_stack };
    match MEM_GROWTH.get_ptr_mut(&key) {
        // SAFETY: a map value; threads of one process may share a stack: a
        // lost update is one sample's bytes.
        Some(p) => unsafe {
            (*p).grown += grown;
            (*p).released += released;
            (*p).samples += 1;
        },
        None => {
            let v = GrowthStats { grown, released, samples: 1 };
            if MEM_GROWTH.insert(&key, &v, 0).is_err() {
                count_drop(counters::MEM_LOST);
            }
        }
    }
}
