//! Reading and writing `.itr` recordings directly (docs/recording-format.md):
//! to craft recordings with values `record` would never write, and to look
//! at the payload of a real one.

use std::fs;
use std::io::Read;
use std::path::Path;

use flate2::{read::GzDecoder, write::GzEncoder, Compression};
use serde_json::{json, Value};

const MAGIC: &[u8; 8] = b"ITRACE\r\n";

/// Writes `payload` (a `Recording` as JSON) as a version-1 `.itr` file.
pub fn write_itr(path: &Path, payload: &Value) {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    let mut gz = GzEncoder::new(bytes, Compression::fast());
    serde_json::to_writer(&mut gz, payload).unwrap();
    let bytes = gz.finish().unwrap();
    fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// The JSON payload of an `.itr` file.
pub fn read_itr(path: &Path) -> Value {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() >= 16 && &bytes[..8] == MAGIC,
        "{}: not a recording",
        path.display()
    );
    let mut s = String::new();
    GzDecoder::new(&bytes[16..])
        .read_to_string(&mut s)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A minimal valid recording of one process (pid 10, `demo`) with the
/// given `threads[]` rows and no syscalls.
pub fn crafted_recording(threads: Value) -> Value {
    json!({
        "format_version": 1,
        "tool_version": "crafted",
        "host": {"hostname": "h", "kernel_release": "6.18", "arch": "x86_64"},
        "started_unix_ms": 1,
        "duration_ns": 1_000_000_000u64,
        "argv": ["infertrace"],
        "targets": [{"pid": 10, "ppid": 1, "comm": "demo", "exe": null, "cmdline": [], "origin": "launched", "exit_code": 0}],
        "syscalls": [],
        "threads": threads,
        "stacks": [],
        "runqueue_hist": {},
        "sample_hz": 0,
        "lost": {},
        "notes": [],
    })
}

/// One `threads[]` row of pid 10: `wall_ns`, `on_cpu_ns`, `runqueue_ns`,
/// nothing off CPU.
pub fn thread_row(tid: u32, wall_ns: u64, on_cpu_ns: u64, runqueue_ns: u64) -> Value {
    json!({
        "pid": 10, "tid": tid, "comm": "crafted",
        "wall_ns": wall_ns, "on_cpu_ns": on_cpu_ns, "syscall_ns": 0,
        "off_cpu": {"io_ns": 0, "lock_ns": 0, "poll_ns": 0, "sleep_ns": 0, "other_ns": 0, "gil_ns": 0},
        "runqueue_ns": runqueue_ns,
    })
}
