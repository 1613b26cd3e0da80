//! The thread list of a CPython process: every thread state of every
//! interpreter, and the kernel thread id of each (`native_thread_id` from
//! 3.11; before, the `tid` field of glibc's or musl's `struct pthread`
//! that `thread_id` points to, its offset calibrated on the live threads).
//! Both hold the id the process knows its thread by, in its own PID
//! namespace: translated to ours through `procfs::ThreadIdMap` (NSpid).

use std::collections::{HashMap, HashSet};

use super::{
    proc::le_u32,
    walk, Interpreter, PythonError,
};

/// Most thread states walked (all interpreters together): `THREADS_PER_LIVE`
/// per live thread of the process and `THREADS_SLACK` more, at most
/// `MAX_THREADS`; most interpreters per process.
const MAX_THREADS: usize = 65_536;
const THREADS_PER_LIVE: usize = 4;
const THREADS_SLACK: usize = 256;
pub(super) const MAX_INTERPRETERS: usize = 1024;
/// glibc's `offsetof(struct pthread, tid)` on x86_64 (0x2d0), preferred when
/// several offsets fit.
pub(super) const GLIBC_PTHREAD_TID: u64 = 0x2d0;
/// Bytes of `struct pthread` searched for the `tid` field.
const PTHREAD_SCAN: usize = 2048;

/// One thread state found in the interpreter list.
#[derive(Clone, Copy, Debug)]
pub(super) struct TState {
    pub(super) addr: u64,
    /// `native_thread_id` (3.11+) or the `pthread_t` `thread_id`.
    pub(super) thread_id: u64,
}

impl Interpreter {
    /// Every thread state of every interpreter, in list order, with its raw
    /// thread id. Bounded (`walk`): at most `MAX_INTERPRETERS` interpreters
    /// and, all lists together, a few times the process's live threads
    /// (a thread state exists only for a thread that runs, starts or ends);
    /// a list that loops, runs on past the bound or into unreadable memory
    /// ends the walk with a note, keeping the thread states read before.
    pub(super) fn walk_tstates(&self) -> Result<Vec<TState>, PythonError> {
        let o = &self.offsets;
        let tid_off = o.tstate_native_thread_id.unwrap_or(o.tstate_thread_id);
        let pid = self.pid;
        let first = self.mem.u64(self.runtime + o.runtime_interpreters_head)?;
        let (interps, stopped, err) = walk::chain(first, &mut self.walk(MAX_INTERPRETERS), |i| self.mem.u64(i + o.interp_next));
        if let Some(s) = stopped {
            self.tripped(format_args!("interpreter list of pid {pid}"), s);
        }
        if let Some(e) = err {
            self.walk_note(format!("interpreter list of pid {pid}"), |w| format!("{w}: {e}, stopped after {} nodes", interps.len()));
        }
        let live = crate::os::procfs::thread_ids(pid).len();
        let mut walk = self.walk((THREADS_PER_LIVE * live + THREADS_SLACK).min(MAX_THREADS));
        let mut out = Vec::new();
        self.tstates_cut.set(false);
        for interp in interps {
            let head = match self.mem.u64(interp + o.interp_threads_head) {
                Ok(h) => h,
                Err(e) if out.is_empty() => return Err(e),
                Err(_) => break,
            };
            let mut ids = Vec::new();
            let (list, stopped, err) = walk::chain(head, &mut walk, |ts| {
                ids.push(self.mem.u64(ts + tid_off)?);
                self.mem.u64(ts + o.tstate_next)
            });
            out.extend(list.iter().zip(&ids).map(|(&addr, &thread_id)| TState { addr, thread_id }));
            if let Some(s) = stopped {
                self.tripped(format_args!("thread list of pid {pid}"), s);
                self.tstates_cut.set(true);
                break;
            }
            if let Some(e) = err {
                if out.is_empty() {
                    return Err(e);
                }
                let n = walk.visited();
                self.walk_note(format!("thread list of pid {pid}"), |w| format!("{w}: {e}, stopped after {n} nodes"));
                self.tstates_cut.set(true);
                break;
            }
        }
        Ok(out)
    }

    /// Kernel thread id of each thread state, as we (and the kernel
    /// programs) know it (`None`: not a live thread).
    pub(super) fn tids(&self, tstates: &[TState]) -> Vec<Option<u32>> {
        // The process's own id of each live thread -> ours.
        let tasks: HashMap<u32, u32> = self.thread_ids.borrow_mut().threads();
        let ours = |own: u32| tasks.get(&own).copied();
        if self.offsets.tstate_native_thread_id.is_some() {
            return tstates.iter().map(|t| u32::try_from(t.thread_id).ok().and_then(ours)).collect();
        }
        // pthread_t -> struct pthread -> tid. A struct pthread may end
        // before PTHREAD_SCAN bytes (musl): read what is mapped.
        let pthreads: Vec<Vec<u8>> = tstates
            .iter()
            .map(|t| if t.thread_id == 0 { Vec::new() } else { self.mem.bytes_lossy(t.thread_id, PTHREAD_SCAN) })
            .collect();
        let at = |off: u64| -> Vec<Option<u32>> { pthreads.iter().map(|b| ours(le_u32(b, off))).collect() };
        if let Some(off) = self.pthread_tid.get() {
            let r = at(off);
            if r.iter().any(Option::is_some) {
                return r;
            }
        }
        // Calibrate: the offset at which the most thread states find
        // distinct live tids (a thread that exited has tid 0 there, the
        // kernel clears it), glibc's when it is among the best.
        let score = |off: u64| -> usize { at(off).into_iter().flatten().collect::<HashSet<u32>>().len() };
        let scores: Vec<(u64, usize)> = (0..PTHREAD_SCAN as u64 - 4).step_by(4).map(|o| (o, score(o))).collect();
        let best = scores.iter().map(|s| s.1).max().unwrap_or(0);
        if best == 0 {
            return vec![None; tstates.len()];
        }
        let off = if score(GLIBC_PTHREAD_TID) == best {
            GLIBC_PTHREAD_TID
        } else {
            scores.iter().find(|s| s.1 == best).map_or(GLIBC_PTHREAD_TID, |s| s.0)
        };
        self.pthread_tid.set(Some(off));
        at(off)
    }

    /// Every thread state of every interpreter: (kernel tid, address of its
    /// `PyThreadState`). Thread states whose thread is gone (or, before
    /// 3.11, whose tid cannot be found) are left out. Does not need the GIL.
    pub fn thread_states(&self) -> Result<Vec<(u32, u64)>, PythonError> {
        let tstates = self.walk_tstates()?;
        let tids = self.tids(&tstates);
        Ok(tstates.iter().zip(tids).filter_map(|(t, tid)| Some((tid?, t.addr))).collect())
    }
}
