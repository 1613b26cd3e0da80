//! `bpftool`: the loaded BPF programs, and what a running tracer holds.

use std::collections::HashSet;
use std::fs;
use std::process::Command;
use std::thread;
use std::time::Duration;

use serde_json::Value;

use crate::poll;

/// One loaded BPF program, from `bpftool prog list -j`.
#[derive(Clone, Debug)]
pub struct Prog {
    pub id: u64,
    pub name: String,
    /// Processes holding an fd to it (when bpftool reports them).
    pub pids: Vec<u32>,
}

/// The loaded BPF programs.
pub fn bpf_progs() -> Vec<Prog> {
    let o = Command::new("bpftool")
        .args(["prog", "list", "-j"])
        .output()
        .expect("running bpftool");
    assert!(
        o.status.success(),
        "bpftool prog list: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("bpftool json");
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| Prog {
            id: p["id"].as_u64().unwrap(),
            name: p["name"].as_str().unwrap_or("").to_string(),
            pids: p["pids"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x["pid"].as_u64())
                        .map(|x| x as u32)
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// The ids of all loaded programs.
pub fn bpf_prog_ids() -> HashSet<u64> {
    bpf_progs().into_iter().map(|p| p.id).collect()
}

/// Waits until infertrace process `pid` has its syscall programs loaded
/// (`sys_enter` and `sys_exit` programs held by `pid`: through its file
/// descriptors, else as bpftool reports holders, else new ones not in
/// `before`, which on a machine where other tracers start meanwhile takes
/// theirs too). Returns the ids of all programs attributed to it.
pub fn wait_for_tracer_progs(
    pid: u32,
    before: &HashSet<u64>,
    timeout: Duration,
) -> Option<Vec<u64>> {
    poll(timeout, || {
        let progs = bpf_progs();
        let held = held_prog_ids(pid);
        let reports_pids = progs.iter().any(|p| !p.pids.is_empty());
        let mine: Vec<&Prog> = progs
            .iter()
            .filter(|p| !before.contains(&p.id))
            .filter(|p| {
                if !held.is_empty() {
                    held.contains(&p.id)
                } else {
                    !reports_pids || p.pids.contains(&pid)
                }
            })
            .collect();
        let linked = linked_prog_ids();
        // A syscall program counts once it is loaded and, when bpftool can
        // list links, attached through a link.
        let ready = |n: &str| {
            mine.iter()
                .any(|p| p.name == n && linked.as_ref().is_none_or(|l| l.contains(&p.id)))
        };
        (ready("sys_enter") && ready("sys_exit")).then(|| mine.iter().map(|p| p.id).collect())
    })
}

/// Ids of the programs attached through a BPF link (`bpftool link list`),
/// or `None` when bpftool cannot list links.
pub fn linked_prog_ids() -> Option<HashSet<u64>> {
    Some(bpf_links()?.into_iter().map(|(_, prog)| prog).collect())
}

/// The ids of the BPF maps process `pid` holds a file descriptor to (the
/// `map_id:` lines of /proc/PID/fdinfo/*).
pub fn held_map_ids(pid: u32) -> HashSet<u64> {
    held_ids(pid, "map_id:")
}

/// The ids of the BPF links process `pid` holds a file descriptor to.
pub fn held_link_ids(pid: u32) -> HashSet<u64> {
    held_ids(pid, "link_id:")
}

/// The ids of the BPF programs process `pid` holds a file descriptor to,
/// itself or through a link.
pub fn held_prog_ids(pid: u32) -> HashSet<u64> {
    held_ids(pid, "prog_id:")
}

/// The values of the `key` lines (`map_id:`, ...) of /proc/PID/fdinfo/*.
fn held_ids(pid: u32, key: &str) -> HashSet<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return HashSet::new();
    };
    fds.flatten()
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// The BPF links in the system as (link id, program id) (`bpftool link
/// list`), or `None` when bpftool cannot list links.
pub fn bpf_links() -> Option<Vec<(u64, u64)>> {
    let o = Command::new("bpftool")
        .args(["link", "list", "-j"])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&o.stdout).ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter_map(|l| Some((l["id"].as_u64()?, l["prog_id"].as_u64()?)))
            .collect(),
    )
}

/// The entries (`bpftool map dump -j`) of the BPF map named `name` held by
/// process `holder` (found through its fds, or bpftool's `pids`), or `None`
/// when no such map is visible.
pub fn tracer_map_entries(holder: u32, name: &str) -> Option<Vec<Value>> {
    let o = Command::new("bpftool")
        .args(["map", "list", "-j"])
        .output()
        .ok()?;
    let maps: Value = serde_json::from_slice(&o.stdout).ok()?;
    let held = held_map_ids(holder);
    let map = maps.as_array()?.iter().find(|m| {
        m["name"] == name
            && (m["id"].as_u64().is_some_and(|id| held.contains(&id))
                || m["pids"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|p| p["pid"] == holder)))
    })?;
    let id = map["id"].as_u64()?;
    let o = Command::new("bpftool")
        .args(["map", "dump", "id", &id.to_string(), "-j"])
        .output()
        .ok()?;
    let entries: Value = serde_json::from_slice(&o.stdout).ok()?;
    entries.as_array().cloned()
}

/// The raw key of a `bpftool map dump -j` entry (`"key": ["0x2a", ...]`).
pub fn entry_key_bytes(e: &Value) -> Option<Vec<u8>> {
    e["key"].as_array().map(|k| {
        k.iter()
            .filter_map(|b| b.as_str())
            .filter_map(|b| u8::from_str_radix(b.trim_start_matches("0x"), 16).ok())
            .collect()
    })
}

/// Whether the kernel-side target set of tracer `pid` contains `target`:
/// looks for a BPF map named TARGETS held by `pid` and dumps it. Returns
/// `None` if no such map is visible (then callers fall back to a delay).
pub fn tracer_targets_contain(tracer: u32, target: u32) -> Option<bool> {
    tracer_map_has_pid(tracer, "TARGETS", target)
}

/// Whether map `name` of tracer `pid`, keyed by a pid (u32), has `key`;
/// `None` if no such map is visible.
pub fn tracer_map_has_pid(tracer: u32, name: &str, target: u32) -> Option<bool> {
    let entries = tracer_map_entries(tracer, name)?;
    let want = target.to_le_bytes();
    Some(entries.iter().any(|e| {
        if let Some(k) = e["formatted"]["key"].as_u64() {
            return k == target as u64;
        }
        let key = entry_key_bytes(e).unwrap_or_default();
        key.len() >= 4 && key[..4] == want
    }))
}

/// Waits until tracer `tracer` has published the Python layout of `target`
/// to the kernel (`PY_LAYOUT`): by then every program is attached and the
/// target's Python stacks are walked. Panics after 15 s.
pub fn wait_python_attached(tracer: u32, target: u32) {
    let ok = poll(Duration::from_secs(15), || tracer_map_has_pid(tracer, "PY_LAYOUT", target).unwrap_or(false).then_some(()));
    assert!(ok.is_some(), "infertrace (pid {tracer}) did not publish the Python layout of pid {target} within 15 s");
}

/// Waits until tracer `tracer` is tracing `target`: its programs are loaded
/// and (when visible through bpftool) `target` is in its target map; when the
/// map is not visible, waits an extra second after the programs appear.
/// Panics with the tracer's state on timeout.
pub fn wait_attached(tracer: u32, target: u32, before: &HashSet<u64>) {
    let progs = wait_for_tracer_progs(tracer, before, Duration::from_secs(15));
    assert!(
        progs.is_some(),
        "infertrace (pid {tracer}) did not load sys_enter/sys_exit within 15 s"
    );
    let in_map = poll(Duration::from_secs(10), || {
        match tracer_targets_contain(tracer, target) {
            Some(true) => Some(true),
            Some(false) => None,
            None => Some(false),
        }
    });
    match in_map {
        Some(true) => {}
        Some(false) => thread::sleep(Duration::from_secs(1)),
        None => panic!("pid {target} never appeared in infertrace's TARGETS map"),
    }
}
