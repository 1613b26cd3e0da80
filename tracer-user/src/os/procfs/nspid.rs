//! Thread ids across PID namespaces. A process in its own PID namespace
//! (a container, `unshare -p`) knows its threads by the ids of that
//! namespace (`gettid()` there: what CPython stores), while /proc and the
//! kernel programs name them by ours. `NSpid:` in
//! /proc/PID/task/TID/status lists a thread's id in every namespace from
//! the one of this /proc down to the thread's own: the first is ours, the
//! last the process's.

use std::{collections::HashMap, fs};

/// The ids of thread `tid` of process `pid`, from our PID namespace down to
/// the thread's own (one id when it lives in ours). `None`: the thread is
/// gone, or the kernel writes no `NSpid:` line.
pub fn nspid(pid: u32, tid: u32) -> Option<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_nspid(&status)
}

/// The ids of the `NSpid:` line of a status file.
fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Option<Vec<u32>> = line.split_whitespace().map(|v| v.parse().ok()).collect();
    ids.filter(|v| !v.is_empty())
}

/// The threads of one process, each by the id the process itself knows it
/// by, mapped to ours. A thread's ids never change, so each thread's status
/// is read once; a process outside any namespace of its own (known from its
/// main thread) needs no status read at all.
#[derive(Debug)]
pub struct ThreadIdMap {
    pid: u32,
    /// Whether the process lives in a PID namespace below ours (`None`: not
    /// known yet, its main thread's status was unreadable).
    nested: Option<bool>,
    /// Our tid -> the process's own id of that thread.
    own: HashMap<u32, u32>,
}

impl ThreadIdMap {
    pub fn new(pid: u32) -> ThreadIdMap {
        ThreadIdMap { pid, nested: None, own: HashMap::new() }
    }

    /// Whether the process lives in a PID namespace of its own, below ours.
    pub fn nested(&mut self) -> bool {
        if self.nested.is_none() {
            // Without an NSpid line (kernels before 4.1), ids are ours.
            let status = fs::read_to_string(format!("/proc/{}/status", self.pid)).ok();
            self.nested = status.map(|s| parse_nspid(&s).is_some_and(|ids| ids.len() > 1));
        }
        self.nested == Some(true)
    }

    /// The live threads: the process's own id of each -> ours. Identity
    /// outside a nested namespace.
    pub fn threads(&mut self) -> HashMap<u32, u32> {
        let tids = super::thread_ids(self.pid);
        if !self.nested() {
            return tids.into_iter().map(|t| (t, t)).collect();
        }
        self.own.retain(|tid, _| tids.binary_search(tid).is_ok());
        let mut out = HashMap::with_capacity(tids.len());
        for tid in tids {
            let own = match self.own.get(&tid) {
                Some(&own) => own,
                None => {
                    // Gone since the listing: left out.
                    let Some(&own) = nspid(self.pid, tid).as_ref().and_then(|ids| ids.last()) else { continue };
                    self.own.insert(tid, own);
                    own
                }
            };
            out.insert(own, tid);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines() {
        assert_eq!(parse_nspid("Name:\tx\nNSpid:\t4242\t7\t1\nNSsid:\t1\n"), Some(vec![4242, 7, 1]));
        assert_eq!(parse_nspid("Name:\tx\nNSpid:\t4242\n"), Some(vec![4242]));
        assert_eq!(parse_nspid("Name:\tx\nPid:\t4242\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
        assert_eq!(parse_nspid("NSpid:\t12 x\n"), None);
    }

    #[test]
    fn own_threads_map_to_themselves() {
        let me = std::process::id();
        let mut m = ThreadIdMap::new(me);
        let threads = m.threads();
        assert!(!m.nested());
        assert_eq!(threads.get(&me), Some(&me));
        assert_eq!(nspid(me, me), Some(vec![me]));
    }
}
