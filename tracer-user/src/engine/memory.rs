//! The kernel maps sized to the memory this process may use. On 6.x
//! kernels BPF maps are charged to the memory cgroup of the process that
//! creates them, and at their default sizes the maps take ~110 MiB: an
//! agent started in a 128 MiB cgroup failed at load with an error that
//! blamed eBPF support. The limit is that of our own memory cgroup (v2
//! `memory.max`, v1 `memory.limit_in_bytes`) and of every cgroup above it
//! (the smallest wins); under it the large
//! maps get 1/2, 1/4 or 1/8 of their default entries, so that the maps
//! take at most a third of the limit; below [`MIN_LIMIT_MIB`] we refuse
//! with a message that names memory.

use std::path::{Path, PathBuf};

use tracer_common::maps;

/// The large maps, scaled together (their default sizes are in the
/// object). Together ~100 MiB at the defaults; the other maps ~10 MiB.
pub const SCALED: &[(&str, u32)] = &[
    (maps::STACKS, 16384),
    (maps::SYSCALL_STATS, 32768),
    (maps::PY_STACKS, 8192),
    (maps::PY_CODES, 4096),
    (maps::THREADS, 32768),
    (maps::CUDA_INFLIGHT, 32768),
    (maps::SYSCALL_START, 65536),
    (maps::OFFCPU_STACKS, 32768),
    (maps::CPU_SAMPLES, 32768),
    (maps::PY_TSTATE, 32768),
    (maps::PY_TSTATE_TID, 32768),
    (maps::CUDA_SLICE_HITS, 32768),
    (maps::CUDA_STATS, 16384),
    (maps::CUDA_TEXT, 16384),
    (maps::CUDA_LAUNCHES, 16384),
    (maps::SYSCALL_ERRNO, 16384),
    (maps::CUDA_DRV_ROUTE, 16384),
];

/// MiB the [`SCALED`] maps take at their default sizes (`bytes_memlock`
/// measured with bpftool), and the others.
const SCALED_MIB: u64 = 100;
const OTHER_MIB: u64 = 10;
/// The largest divisor of the scaled maps.
const MAX_DIVISOR: u64 = 8;
/// Below this limit the maps cannot fit in a third of it, even scaled.
pub const MIN_LIMIT_MIB: u64 = 3 * (OTHER_MIB + SCALED_MIB / MAX_DIVISOR);

#[derive(Debug, thiserror::Error)]
#[error("the memory limit of infertrace's cgroup ({limit_mib} MiB, {path}) is below the {MIN_LIMIT_MIB} MiB it needs for its kernel maps")]
pub struct TooLittleMemory {
    pub limit_mib: u64,
    pub path: String,
}

/// The smallest memory limit of our cgroup and those above it, in bytes,
/// with the file it came from (None: no limit). cgroup v2: `memory.max`
/// under /sys/fs/cgroup; v1: `memory.limit_in_bytes` under
/// /sys/fs/cgroup/memory.
pub fn own_limit() -> Option<(u64, PathBuf)> {
    limit_of(&std::fs::read_to_string("/proc/self/cgroup").ok()?)
}

/// The smallest memory limit of the cgroup a `/proc/PID/cgroup` text
/// names and of those above it (as [`own_limit`], for any process).
pub fn limit_of(text: &str) -> Option<(u64, PathBuf)> {
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, rel) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            if let Some(l) = limit_under(Path::new("/sys/fs/cgroup/memory"), rel, "memory.limit_in_bytes") {
                return Some(l);
            }
        }
    }
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    limit_under(Path::new("/sys/fs/cgroup"), rel, "memory.max")
}

/// Values at or above this are "no limit" (v1 writes 2^63 rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

fn limit_under(root: &Path, rel: &str, file: &str) -> Option<(u64, PathBuf)> {
    let mut dir = root.join(rel.trim_start_matches('/'));
    let mut best: Option<(u64, PathBuf)> = None;
    while dir.starts_with(root) {
        let path = dir.join(file);
        if let Some(v) = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<u64>().ok()) {
            if v < UNLIMITED && best.as_ref().is_none_or(|(b, _)| v < *b) {
                best = Some((v, path));
            }
        }
        if !dir.pop() {
            break;
        }
    }
    best
}

/// About what the maps take with the large ones divided by `divisor` (MiB).
pub fn maps_mib(divisor: u32) -> u64 {
    OTHER_MIB + SCALED_MIB / u64::from(divisor.max(1))
}

/// What the large maps' entries are divided by under `limit` bytes (1: no
/// limit, or room enough).
pub fn divisor(limit: Option<(u64, PathBuf)>) -> Result<u32, TooLittleMemory> {
    let Some((bytes, path)) = limit else { return Ok(1) };
    let mib = bytes >> 20;
    let third = mib / 3;
    let mut d = 1;
    while d <= MAX_DIVISOR {
        if OTHER_MIB + SCALED_MIB / d <= third {
            return Ok(d as u32);
        }
        d *= 2;
    }
    Err(TooLittleMemory { limit_mib: mib, path: path.display().to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(mib: u64) -> Option<(u64, PathBuf)> {
        Some((mib << 20, PathBuf::from("/sys/fs/cgroup/x/memory.max")))
    }

    #[test]
    fn maps_shrink_with_the_limit() {
        assert_eq!(divisor(None).unwrap(), 1);
        assert_eq!(divisor(lim(1024)).unwrap(), 1);
        assert_eq!(divisor(lim(256)).unwrap(), 2);
        assert_eq!(divisor(lim(128)).unwrap(), 4);
        assert_eq!(divisor(lim(MIN_LIMIT_MIB)).unwrap(), 8);
        let e = divisor(lim(MIN_LIMIT_MIB - 1)).unwrap_err();
        assert!(e.to_string().contains("memory limit"), "{e}");
    }

    #[test]
    fn the_smallest_limit_above_wins() {
        let root = std::env::temp_dir().join(format!("itr-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/memory.max"), "134217728\n").unwrap();
        std::fs::write(root.join("a/b/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("a/b/c/memory.max"), "268435456\n").unwrap();
        std::fs::write(root.join("memory.max"), "9223372036854771712\n").unwrap();
        let (v, p) = limit_under(&root, "/a/b/c", "memory.max").unwrap();
        assert_eq!(v, 128 << 20);
        assert!(p.ends_with("a/memory.max"));
        assert!(limit_under(&root, "/a/b/none", "memory.max").is_some_and(|(v, _)| v == 128 << 20));
        assert!(limit_under(&root, "/", "memory.max").is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
