//! `/targets`: what the agent traces and why — each target with its host
//! PID, its PID inside its own namespace (`NSpid`), its container (from the
//! cgroup path) and the criteria it met.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{container::ContainerInfo, select::Candidate};

#[derive(Clone, Debug, Serialize)]
pub struct TargetInfo {
    /// Host PID (the agent's PID namespace).
    pub pid: u32,
    /// The PID inside the process's own namespace (= `pid` outside any container).
    pub ns_pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
    #[serde(flatten)]
    pub container: ContainerInfo,
    /// The criteria it met (`comm ~ /re/`, `container abc`...), or how it came in.
    pub why: Vec<String>,
    /// `scan` (running when the agent looked) or `exec` (picked up at its exec).
    pub found_by: &'static str,
    pub alive: bool,
    /// When it was picked up (Unix ms).
    pub since_unix_ms: u64,
}

impl TargetInfo {
    pub fn new(c: &Candidate, why: Vec<String>, found_by: &'static str) -> TargetInfo {
        let ns_pid = crate::os::procfs::nspid(c.pid, c.pid).and_then(|v| v.last().copied()).unwrap_or(c.pid);
        TargetInfo {
            pid: c.pid,
            ns_pid,
            comm: c.comm.clone(),
            cmdline: c.cmdline.clone(),
            exe: c.exe.clone(),
            container: c.container.clone(),
            why,
            found_by,
            alive: true,
            since_unix_ms: crate::os::clock::unix_ms(),
        }
    }
}

/// The `/targets` document.
pub fn render(targets: &BTreeMap<u32, TargetInfo>) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        targets: Vec<&'a TargetInfo>,
    }
    let doc = Doc { targets: targets.values().filter(|t| t.alive).collect() };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into())
}
