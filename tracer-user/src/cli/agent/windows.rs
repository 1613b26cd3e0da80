//! Rolling windows: each window's recording is the difference between two
//! cumulative snapshots of the same collectors (the one at the window's end
//! minus the one at its start), so the windows add up exactly to what one
//! long recording would hold: a syscall is counted in exactly one window.
//!
//! Rows of threads that exited may move between snapshots into their
//! process's summed row (tid 0, `aggregated_threads`): a row that vanished
//! gives a negative difference, which is taken from the summed row of the
//! same process (and syscall), where its counts went; sums per process stay
//! exact.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::{OsStr, OsString},
    fs,
    io::{self, Write as _},
    path::PathBuf,
    sync::Mutex,
};

use crate::recording::{
    safe_write::{self, Dir, Place},
    GilHold, Recording, RecordingError, StackRecord, ThreadSyscall, ThreadTimes,
};

/// What the next window's difference needs of a cumulative snapshot: the
/// snapshot without its stacks, and each stack's counts by its identity
/// (a 128-bit hash of what tells stacks apart). Holding the frames of every
/// stack twice (the last snapshot's and the new one's) was most of the
/// agent's memory under many targets.
#[derive(Debug)]
pub struct Baseline {
    /// The cumulative snapshot, stacks taken out.
    pub rec: Recording,
    stacks: HashMap<StackId, (u64, u64)>,
}

/// A stack's identity: kind, reason, thread, syscall and frames, hashed.
type StackId = u128;

fn stack_id(s: &StackRecord) -> StackId {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        (s.kind, s.reason, s.pid, s.tid, &s.syscall, &s.frames).hash(&mut h);
        h.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// The window between the baseline `prev` and the cumulative snapshot
/// `cur` (`prev` None: the first window, which is `cur` itself), and the
/// baseline for the next window. `cur`'s stacks move into the window: the
/// frames are never copied.
pub fn delta(mut cur: Recording, prev: Option<&Baseline>) -> (Recording, Baseline) {
    let stacks = std::mem::take(&mut cur.stacks);
    let ids: Vec<StackId> = stacks.iter().map(stack_id).collect();
    let mut next = Baseline {
        stacks: ids.iter().zip(&stacks).map(|(id, s)| (*id, (s.samples, s.weight_ns))).collect(),
        rec: cur,
    };
    let Some(prev) = prev else {
        let mut out = next.rec.clone();
        out.stacks = stacks;
        return (out, next);
    };
    let mut out = without_tables(&mut next.rec);
    let (cur, prev_rec) = (&next.rec, &prev.rec);
    out.started_unix_ms = cur.started_unix_ms + prev_rec.duration_ns / 1_000_000;
    out.duration_ns = cur.duration_ns.saturating_sub(prev_rec.duration_ns);
    out.syscalls = syscalls_delta(&cur.syscalls, &prev_rec.syscalls);
    out.threads = threads_delta(&cur.threads, &prev_rec.threads);
    out.stacks = stacks_delta(stacks, &ids, &prev.stacks);
    out.runqueue_hist = cur
        .runqueue_hist
        .iter()
        .map(|(pid, h)| {
            let p = prev_rec.runqueue_hist.get(pid);
            let d = h.iter().enumerate().map(|(i, v)| v.saturating_sub(p.and_then(|p| p.get(i)).copied().unwrap_or(0))).collect();
            (*pid, d)
        })
        .collect();
    out.lost = cur
        .lost
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(prev_rec.lost.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect();
    out.cuda = cur.cuda.as_ref().map(|c| super::cuda_delta::cuda_delta(c, prev_rec.cuda.as_ref(), prev_rec.duration_ns));
    out.memory = cur.memory.as_ref().map(|m| super::memory_delta::memory_delta(m, prev_rec.memory.as_ref(), prev_rec.duration_ns));
    out.gil_holders = gil_holders_delta(&cur.gil_holders, &prev_rec.gil_holders);
    // The targets active in this window, and those that appeared in it.
    let active: std::collections::HashSet<u32> =
        out.syscalls.iter().map(|s| s.pid).chain(out.threads.iter().map(|t| t.pid)).collect();
    let before: std::collections::HashSet<u32> = prev_rec.targets.iter().map(|t| t.pid).collect();
    out.targets.retain(|t| active.contains(&t.pid) || !before.contains(&t.pid));
    (out, next)
}

/// A copy of `rec` without the tables a window computes from two
/// snapshots (left empty, `rec` unchanged): cloning them only to replace
/// them doubled the cumulative memory report at each cut (27 MiB of the
/// agent's 217 MiB peak under 350 Python processes a minute).
fn without_tables(rec: &mut Recording) -> Recording {
    let syscalls = std::mem::take(&mut rec.syscalls);
    let threads = std::mem::take(&mut rec.threads);
    let runqueue_hist = std::mem::take(&mut rec.runqueue_hist);
    let gil_holders = std::mem::take(&mut rec.gil_holders);
    let (cuda, memory) = (rec.cuda.take(), rec.memory.take());
    let out = rec.clone();
    rec.syscalls = syscalls;
    rec.threads = threads;
    rec.runqueue_hist = runqueue_hist;
    rec.gil_holders = gil_holders;
    (rec.cuda, rec.memory) = (cuda, memory);
    out
}

/// The GIL waits of the window: each (waiter, holder, what it did) row's
/// growth since the last snapshot (the kernel sums them from the start).
fn gil_holders_delta(cur: &[GilHold], prev: &[GilHold]) -> Vec<GilHold> {
    let key = |h: &GilHold| (h.pid, h.tid, h.holder_tid, h.holder_state.clone(), h.syscall.clone(), format!("{:?}", h.frames));
    let before: HashMap<_, (u64, u64)> = prev.iter().map(|h| (key(h), (h.wait_ns, h.waits))).collect();
    cur.iter()
        .filter_map(|h| {
            let (ns, n) = before.get(&key(h)).copied().unwrap_or((0, 0));
            let wait_ns = h.wait_ns.saturating_sub(ns);
            (wait_ns > 0).then(|| GilHold { wait_ns, waits: h.waits.saturating_sub(n), ..h.clone() })
        })
        .collect()
}

/// Signed per-row differences. A row gone since (folded into its group's
/// summed row, tid 0) gives its whole previous value as a debt of that
/// summed row, where its counts went. `build` gets a row's signed
/// differences (a field can also go down in a row that stays, like a call
/// in flight whose histogram bucket moved) and makes the window's row.
fn fold<R: Clone, K: std::hash::Hash + Eq + Clone, G: std::hash::Hash + Eq + Clone>(
    cur: &[R],
    prev: &[R],
    key: impl Fn(&R) -> K,
    group: impl Fn(&R) -> G,
    is_sum_row: impl Fn(&R) -> bool,
    fields: impl Fn(&R) -> Vec<i128>,
    build: impl Fn(&R, &[i128]) -> Option<R>,
) -> Vec<R> {
    let prev_by: HashMap<K, &R> = prev.iter().map(|r| (key(r), r)).collect();
    let cur_keys: std::collections::HashSet<K> = cur.iter().map(&key).collect();
    let mut debt: HashMap<G, Vec<i128>> = HashMap::new();
    for p in prev.iter().filter(|p| !cur_keys.contains(&key(p)) && !is_sum_row(p)) {
        let f = fields(p);
        let d = debt.entry(group(p)).or_insert_with(|| vec![0; f.len()]);
        for (a, b) in d.iter_mut().zip(f) {
            *a -= b;
        }
    }
    cur.iter()
        .filter_map(|r| {
            let mut f = fields(r);
            if let Some(p) = prev_by.get(&key(r)) {
                for (a, b) in f.iter_mut().zip(fields(p)) {
                    *a -= b;
                }
            }
            if is_sum_row(r) {
                if let Some(d) = debt.get(&group(r)) {
                    for (a, b) in f.iter_mut().zip(d) {
                        *a += b;
                    }
                }
            }
            build(r, &f)
        })
        .collect()
}

/// Histogram differences made non-negative without changing their sum: a
/// call counted in flight at the last snapshot (in the bucket of its time
/// so far) and finished since moved up, so a negative bucket borrows from
/// the buckets above it.
fn carry_up(h: &[i128]) -> Vec<u64> {
    let mut out = vec![0u64; h.len()];
    let mut carry: i128 = 0;
    for (i, v) in h.iter().enumerate() {
        let x = carry + v;
        if x < 0 {
            carry = x;
        } else {
            out[i] = x as u64;
            carry = 0;
        }
    }
    out
}

const SYSCALL_FIXED: usize = 4;

fn syscalls_delta(cur: &[ThreadSyscall], prev: &[ThreadSyscall]) -> Vec<ThreadSyscall> {
    let hist_len = cur.iter().chain(prev).map(|s| s.hist_log2_ns.len()).max().unwrap_or(0);
    let errnos: Vec<u32> = {
        let mut v: Vec<u32> = cur.iter().chain(prev).flat_map(|s| s.errnos.keys().copied()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    fold(
        cur,
        prev,
        |s| (s.pid, s.tid, s.nr),
        |s| (s.pid, s.nr),
        |s| s.tid == 0,
        |s| {
            let mut f = vec![s.count as i128, s.errors as i128, s.total_ns as i128, s.in_flight as i128];
            f.extend((0..hist_len).map(|i| s.hist_log2_ns.get(i).copied().unwrap_or(0) as i128));
            f.extend(errnos.iter().map(|e| s.errnos.get(e).copied().unwrap_or(0) as i128));
            f
        },
        |s, f| {
            let count = u64::try_from(f[0]).unwrap_or(0);
            if count == 0 {
                return None;
            }
            let total_ns = u64::try_from(f[2]).unwrap_or(0);
            let mut hist = carry_up(&f[SYSCALL_FIXED..SYSCALL_FIXED + hist_len]);
            // Each snapshot's histogram sums to its count; should rounding
            // of a folded row leave a difference, the last bucket used takes it.
            let hsum: u64 = hist.iter().sum();
            if hsum != count {
                if let Some(i) = hist.iter().rposition(|v| *v > 0).or(if hist.is_empty() { None } else { Some(0) }) {
                    hist[i] = (hist[i] + count).saturating_sub(hsum);
                }
            }
            let errnos: BTreeMap<u32, u64> = errnos
                .iter()
                .zip(&f[SYSCALL_FIXED + hist_len..])
                .filter(|(_, n)| **n > 0)
                .map(|(e, n)| (*e, *n as u64))
                .collect();
            Some(ThreadSyscall {
                pid: s.pid,
                tid: s.tid,
                nr: s.nr,
                count,
                errors: u64::try_from(f[1]).unwrap_or(0).min(count),
                errnos,
                total_ns,
                // Not kept per window: the cumulative maximum, bounded by
                // the window's own total.
                max_ns: s.max_ns.min(total_ns),
                hist_log2_ns: hist,
                // Still in flight at this window's end (counted in it or before).
                in_flight: s.in_flight.min(count),
                aggregated_threads: s.aggregated_threads,
            })
        },
    )
}

fn threads_delta(cur: &[ThreadTimes], prev: &[ThreadTimes]) -> Vec<ThreadTimes> {
    fold(
        cur,
        prev,
        |t| (t.pid, t.tid),
        |t| t.pid,
        |t| t.tid == 0,
        |t| {
            let o = &t.off_cpu;
            let m = &o.memory;
            [
                t.wall_ns, t.on_cpu_ns, t.syscall_ns, o.io_ns, o.lock_ns, o.poll_ns, o.sleep_ns, o.other_ns, o.gil_ns, t.runqueue_ns,
                o.memory_ns, m.page_fault_ns, m.reclaim_ns, m.compaction_ns, m.throttle_ns,
            ]
                .into_iter()
                .map(i128::from)
                .collect()
        },
        |t, f| {
            if f.iter().all(|v| *v <= 0) {
                return None;
            }
            let g = |i: usize| u64::try_from(f[i]).unwrap_or(0);
            let mut r = t.clone();
            r.wall_ns = g(0);
            r.on_cpu_ns = g(1);
            r.syscall_ns = g(2);
            r.off_cpu.io_ns = g(3);
            r.off_cpu.lock_ns = g(4);
            r.off_cpu.poll_ns = g(5);
            r.off_cpu.sleep_ns = g(6);
            r.off_cpu.other_ns = g(7);
            r.off_cpu.gil_ns = g(8);
            r.runqueue_ns = g(9);
            r.off_cpu.memory_ns = g(10);
            r.off_cpu.memory = crate::recording::MemoryWaits { page_fault_ns: g(11), reclaim_ns: g(12), compaction_ns: g(13), throttle_ns: g(14) };
            Some(r)
        },
    )
}

/// Each stack less its counts in the baseline (`ids[i]` is `cur[i]`'s
/// identity); stacks with nothing left are dropped.
fn stacks_delta(cur: Vec<StackRecord>, ids: &[StackId], prev: &HashMap<StackId, (u64, u64)>) -> Vec<StackRecord> {
    cur.into_iter()
        .zip(ids)
        .filter_map(|(mut s, id)| {
            let (ps, pw) = prev.get(id).copied().unwrap_or((0, 0));
            s.samples = s.samples.saturating_sub(ps);
            s.weight_ns = s.weight_ns.saturating_sub(pw);
            (s.samples > 0 || s.weight_ns > 0).then_some(s)
        })
        .collect()
}

/// The windows in `dir`, oldest first (names sort by time): regular files
/// of this user named like one. Anything else there (a link or a FIFO
/// someone planted at a window's name) is neither counted nor removed.
fn window_files(dir: &Dir) -> Vec<(OsString, u64)> {
    let me = safe_write::euid();
    let mut v: Vec<(OsString, u64)> = dir
        .names()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.to_str().is_some_and(|s| s.starts_with(FILE_PREFIX) && s.ends_with(".itr")))
        .filter_map(|n| {
            let st = dir.stat_at(&n).ok().flatten()?;
            (st.is_file() && st.uid == me).then_some((n, st.size))
        })
        .collect();
    v.sort();
    v
}

pub const FILE_PREFIX: &str = "infertrace-agent-";

/// Mode of a window (less the umask): its owner and group read it.
const WINDOW_MODE: u32 = 0o640;
/// Mode of an output directory the agent creates (less the umask).
const DIR_MODE: u32 = 0o750;
/// Other names tried when a window's name is taken (`-1` ... `-15`).
const NAME_TRIES: u64 = 16;

/// Where the windows go, and how many are kept.
#[derive(Debug)]
pub struct Retention {
    pub dir: PathBuf,
    /// Keep at most this many windows (0: no limit).
    pub keep: usize,
    /// Keep at most this many bytes of windows (None: no limit); the
    /// newest window is always kept.
    pub max_size: Option<u64>,
    /// The directory as opened ([`Retention::open`]); opened again (and
    /// created again) when it is no longer at `dir`.
    opened: Mutex<Option<Dir>>,
}

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "infertrace agent: {line}");
}

impl Retention {
    pub fn new(dir: PathBuf, keep: usize, max_size: Option<u64>) -> Retention {
        Retention { dir, keep, max_size, opened: Mutex::new(None) }
    }

    /// Creates the directory if missing (0750), opens it and checks it:
    /// refused when it belongs to someone other than root or this user, or
    /// when others can write it without the sticky bit. Removes the
    /// temporary files of agents that are gone. Errors say why in one line.
    pub fn open(&self) -> io::Result<()> {
        let mut slot = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        *slot = None;
        let dir = self.current(&mut slot)?;
        dir.probe()?;
        dir.remove_stale_temps(None);
        Ok(())
    }

    /// The directory, opened again if it is no longer at `dir` (removed:
    /// created again; replaced: checked again), with a line on stderr.
    fn current<'a>(&self, slot: &'a mut Option<Dir>) -> io::Result<&'a Dir> {
        let was_open = match slot.take() {
            Some(d) if d.still_at_path() => return Ok(slot.insert(d)),
            Some(_) => true,
            None => false,
        };
        let gone = fs::metadata(&self.dir).is_err();
        if gone {
            safe_write::create_dir_all(&self.dir, DIR_MODE)?;
        }
        let dir = Dir::open(&self.dir)?;
        dir.check_owned()?;
        if was_open {
            let what = if gone { "was removed: created again" } else { "was replaced: opened again" };
            say(&format!("the output directory {} {what}", self.dir.display()));
        }
        Ok(slot.insert(dir))
    }

    /// Writes one window atomically (a new temporary file, renamed within
    /// the directory to a name nothing holds yet), then applies the
    /// retention. Returns the path.
    pub fn write(&self, rec: &Recording, seq: u64) -> Result<PathBuf, RecordingError> {
        let base = format!("{FILE_PREFIX}{}-{seq:06}", crate::os::clock::local_timestamp());
        let first = self.dir.join(format!("{base}.itr"));
        let werr = |path: &PathBuf, source| RecordingError::Write { path: path.clone(), source };
        let mut slot = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.current(&mut slot).map_err(|e| werr(&self.dir, e))?;
        let mut tmp = dir.create_temp(OsStr::new(&format!("{base}.itr")), WINDOW_MODE).map_err(|e| werr(&first, e))?;
        rec.write_to(tmp.file().try_clone().map_err(|e| werr(&first, e))?, &first)?;
        // The name is predictable: whatever is there already (a link or a
        // FIFO someone planted) is left alone, and the window takes the next name.
        let mut last = None;
        for k in 0..NAME_TRIES {
            let name = if k == 0 { format!("{base}.itr") } else { format!("{base}-{k}.itr") };
            match tmp.place(OsStr::new(&name), Place::New) {
                Ok(()) => {
                    if k > 0 {
                        say(&format!("window {seq}: {} was already there: left alone, the window is {name}", first.display()));
                    }
                    prune_in(dir, self.keep, self.max_size);
                    return Ok(self.dir.join(name));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(werr(&first, e)),
            }
        }
        Err(werr(&first, last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists))))
    }

    /// Removes the oldest windows beyond `keep` and `max_size`.
    pub fn prune(&self) {
        let slot = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = slot.as_ref() {
            prune_in(dir, self.keep, self.max_size);
        }
    }
}

fn prune_in(dir: &Dir, keep: usize, max_size: Option<u64>) {
    let mut files = window_files(dir);
    while files.len() > 1 {
        let total: u64 = files.iter().map(|f| f.1).sum();
        let over_count = keep > 0 && files.len() > keep;
        let over_size = max_size.is_some_and(|m| total > m);
        if !over_count && !over_size {
            break;
        }
        let (name, _) = files.remove(0);
        let _ = dir.remove(&name);
    }
}

/// Per-window totals for the metrics, by (pid, syscall nr): calls, errors, ns.
pub fn syscall_totals(rec: &Recording) -> BTreeMap<(u32, u32), (u64, u64, u64)> {
    let mut m: BTreeMap<(u32, u32), (u64, u64, u64)> = BTreeMap::new();
    for s in &rec.syscalls {
        let e = m.entry((s.pid, s.nr)).or_default();
        e.0 += s.count;
        e.1 += s.errors;
        e.2 += s.total_ns;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(pid: u32, tid: u32, nr: u32, count: u64, total_ns: u64, agg: u64) -> ThreadSyscall {
        ThreadSyscall {
            pid,
            tid,
            nr,
            count,
            errors: 0,
            errnos: BTreeMap::new(),
            total_ns,
            max_ns: total_ns,
            hist_log2_ns: vec![count],
            in_flight: 0,
            aggregated_threads: agg,
        }
    }

    fn stack(tid: u32, leaf: &str, samples: u64, weight_ns: u64) -> StackRecord {
        use crate::recording::{Frame, FrameKind, StackKind};
        let f = |name: &str| Frame { function: name.into(), file: Some("w.py".into()), line: Some(3), kind: FrameKind::Python, module: None };
        StackRecord { kind: StackKind::Cpu, reason: None, pid: 10, tid, samples, weight_ns, syscall: None, frames: vec![f(leaf), f("main")] }
    }

    #[test]
    fn gil_waits_are_the_window_s_growth_per_holder() {
        let h = |holder_tid: u32, wait_ns: u64, waits: u64| GilHold {
            pid: 10,
            tid: 11,
            holder_tid,
            holder_state: "blocked".into(),
            syscall: Some("clock_nanosleep".into()),
            frames: vec![],
            wait_ns,
            waits,
        };
        let d = gil_holders_delta(&[h(12, 500, 5), h(13, 40, 2)], &[h(12, 300, 3), h(13, 40, 2)]);
        assert_eq!(d, vec![h(12, 200, 2)]);
        // A holder new in this window: all of it.
        assert_eq!(gil_holders_delta(&[h(14, 7, 1)], &[]), vec![h(14, 7, 1)]);
    }

    #[test]
    fn stacks_are_differenced_by_identity_and_windows_add_up() {
        let snap = |stacks: Vec<StackRecord>, duration_ns| {
            let mut r = crate::recording::tests::sample();
            r.stacks = stacks;
            r.duration_ns = duration_ns;
            r
        };
        let (w1, base) = delta(snap(vec![stack(10, "a", 3, 0), stack(10, "b", 2, 0)], 1_000), None);
        assert_eq!(w1.stacks.len(), 2, "the first window is the snapshot");
        assert!(base.rec.stacks.is_empty(), "the baseline keeps no frames");
        // a grew by 2, b did not move, the same frames on another thread
        // are another stack, c is new.
        let cur = vec![stack(10, "a", 5, 0), stack(10, "b", 2, 0), stack(11, "a", 1, 0), stack(10, "c", 0, 7)];
        let (w2, base) = delta(snap(cur, 3_000), Some(&base));
        let got: Vec<(u32, &str, u64, u64)> =
            w2.stacks.iter().map(|s| (s.tid, s.frames[0].function.as_str(), s.samples, s.weight_ns)).collect();
        assert_eq!(got, [(10, "a", 2, 0), (11, "a", 1, 0), (10, "c", 0, 7)]);
        assert_eq!(w2.duration_ns, 2_000);
        // The next window starts from the second snapshot, not the first.
        let (w3, _) = delta(snap(vec![stack(10, "a", 6, 0), stack(10, "c", 0, 7)], 4_000), Some(&base));
        let got: Vec<(&str, u64)> = w3.stacks.iter().map(|s| (s.frames[0].function.as_str(), s.samples)).collect();
        assert_eq!(got, [("a", 1)]);
        // A different line is a different stack.
        let mut moved = stack(10, "a", 5, 0);
        moved.frames[0].line = Some(4);
        assert_ne!(stack_id(&moved), stack_id(&stack(10, "a", 5, 0)));
    }

    #[test]
    fn windows_add_up_when_rows_fold_into_the_summed_row() {
        // Window 1: threads 11 and 12 with own rows. Window 2: thread 12
        // exited and was folded into tid 0 (with 5 more calls of its own
        // before it exited), thread 11 made 3 more.
        let prev = vec![sc(10, 11, 39, 7, 70, 0), sc(10, 12, 39, 4, 40, 0)];
        let cur = vec![sc(10, 11, 39, 10, 100, 0), sc(10, 0, 39, 9, 90, 1)];
        let d = syscalls_delta(&cur, &prev);
        let total: u64 = d.iter().map(|s| s.count).sum();
        assert_eq!(total, 19 - 11);
        let t11 = d.iter().find(|s| s.tid == 11).unwrap();
        assert_eq!((t11.count, t11.total_ns), (3, 30));
        let t0 = d.iter().find(|s| s.tid == 0).unwrap();
        assert_eq!((t0.count, t0.total_ns), (5, 50));
        assert!(d.iter().all(|s| s.tid != 12));
    }

    #[test]
    fn new_rows_and_unchanged_rows() {
        let prev = vec![sc(1, 1, 0, 5, 5, 0)];
        let cur = vec![sc(1, 1, 0, 5, 5, 0), sc(1, 2, 0, 2, 2, 0)];
        let d = syscalls_delta(&cur, &prev);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].tid, d[0].count), (2, 2));
    }

    #[test]
    fn retention_keeps_the_newest() {
        let dir = std::env::temp_dir().join(format!("itr-retention-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let r = Retention::new(dir.clone(), 3, None);
        r.open().unwrap();
        for i in 0..5 {
            fs::write(dir.join(format!("{FILE_PREFIX}20260101-000000-{i:06}.itr")), vec![0u8; 100]).unwrap();
        }
        fs::write(dir.join("other.itr"), b"x").unwrap();
        // Planted at a window's name: not a window of this agent's.
        std::os::unix::fs::symlink("/etc/passwd", dir.join(format!("{FILE_PREFIX}20250101-000000-000000.itr"))).unwrap();
        r.prune();
        let names = |d: &std::path::Path| window_files(&Dir::open(d).unwrap()).iter().map(|f| f.0.to_string_lossy().into_owned()).collect::<Vec<_>>();
        let left = names(&dir);
        assert_eq!(left.len(), 3);
        assert!(left[0].ends_with("000002.itr"));
        let r = Retention::new(dir.clone(), 0, Some(150));
        r.open().unwrap();
        r.prune();
        assert_eq!(names(&dir).len(), 1);
        assert!(dir.join("other.itr").exists());
        assert!(fs::symlink_metadata(dir.join(format!("{FILE_PREFIX}20250101-000000-000000.itr"))).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_planted_name_is_left_alone_and_a_removed_directory_comes_back() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("itr-planted-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let victim = base.join("victim");
        fs::write(&victim, b"secret").unwrap();
        let dir = base.join("out");
        let r = Retention::new(dir.clone(), 0, None);
        r.open().unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o027, 0, "created 0750 at most: {mode:o}");
        let rec = crate::recording::tests::sample();
        // The name window 7 gets is taken by a link (planted again should
        // the clock turn a second in between).
        let mut p = PathBuf::new();
        for _ in 0..5 {
            let ts = crate::os::clock::local_timestamp();
            let planted = dir.join(format!("{FILE_PREFIX}{ts}-000007.itr"));
            let _ = fs::remove_file(&planted);
            std::os::unix::fs::symlink(&victim, &planted).unwrap();
            p = r.write(&rec, 7).unwrap();
            if p.to_string_lossy().ends_with("-000007-1.itr") {
                break;
            }
        }
        assert!(p.to_string_lossy().ends_with("-000007-1.itr"), "{}", p.display());
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
        assert!(Recording::read(&p).is_ok());
        let st = fs::symlink_metadata(&p).unwrap();
        assert!(st.is_file());
        assert_eq!(st.permissions().mode() & 0o037, 0, "a window is 0640 at most");
        // Removed: created again at the next window.
        fs::remove_dir_all(&dir).unwrap();
        let p = r.write(&rec, 8).unwrap();
        assert!(Recording::read(&p).is_ok());
        // Replaced by a world-writable one: refused.
        fs::remove_dir_all(&dir).unwrap();
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = r.write(&rec, 9).unwrap_err().to_string();
        assert!(e.contains("without the sticky bit"), "{e}");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        fs::remove_dir_all(&base).unwrap();
    }
}

#[cfg(test)]
mod in_flight_tests {
    use super::*;

    #[test]
    fn a_call_in_flight_at_the_last_cut_moves_up_in_the_histogram() {
        let row = |count, hist: Vec<u64>, in_flight| ThreadSyscall {
            pid: 1,
            tid: 1,
            nr: 230,
            count,
            errors: 0,
            errnos: BTreeMap::new(),
            total_ns: count * 10,
            max_ns: 10,
            hist_log2_ns: hist,
            in_flight,
            aggregated_threads: 0,
        };
        // Cut 1: 4 finished calls in bucket 0, one in flight so far in bucket 1.
        // Cut 2: that one finished in bucket 2, plus one more in bucket 2.
        let d = syscalls_delta(&[row(6, vec![4, 0, 2], 0)], &[row(5, vec![4, 1, 0], 1)]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].count, 1);
        assert_eq!(d[0].hist_log2_ns, [0, 0, 1]);
        assert_eq!(d[0].in_flight, 0);
        assert_eq!(carry_up(&[2, -1, -1, 3]), [2, 0, 0, 1]);
    }
}
