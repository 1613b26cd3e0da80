//! asyncio event loops (`record --async`, docs/python.md "asyncio in
//! record"): per event loop its iterations (busy, idle, lag), the Python
//! lines that ran on it, its tasks' time when the interpreter publishes its
//! asyncio structures (3.14+), and the findings (a blocked loop, work
//! serialized behind an executor). Model only: serde types.
//!
//! Also the asyncio task tree of a live process as `dump --async` shows it
//! ([`LoopTasks`], [`AsyncTask`]): read by
//! `crate::families::python::asyncio`, rendered by `crate::report::async_dump`.

use serde::{Deserialize, Serialize};

use super::Frame;

/// What `record --async` found; absent from recordings without event loops.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AsyncioReport {
    /// A step longer than this (ns) is a blocked loop (`--blocked-loop`).
    pub blocked_threshold_ns: u64,
    /// Python stacks of event-loop threads read per second.
    pub sample_hz: u32,
    #[serde(default)]
    pub loops: Vec<EventLoop>,
    #[serde(default)]
    pub findings: Vec<AsyncFinding>,
}

/// A Python line (where a loop's or a task's time went).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AsyncLine {
    pub function: String,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: Option<u32>,
}

/// Time at one line, estimated from samples.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LineTime {
    #[serde(flatten)]
    pub at: AsyncLine,
    /// The Python frame beneath the user line, when different (the
    /// library function the line called).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beneath: Option<AsyncLine>,
    pub ns: u64,
    pub samples: u64,
}

/// One event loop: a thread that ran `BaseEventLoop._run_once`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EventLoop {
    pub pid: u32,
    pub tid: u32,
    #[serde(default)]
    pub thread_name: Option<String>,
    /// From the first selector call seen to the last event (ns).
    pub wall_ns: u64,
    /// Selector calls returned (loop iterations).
    pub iterations: u64,
    /// Time outside the selector: running callbacks and task steps.
    pub busy_ns: u64,
    /// Time inside the selector (`epoll_wait`): nothing to do.
    pub idle_ns: u64,
    /// Of `busy_ns`: on CPU, waiting for a CPU (run queue), and off CPU
    /// (blocked in a syscall the loop should not have made).
    pub busy_on_cpu_ns: u64,
    pub busy_runqueue_ns: u64,
    pub busy_blocked_ns: u64,
    /// Loop lag: how long work that becomes ready waits for the loop to
    /// come back to its selector. Mean over the wall time (a random moment
    /// waits on average sum(busy^2) / (2 wall)), and the 99th percentile and
    /// maximum of the busy stretches.
    pub lag_mean_ns: u64,
    pub lag_p99_ns: u64,
    pub lag_max_ns: u64,
    /// Steps over the threshold that no stack sample fell in (before the
    /// sampler found the loop, or while it lagged): not in the findings.
    #[serde(default)]
    pub long_steps_unsampled: u64,
    /// Busy time by the user line that ran (samples of the loop's thread).
    #[serde(default)]
    pub lines: Vec<LineTime>,
    /// Tasks, when the interpreter's asyncio structures could be read.
    #[serde(default)]
    pub tasks: Vec<TaskTime>,
    /// Why `tasks` is empty, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_unavailable: Option<String>,
}

/// What an awaiting task waits for, where it can be named.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum AwaitKind {
    Sleep,
    SocketRead,
    SocketWrite,
    Lock,
    Queue,
    Task,
    Executor,
    Future,
    Other,
}

impl AwaitKind {
    pub fn name(self) -> &'static str {
        match self {
            AwaitKind::Sleep => "sleep",
            AwaitKind::SocketRead => "socket read",
            AwaitKind::SocketWrite => "socket write",
            AwaitKind::Lock => "lock",
            AwaitKind::Queue => "queue",
            AwaitKind::Task => "another task",
            AwaitKind::Executor => "executor future",
            AwaitKind::Future => "future",
            AwaitKind::Other => "other",
        }
    }
}

/// Awaiting time at one `await` line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AwaitTime {
    #[serde(flatten)]
    pub at: AsyncLine,
    pub awaits: AwaitKind,
    pub ns: u64,
}

/// One task's wall time (while seen), split three ways.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskTime {
    /// The task object's address.
    pub id: u64,
    pub name: String,
    /// The task's outermost coroutine.
    #[serde(default)]
    pub coroutine: Option<String>,
    pub wall_ns: u64,
    /// The loop was running this task's step.
    pub running_ns: u64,
    /// Suspended at an `await` on something not done yet.
    pub awaiting_ns: u64,
    /// Ready, waiting for the loop to get to it.
    pub ready_ns: u64,
    #[serde(default)]
    pub running: Vec<LineTime>,
    #[serde(default)]
    pub awaiting: Vec<AwaitTime>,
}

/// What a blocked event loop's step did, by its samples.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum StepActivity {
    /// Ran on the CPU.
    Cpu,
    /// Sat in a blocking syscall (off CPU).
    Syscall,
}

/// A finding about an event loop: its kind, numbers and line. What the line
/// was doing and the advice are the report's to write
/// (`crate::report::findings`); recordings of format 1 carry them as
/// written at record time, and those are shown as they are.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AsyncFinding {
    /// `blocked_event_loop` or `executor_serialized`.
    pub kind: String,
    pub pid: u32,
    /// The loop's thread.
    pub tid: u32,
    /// The user line responsible.
    #[serde(flatten)]
    pub at: AsyncLine,
    /// Format 1: what the line was doing, in words (`blocking syscall
    /// clock_nanosleep`, `CPU`, ...). Absent from format 2 on (the report
    /// writes it from `step`, `syscall` and the loop's times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doing: Option<String>,
    /// Steps (blocked loop) or stretches (executor) seen.
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Format 1: the advice, as written at record time. Absent from format
    /// 2 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    /// `blocked_event_loop`: what the steps did (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepActivity>,
    /// `blocked_event_loop` in a syscall: its name, when the samples caught
    /// the thread in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// `executor_serialized`: the loop's idle time and wall time (its
    /// `idle_ns` and `wall_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_idle_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_wall_ns: Option<u64>,
}

/// The state of a task when it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Running a step now (the thread's `asyncio_running_task`).
    Running,
    /// Suspended on a future (`task_fut_waiter` set): [`AsyncTask::waiting_on`].
    Awaiting,
    /// Pending, not running, waiting on nothing: queued for the loop's next
    /// iteration (a new task, one that yielded with `await sleep(0)`, one
    /// whose future just completed).
    Ready,
    /// Finished or cancelled, still listed.
    Done,
    /// The task's state cannot be read in this build (its `TaskObj` layout
    /// differs from 3.14's): only running is known.
    Unknown,
}

/// The future a task is suspended on (`task._fut_waiter`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Awaitable {
    /// Its address.
    pub id: u64,
    /// Its type's `tp_name` (`_asyncio.Future`, `_asyncio.Task`, ...).
    pub type_name: String,
}

/// One task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncTask {
    /// The task object's address (what `pstree` calls the task id).
    pub id: u64,
    /// `task.get_name()` (`Task-N` for unnamed tasks).
    pub name: String,
    pub state: TaskState,
    /// Address of the event loop the task belongs to (`task._loop`); `None`
    /// where the task layout is not the known one.
    pub loop_id: Option<u64>,
    /// The coroutine stack, innermost first (like a thread stack, leaf
    /// first): for a suspended task each coroutine at the line of the
    /// `await` that suspended it, the task's own coroutine last; for the
    /// running task the thread's frames down to the task's coroutine.
    pub coroutine_stack: Vec<Frame>,
    /// Ids of the futures awaiting this task: tasks (`await task`,
    /// a `TaskGroup`, `gather`) and other futures.
    pub awaited_by: Vec<u64>,
    /// What the task is suspended on, when [`TaskState::Awaiting`].
    pub waiting_on: Option<Awaitable>,
}

/// The tasks of one thread's list (the tasks created in that thread,
/// normally those of its event loop).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopTasks {
    /// Kernel thread id; `None` for the interpreter's list of tasks whose
    /// thread has exited (and a thread whose id could not be found).
    pub tid: Option<u32>,
    pub thread_name: Option<String>,
    /// The loop running in this thread now (`asyncio_running_loop`).
    pub loop_id: Option<u64>,
    /// The task running a step now, if any.
    pub running_task: Option<u64>,
    /// In list order (creation order).
    pub tasks: Vec<AsyncTask>,
}
