//! The asyncio task tree of a live CPython 3.14+ process, read from
//! outside (`process_vm_readv`, the process is not stopped), with the
//! offsets the interpreter publishes for debuggers: what
//! `python -m asyncio pstree PID` shows, as data.
//!
//! Where the tasks are: since 3.14 every pending task is on a linked list
//! (`llist_node task_node` inside the task) whose head is in the thread
//! state of the thread that created it (`_PyThreadStateImpl.asyncio_tasks_head`;
//! the interpreter's own list keeps the tasks of threads that are gone).
//! Each thread state also holds its running loop and the task running a
//! step now. A task's coroutine stack is its coroutine's frame, then the
//! coroutine it awaits (the object at the top of the suspended frame's
//! stack, when it is a coroutine of the same type), and so on down to the
//! innermost one, which awaits a future; the running task's stack is the
//! thread's Python stack down to the task's coroutine frame. A task's
//! awaiters are in `task_awaited_by` (one future, or a set of them).
//!
//! API: [`AsyncioReader::new`] once per interpreter (finds and checks the
//! offsets; fails with [`AsyncioError::NotLoaded`] until the process has
//! imported asyncio), then [`AsyncioReader::read`] as often as needed
//! (code objects are cached by the [`Interpreter`]): one [`LoopTasks`] per
//! thread that has tasks or a running loop. The task types are the model's
//! (`crate::recording::asyncio`); rendered by `crate::report::async_dump`.

pub mod record;
mod locate;
mod offsets;

use std::collections::HashMap;

use super::{
    proc::{le_u32, le_u64},
    Interpreter, PythonError,
};
use crate::recording::{
    asyncio::{AsyncTask, Awaitable, LoopTasks, TaskState},
    Frame,
};
pub use locate::Located;
use offsets::{AsyncioDebug, DerivedTask, RuntimeGroups, VersionFacts};

/// Most tasks read per list, coroutines per chain, awaiters per task.
const MAX_TASKS: usize = 1 << 16;
const MAX_CHAIN: usize = 1024;
const MAX_SET_TABLE: u64 = 1 << 20;
/// Longest task name read (longer ones end in `…`).
const MAX_NAME: usize = 1024;
/// `Py_TAG_BITS`: object pointers on the value stack carry tags.
const TAG_MASK: u64 = !3;

#[derive(Debug, thiserror::Error)]
pub enum AsyncioError {
    /// 3.11 - 3.13 publish no asyncio offsets (see docs/python.md).
    #[error("--async needs CPython 3.14 or later: process {pid} runs CPython {version}, which publishes no asyncio debug offsets")]
    NeedsNewerPython { pid: u32, version: String },
    /// No `.AsyncioDebug` section mapped yet.
    #[error("process {pid} (CPython {version}) has not loaded asyncio: no .AsyncioDebug section in its interpreter or a mapped _asyncio module")]
    NotLoaded { pid: u32, version: String },
    /// The offsets are there but not what this reader knows.
    #[error("CPython {version} in process {pid}: asyncio debug offsets not usable: {message}")]
    Layout { pid: u32, version: String, message: String },
    /// A list or object changed under the reader (or is corrupt).
    #[error("process {pid}: asyncio structures changed while being read: {message}")]
    Inconsistent { pid: u32, message: String },
    #[error(transparent)]
    Python(#[from] PythonError),
}

impl AsyncioError {
    pub fn hint(&self) -> &'static str {
        match self {
            AsyncioError::NeedsNewerPython { .. } => {
                "`infertrace dump -p PID` (without --async) still shows every thread's stack"
            }
            AsyncioError::NotLoaded { .. } => "retry once the program has imported asyncio",
            AsyncioError::Layout { .. } => "this build's asyncio structures differ from upstream CPython 3.14/3.15",
            AsyncioError::Inconsistent { .. } => "retry; the event loop was changing its task list",
            AsyncioError::Python(e) => e.hint(),
        }
    }
}

/// Reads the asyncio tasks of one interpreter (see the module doc).
#[derive(Clone, Debug)]
pub struct AsyncioReader {
    pid: u32,
    debug: AsyncioDebug,
    derived: Option<DerivedTask>,
    groups: RuntimeGroups,
    facts: VersionFacts,
    section: Located,
}

/// A task as read from its object.
struct RawTask {
    name_ptr: u64,
    awaited_by: u64,
    awaited_by_is_set: bool,
    coro: u64,
    loop_: Option<u64>,
    fut_state: Option<u32>,
    fut_waiter: u64,
}

impl AsyncioReader {
    /// Finds and checks the asyncio offsets of `interp`'s process. Fails
    /// with [`AsyncioError::NeedsNewerPython`] before 3.14 and
    /// [`AsyncioError::NotLoaded`] until asyncio is imported (worth
    /// retrying later).
    pub fn new(interp: &Interpreter) -> Result<AsyncioReader, AsyncioError> {
        let pid = interp.pid();
        let (major, minor, _) = interp.version();
        let version = interp.version_string().to_string();
        if major != 3 || minor < 14 {
            return Err(AsyncioError::NeedsNewerPython { pid, version });
        }
        let layout = |message: String| AsyncioError::Layout { pid, version: version.clone(), message };
        let facts = VersionFacts::for_minor(minor)
            .ok_or_else(|| layout(format!("3.{minor} is newer than the versions known (3.14, 3.15)")))?;
        let blob = interp.mem.bytes(interp.runtime, crate::families::python::debug_offsets::READ_LEN)?;
        let groups = RuntimeGroups::parse(&blob, minor).map_err(layout)?;
        let section = locate::find_section(pid, interp.binary())?
            .ok_or_else(|| AsyncioError::NotLoaded { pid, version: version.clone() })?;
        let bytes = interp.mem.bytes(section.address, offsets::SECTION_LEN)?;
        let debug = AsyncioDebug::parse(&bytes).map_err(layout)?;
        Ok(AsyncioReader { pid, derived: debug.derived_task_members(), debug, groups, facts, section })
    }

    /// Where the offsets were found.
    pub fn section(&self) -> &Located {
        &self.section
    }

    /// Every thread's tasks (threads with neither tasks nor a running loop
    /// are left out), then the interpreter's list of tasks whose thread
    /// has exited, if not empty.
    ///
    /// The process runs on while it is read: a task that finishes meanwhile
    /// may be freed under the reader. Such a read fails with
    /// [`AsyncioError::Inconsistent`] (a read of freed or reused memory,
    /// while the process is alive): read again.
    pub fn read(&self, interp: &mut Interpreter) -> Result<Vec<LoopTasks>, AsyncioError> {
        self.read_once(interp).map_err(|e| match e {
            AsyncioError::Python(p @ (PythonError::Memory { .. } | PythonError::Layout { .. }))
                if crate::os::procfs::is_alive(self.pid) =>
            {
                self.inconsistent(p.to_string())
            }
            e => e,
        })
    }

    fn read_once(&self, interp: &mut Interpreter) -> Result<Vec<LoopTasks>, AsyncioError> {
        let tstates = interp.walk_tstates()?;
        let tids = interp.tids(&tstates);
        // A thread list cut at a bound: only the states of live threads.
        let cut = interp.tstates_cut.get();
        let mut lists: Vec<(LoopTasks, Vec<u64>, u64)> = Vec::new();
        for (ts, tid) in tstates.iter().zip(tids).filter(|(_, tid)| !cut || tid.is_some()) {
            let loop_id = nonzero(interp.mem.u64(ts.addr + self.debug.tstate_running_loop)? & TAG_MASK);
            let running = match loop_id {
                Some(_) => nonzero(interp.mem.u64(ts.addr + self.debug.tstate_running_task)? & TAG_MASK),
                None => None,
            };
            let ids = self.list(interp, ts.addr + self.debug.tstate_tasks_head)?;
            if ids.is_empty() && loop_id.is_none() {
                continue;
            }
            let thread_name = tid.and_then(|t| crate::os::procfs::thread_comm(self.pid, t));
            lists.push((LoopTasks { tid, thread_name, loop_id, running_task: running, tasks: vec![] }, ids, ts.addr));
        }
        for head in self.interpreters(interp)? {
            let ids = self.list(interp, head + self.debug.interp_tasks_head)?;
            if !ids.is_empty() {
                let lt = LoopTasks { tid: None, thread_name: None, loop_id: None, running_task: None, tasks: vec![] };
                lists.push((lt, ids, 0));
            }
        }
        for (lt, ids, tstate) in &mut lists {
            for &id in ids.iter() {
                let running = lt.running_task == Some(id);
                // None: a task being created or torn down (no name yet or
                // any more); it is left out of this read.
                if let Some(task) = self.task(interp, id, running.then_some(*tstate))? {
                    lt.tasks.push(task);
                }
            }
        }
        Ok(lists.into_iter().map(|l| l.0).collect())
    }

    /// Every interpreter state's address.
    fn interpreters(&self, interp: &Interpreter) -> Result<Vec<u64>, AsyncioError> {
        let o = &interp.offsets;
        let first = interp.mem.u64(interp.runtime + o.runtime_interpreters_head)?;
        let mut walk = interp.walk(super::threads::MAX_INTERPRETERS);
        let (out, stopped, err) = super::walk::chain(first, &mut walk, |i| interp.mem.u64(i + o.interp_next));
        if let Some(s) = stopped {
            interp.tripped(format_args!("interpreter list of pid {}", self.pid), s);
        }
        match err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// The task addresses on the list whose head is at `head`.
    fn list(&self, interp: &Interpreter, head: u64) -> Result<Vec<u64>, AsyncioError> {
        let mut out = Vec::new();
        let mut walk = interp.walk(MAX_TASKS);
        let mut node = interp.mem.u64(head)?;
        while node != head {
            if node == 0 {
                return Err(self.inconsistent(format!("the task list at {head:#x} does not lead back to its head")));
            }
            // A loop that misses its head, too many tasks, too long: the
            // tasks read so far, and a note.
            if let Err(s) = walk.visit(node) {
                interp.tripped(format_args!("asyncio task list at {head:#x} of pid {}", self.pid), s);
                break;
            }
            out.push(node.wrapping_sub(self.debug.task_node));
            node = interp.mem.u64(node)?;
        }
        Ok(out)
    }

    fn inconsistent(&self, message: String) -> AsyncioError {
        AsyncioError::Inconsistent { pid: self.pid, message }
    }

    fn raw_task(&self, interp: &Interpreter, id: u64) -> Result<RawTask, AsyncioError> {
        let b = interp.mem.bytes(id, self.debug.task_size as usize)?;
        let d = &self.debug;
        let byte = |off: u64| b.get(off as usize).copied().unwrap_or(0);
        Ok(RawTask {
            name_ptr: le_u64(&b, d.task_name) & TAG_MASK,
            awaited_by: le_u64(&b, d.task_awaited_by) & TAG_MASK,
            awaited_by_is_set: byte(d.task_awaited_by_is_set) != 0,
            coro: le_u64(&b, d.task_coro) & TAG_MASK,
            loop_: self.derived.map(|x| le_u64(&b, x.loop_)),
            fut_state: self.derived.map(|x| le_u32(&b, x.state)),
            fut_waiter: self.derived.map_or(0, |x| le_u64(&b, x.fut_waiter) & TAG_MASK),
        })
    }

    /// Task `id`; `running_in` is the thread state when it is the running task.
    /// None for a task whose name is not set (being initialized, or
    /// cleared on its way out while still linked in the list).
    fn task(&self, interp: &mut Interpreter, id: u64, running_in: Option<u64>) -> Result<Option<AsyncTask>, AsyncioError> {
        let raw = self.raw_task(interp, id)?;
        if raw.name_ptr == 0 {
            return Ok(None);
        }
        let name = self.task_name(interp, raw.name_ptr)?;
        let mut stack = match running_in {
            Some(ts) if raw.coro != 0 => self.running_stack(interp, ts, raw.coro + self.groups.gen_iframe),
            _ => Vec::new(),
        };
        if stack.is_empty() && raw.coro != 0 {
            stack = self.coroutine_chain(interp, raw.coro)?;
        }
        let awaited_by = self.awaiters(interp, &raw)?;
        let state = match (running_in, raw.fut_state) {
            (Some(_), _) => TaskState::Running,
            (None, None) => TaskState::Unknown,
            (None, Some(s)) if s != 0 => TaskState::Done,
            (None, Some(_)) if raw.fut_waiter != 0 => TaskState::Awaiting,
            (None, Some(_)) => TaskState::Ready,
        };
        let waiting_on = match raw.fut_waiter {
            0 => None,
            w => Some(Awaitable { id: w, type_name: self.type_name(interp, w).unwrap_or_else(|| "?".into()) }),
        };
        Ok(Some(AsyncTask { id, name, state, loop_id: raw.loop_.filter(|&l| l != 0), coroutine_stack: stack, awaited_by, waiting_on }))
    }

    /// `tp_flags` of the object at `obj`'s type.
    fn type_flags(&self, interp: &Interpreter, obj: u64) -> Result<(u64, u64), AsyncioError> {
        let ty = interp.mem.u64(obj + 8)?;
        Ok((ty, interp.mem.u64(ty + self.groups.tp_flags)?))
    }

    fn type_name(&self, interp: &Interpreter, obj: u64) -> Option<String> {
        let ty = interp.mem.u64(obj + 8).ok()?;
        let name = interp.mem.u64(ty + offsets::TP_NAME).ok()?;
        interp.mem.c_string(name, 256).ok()
    }

    /// A task name: a `str`, or an `int` N for the lazily named `Task-N`.
    fn task_name(&self, interp: &Interpreter, obj: u64) -> Result<String, AsyncioError> {
        let (_, flags) = self.type_flags(interp, obj)?;
        if flags & offsets::TPFLAGS_LONG_SUBCLASS != 0 {
            let tag = interp.mem.u64(obj + self.groups.long_lv_tag)?;
            let ndigits = (tag >> 3).min(3);
            let mut value: u128 = 0;
            for i in (0..ndigits).rev() {
                let d = interp.mem.u32(obj + self.groups.long_digit + 4 * i)?;
                value = (value << 30) | u128::from(d & ((1 << 30) - 1));
            }
            let sign = if tag & 3 == 2 { "-" } else { "" };
            return Ok(format!("Task-{sign}{value}"));
        }
        if flags & offsets::TPFLAGS_UNICODE_SUBCLASS == 0 {
            return Err(self.inconsistent(format!("task name at {obj:#x} is neither a str nor an int")));
        }
        let (mut s, _) = interp.read_str(&interp.mem, obj)?;
        if s.chars().count() > MAX_NAME {
            s = s.chars().take(MAX_NAME).collect::<String>() + "…";
        }
        Ok(s)
    }

    /// The coroutine chain from `coro` inward, innermost first.
    fn coroutine_chain(&self, interp: &mut Interpreter, coro: u64) -> Result<Vec<Frame>, AsyncioError> {
        let g = self.groups;
        let mut out = Vec::new();
        let mut cur = coro;
        let mut walk = interp.walk(MAX_CHAIN);
        loop {
            if let Err(s) = walk.visit(cur) {
                interp.tripped(format_args!("coroutine chain of task at {coro:#x} of pid {}", self.pid), s);
                break;
            }
            let gen = interp.mem.bytes(cur, g.gen_size as usize)?;
            let state = gen[g.gen_frame_state as usize] as i8;
            if state >= self.facts.finished_from {
                break;
            }
            let gen_type = le_u64(&gen, 8);
            let iframe = cur + g.gen_iframe;
            // A coroutine being finished or freed under the reader (its code
            // already cleared): the chain ends here rather than failing the
            // whole read, which a loop churning tasks would do every time.
            let Ok(f) = interp.read_frame(iframe) else { break };
            if f.code != 0 && !f.skip {
                let checksum = interp.mem.u32(f.code + interp.offsets.code_firstlineno).unwrap_or(0);
                out.push(interp.resolve_frame(f.code, f.instr, checksum));
            }
            if state != self.facts.suspended_yield_from {
                break;
            }
            let frame = &gen[g.gen_iframe as usize..];
            if frame.get(g.frame_owner as usize).copied() != Some(offsets::FRAME_OWNED_BY_GENERATOR) {
                break;
            }
            let sp = le_u64(frame, g.frame_stackpointer) & TAG_MASK;
            if sp == 0 {
                break;
            }
            let awaited = interp.mem.u64(sp - 8 * self.facts.awaited_slot)? & TAG_MASK;
            // Only a coroutine of the same type continues the chain (a
            // future, an iterator or another awaitable ends it).
            if awaited == 0 || interp.mem.u64(awaited + 8)? != gen_type {
                break;
            }
            cur = awaited;
        }
        out.reverse();
        Ok(out)
    }

    /// The running task's stack: the thread's frames from the innermost
    /// down to the task's coroutine frame (`task_frame`), innermost first;
    /// empty when that frame is not on the thread's stack.
    fn running_stack(&self, interp: &mut Interpreter, tstate: u64, task_frame: u64) -> Vec<Frame> {
        let mut out = Vec::new();
        let Ok(mut frame) = interp.top_frame(tstate) else { return out };
        let mut walk = interp.walk(super::frames::MAX_VISITED);
        while frame != 0 && out.len() < super::frames::MAX_DEPTH {
            if let Err(s) = walk.visit(frame) {
                interp.tripped(format_args!("frame chain of thread state {tstate:#x} of pid {}", self.pid), s);
                return Vec::new();
            }
            let Ok(f) = interp.read_frame(frame) else { return Vec::new() };
            if !f.skip {
                let checksum = interp.mem.u32(f.code + interp.offsets.code_firstlineno).unwrap_or(0);
                out.push(interp.resolve_frame(f.code, f.instr, checksum));
            }
            if frame == task_frame {
                return out;
            }
            frame = f.back;
        }
        Vec::new()
    }

    /// The ids of a task's awaiters (`task_awaited_by`: one future or a set).
    fn awaiters(&self, interp: &Interpreter, raw: &RawTask) -> Result<Vec<u64>, AsyncioError> {
        if raw.awaited_by == 0 {
            return Ok(Vec::new());
        }
        if !raw.awaited_by_is_set {
            return Ok(vec![raw.awaited_by]);
        }
        let g = self.groups;
        let set = raw.awaited_by;
        let used = interp.mem.u64(set + g.set_used)?;
        let mask = interp.mem.u64(set + g.set_mask)?;
        let table = interp.mem.u64(set + g.set_table)?;
        if mask >= MAX_SET_TABLE || used > mask + 1 {
            return Err(self.inconsistent(format!("awaited_by set at {set:#x}: mask {mask}, {used} used")));
        }
        let entries = interp.mem.bytes(table, (mask as usize + 1) * 16)?;
        let mut out = Vec::new();
        for e in entries.chunks_exact(16) {
            let (key, hash) = (le_u64(e, 0), le_u64(e, 8) as i64);
            // A removed entry keeps the dummy key with hash -1.
            if key != 0 && hash != -1 {
                out.push(key);
            }
        }
        Ok(out)
    }
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// The tasks of `loops` by id.
pub fn tasks_by_id(loops: &[LoopTasks]) -> HashMap<u64, &AsyncTask> {
    loops.iter().flat_map(|l| &l.tasks).map(|t| (t.id, t)).collect()
}
