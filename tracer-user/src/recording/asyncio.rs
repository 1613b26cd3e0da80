//! asyncio event loops (`record --async`, docs/python.md "asyncio in
//! record"): per event loop its iterations (busy, idle, lag), the Python
//! lines that ran on it, its tasks' time when the interpreter publishes its
//! asyncio structures (3.14+), and the findings (a blocked loop, work
//! serialized behind an executor). Model only: serde types.

use serde::{Deserialize, Serialize};

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

/// A finding about an event loop.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AsyncFinding {
    /// `blocked_event_loop` or `executor_serialized`.
    pub kind: String,
    pub pid: u32,
    /// The loop's thread.
    pub tid: u32,
    /// The user line responsible.
    #[serde(flatten)]
    pub at: AsyncLine,
    /// What the line was doing: `blocking syscall clock_nanosleep`, `CPU`, ...
    pub doing: String,
    /// Steps (blocked loop) or stretches (executor) seen.
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub advice: String,
}
