//! Which processes the agent traces: `--pid`, `--comm REGEX`, `--cmdline
//! REGEX`, `--exe PATH`, `--cgroup PATH`, `--container ID-or-prefix`,
//! `--python`. Criteria of different kinds combine with AND (a process must
//! meet every one given); repeated `--pid` values are alternatives. With no
//! criterion at all, nothing is selected (the CLI refuses that).

use regex::Regex;

use super::container::{self, ContainerInfo};
use crate::os::procfs;

#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub pids: Vec<u32>,
    pub comm: Option<Regex>,
    pub cmdline: Option<Regex>,
    pub exe: Option<String>,
    pub cgroup: Option<String>,
    pub container: Option<String>,
    pub python: bool,
}

/// What is known of a process when it is matched.
#[derive(Clone, Debug, Default)]
pub struct Candidate {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
    pub container: ContainerInfo,
}

impl Candidate {
    /// Reads it from /proc; `None` when gone (or a kernel thread).
    pub fn read(pid: u32) -> Option<Candidate> {
        if procfs::is_kernel_thread(pid) != Some(false) {
            return None;
        }
        let info = procfs::process_info(pid);
        Some(Candidate {
            pid,
            comm: info.comm?,
            cmdline: info.cmdline,
            exe: info.exe,
            container: container::of_pid(pid)?,
        })
    }
}

/// CPython, by the executable's or the comm's name (`python3`, `python3.12`, `python`).
fn is_python(c: &Candidate) -> bool {
    let looks = |s: &str| {
        let base = s.rsplit('/').next().unwrap_or(s);
        base.strip_prefix("python").is_some_and(|rest| rest.chars().all(|ch| ch.is_ascii_digit() || ch == '.'))
    };
    c.exe.as_deref().is_some_and(looks) || looks(&c.comm)
}

impl Selector {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty()
            && self.comm.is_none()
            && self.cmdline.is_none()
            && self.exe.is_none()
            && self.cgroup.is_none()
            && self.container.is_none()
            && !self.python
    }

    /// Whether `c` is selected, and why (the criteria it met, for /targets).
    pub fn matches(&self, c: &Candidate) -> Option<Vec<String>> {
        if self.is_empty() || c.pid == std::process::id() {
            return None;
        }
        let mut why = Vec::new();
        if !self.pids.is_empty() {
            if !self.pids.contains(&c.pid) {
                return None;
            }
            why.push(format!("pid {}", c.pid));
        }
        if let Some(re) = &self.comm {
            if !re.is_match(&c.comm) {
                return None;
            }
            why.push(format!("comm ~ /{re}/"));
        }
        if let Some(re) = &self.cmdline {
            if !re.is_match(&c.cmdline.join(" ")) {
                return None;
            }
            why.push(format!("cmdline ~ /{re}/"));
        }
        if let Some(exe) = &self.exe {
            if c.exe.as_deref() != Some(exe.as_str()) {
                return None;
            }
            why.push(format!("exe {exe}"));
        }
        if let Some(cg) = &self.cgroup {
            let p = &c.container.cgroup;
            let under = p == cg || p.strip_prefix(cg.trim_end_matches('/')).is_some_and(|r| r.starts_with('/'));
            if !under {
                return None;
            }
            why.push(format!("cgroup {cg}"));
        }
        if let Some(id) = &self.container {
            if !c.container.container_id.as_deref().is_some_and(|cid| cid.starts_with(id.as_str())) {
                return None;
            }
            why.push(format!("container {id}"));
        }
        if self.python {
            if !is_python(c) {
                return None;
            }
            why.push("python".into());
        }
        Some(why)
    }
}

/// Every process of the machine (numeric /proc entries).
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(pid: u32, comm: &str, exe: &str, cgroup: &str) -> Candidate {
        Candidate {
            pid,
            comm: comm.into(),
            cmdline: vec![exe.into(), "serve.py".into()],
            exe: Some(exe.into()),
            container: container::from_path(cgroup),
        }
    }

    #[test]
    fn criteria_combine_with_and() {
        let id = "ab".repeat(32);
        let c = cand(42, "python3", "/usr/bin/python3.11", &format!("/libpod_parent/libpod-{id}"));
        let s = Selector { comm: Some(Regex::new("^py").unwrap()), python: true, ..Default::default() };
        assert_eq!(s.matches(&c).unwrap(), ["comm ~ /^py/", "python"]);
        let s = Selector { comm: Some(Regex::new("^py").unwrap()), container: Some("abab".into()), ..Default::default() };
        assert!(s.matches(&c).is_some());
        let s = Selector { comm: Some(Regex::new("^py").unwrap()), container: Some("cd".into()), ..Default::default() };
        assert!(s.matches(&c).is_none());
        let s = Selector { pids: vec![1, 42], cmdline: Some(Regex::new("serve").unwrap()), ..Default::default() };
        assert!(s.matches(&c).is_some());
        let s = Selector { pids: vec![1], ..Default::default() };
        assert!(s.matches(&c).is_none());
        assert!(Selector::default().matches(&c).is_none(), "no criterion selects nothing");
    }

    #[test]
    fn cgroup_prefix_is_by_component() {
        let c = cand(7, "w", "/bin/w", "/system.slice/app.service");
        let sel = |p: &str| Selector { cgroup: Some(p.into()), ..Default::default() };
        assert!(sel("/system.slice").matches(&c).is_some());
        assert!(sel("/system.slice/").matches(&c).is_some());
        assert!(sel("/system.slice/app.service").matches(&c).is_some());
        assert!(sel("/system.sl").matches(&c).is_none());
    }

    #[test]
    fn python_by_exe_or_comm() {
        assert!(is_python(&cand(1, "python3.12", "/opt/py/bin/python3.12", "/")));
        assert!(is_python(&cand(1, "gunicorn", "/usr/bin/python3", "/")));
        assert!(!is_python(&cand(1, "pythonista", "/usr/bin/pythonista", "/")));
        assert!(!is_python(&cand(1, "bash", "/usr/bin/bash", "/")));
    }
}
