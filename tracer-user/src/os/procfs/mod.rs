//! Everything read from /proc: facts about processes and threads (here),
//! their mappings ([`maps`]), their files by the paths they see
//! ([`root`]; what is refused there is counted in [`refused`]) and their thread ids in their own PID namespace
//! ([`nspid`]). Every value here comes from outside the tool, so every
//! accessor returns `Option`/`Result`, never panics.

mod maps;
mod nspid;
pub mod refused;
mod root;

pub use maps::{maps, open_mapped, open_mapped_via, parse_maps, MappedFile, MapsLine};
pub use maps::as_seen_by as maps_as_seen_by;
pub use nspid::{nspid, ThreadIdMap};
pub use refused::{Refused, refuse};
pub use root::{exists_in_root, list_in_root, open_in_root, open_regular, read_capped};

use std::{fs, io, path::{Path, PathBuf}};

/// `PF_KTHREAD` in the `flags` field of /proc/PID/stat.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Reads `rel` of process `pid` with `read`: at `/proc/PID/REL` first, and
/// only when that fails or `usable` refuses what it gave, through a live
/// thread of the process (`/proc/PID/task/TID/REL`, [`stand_in_thread`]).
/// What the kernel serves from a task's memory map or filesystem context
/// (maps, exe, root, cwd, cmdline, environ, map_files) a thread-group leader
/// that has exited no longer has: it answers empty or with an error. Asking
/// the leader first costs nothing for the usual process; checking for an
/// exited leader on every read cost a read of `/proc/PID/stat` each time.
fn through_a_live_thread<T>(pid: u32, rel: &str, read: impl Fn(&Path) -> io::Result<T>, usable: impl Fn(&T) -> bool) -> io::Result<T> {
    let direct = read(Path::new(&format!("/proc/{pid}/{rel}")));
    if direct.as_ref().is_ok_and(&usable) {
        return direct;
    }
    match stand_in_thread(pid) {
        Some(tid) => read(Path::new(&format!("/proc/{pid}/task/{tid}/{rel}"))),
        None => direct,
    }
}

fn proc_path(pid: u32, rel: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{rel}"))
}

/// A live thread of process `pid` whose main thread (tid == pid) has exited
/// (a zombie leader); `None` for any other process.
pub fn stand_in_thread(pid: u32) -> Option<u32> {
    if state(pid)? != 'Z' {
        return None;
    }
    thread_ids(pid).into_iter().find(|&t| t != pid && thread_alive(pid, t))
}

/// The fields of /proc/PID/stat that follow `(comm)`, which may itself hold
/// spaces or parentheses.
fn stat_fields(pid: u32) -> io::Result<Vec<String>> {
    let raw = fs::read_to_string(proc_path(pid, "stat"))?;
    let after = raw
        .rfind(')')
        .map(|i| &raw[i + 1..])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))?;
    Ok(after.split_whitespace().map(str::to_owned).collect())
}

/// (minor, major) page faults of a process so far, its exited threads'
/// included (`minflt`, `majflt`).
pub fn page_faults(pid: u32) -> Option<[u64; 2]> {
    let f = stat_fields(pid).ok()?;
    // After `(comm)`: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt.
    Some([f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?])
}

/// Process state letter (`R`, `S`, `Z`, ...), `None` when the process is gone.
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid).ok()?.first()?.chars().next()
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match state(pid) {
        // A leader that exited before its other threads: alive while they are.
        Some('Z') => stand_in_thread(pid).is_some(),
        Some(s) => s != 'X',
        None => false,
    }
}

pub fn ppid(pid: u32) -> Option<u32> {
    stat_fields(pid).ok()?.get(1)?.parse().ok()
}

pub fn is_kernel_thread(pid: u32) -> Option<bool> {
    // Field 9 of stat is flags; index 6 after the state (fields 3..).
    let flags: u64 = stat_fields(pid).ok()?.get(6)?.parse().ok()?;
    Some(flags & PF_KTHREAD != 0)
}

pub fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(proc_path(pid, "comm")).ok().map(|s| s.trim_end().to_owned())
}

/// The process's executable, as the process sees its path.
pub fn exe(pid: u32) -> Option<String> {
    let p = through_a_live_thread(pid, "exe", |p| fs::read_link(p), |_| true).ok()?.to_string_lossy().into_owned();
    Some(as_seen_by(root_prefix(pid).as_deref(), p))
}

/// The process's root directory as we see it, when it is not ours and lies
/// inside our tree: a process chrooted (`chroot`, `unshare --root`) into a
/// directory we can reach. The kernel writes the paths of
/// `/proc/PID/maps` and `/proc/PID/exe` as the reader sees them, so for
/// such a process they start with this prefix. `None` for our own root and
/// for a root we cannot reach (a container in another mount namespace,
/// whose paths are already written as it sees them).
pub fn root_prefix(pid: u32) -> Option<String> {
    let root = through_a_live_thread(pid, "root", |p| fs::read_link(p), |_| true).ok()?;
    let root = root.to_str()?.trim_end_matches('/');
    (!root.is_empty()).then(|| root.to_owned())
}

/// `path`, read in one of `pid`'s /proc files, as the process sees it
/// (`prefix` from [`root_prefix`]): the prefix stripped, when there.
pub fn as_seen_by(prefix: Option<&str>, path: String) -> String {
    match prefix.and_then(|r| path.strip_prefix(r)) {
        Some(rest) if rest.starts_with('/') => rest.to_owned(),
        _ => path,
    }
}

/// Inode of the process's executable (`stat /proc/PID/exe`).
pub fn exe_inode(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    through_a_live_thread(pid, "exe", |p| fs::metadata(p), |_| true).ok().map(|m| m.ino())
}

/// The text of /proc/PID/maps (see [`parse_maps`]).
pub fn maps_text(pid: u32) -> io::Result<String> {
    through_a_live_thread(pid, "maps", |p| fs::read_to_string(p), |t| !t.is_empty())
}

/// The processes descending from `pid` now (children, their children...),
/// in the order found (parents before their children), from one scan of
/// /proc: at most `limit` of them.
pub fn descendants(pid: u32, limit: usize) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for e in dir.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some(pp) = ppid(p) {
            children.entry(pp).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([pid]);
    while let Some(p) = queue.pop_front() {
        let mut kids = children.remove(&p).unwrap_or_default();
        kids.sort_unstable();
        for k in kids {
            if out.len() >= limit {
                return out;
            }
            out.push(k);
            queue.push_back(k);
        }
    }
    out
}

/// Whether a process or thread with this id exists (`/proc/ID`).
pub fn exists(id: u32) -> bool {
    proc_path(id, "").exists()
}

/// A kernel setting under /proc/sys (`kernel/osrelease`), trimmed.
pub fn sysctl(name: &str) -> Option<String> {
    fs::read_to_string(format!("/proc/sys/{name}")).ok().map(|s| s.trim().to_owned())
}

pub fn cmdline(pid: u32) -> Vec<String> {
    through_a_live_thread(pid, "cmdline", |p| fs::read(p), |b| !b.is_empty())
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The environment a process started with (`/proc/PID/environ`: what it
/// was exec'd with, not later `setenv`s), as (name, value) pairs; empty
/// when unreadable.
pub fn environ(pid: u32) -> Vec<(String, String)> {
    through_a_live_thread(pid, "environ", |p| fs::read(p), |b| !b.is_empty())
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter_map(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The thread group a tid belongs to (works for any tid, not just leaders).
pub fn tgid_of(tid: u32) -> Option<u32> {
    let status = fs::read_to_string(proc_path(tid, "status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
}

/// True while thread `tid` of process `pid` exists (zombie threads excluded).
pub fn thread_alive(pid: u32, tid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) {
        Ok(s) => match s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next()) {
            Some(st) => st != "Z" && st != "X",
            None => false,
        },
        Err(_) => false,
    }
}

/// State letter of one thread (`R`, `S`, `D`, ...).
pub fn thread_state(pid: u32, tid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next()).and_then(|st| st.chars().next())
}

/// CPU time of one thread as the scheduler counts it
/// (`se.sum_exec_runtime`, first field of /proc/PID/task/TID/schedstat).
pub fn thread_exec_ns(pid: u32, tid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Name of one thread.
pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok().map(|s| s.trim_end().to_owned())
}

/// Thread ids of a process, ascending (empty when it is gone).
pub fn thread_ids(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(proc_path(pid, "task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The syscall a thread is blocked in, from /proc/PID/task/TID/syscall
/// (`None` when it is running, in user space, or unreadable).
pub fn blocked_syscall(pid: u32, tid: u32) -> Option<u32> {
    let raw = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let first = raw.split_whitespace().next()?;
    first.parse::<i64>().ok().filter(|n| *n >= 0).map(|n| n as u32)
}

/// Effective capability mask of this process (CapEff in /proc/self/status).
pub fn own_effective_caps() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Snapshot of the facts the report shows about a target.
#[derive(Clone, Debug, Default)]
pub struct ProcessInfo {
    pub comm: Option<String>,
    pub exe: Option<String>,
    pub cmdline: Vec<String>,
    pub ppid: Option<u32>,
}

pub fn process_info(pid: u32) -> ProcessInfo {
    ProcessInfo { comm: comm(pid), exe: exe(pid), cmdline: cmdline(pid), ppid: ppid(pid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert_eq!(tgid_of(me), Some(me));
        assert_eq!(is_kernel_thread(me), Some(false));
        assert!(!cmdline(me).is_empty());
        assert!(exe(me).is_some());
    }

    #[test]
    fn missing_process_is_dead() {
        // pid_max is at most 2^22, so this pid cannot exist.
        assert!(!is_alive(u32::MAX - 1));
        assert_eq!(state(u32::MAX - 1), None);
    }
}
