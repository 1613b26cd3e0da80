//! The processes of one recording: who they are, how they came to be
//! traced, whether they are alive, the command we launched, which of their
//! exited threads keep rows of their own, and the events about them that
//! wait for the collectors.

use std::collections::{BTreeMap, VecDeque};

use crate::{
    os::procfs,
    recording::{Origin, Target},
    engine::{targets::Launched, ExitedThreads, TargetEvent},
};

pub struct TargetState {
    pub target: Target,
    pub alive: bool,
}

impl TargetState {
    pub fn observe(pid: u32, origin: Origin) -> Self {
        let info = procfs::process_info(pid);
        TargetState {
            target: Target {
                pid,
                ppid: info.ppid,
                comm: info.comm.unwrap_or_default(),
                exe: info.exe,
                cmdline: info.cmdline,
                origin,
                exit_code: None,
            },
            alive: true,
        }
    }

    /// Re-reads what exec changed (comm, exe, cmdline), keeping old values
    /// when the process is already gone.
    pub fn refresh(&mut self) {
        let info = procfs::process_info(self.target.pid);
        if let Some(c) = info.comm {
            self.target.comm = c;
        }
        if info.exe.is_some() {
            self.target.exe = info.exe;
        }
        if !info.cmdline.is_empty() {
            self.target.cmdline = info.cmdline;
        }
    }
}

#[derive(Default)]
pub struct TargetSet {
    pub states: BTreeMap<u32, TargetState>,
    /// The command launched by `record -- CMD`, if any.
    pub launched: Option<Launched>,
    /// Which exited threads keep rows of their own (`exited`).
    pub exited: ExitedThreads,
    /// Whether the process follower reports every executable mapping of a
    /// target ([`TargetEvent::Mapped`], from the syscall family's
    /// `sys_exit`); when not, a collector that needs new libraries
    /// re-scans the maps instead.
    pub mappings_followed: bool,
    events: VecDeque<TargetEvent>,
}

impl TargetSet {
    /// Queues an event for every collector (delivered by the session). A
    /// [`TargetEvent::Mapped`] right behind an undelivered one of the same
    /// process (nothing of that process between them) is dropped: the
    /// collectors read the maps when it is delivered, which then hold both
    /// mappings, and a starting process maps dozens of libraries at once.
    pub fn emit(&mut self, ev: TargetEvent) {
        queue_event(&mut self.events, ev);
    }

    pub(in crate::engine) fn next_event(&mut self) -> Option<TargetEvent> {
        self.events.pop_front()
    }

    /// The state of `pid`, created (as followed) when unknown.
    pub fn entry(&mut self, pid: u32, origin: Origin) -> &mut TargetState {
        self.states.entry(pid).or_insert_with(|| TargetState::observe(pid, origin))
    }

    pub fn insert(&mut self, st: TargetState) {
        self.states.insert(st.target.pid, st);
    }

    pub fn alive_count(&self) -> usize {
        self.states.values().filter(|s| s.alive).count()
    }

    /// Targets still alive (by our bookkeeping and by /proc).
    pub fn live_pids(&self) -> Vec<u32> {
        self.states.values().filter(|s| s.alive && procfs::is_alive(s.target.pid)).map(|s| s.target.pid).collect()
    }

    pub fn attached_pids(&self) -> Vec<u32> {
        self.states.values().filter(|s| s.target.origin == Origin::Attached).map(|s| s.target.pid).collect()
    }

    pub fn all_pids(&self) -> Vec<u32> {
        self.states.keys().copied().collect()
    }

    /// Collects the launched command's exit status once it has exited.
    pub fn reap_launched(&mut self) {
        let Some(l) = self.launched.as_mut() else { return };
        if let Some(code) = l.reap(false) {
            let pid = l.pid;
            if let Some(s) = self.states.get_mut(&pid) {
                s.target.exit_code = Some(code);
            }
        }
    }

    /// The launched command as a target: what we exec'd is known, while
    /// /proc may still show the pre-exec fork.
    pub fn launched_state(&self) -> Option<TargetState> {
        let l = self.launched.as_ref()?;
        let mut st = TargetState::observe(l.pid, Origin::Launched);
        st.target.exe = Some(l.path.display().to_string());
        st.target.cmdline = l.argv.clone();
        st.target.comm = l.path.file_name().map(|n| n.to_string_lossy().chars().take(15).collect()).unwrap_or_default();
        Some(st)
    }

    pub fn to_targets(&self) -> Vec<Target> {
        self.states.values().map(|s| s.target.clone()).collect()
    }
}

/// [`TargetSet::emit`]'s queue.
fn queue_event(events: &mut VecDeque<TargetEvent>, ev: TargetEvent) {
    if let TargetEvent::Mapped { pid, .. } = ev {
        let last_of_pid = events.iter().rev().find(|e| e.pid() == pid);
        if matches!(last_of_pid, Some(TargetEvent::Mapped { .. })) {
            return;
        }
    }
    events.push_back(ev);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_queued_back_to_back_are_delivered_once() {
        let mut q = VecDeque::new();
        let mapped = |pid, ts_ns| TargetEvent::Mapped { pid, ts_ns };
        queue_event(&mut q, mapped(1, 10));
        queue_event(&mut q, mapped(1, 11));
        queue_event(&mut q, mapped(2, 12));
        queue_event(&mut q, mapped(1, 13));
        // Across an exec the maps are another program's: kept.
        queue_event(&mut q, TargetEvent::Execed { pid: 2, comm: "x".into() });
        queue_event(&mut q, mapped(2, 14));
        queue_event(&mut q, mapped(2, 15));
        assert_eq!(Vec::from(q.clone()), [mapped(1, 10), mapped(2, 12), TargetEvent::Execed { pid: 2, comm: "x".into() }, mapped(2, 14)]);
        // Once delivered, a new mapping is news again.
        q.clear();
        queue_event(&mut q, mapped(1, 16));
        assert_eq!(q.len(), 1);
    }
}
