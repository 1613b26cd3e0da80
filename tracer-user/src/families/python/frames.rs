//! Walking a thread's Python stack in the process's memory, from its
//! thread state's top frame (through `cframe` in 3.11 and 3.12) down the
//! `back` links, skipping C-stack shims, and [`Interpreter::dump`]: the
//! current stack of every thread.

use std::time::{Duration, Instant};

use super::{
    layout::{self, InstrKind},
    proc::{le_u32, le_u64},
    Interpreter, PythonError, ThreadDump,
};
use crate::recording::Frame;

/// Most frames kept per thread (the default recursion limit is 1000), and
/// most visited (C-stack shims included: at most one per Python frame).
pub(super) const MAX_DEPTH: usize = 4096;
pub(super) const MAX_VISITED: usize = 2 * MAX_DEPTH + 1;
/// How long one `dump` may read, unless its caller set a deadline.
const DUMP_TIME: Duration = Duration::from_secs(2);

impl Interpreter {
    /// Address of the innermost frame of a thread state (0: none).
    pub(super) fn top_frame(&self, tstate: u64) -> Result<u64, PythonError> {
        let o = &self.offsets;
        let p = self.mem.u64(tstate + o.tstate_frame)?;
        match o.cframe_current_frame {
            Some(off) if p != 0 => self.mem.u64(p + off),
            _ => Ok(p),
        }
    }

    /// The fields of one frame the walk needs.
    pub(super) fn read_frame(&self, frame: u64) -> Result<RawFrame, PythonError> {
        let o = &self.offsets;
        let len = [o.frame_code + 8, o.frame_back + 8, o.frame_instr + 8, o.frame_owner.map_or(0, |x| x + 1)]
            .into_iter()
            .max()
            .unwrap_or(0);
        let buf = self.mem.bytes(frame, len as usize)?;
        let instr = match o.instr_kind {
            InstrKind::Pointer => le_u64(&buf, o.frame_instr),
            _ => u64::from(le_u32(&buf, o.frame_instr)),
        };
        let skip = o.frame_owner.is_some_and(|off| u32::from(buf[off as usize]) >= layout::FRAME_OWNED_BY_CSTACK);
        let code = le_u64(&buf, o.frame_code) & !layout::CODE_TAG_MASK;
        Ok(RawFrame { code, back: le_u64(&buf, o.frame_back), instr, skip })
    }

    /// The Python stack of one thread state, leaf first. A frame that cannot
    /// be read ends the walk (the thread may be returning right now); a
    /// chain that loops, or runs on past `MAX_VISITED` frames (C-stack
    /// shims included) or `walk::WALK_TIME`, ends it with a note on `what`.
    fn stack(&mut self, tstate: u64, what: impl FnOnce() -> String) -> Vec<Frame> {
        let mut frames = Vec::new();
        let Ok(mut frame) = self.top_frame(tstate) else { return frames };
        let mut walk = self.walk(MAX_VISITED);
        while frame != 0 && frames.len() < MAX_DEPTH {
            if let Err(s) = walk.visit(frame) {
                self.tripped(what(), s);
                break;
            }
            let Ok(f) = self.read_frame(frame) else { break };
            if !f.skip {
                let checksum = self.mem.u32(f.code + self.offsets.code_firstlineno).unwrap_or(0);
                frames.push(self.resolve_frame(f.code, f.instr, checksum));
            }
            frame = f.back;
        }
        frames
    }

    /// The current Python stack of every thread (leaf first), read from the
    /// process's memory without stopping it. Within the deadline set with
    /// [`Interpreter::set_deadline`], else `DUMP_TIME`: the threads not
    /// reached by then are listed without frames, with a note.
    pub fn dump(&mut self) -> Result<Vec<ThreadDump>, PythonError> {
        let own_deadline = self.walk_deadline.get().is_none();
        if own_deadline {
            self.set_deadline(Some(Instant::now() + DUMP_TIME));
        }
        let r = self.dump_within();
        if own_deadline {
            self.set_deadline(None);
        }
        r
    }

    fn dump_within(&mut self) -> Result<Vec<ThreadDump>, PythonError> {
        let tstates = self.walk_tstates()?;
        let tids = self.tids(&tstates);
        let pid = self.pid;
        // A thread list cut at a bound: only the states of live threads.
        let cut = self.tstates_cut.get();
        let mut out = Vec::with_capacity(tstates.len());
        for (i, (ts, tid)) in tstates.iter().zip(tids).enumerate().filter(|(_, (_, tid))| !cut || tid.is_some()) {
            let late = self.walk_deadline.get().is_some_and(|d| Instant::now() >= d);
            let frames = if late {
                let n = tstates.len();
                self.walk_note(format!("stacks of pid {pid}"), |w| format!("{w}: not done in time, read {i} of {n} threads"));
                Vec::new()
            } else {
                let tid = tid.unwrap_or(0);
                self.stack(ts.addr, || format!("frame chain of thread {tid} of pid {pid}"))
            };
            let tid = tid.unwrap_or(0);
            let thread_name = (tid != 0).then(|| crate::os::procfs::thread_comm(self.pid, tid)).flatten();
            out.push(ThreadDump { tid, thread_name, frames });
        }
        Ok(out)
    }
}

/// One frame as read from the process.
pub(super) struct RawFrame {
    pub(super) code: u64,
    pub(super) back: u64,
    pub(super) instr: u64,
    /// A C-stack shim (3.12+), not a Python function.
    pub(super) skip: bool,
}
