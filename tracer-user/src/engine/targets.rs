//! Choosing what to trace: validating `-p` pids and launching the command
//! given after `--` so that it is a target before its first instruction.

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use crate::os::procfs;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error("{tid} is not a process id: it is thread {tid} of process {pid}; `-p {pid}` traces that process with all its threads")]
    Thread { tid: u32, pid: u32 },
    #[error("pid {0} is a kernel thread; only user-space processes can be traced")]
    KernelThread(u32),
    #[error("pid {0} is infertrace's own pid; tracing itself is not supported")]
    OwnPid(u32),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("command argument contains a NUL byte: {0:?}")]
    BadArgument(String),
    #[error("cannot execute {cmd}: {source}")]
    Exec { cmd: String, source: std::io::Error },
    #[error("launching the command failed: {0}")]
    Spawn(std::io::Error),
}

impl TargetError {
    pub fn hint(&self) -> &'static str {
        match self {
            Self::NoSuchProcess(_) => "check the pid with `ps -e`; it may have exited",
            Self::Thread { .. } => "pass the process id (the Tgid in /proc/TID/status); `ps -eL` lists threads by process",
            Self::KernelThread(_) => "pass the pid of a user-space process",
            Self::OwnPid(_) => "run infertrace against another process",
            Self::CommandNotFound(_) => "give a path or a command on $PATH",
            Self::BadArgument(_) => "remove the NUL byte",
            Self::Exec { .. } => "check that the file is executable",
            Self::Spawn(_) => "check system limits (ulimit -u, memory)",
        }
    }
}

/// Checks that `pid` names a live user-space process other than ourselves.
pub fn validate_pid(pid: u32) -> Result<(), TargetError> {
    if pid == std::process::id() {
        return Err(TargetError::OwnPid(pid));
    }
    if !procfs::is_alive(pid) {
        return Err(TargetError::NoSuchProcess(pid));
    }
    // Threads have /proc entries too (hidden from listings): accept only leaders.
    if let Some(tgid) = procfs::tgid_of(pid).filter(|&tgid| tgid != pid) {
        return Err(TargetError::Thread { tid: pid, pid: tgid });
    }
    if procfs::is_kernel_thread(pid) == Some(true) {
        return Err(TargetError::KernelThread(pid));
    }
    Ok(())
}

/// Resolves a command like execvp would, but once, in the parent, so the
/// traced child does a single execve.
pub fn resolve_command(cmd: &str) -> Result<PathBuf, TargetError> {
    let is_exec = |p: &Path| {
        let c = match CString::new(p.as_os_str().as_bytes()) {
            Ok(c) => c,
            Err(_) => return false,
        };
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    };
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return if p.exists() { Ok(p) } else { Err(TargetError::CommandNotFound(cmd.to_owned())) };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(cmd))
        .find(|p| is_exec(p))
        .ok_or_else(|| TargetError::CommandNotFound(cmd.to_owned()))
}

/// A forked child parked on a pipe until the probes are attached.
pub struct Launched {
    pub pid: u32,
    /// The resolved executable and the argv it was given.
    pub path: PathBuf,
    pub argv: Vec<String>,
    cmd: String,
    go_w: libc::c_int,
    err_r: libc::c_int,
    pub exit_code: Option<i32>,
}

fn pipe_cloexec() -> Result<(libc::c_int, libc::c_int), TargetError> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(TargetError::Spawn(std::io::Error::last_os_error()));
    }
    Ok((fds[0], fds[1]))
}

impl Launched {
    /// Forks the command; it waits (blocked on a pipe) until [`Launched::release`].
    /// If infertrace dies first, the pipe closes and the child exits unexecuted.
    pub fn spawn(argv: &[String]) -> Result<Launched, TargetError> {
        let first = argv.first().ok_or_else(|| TargetError::CommandNotFound(String::new()))?;
        let path = resolve_command(first)?;
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| TargetError::BadArgument(first.clone()))?;
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| TargetError::BadArgument(a.clone())))
            .collect::<Result<_, _>>()?;
        let mut arg_ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        arg_ptrs.push(std::ptr::null());
        let (go_r, go_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        // The Rust runtime ignores SIGPIPE and ignored signals survive exec:
        // give the child the default disposition without a syscall of its own.
        // SAFETY: the child only calls async-signal-safe functions before execv.
        let (pid, fork_errno) = unsafe {
            let old = libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let pid = libc::fork();
            let e = std::io::Error::last_os_error();
            if pid != 0 {
                libc::signal(libc::SIGPIPE, old);
            }
            (pid, e)
        };
        if pid < 0 {
            return Err(TargetError::Spawn(fork_errno));
        }
        if pid == 0 {
            unsafe {
                libc::close(go_w);
                libc::close(err_r);
                let mut b = 0u8;
                if libc::read(go_r, (&mut b as *mut u8).cast(), 1) != 1 {
                    libc::_exit(126);
                }
                libc::execv(cpath.as_ptr(), arg_ptrs.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_w, (&errno as *const i32).cast(), 4);
                libc::_exit(127);
            }
        }
        unsafe {
            libc::close(go_r);
            libc::close(err_w);
        }
        Ok(Launched { pid: pid as u32, path, argv: argv.to_vec(), cmd: first.clone(), go_w, err_r, exit_code: None })
    }

    /// Lets the child exec; fails if the exec itself failed.
    pub fn release(&mut self) -> Result<(), TargetError> {
        unsafe {
            libc::write(self.go_w, b"g".as_ptr().cast(), 1);
            libc::close(self.go_w);
        }
        self.go_w = -1;
        let mut errno = 0i32;
        let n = unsafe { libc::read(self.err_r, (&mut errno as *mut i32).cast(), 4) };
        unsafe { libc::close(self.err_r) };
        self.err_r = -1;
        if n == 4 {
            self.reap(true);
            return Err(TargetError::Exec { cmd: self.cmd.clone(), source: std::io::Error::from_raw_os_error(errno) });
        }
        Ok(())
    }

    /// Collects the child's exit status once it has exited.
    pub fn reap(&mut self, block: bool) -> Option<i32> {
        if self.exit_code.is_none() {
            let mut status = 0;
            let flags = if block { 0 } else { libc::WNOHANG };
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, flags) };
            if r == self.pid as i32 {
                self.exit_code = Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    -libc::WTERMSIG(status)
                });
            }
        }
        self.exit_code
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        for fd in [self.go_w, self.err_r] {
            if fd >= 0 {
                unsafe { libc::close(fd) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_and_missing_pid_are_rejected() {
        assert!(matches!(validate_pid(std::process::id()), Err(TargetError::OwnPid(_))));
        assert!(matches!(validate_pid(u32::MAX - 1), Err(TargetError::NoSuchProcess(_))));
    }

    #[test]
    fn a_thread_id_names_its_process() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let me = std::process::id();
        match validate_pid(tid) {
            Err(e @ TargetError::Thread { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&format!("thread {tid} of process {me}")) && text.contains(&format!("-p {me}")), "{text}");
            }
            other => panic!("{other:?}"),
        }
        drop(stop_tx);
        t.join().unwrap();
    }

    #[test]
    fn resolves_path_commands() {
        assert!(resolve_command("sh").is_ok());
        assert!(matches!(resolve_command("no-such-command-xyz"), Err(TargetError::CommandNotFound(_))));
    }

    #[test]
    fn launched_child_runs_after_release() {
        let mut l = Launched::spawn(&["sh".into(), "-c".into(), "exit 7".into()]).unwrap();
        l.release().unwrap();
        assert_eq!(l.reap(true), Some(7));
    }
}
