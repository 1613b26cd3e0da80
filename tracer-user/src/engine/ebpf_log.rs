//! Kernel-side diagnostics (`record --debug-ebpf`).
//!
//! The kernel programs log, through aya-log, only on paths that are rare by
//! nature (a Python stack walk that meets an unreadable frame or thread
//! state, or a frame owner CPython does not define; a CUDA argument that
//! `bpf_probe_read_user` cannot read), at most one line per CPU per 100 ms,
//! and only when the load-time global [`DEBUG_GLOBAL`] is non-zero (it is 0
//! by default: a Python stack capture or a failed CUDA read then pays one
//! load and a branch). With it on, the verifier also checks the diagnostic
//! code: `record -- true` took 0.41-0.50 s against 0.27-0.42 s without
//! (three runs each, on the 2-vCPU VM). The records
//! arrive through the `AYA_LOGS` ring buffer; [`start`] reads them in a
//! tokio task and prints each as one stderr line `infertrace[ebpf]: LEVEL
//! message (file:line)` (through a `log::Log` of its own: no global logger
//! is installed).
//!
//! Wiring, in the session:
//!
//! ```text
//! loader.override_global(ebpf_log::DEBUG_GLOBAL, &1u32, true); // before load
//! let ebpf_log = ebpf_log::start(&mut ebpf)?; // after load, inside the runtime
//! // ... the recording window ...
//! if let Some(l) = ebpf_log { l.finish().await } // prints what is left
//! ```

use std::{fmt::Write as _, io::Write as _};

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::{io::unix::AsyncFd, sync::oneshot, task::JoinHandle};

/// The kernel programs' load-time global (`u32`) that turns their
/// diagnostics on: override it to 1 with `EbpfLoader::override_global`.
pub const DEBUG_GLOBAL: &str = "DEBUG_EBPF";

/// What every line printed here starts with.
pub const PREFIX: &str = "infertrace[ebpf]:";

#[derive(Debug, thiserror::Error)]
pub enum EbpfLogError {
    #[error("reading the kernel's diagnostics needs a tokio runtime (call ebpf_log::start inside it)")]
    NoRuntime,
    #[error("cannot open the kernel's log buffer AYA_LOGS: {0}")]
    Logger(#[source] aya_log::Error),
    #[error("cannot watch the kernel's log buffer AYA_LOGS: {0}")]
    Watch(#[source] std::io::Error),
}

/// The running reader of the kernel's diagnostics. Dropping it stops the
/// reader at its next wake-up; [`EbpfLog::finish`] also prints what is left.
pub struct EbpfLog {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Starts printing the kernel programs' log records to stderr. Call it
/// after the object is loaded (it takes the `AYA_LOGS` map from `ebpf`),
/// from inside a tokio runtime with IO enabled (it spawns a task that waits
/// on the ring buffer's file descriptor). `Ok(None)`: the object has no
/// `AYA_LOGS` map, so nothing to read.
///
/// Without `DEBUG_EBPF` set to a non-zero value at load time the kernel
/// never writes a record, and the reader simply never wakes.
pub fn start(ebpf: &mut Ebpf) -> Result<Option<EbpfLog>, EbpfLogError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(EbpfLogError::NoRuntime);
    }
    let logger = match EbpfLogger::init_with_logger(ebpf, StderrLog) {
        Ok(l) => l,
        Err(aya_log::Error::MapNotFound) => return Ok(None),
        Err(e) => return Err(EbpfLogError::Logger(e)),
    };
    // SAFETY: the logger owns the ring buffer's map fd: it stays open, and
    // `as_raw_fd` returns it, for as long as the logger (moved into the
    // `AsyncFd`) lives.
    let fd = unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
        .map_err(|e| EbpfLogError::Watch(e.into_parts().1))?;
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(read_records(fd, stopped));
    Ok(Some(EbpfLog { stop: Some(stop), task: Some(task) }))
}

impl EbpfLog {
    /// Stops the reader after printing the records still in the buffer.
    pub async fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for EbpfLog {
    fn drop(&mut self) {
        // Closing the channel stops the task (after a last drain) whenever
        // the runtime next polls it.
        self.stop.take();
    }
}

async fn read_records(mut fd: AsyncFd<EbpfLogger<StderrLog>>, mut stop: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            // Sent or dropped: either way, stop.
            _ = &mut stop => break,
            ready = fd.readable_mut() => match ready {
                Ok(mut guard) => {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                Err(e) => {
                    eprintln!("{PREFIX} stopped reading the kernel's diagnostics: {e}");
                    return;
                }
            },
        }
    }
    fd.get_mut().flush();
}

/// The `log` sink for the records: one line each on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = render(record);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// `infertrace[ebpf]: WARN message (src/python.rs:170)\n`
fn render(record: &log::Record<'_>) -> String {
    let mut line = format!("{PREFIX} {} {}", record.level(), record.args());
    if let (Some(file), Some(n)) = (record.file(), record.line()) {
        let _ = write!(line, " ({file}:{n})");
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_prefixed_line_per_record() {
        let line = render(
            &log::Record::builder()
                .level(log::Level::Warn)
                .args(format_args!("python stack: pid {} tid {}: frame 3 of 9 unreadable", 10, 11))
                .file(Some("src/python.rs"))
                .line(Some(170))
                .build(),
        );
        assert_eq!(line, "infertrace[ebpf]: WARN python stack: pid 10 tid 11: frame 3 of 9 unreadable (src/python.rs:170)\n");
        let bare = render(&log::Record::builder().level(log::Level::Debug).args(format_args!("x")).build());
        assert_eq!(bare, "infertrace[ebpf]: DEBUG x\n");
    }
}
