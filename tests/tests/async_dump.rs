//! `infertrace dump -p PID --async`: the asyncio task tree of a live
//! process, compared with what CPython's own tool prints for the same
//! process, `python3.X -m asyncio pstree PID` (the tree, with each
//! coroutine's file and line) and `python3.X -m asyncio ps PID` (a row per
//! task and awaiter: thread id, task id, name, coroutine stack, awaiter
//! chain, awaiter name and id), run by the target's own interpreter in the
//! target's own root and mount namespace (`nsenter -t PID -m -r`, which
//! also gives it /proc), on Debian sid's 3.14 and 3.15 (tests/src/pyroot.rs).
//! Workload: tests/workloads/async_tree.py. Also: two event loops in two
//! threads keep their tasks apart; the running task is named, with the
//! thread's frames as its stack; 3.11-3.13 are refused with one line.
//!
//! Needs root, the infertrace binary, nsenter (util-linux), the chroot
//! interpreters (`cargo xtask setup`) and pyenv's 3.11-3.13; under
//! `CI=true` a missing one fails the test.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

fn script() -> PathBuf {
    workspace_root().join("tests/workloads/async_tree.py").canonicalize().unwrap()
}

fn chroot_or_skip(test: &str) -> Vec<PythonExe> {
    if !in_path("nsenter") {
        skip(test, "nsenter (util-linux)");
        return Vec::new();
    }
    chroot_pythons_or_skip(test)
}

/// `async_tree.py MODE` under `python`, once it printed its ready line
/// (returned, split in words); killed on drop.
struct Workload {
    child: Child,
    ready: Vec<String>,
}

impl Workload {
    fn start(python: &Path, mode: &str) -> Workload {
        let mut child = Command::new(python)
            .arg(script())
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = line_channel(child.stdout.take().unwrap());
        let mut w = Workload { child, ready: Vec::new() };
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with("ready") => w.ready = l.split_whitespace().map(String::from).collect(),
            other => panic!("{} {mode}: no ready line: {other:?}", python.display()),
        }
        w
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `infertrace dump -p PID --async --format json`: its loops.
fn dump_async(pid: u32) -> Vec<Value> {
    let r = run_infertrace(["dump", "-p", &pid.to_string(), "--async", "--format", "json"]);
    r.assert_ok();
    let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{}", r.describe()));
    v["loops"].as_array().unwrap_or_else(|| panic!("no loops list: {v}")).clone()
}

/// `python3.MINOR -m asyncio TOOL PID` in the target's root and mount
/// namespace (it reads the target's maps by the paths the target sees).
fn asyncio_tool(minor: u32, tool: &str, pid: u32) -> String {
    let r = run_cmd(
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "-r", "-w"])
            .arg(format!("/usr/bin/python3.{minor}"))
            .args(["-m", "asyncio", tool, &pid.to_string()]),
        RUN_TIMEOUT,
    );
    r.assert_ok();
    r.stdout
}

fn tasks_of(loops: &[Value]) -> Vec<&Value> {
    loops.iter().flat_map(|l| l["tasks"].as_array().unwrap()).collect()
}

fn hex(v: &Value) -> String {
    format!("{:#x}", v.as_u64().unwrap())
}

fn functions(stack: &Value) -> Vec<String> {
    stack.as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap().to_string()).collect()
}

/// pstree's label of a frame: `function file:line`.
fn frame_label(f: &Value) -> String {
    format!("{} {}:{}", f["function"].as_str().unwrap(), f["file"].as_str().unwrap(), f["line"])
}

/// One row of `ps`: (tid, task id, name, coroutine stack, awaiter chain,
/// awaiter name, awaiter id), chains as `a -> b`.
type PsRow = (String, String, String, String, String, String, String);

/// Parses `asyncio ps` (names without spaces; the columns overflow their
/// widths, so rows are split on words: two chains of `a -> b` words, the
/// awaiter's name and id last, or `0x0` alone when there is no awaiter).
fn parse_ps(text: &str) -> BTreeSet<PsRow> {
    let mut rows = BTreeSet::new();
    for line in text.lines().skip(2).filter(|l| !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(w.len() >= 4, "short ps row {line:?}");
        let (tid, id, name) = (w[0], w[1], w[2]);
        let last = *w.last().unwrap();
        let (middle, aname) = if last == "0x0" { (&w[3..w.len() - 1], "") } else { (&w[3..w.len() - 2], w[w.len() - 2]) };
        // The chains: words alternating name, "->", name ...; a new chain
        // starts where two names are adjacent.
        let mut chains: Vec<Vec<&str>> = vec![Vec::new()];
        for (i, word) in middle.iter().enumerate() {
            if i > 0 && *word != "->" && middle[i - 1] != "->" {
                chains.push(Vec::new());
            }
            chains.last_mut().unwrap().push(word);
        }
        let join = |c: Option<&Vec<&str>>| c.map(|c| c.join(" ")).unwrap_or_default();
        rows.insert((
            tid.to_string(),
            id.to_string(),
            name.to_string(),
            join(chains.first()),
            join(chains.get(1)),
            aname.to_string(),
            last.to_string(),
        ));
    }
    rows
}

/// The same rows from infertrace's JSON.
fn ps_rows_of(loops: &[Value]) -> BTreeSet<PsRow> {
    let by_id: HashMap<u64, &Value> = tasks_of(loops).into_iter().map(|t| (t["id"].as_u64().unwrap(), t)).collect();
    let mut rows = BTreeSet::new();
    for l in loops {
        let tid = l["tid"].as_u64().map_or("0".to_string(), |t| t.to_string());
        for t in l["tasks"].as_array().unwrap() {
            let stack = functions(&t["coroutine_stack"]).join(" -> ");
            let row = |chain: String, aname: String, aid: String| {
                (tid.clone(), hex(&t["id"]), t["name"].as_str().unwrap().to_string(), stack.clone(), chain, aname, aid)
            };
            let awaiters = t["awaited_by"].as_array().unwrap();
            if awaiters.is_empty() {
                rows.insert(row(String::new(), String::new(), "0x0".into()));
            }
            for a in awaiters {
                let parent = by_id.get(&a.as_u64().unwrap()).unwrap_or_else(|| panic!("awaiter {a} is not a task"));
                rows.insert(row(
                    functions(&parent["coroutine_stack"]).join(" -> "),
                    parent["name"].as_str().unwrap().to_string(),
                    hex(a),
                ));
            }
        }
    }
    rows
}

/// Every node of `pstree`'s tree as the labels from its root down
/// (`(T) name` for tasks, `function file:line` for coroutines).
fn parse_pstree(text: &str) -> BTreeMap<Vec<String>, usize> {
    let mut paths = BTreeMap::new();
    let mut stack: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let pos = line.find("└── ").or_else(|| line.find("├── ")).unwrap_or_else(|| panic!("pstree line {line:?}"));
        let depth = line[..pos].chars().count() / 4;
        let label = line[pos..].chars().skip(4).collect::<String>().trim().to_string();
        stack.truncate(depth);
        stack.push(label);
        *paths.entry(stack.clone()).or_insert(0) += 1;
    }
    paths
}

/// The tree `pstree` draws (Lib/asyncio/tools.py: each awaiter's stack,
/// outermost first, under the awaiter task, the awaited task under its
/// innermost frame; tasks awaiting no task get their own stack), built
/// from infertrace's JSON, as [`parse_pstree`] gives it.
fn pstree_of(loops: &[Value]) -> BTreeMap<Vec<String>, usize> {
    let tasks = tasks_of(loops);
    let by_id: HashMap<u64, &Value> = tasks.iter().map(|t| (t["id"].as_u64().unwrap(), *t)).collect();
    let labels = |t: &Value| -> Vec<String> { t["coroutine_stack"].as_array().unwrap().iter().rev().map(frame_label).collect() };
    let name = |id: u64| format!("(T) {}", by_id[&id]["name"].as_str().unwrap());
    // node -> children (nodes: task ids and coroutine nodes "c<n>").
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    enum Node {
        Task(u64),
        Coro(usize),
    }
    let mut children: HashMap<Node, Vec<Node>> = HashMap::new();
    let mut coro_label: Vec<String> = Vec::new();
    let mut coro_of: HashMap<(Node, String), Node> = HashMap::new();
    let mut child_of = |parent: Node, label: String, children: &mut HashMap<Node, Vec<Node>>, coro_label: &mut Vec<String>| -> Node {
        if let Some(n) = coro_of.get(&(parent.clone(), label.clone())) {
            return n.clone();
        }
        let n = Node::Coro(coro_label.len());
        coro_label.push(label.clone());
        children.entry(parent.clone()).or_default().push(n.clone());
        coro_of.insert((parent, label), n.clone());
        n
    };
    let mut awaiting = std::collections::HashSet::new();
    for t in &tasks {
        for a in t["awaited_by"].as_array().unwrap() {
            let parent = a.as_u64().unwrap();
            awaiting.insert(parent);
            let mut cur = Node::Task(parent);
            for l in labels(by_id[&parent]) {
                cur = child_of(cur, l, &mut children, &mut coro_label);
            }
            let kid = Node::Task(t["id"].as_u64().unwrap());
            let list = children.entry(cur).or_default();
            if !list.contains(&kid) {
                list.push(kid);
            }
        }
    }
    for t in &tasks {
        let id = t["id"].as_u64().unwrap();
        if !awaiting.contains(&id) {
            let mut cur = Node::Task(id);
            for l in labels(t) {
                cur = child_of(cur, l, &mut children, &mut coro_label);
            }
        }
    }
    let all_children: std::collections::HashSet<Node> = children.values().flatten().cloned().collect();
    let mut paths = BTreeMap::new();
    fn walk(
        n: &Node,
        prefix: &mut Vec<String>,
        label: &dyn Fn(&Node) -> String,
        children: &HashMap<Node, Vec<Node>>,
        out: &mut BTreeMap<Vec<String>, usize>,
    ) {
        prefix.push(label(n));
        *out.entry(prefix.clone()).or_insert(0) += 1;
        for c in children.get(n).into_iter().flatten() {
            walk(c, prefix, label, children, out);
        }
        prefix.pop();
    }
    let label = |n: &Node| match n {
        Node::Task(id) => name(*id),
        Node::Coro(i) => coro_label[*i].clone(),
    };
    for t in &tasks {
        let n = Node::Task(t["id"].as_u64().unwrap());
        if !all_children.contains(&n) {
            walk(&n, &mut Vec::new(), &label, &children, &mut paths);
        }
    }
    paths
}

/// pstree and ps of the same interpreter against infertrace, read in
/// between the two: every task's id, name, thread, coroutine stack with
/// each coroutine's file and line, and awaiter chain are the same.
#[test]
fn dump_async_agrees_with_pstree() {
    let test = "dump_async_agrees_with_pstree";
    require!(test, Root, Binary);
    let src = script();
    let marks = markers_of(&src);
    for p in chroot_or_skip(test) {
        let label = &p.label;
        let w = Workload::start(&p.exe, "tree");
        let pid = w.pid();
        let tree = asyncio_tool(p.minor, "pstree", pid);
        let ps = asyncio_tool(p.minor, "ps", pid);
        let loops = dump_async(pid);
        eprintln!("{label}: pstree:\n{tree}");

        // Ground truth from the workload itself: 15 tasks, named as it names them.
        let names: BTreeSet<&str> = tasks_of(&loops).iter().map(|t| t["name"].as_str().unwrap()).collect();
        let want: BTreeSet<&str> = [
            "Task-1", "Task-2", "root", "worker-1", "worker-2", "worker-3", "group-b", "inner-1", "inner-2", "holder", "waiter-1",
            "waiter-2", "shared", "joiner-1", "joiner-2",
        ]
        .into();
        assert_eq!(names, want, "{label}: task names");
        assert_eq!(loops.len(), 1, "{label}: one thread with tasks: {loops:?}");
        assert_eq!(loops[0]["tid"], pid, "{label}: the tasks are the main thread's");
        assert!(loops[0]["loop_id"].as_u64().is_some(), "{label}: a running loop");
        assert_eq!(loops[0]["running_task"], Value::Null, "{label}: every task is suspended");
        let by_name: HashMap<&str, &Value> = tasks_of(&loops).into_iter().map(|t| (t["name"].as_str().unwrap(), t)).collect();
        let w1 = by_name["worker-1"];
        assert_eq!(functions(&w1["coroutine_stack"]), ["sleep", "leaf", "mid"], "{label}");
        let src_s = src.to_str().unwrap();
        assert_eq!(w1["coroutine_stack"][1]["file"], src_s, "{label}");
        assert_eq!(w1["coroutine_stack"][1]["line"], marks["await-sleep"], "{label}: leaf's await line");
        assert_eq!(w1["coroutine_stack"][2]["line"], marks["await-leaf"], "{label}: mid's await line");
        assert_eq!(w1["awaited_by"], Value::from(vec![by_name["root"]["id"].clone()]), "{label}");
        assert_eq!(by_name["inner-2"]["awaited_by"][0], by_name["group-b"]["id"], "{label}");
        assert_eq!(by_name["root"]["awaited_by"][0], by_name["Task-1"]["id"], "{label}");
        assert_eq!(by_name["Task-1"]["coroutine_stack"][0]["line"], marks["main-await-root"], "{label}");
        for t in tasks_of(&loops) {
            assert_eq!(t["state"], "awaiting", "{label}: {t}");
            assert_eq!(t["loop_id"], loops[0]["loop_id"], "{label}: {t}");
        }
        assert_eq!(by_name["Task-1"]["waiting_on"]["type_name"], "_asyncio.Task", "{label}");
        // Two awaiters: a set.
        let joiners: BTreeSet<u64> = ["joiner-1", "joiner-2"].iter().map(|n| by_name[n]["id"].as_u64().unwrap()).collect();
        let awaiters: BTreeSet<u64> = by_name["shared"]["awaited_by"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(awaiters, joiners, "{label}: shared is awaited by both joiners");
        assert_eq!(by_name["joiner-1"]["coroutine_stack"][0]["line"], marks["await-shared"], "{label}");
        assert_eq!(by_name["waiter-1"]["waiting_on"]["type_name"], "_asyncio.Future", "{label}");
        assert_eq!(by_name["waiter-1"]["coroutine_stack"].as_array().unwrap().last().unwrap()["line"], marks["await-lock"], "{label}");

        // CPython's own reading of the same process.
        assert_eq!(ps_rows_of(&loops), parse_ps(&ps), "{label}: `asyncio ps` rows differ\n{ps}");
        let ours = pstree_of(&loops);
        let theirs = parse_pstree(&tree);
        assert_eq!(ours, theirs, "{label}: `asyncio pstree` differs\n{tree}");
        assert!(theirs.len() >= 40, "{label}: a tree this size: {}", theirs.len());

        // The text form names the same tasks and lines.
        let r = run_infertrace(["dump", "-p", &pid.to_string(), "--async"]);
        r.assert_ok();
        assert!(r.stdout.starts_with(&format!("Thread {pid} (")), "{label}\n{}", r.stdout);
        assert!(r.stdout.contains(&format!("leaf ({src_s}:{})", marks["await-sleep"])), "{label}\n{}", r.stdout);
        assert!(r.stdout.contains("(T) worker-3 0x"), "{label}\n{}", r.stdout);
    }
}

/// Two threads, each running its own loop: each thread's tasks are its
/// loop's (the workload's own thread ids and names), the loops differ, and
/// 3.15's `asyncio ps` puts every task in the same thread (3.14's reads
/// the main thread only).
#[test]
fn dump_async_two_loops() {
    let test = "dump_async_two_loops";
    require!(test, Root, Binary);
    for p in chroot_or_skip(test) {
        let label = &p.label;
        let w = Workload::start(&p.exe, "two_loops");
        let pid = w.pid();
        let tids: HashMap<&str, u64> = [("A", w.ready[1].parse().unwrap()), ("B", w.ready[2].parse().unwrap())].into();
        let loops = dump_async(pid);
        assert_eq!(loops.len(), 2, "{label}: two threads with tasks, the main thread has none: {loops:#?}");
        let mut loop_ids = BTreeSet::new();
        for l in &loops {
            let tag = l["thread_name"].as_str().unwrap().strip_prefix("loop-").unwrap_or_else(|| panic!("{label}: {l}"));
            assert_eq!(l["tid"].as_u64(), Some(tids[tag]), "{label}: thread of loop {tag}");
            let lid = l["loop_id"].as_u64().unwrap();
            loop_ids.insert(lid);
            let names: BTreeSet<&str> = l["tasks"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
            let workers: BTreeSet<String> = (1..=3).map(|i| format!("{tag}-worker-{i}")).collect();
            let mut want: BTreeSet<&str> = workers.iter().map(String::as_str).collect();
            want.insert(if tag == "A" { "Task-1" } else { "Task-2" });
            // Task numbering is per process: the loop that started first has Task-1.
            let alt: BTreeSet<&str> = want.iter().map(|n| match *n { "Task-1" => "Task-2", "Task-2" => "Task-1", n => n }).collect();
            assert!(names == want || names == alt, "{label}: loop {tag} holds {names:?}");
            for t in l["tasks"].as_array().unwrap() {
                assert_eq!(t["loop_id"].as_u64(), Some(lid), "{label}: {t} belongs to loop {tag}");
            }
        }
        assert_eq!(loop_ids.len(), 2, "{label}: two distinct loops");
        // 3.15's tool reads every thread's list; 3.14.x's reads only the
        // main thread's and the interpreter's (here: no rows), so there its
        // rows can only be a subset of ours.
        let ps = asyncio_tool(p.minor, "ps", pid);
        let (ours, theirs) = (ps_rows_of(&loops), parse_ps(&ps));
        if p.minor >= 15 {
            assert_eq!(ours, theirs, "{label}: `asyncio ps` rows differ\n{ps}");
        } else {
            assert!(theirs.is_subset(&ours), "{label}: `asyncio ps` rows not among ours\n{ps}");
        }
    }
}

/// A task running on the CPU (never yielding): it is the thread's running
/// task, in state running, its stack the thread's frames from spin() down
/// to its coroutine; the other tasks are suspended, or ready (scheduled,
/// never run, behind the blocked loop).
#[test]
fn dump_async_running_task() {
    let test = "dump_async_running_task";
    require!(test, Root, Binary);
    let src = script();
    let marks = markers_of(&src);
    for p in chroot_or_skip(test) {
        let label = &p.label;
        let w = Workload::start(&p.exe, "spin");
        let loops = dump_async(w.pid());
        assert_eq!(loops.len(), 1, "{label}: {loops:#?}");
        let by_name: HashMap<&str, &Value> = tasks_of(&loops).into_iter().map(|t| (t["name"].as_str().unwrap(), t)).collect();
        let spinner = by_name["spinner"];
        assert_eq!(loops[0]["running_task"], spinner["id"], "{label}");
        assert_eq!(spinner["state"], "running", "{label}");
        let stack = spinner["coroutine_stack"].as_array().unwrap();
        assert_eq!(functions(&spinner["coroutine_stack"]), ["spin", "busy"], "{label}");
        let spin_line = stack[0]["line"].as_u64().unwrap();
        assert!((marks["spin-loop"]..=marks["spin-loop"] + 1).contains(&spin_line), "{label}: spin at line {spin_line}");
        assert_eq!(stack[1]["line"], marks["busy-calls-spin"], "{label}");
        assert_eq!(by_name["idle-1"]["state"], "awaiting", "{label}");
        assert_eq!(functions(&by_name["idle-1"]["coroutine_stack"]), ["sleep", "leaf", "mid"], "{label}");
        assert_eq!(by_name["Task-1"]["state"], "awaiting", "{label}");
        // Created by the spinner, scheduled, never run: ready, its coroutine
        // not started (its only frame, at the function's first line).
        let queued = by_name["queued"];
        assert_eq!(queued["state"], "ready", "{label}");
        assert_eq!(queued["waiting_on"], Value::Null, "{label}");
        assert_eq!(functions(&queued["coroutine_stack"]), ["mid"], "{label}");
    }
}

/// 3.11 - 3.13 publish no asyncio offsets: one error line saying 3.14 is
/// needed, exit code 1, nothing on stdout.
#[test]
fn dump_async_needs_314() {
    let test = "dump_async_needs_314";
    require!(test, Root, Binary);
    let (found, missing) = expected_pythons();
    let olds: Vec<&PythonExe> = found.iter().filter(|p| p.root.is_none() && (11..=13).contains(&p.minor)).collect();
    let missing: Vec<String> = missing.into_iter().filter(|m| ["3.11", "3.12", "3.13"].iter().any(|v| m.contains(v))).collect();
    if olds.is_empty() {
        skip(test, &format!("pyenv CPython 3.11-3.13 ({})", missing.join(", ")));
        return;
    }
    if !skip_some(test, &missing) {
        return;
    }
    for p in olds {
        let w = Workload::start(&p.exe, "tree");
        let r = run_infertrace(["dump", "-p", &w.pid().to_string(), "--async"]);
        assert_eq!(r.code(), Some(1), "{}: {}", p.label, r.describe());
        let line = single_error_line(&r);
        assert!(line.contains("--async needs CPython 3.14 or later"), "{}: {line}", p.label);
        assert!(line.contains(&format!("CPython 3.{}.", p.minor)), "{}: {line}", p.label);
        assert!(r.stdout.is_empty(), "{}: {}", p.label, r.describe());
    }
}

/// A loop creating and finishing thousands of tasks a second: every one of
/// 30 dumps succeeds (a read that meets a freed task is made again), and
/// lists only the workload's tasks (`Task-1` and `short-N`) in valid states.
#[test]
fn dump_async_churn() {
    let test = "dump_async_churn";
    require!(test, Root, Binary);
    for p in chroot_or_skip(test) {
        let label = &p.label;
        let w = Workload::start(&p.exe, "churn");
        let mut seen_short = 0;
        for i in 0..30 {
            let r = run_infertrace(["dump", "-p", &w.pid().to_string(), "--async", "--format", "json"]);
            assert!(r.status.success(), "{label}: dump {i}: {}", r.describe());
            let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{label}: not JSON: {e}\n{}", r.describe()));
            let loops = v["loops"].as_array().unwrap();
            assert_eq!(loops.len(), 1, "{label}: {v}");
            for t in tasks_of(loops) {
                let name = t["name"].as_str().unwrap();
                let short = name.strip_prefix("short-").is_some_and(|n| n.parse::<u64>().is_ok());
                assert!(short || name == "Task-1", "{label}: unexpected task {t}");
                seen_short += usize::from(short);
                let state = t["state"].as_str().unwrap();
                // done: finished, not yet off the list.
                assert!(["running", "awaiting", "ready", "done"].contains(&state), "{label}: {t}");
            }
        }
        assert!(seen_short > 0, "{label}: no short-N task seen in 30 dumps");
    }
}
