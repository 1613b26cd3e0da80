//! Locating (and, when missing, mounting) tracefs, and reading tracepoint
//! record layouts from it: field offsets differ between kernel versions.

use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {0}")]
    MountFailed(std::io::Error),
    #[error("tracefs is mounted at {}, but not readable by uid {uid}", path.display())]
    Unreadable { path: PathBuf, uid: u32 },
    #[error("cannot read tracepoint format {path}: {source}")]
    Format { path: PathBuf, source: std::io::Error },
    #[error("field `{field}` not found in {path}")]
    MissingField { path: PathBuf, field: String },
}

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

fn looks_mounted(p: &Path) -> bool {
    p.join("events").is_dir()
}

/// The mounted tracefs, if any (and readable by this process).
pub fn find() -> Option<PathBuf> {
    CANDIDATES.iter().map(PathBuf::from).find(|p| looks_mounted(p))
}

/// Where tracefs is mounted according to the mount table, readable or not
/// (tracefs is mode 0700: an unprivileged process sees it mounted, but
/// cannot list it).
pub fn mount_point() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    tracefs_mount(&mounts)
}

/// The first tracefs mount in a `/proc/self/mounts` text, preferring the
/// usual places.
fn tracefs_mount(mounts: &str) -> Option<PathBuf> {
    let points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "tracefs").then_some(point)
        })
        .collect();
    CANDIDATES
        .iter()
        .find(|c| points.contains(c))
        .or(points.first())
        .map(PathBuf::from)
}

/// Finds tracefs, mounting it at /sys/kernel/tracing when it is missing (as
/// bpftrace does). Returns the path and whether we mounted it.
pub fn ensure_mounted() -> Result<(PathBuf, bool), TracefsError> {
    if let Some(p) = find() {
        return Ok((p, false));
    }
    if let Some(path) = mount_point() {
        // SAFETY: geteuid cannot fail.
        return Err(TracefsError::Unreadable { path, uid: unsafe { libc::geteuid() } });
    }
    let target = CString::new(CANDIDATES[0]).expect("static path has no NUL");
    let fstype = CString::new("tracefs").expect("static string has no NUL");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        return Err(TracefsError::MountFailed(std::io::Error::last_os_error()));
    }
    Ok((PathBuf::from(CANDIDATES[0]), true))
}

/// Byte offset of `field` in the record of tracepoint `category/name`.
pub fn field_offset(tracefs: &Path, category: &str, name: &str, field: &str) -> Result<u32, TracefsError> {
    let path = tracefs.join("events").join(category).join(name).join("format");
    let text = fs::read_to_string(&path).map_err(|source| TracefsError::Format { path: path.clone(), source })?;
    parse_field_offset(&text, field).ok_or(TracefsError::MissingField { path, field: field.to_owned() })
}

fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    for line in format.lines() {
        let mut parts = line.trim().split(';').map(str::trim);
        let Some(decl) = parts.next().and_then(|d| d.strip_prefix("field:")) else { continue };
        // The declaration ends with the name, possibly followed by `[N]`.
        let name = decl.rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
        let name = name.split('[').next().unwrap_or("");
        if name != field {
            continue;
        }
        return parts.find_map(|p| p.strip_prefix("offset:")).and_then(|v| v.trim().parse().ok());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWTASK: &str = "name: task_newtask\nID: 205\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n\
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\
\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n";

    #[test]
    fn finds_the_mount_in_the_table() {
        let table = "sysfs /sys sysfs rw 0 0\nnone /mnt/t tracefs rw 0 0\ntracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n";
        assert_eq!(tracefs_mount(table), Some(PathBuf::from("/sys/kernel/tracing")));
        assert_eq!(tracefs_mount("none /mnt/t tracefs rw 0 0\n"), Some(PathBuf::from("/mnt/t")));
        assert_eq!(tracefs_mount("sysfs /sys sysfs rw 0 0\n"), None);
    }

    #[test]
    fn parses_offsets() {
        assert_eq!(parse_field_offset(NEWTASK, "pid"), Some(8));
        assert_eq!(parse_field_offset(NEWTASK, "comm"), Some(12));
        assert_eq!(parse_field_offset(NEWTASK, "clone_flags"), Some(32));
        assert_eq!(parse_field_offset(NEWTASK, "common_pid"), Some(4));
        assert_eq!(parse_field_offset(NEWTASK, "nope"), None);
    }
}
