//! `infertrace top --python`: the running CPython processes, found in
//! `/proc`: those whose executable is named `python*` or that map a
//! `libpython*` (an embedded interpreter, a pyenv build). Not this
//! process, no kernel thread. Whether the interpreter is one infertrace can
//! read is decided later, at attach, as for `-p`.

use crate::os::procfs;

/// Whether an executable path or a mapped file's name says CPython.
pub fn names_python(exe_basename: &str) -> bool {
    exe_basename.starts_with("python") || exe_basename.starts_with("libpython")
}

fn is_python(pid: u32) -> bool {
    if procfs::is_kernel_thread(pid) != Some(false) {
        return false;
    }
    let exe = procfs::exe(pid).unwrap_or_default();
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
    if names_python(exe.rsplit('/').next().unwrap_or(exe)) {
        return true;
    }
    procfs::maps(pid).map(|lines| lines.iter().any(|l| l.basename().starts_with("libpython"))).unwrap_or(false)
}

/// The pids of the CPython processes running now, in order.
pub fn python_pids() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && is_python(pid))
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_names() {
        for yes in ["python3", "python3.11", "python", "libpython3.12.so.1.0"] {
            assert!(names_python(yes), "{yes}");
        }
        for no in ["bash", "ipython-notebook-server", "mypython"] {
            assert!(!names_python(no), "{no}");
        }
    }

    #[test]
    fn finds_a_running_python_and_not_itself() {
        // python3 is installed by `cargo xtask setup`.
        let mut child = std::process::Command::new("python3").args(["-c", "import time; time.sleep(30)"]).spawn().expect("python3 on PATH (cargo xtask setup installs it)");
        // Found once it has exec'd python3 (until then it is a copy of this test).
        let t0 = std::time::Instant::now();
        let mut found = python_pids();
        while !found.contains(&child.id()) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            found = python_pids();
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        assert!(!found.contains(&std::process::id()));
    }
}
