//! `infertrace dump --async`: the asyncio tasks of a process
//! (read by `crate::families::python::asyncio` into the model's
//! [`crate::recording::asyncio::LoopTasks`]) as a tree per thread's event loop
//! ([`render_async_text`]) or JSON ([`render_async_json`]).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::fmt::{printable, printable_json, printable_text};
use crate::recording::{
    asyncio::{AsyncTask, LoopTasks, TaskState},
    Frame,
};

/// Text: per thread, a header, then each task that no task of the same
/// list awaits, with its coroutine stack (innermost first, like a thread's
/// stack in `dump`) and, indented under it, the tasks it awaits:
///
/// ```text
/// Thread 4057 (python3): event loop 0x7f3a52314b90, 3 tasks, running: none
///   (T) Task-1 0x7fa852314b90 [awaiting _asyncio.Task]
///         tree (/srv/app.py:64)
///     (T) root 0x7fa852314d70 [awaiting _asyncio.Future]
///           TaskGroup._aexit (/usr/lib/python3.14/asyncio/taskgroups.py:121)
///           TaskGroup.__aexit__ (/usr/lib/python3.14/asyncio/taskgroups.py:72)
///           root (/srv/app.py:49)
/// ```
///
/// A task awaited by several tasks is shown under the first, with the
/// others named; names and paths are escaped for the terminal.
pub fn render_async_text(loops: &[LoopTasks]) -> String {
    let mut out = String::new();
    if loops.is_empty() {
        out.push_str("no asyncio tasks and no running event loop\n");
    }
    for l in loops {
        let thread = match (l.tid, &l.thread_name) {
            (Some(tid), Some(name)) => format!("Thread {tid} ({})", printable(name)),
            (Some(tid), None) => format!("Thread {tid}"),
            (None, _) => "Tasks of exited threads".to_string(),
        };
        let lp = l.loop_id.map_or("no running event loop".to_string(), |id| format!("event loop {id:#x}"));
        let by_id: HashMap<u64, &AsyncTask> = l.tasks.iter().map(|t| (t.id, t)).collect();
        let running = match l.running_task.map(|id| by_id.get(&id).map_or(format!("{id:#x}"), |t| printable(&t.name).into_owned())) {
            Some(name) => name,
            None => "none".into(),
        };
        writeln!(out, "{thread}: {lp}, {} tasks, running: {running}", l.tasks.len()).unwrap();
        // Children: the tasks of this list each task is awaited by, in list order.
        let mut children: HashMap<u64, Vec<&AsyncTask>> = HashMap::new();
        let mut roots = Vec::new();
        for t in &l.tasks {
            match t.awaited_by.iter().find(|a| by_id.contains_key(a)) {
                Some(parent) if *parent != t.id => children.entry(*parent).or_default().push(t),
                _ => roots.push(t),
            }
        }
        let mut shown = HashSet::new();
        for t in roots {
            render_task(&mut out, t, 1, &children, &by_id, &mut shown);
        }
        // Tasks only reachable through a cycle of awaiters.
        for t in &l.tasks {
            if !shown.contains(&t.id) {
                render_task(&mut out, t, 1, &children, &by_id, &mut shown);
            }
        }
    }
    printable_text(out)
}

fn render_task(
    out: &mut String,
    t: &AsyncTask,
    depth: usize,
    children: &HashMap<u64, Vec<&AsyncTask>>,
    by_id: &HashMap<u64, &AsyncTask>,
    shown: &mut HashSet<u64>,
) {
    if !shown.insert(t.id) {
        return;
    }
    let pad = "  ".repeat(depth);
    let state = match (t.state, &t.waiting_on) {
        (TaskState::Awaiting, Some(w)) => format!("awaiting {}", printable(&w.type_name)),
        (s, _) => state_name(s).to_string(),
    };
    write!(out, "{pad}(T) {} {:#x} [{state}]", printable(&t.name), t.id).unwrap();
    let others: Vec<String> = t
        .awaited_by
        .iter()
        .skip(1)
        .map(|a| by_id.get(a).map_or(format!("{a:#x}"), |p| printable(&p.name).into_owned()))
        .collect();
    if !others.is_empty() {
        write!(out, " also awaited by {}", others.join(", ")).unwrap();
    }
    out.push('\n');
    if t.coroutine_stack.is_empty() {
        writeln!(out, "{pad}      (no coroutine frames)").unwrap();
    }
    for f in &t.coroutine_stack {
        writeln!(out, "{pad}      {}", frame_text(f)).unwrap();
    }
    for c in children.get(&t.id).into_iter().flatten() {
        render_task(out, c, depth + 1, children, by_id, shown);
    }
}

/// The state as the JSON spells it.
pub fn state_name(s: TaskState) -> &'static str {
    match s {
        TaskState::Running => "running",
        TaskState::Awaiting => "awaiting",
        TaskState::Ready => "ready",
        TaskState::Done => "done",
        TaskState::Unknown => "unknown",
    }
}

fn frame_text(f: &Frame) -> String {
    let function = printable(&f.function);
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{function} ({}:{line})", printable(file)),
        (Some(file), None) => format!("{function} ({})", printable(file)),
        (None, _) => function.into_owned(),
    }
}

/// JSON: `{"loops": [{"tid", "thread_name", "loop_id", "running_task",
/// "tasks": [{"id", "name", "state", "loop_id", "coroutine_stack":
/// [{"function", "file", "line", "kind"}], "awaited_by": [id],
/// "waiting_on": {"id", "type_name"} | null}]}]}`; ids are addresses
/// (numbers), stacks innermost first.
pub fn render_async_json(loops: &[LoopTasks]) -> String {
    let v = serde_json::json!({ "loops": loops });
    printable_json(serde_json::to_string_pretty(&v).expect("asyncio tasks serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::asyncio::Awaitable;
    use crate::recording::FrameKind;

    fn py(function: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: Some("/srv/app.py".into()), line: Some(line), kind: FrameKind::Python, module: None }
    }

    fn task(id: u64, name: &str, awaited_by: &[u64], stack: Vec<Frame>) -> AsyncTask {
        AsyncTask {
            id,
            name: name.into(),
            state: TaskState::Awaiting,
            loop_id: Some(0x500),
            coroutine_stack: stack,
            awaited_by: awaited_by.to_vec(),
            waiting_on: Some(Awaitable { id: 0x900, type_name: "_asyncio.Future".into() }),
        }
    }

    fn loops() -> Vec<LoopTasks> {
        vec![LoopTasks {
            tid: Some(42),
            thread_name: Some("python3".into()),
            loop_id: Some(0x500),
            running_task: None,
            tasks: vec![
                task(0x10, "Task-1", &[], vec![py("main", 9)]),
                task(0x20, "w\x1b[2J", &[0x10], vec![py("sleep", 3), py("mid", 5)]),
                task(0x30, "shared", &[0x10, 0x20], vec![]),
            ],
        }]
    }

    #[test]
    fn text_tree() {
        assert_eq!(
            render_async_text(&loops()),
            "Thread 42 (python3): event loop 0x500, 3 tasks, running: none\n\
             \x20 (T) Task-1 0x10 [awaiting _asyncio.Future]\n\
             \x20       main (/srv/app.py:9)\n\
             \x20   (T) w\\x1b[2J 0x20 [awaiting _asyncio.Future]\n\
             \x20         sleep (/srv/app.py:3)\n\
             \x20         mid (/srv/app.py:5)\n\
             \x20   (T) shared 0x30 [awaiting _asyncio.Future] also awaited by w\\x1b[2J\n\
             \x20         (no coroutine frames)\n"
        );
        assert_eq!(render_async_text(&[]), "no asyncio tasks and no running event loop\n");
    }

    #[test]
    fn json_fields() {
        let v: serde_json::Value = serde_json::from_str(&render_async_json(&loops())).unwrap();
        let l = &v["loops"][0];
        assert_eq!(l["tid"], 42);
        assert_eq!(l["loop_id"], 0x500);
        assert_eq!(l["running_task"], serde_json::Value::Null);
        let t = &l["tasks"][1];
        assert_eq!(t["name"], "w\x1b[2J");
        assert_eq!(t["state"], "awaiting");
        assert_eq!(t["awaited_by"], serde_json::json!([0x10]));
        assert_eq!(t["waiting_on"]["type_name"], "_asyncio.Future");
        assert_eq!(t["coroutine_stack"][0], serde_json::json!({"function": "sleep", "file": "/srv/app.py", "line": 3, "kind": "python"}));
    }
}
