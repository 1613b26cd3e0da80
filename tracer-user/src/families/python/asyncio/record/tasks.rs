//! Tasks of an event loop, tick by tick: the seam to the asyncio memory
//! reader (the only place that names it) and the per-task accounting.
//!
//! Each sampler tick reads every loop's tasks ([`LoopTasks`]); each task
//! is charged the time since the previous tick as running (the loop's
//! current task), awaiting (suspended on a future that is not done: at
//! the `await` line of its innermost user coroutine, grouped by what the
//! coroutine stack shows it awaits) or ready (neither: queued behind other
//! tasks' steps).

use std::collections::HashMap;

use crate::{
    families::python::{
        asyncio::{AsyncioError, AsyncioReader},
        Interpreter,
    },
    recording::{
        asyncio::{AsyncLine, AwaitKind, AwaitTime, LineTime, TaskState, TaskTime},
        attribution as sites, Frame,
    },
};

/// One task as read at one tick.
#[derive(Clone, Debug, Default)]
pub struct TaskSnap {
    /// The task object's address.
    pub id: u64,
    pub name: String,
    /// Coroutine stack, innermost coroutine first, each at its suspended
    /// line.
    pub coroutine: Vec<Frame>,
    /// Waiting on a future (`task_fut_waiter` set).
    pub awaiting: bool,
    /// The future it waits on is another task.
    pub awaits_task: bool,
    pub done: bool,
}

/// One event loop's tasks at one tick.
#[derive(Clone, Debug, Default)]
pub struct LoopTasks {
    /// The thread running the loop (0: unknown).
    pub tid: u32,
    /// The task whose step runs now, if any.
    pub running: Option<u64>,
    pub tasks: Vec<TaskSnap>,
}

/// Reads a process's task trees, repeatedly and cheaply.
pub trait TaskSource: Send {
    fn read(&mut self, interp: &mut Interpreter) -> Result<Vec<LoopTasks>, String>;
}

/// Why there is no task reader: for good (`retry` false), or not yet
/// (asyncio not imported yet).
#[derive(Clone, Debug)]
pub struct NoSource {
    pub why: String,
    pub retry: bool,
}

/// The task reader for `interp`, or why there is none. THE seam: the
/// asyncio memory reader of `dump --async` (`python::asyncio`, CPython
/// 3.14+ debug offsets) is adapted here, and nowhere else.
pub fn open_source(interp: &Interpreter) -> Result<Box<dyn TaskSource>, NoSource> {
    let (major, minor, _) = interp.version();
    if (major, minor) < (3, 14) {
        return Err(NoSource {
            why: format!(
                "CPython {major}.{minor} publishes no asyncio debug offsets: per-task time needs 3.14+ (loop busy, idle, lag and blocked-loop findings work without)"
            ),
            retry: false,
        });
    }
    match AsyncioReader::new(interp) {
        Ok(r) => Ok(Box::new(Reader(r))),
        Err(e) => {
            let retry = matches!(e, AsyncioError::NotLoaded { .. } | AsyncioError::Inconsistent { .. } | AsyncioError::Python(_));
            Err(NoSource { why: e.to_string(), retry })
        }
    }
}

/// `python::asyncio`'s reader as a [`TaskSource`].
struct Reader(AsyncioReader);

impl TaskSource for Reader {
    fn read(&mut self, interp: &mut Interpreter) -> Result<Vec<LoopTasks>, String> {
        let loops = self.0.read(interp).map_err(|e| e.to_string())?;
        Ok(loops
            .into_iter()
            .map(|l| LoopTasks {
                tid: l.tid.unwrap_or(0),
                running: l.running_task,
                tasks: l
                    .tasks
                    .into_iter()
                    .map(|t| TaskSnap {
                        id: t.id,
                        awaits_task: t.waiting_on.as_ref().is_some_and(|w| w.type_name.ends_with("Task")),
                        awaiting: t.state == TaskState::Awaiting,
                        done: t.state == TaskState::Done,
                        name: t.name,
                        coroutine: t.coroutine_stack,
                    })
                    .collect(),
            })
            .collect())
    }
}

/// What an awaiting task waits for, from its coroutine stack.
pub fn await_kind(t: &TaskSnap) -> AwaitKind {
    for f in &t.coroutine {
        let file = f.file.as_deref().unwrap_or("");
        let func = f.function.rsplit('.').next().unwrap_or(&f.function);
        let in_asyncio = |m: &str| file.ends_with(&format!("asyncio/{m}.py"));
        let kind = if in_asyncio("tasks") && func == "sleep" {
            Some(AwaitKind::Sleep)
        } else if in_asyncio("streams") || in_asyncio("selector_events") || in_asyncio("base_events") {
            match func {
                "readline" | "read" | "readexactly" | "readuntil" | "_wait_for_data" | "sock_recv" | "sock_recv_into"
                | "sock_recvfrom" | "sock_accept" => Some(AwaitKind::SocketRead),
                "drain" | "_drain_helper" | "sock_sendall" | "sock_sendto" | "sock_connect" => Some(AwaitKind::SocketWrite),
                _ => None,
            }
        } else if in_asyncio("locks") {
            Some(AwaitKind::Lock)
        } else if in_asyncio("queues") {
            Some(AwaitKind::Queue)
        } else if in_asyncio("threads") {
            Some(AwaitKind::Executor)
        } else if in_asyncio("taskgroups") || (in_asyncio("tasks") && matches!(func, "gather" | "wait" | "wait_for" | "_wait")) {
            Some(AwaitKind::Task)
        } else {
            None
        };
        if let Some(k) = kind {
            return k;
        }
        if f.file.as_deref().is_some_and(sites::is_user_file) {
            break;
        }
    }
    if t.awaits_task {
        AwaitKind::Task
    } else if t.awaiting {
        AwaitKind::Future
    } else {
        AwaitKind::Other
    }
}


/// The line a task's time is charged to: its innermost user coroutine.
fn charged_line(coroutine: &[Frame]) -> Option<(AsyncLine, Option<AsyncLine>)> {
    let c = sites::charge(coroutine)?;
    let l = |s: &sites::SiteRef| AsyncLine { function: s.function.clone(), file: s.file.clone(), line: s.line };
    Some((l(&c.site), c.beneath.as_ref().map(l)))
}

/// Tick counts in each stratum: `[idle, busy]` (the loop's thread in its
/// selector or not at the tick). The sampler competes with the target for
/// the CPU, so it ticks more while the loop idles; each stratum's ticks
/// are weighted by the stratum's own time (exact, from the kernel), which
/// removes that bias.
type Strata = [u64; 2];

fn add(s: &mut Strata, k: usize) {
    s[k] += 1;
}

fn ns(s: &Strata, w: &[f64; 2]) -> u64 {
    (s[0] as f64 * w[0] + s[1] as f64 * w[1]).round() as u64
}

#[derive(Default)]
struct TaskAcc {
    name: String,
    coroutine: Option<String>,
    wall: Strata,
    running: Strata,
    awaiting: Strata,
    ready: Strata,
    run_lines: HashMap<(AsyncLine, Option<AsyncLine>), Strata>,
    await_lines: HashMap<(AsyncLine, AwaitKind), Strata>,
}

/// Per-task time of one loop.
#[derive(Default)]
pub struct TaskAccounts {
    tasks: HashMap<u64, TaskAcc>,
    order: Vec<u64>,
    /// Ticks seen per stratum.
    pub ticks: Strata,
}

impl TaskAccounts {
    /// Counts one tick's view of the loop; `busy`: the loop's thread was
    /// outside its selector.
    pub fn tick(&mut self, lt: &LoopTasks, busy: bool) {
        let k = usize::from(busy);
        add(&mut self.ticks, k);
        for t in &lt.tasks {
            if t.done {
                continue;
            }
            let acc = self.tasks.entry(t.id).or_insert_with(|| {
                self.order.push(t.id);
                TaskAcc::default()
            });
            acc.name.clone_from(&t.name);
            if acc.coroutine.is_none() {
                acc.coroutine = t.coroutine.last().map(|f| f.function.clone());
            }
            add(&mut acc.wall, k);
            if lt.running == Some(t.id) {
                add(&mut acc.running, k);
                if let Some(key) = charged_line(&t.coroutine) {
                    add(acc.run_lines.entry(key).or_default(), k);
                }
            } else if t.awaiting {
                add(&mut acc.awaiting, k);
                if let Some((at, _)) = charged_line(&t.coroutine) {
                    add(acc.await_lines.entry((at, await_kind(t))).or_default(), k);
                }
            } else {
                add(&mut acc.ready, k);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// ns per tick in each stratum: the stratum's time over its ticks.
    pub fn weights(&self, idle_ns: u64, busy_ns: u64) -> [f64; 2] {
        let w = |ns: u64, n: u64| if n == 0 { 0.0 } else { ns as f64 / n as f64 };
        [w(idle_ns, self.ticks[0]), w(busy_ns, self.ticks[1])]
    }

    /// Total awaiting time per await line of one kind (for the executor finding).
    pub fn awaiting_by_kind(&self, kind: AwaitKind, w: &[f64; 2]) -> Vec<(AsyncLine, u64)> {
        let mut m: HashMap<AsyncLine, u64> = HashMap::new();
        for acc in self.tasks.values() {
            for ((at, k), c) in &acc.await_lines {
                if *k == kind {
                    *m.entry(at.clone()).or_default() += ns(c, w);
                }
            }
        }
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    pub fn report(&self, w: &[f64; 2]) -> Vec<TaskTime> {
        let mut out: Vec<TaskTime> = self
            .order
            .iter()
            .filter_map(|id| {
                let a = self.tasks.get(id)?;
                let mut running: Vec<LineTime> = a
                    .run_lines
                    .iter()
                    .map(|((at, beneath), c)| LineTime { at: at.clone(), beneath: beneath.clone(), ns: ns(c, w), samples: c[0] + c[1] })
                    .collect();
                running.sort_by(|x, y| y.ns.cmp(&x.ns).then(x.at.cmp(&y.at)));
                let mut awaiting: Vec<AwaitTime> =
                    a.await_lines.iter().map(|((at, k), c)| AwaitTime { at: at.clone(), awaits: *k, ns: ns(c, w) }).collect();
                awaiting.sort_by(|x, y| y.ns.cmp(&x.ns).then(x.at.cmp(&y.at)));
                let (running_ns, awaiting_ns, ready_ns) = (ns(&a.running, w), ns(&a.awaiting, w), ns(&a.ready, w));
                Some(TaskTime {
                    id: *id,
                    name: a.name.clone(),
                    coroutine: a.coroutine.clone(),
                    wall_ns: running_ns + awaiting_ns + ready_ns,
                    running_ns,
                    awaiting_ns,
                    ready_ns,
                    running,
                    awaiting,
                })
            })
            .collect();
        out.sort_by(|x, y| y.wall_ns.cmp(&x.wall_ns).then(x.id.cmp(&y.id)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::FrameKind;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: Some(file.into()), line: Some(line), kind: FrameKind::Python, module: None }
    }

    fn task(id: u64, coroutine: Vec<Frame>, awaiting: bool) -> TaskSnap {
        TaskSnap { id, name: format!("Task-{id}"), coroutine, awaiting, awaits_task: false, done: false }
    }

    #[test]
    fn ticks_split_a_task_three_ways_and_charge_the_await_line() {
        let sleep = py("sleep", "/usr/lib/python3.14/asyncio/tasks.py", 702);
        let handle = py("handle", "/srv/aserve.py", 7);
        let mut acc = TaskAccounts::default();
        let waiting = LoopTasks { tid: 5, running: None, tasks: vec![task(1, vec![sleep.clone(), handle.clone()], true)] };
        let ready = LoopTasks { tid: 5, running: None, tasks: vec![task(1, vec![handle.clone()], false)] };
        let running = LoopTasks { tid: 5, running: Some(1), tasks: vec![task(1, vec![py("handle", "/srv/aserve.py", 8)], false)] };
        // Idle: two ticks awaiting; busy: one ready, one running.
        acc.tick(&waiting, false);
        acc.tick(&waiting, false);
        acc.tick(&ready, true);
        acc.tick(&running, true);
        // 20 ns idle, 8 ns busy, whatever the tick counts.
        let w = acc.weights(20, 8);
        let r = acc.report(&w);
        assert_eq!(r.len(), 1);
        let t = &r[0];
        assert_eq!((t.wall_ns, t.awaiting_ns, t.ready_ns, t.running_ns), (28, 20, 4, 4));
        assert_eq!(t.awaiting[0].at.line, Some(7));
        assert_eq!(t.awaiting[0].awaits, AwaitKind::Sleep);
        assert_eq!(t.running[0].at.line, Some(8));
    }

    #[test]
    fn await_kinds_are_named_from_the_coroutine_stack() {
        let lib = "/usr/lib/python3.14/asyncio/";
        let user = py("handle", "/srv/a.py", 3);
        let k = |f: Frame| await_kind(&task(1, vec![f, user.clone()], true));
        assert_eq!(k(py("StreamReader.readline", &format!("{lib}streams.py"), 1)), AwaitKind::SocketRead);
        assert_eq!(k(py("StreamWriter.drain", &format!("{lib}streams.py"), 1)), AwaitKind::SocketWrite);
        assert_eq!(k(py("Lock.acquire", &format!("{lib}locks.py"), 1)), AwaitKind::Lock);
        assert_eq!(k(py("Queue.get", &format!("{lib}queues.py"), 1)), AwaitKind::Queue);
        assert_eq!(k(py("to_thread", &format!("{lib}threads.py"), 1)), AwaitKind::Executor);
        assert_eq!(k(py("TaskGroup.__aexit__", &format!("{lib}taskgroups.py"), 1)), AwaitKind::Task);
        assert_eq!(await_kind(&task(1, vec![user.clone()], true)), AwaitKind::Future);
    }
}
