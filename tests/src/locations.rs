//! Where things are: the workspace, the binary under test, compiled workloads.

use std::path::{Path, PathBuf};

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The infertrace binary under test.
pub fn bin() -> PathBuf {
    match std::env::var_os("INFERTRACE_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => workspace_root().join("target/release/infertrace"),
    }
}

/// Directory holding the compiled workloads.
pub(crate) fn workload_dir() -> PathBuf {
    workspace_root().join("target/e2e-workloads")
}
