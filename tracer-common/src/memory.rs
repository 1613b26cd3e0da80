//! Resident memory, kernel side to userspace: the `kmem/rss_stat`
//! tracepoint keeps each target process's counters (`MEM_STATE`), sends a
//! point of its series (`MEM_SAMPLES`) when its resident size moved by
//! [`SERIES_BYTES`] or [`SERIES_NS`] passed with a change, and samples the
//! stack of a thread whose process grew (or shrank) by another
//! `MEM_GROWTH_SAMPLE_BYTES` (`MEM_GROWTH`, weighted by the bytes).

/// The kernel's `MM_*` counters, in its order (`rss_stat`'s `member`).
pub const MEMBER_FILE: usize = 0;
pub const MEMBER_ANON: usize = 1;
pub const MEMBER_SWAP: usize = 2;
pub const MEMBER_SHMEM: usize = 3;
pub const MEMBERS: usize = 4;

/// A series point goes out when the resident size moved this much...
pub const SERIES_BYTES: u64 = 1 << 20;
/// ...or this long after the last one, when it changed at all.
pub const SERIES_NS: u64 = 100_000_000;

/// Growth (or release) between two stack samples of a process, default:
/// 512 KiB: an allocator touching 1 GiB/s takes 2,048 stack samples a
/// second, a line that grows by 10 MiB gets ~20 (docs/memory.md; the cost,
/// measured: `cargo xtask bench --only memory`).
pub const GROWTH_SAMPLE_BYTES: u64 = 512 << 10;

/// Value of `MEM_STATE`, per target process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemState {
    /// Bytes per `MM_*` counter, as `rss_stat` last gave them.
    pub cur: [u64; MEMBERS],
    /// Highest resident size (file + anon + shmem) seen in the window.
    pub peak: u64,
    /// Time and resident size of the last series point sent.
    pub last_ns: u64,
    pub last_rss: u64,
    /// Growth and release not yet sampled (bytes).
    pub grown: u64,
    pub released: u64,
    /// Bit `m`: counter `m` has a value (its first event sets a baseline:
    /// the memory held before the window is not growth).
    pub seen: u32,
    /// The `mm_id` these counters are of: an event of another (the
    /// process exec'd a new program) starts them over.
    pub mm_id: u32,
    /// `rss_stat` events of the process in the window (its programs' runs:
    /// what the tracer's overhead estimate counts), across execs.
    pub events: u64,
}

/// A point of a process's resident-memory series (`MEM_SAMPLES`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemSample {
    pub pid: u32,
    pub _pad: u32,
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    pub cur: [u64; MEMBERS],
    pub peak: u64,
}

/// Key of `MEM_GROWTH`: a stack of a target thread whose process grew or
/// shrank (Python stack, or the user stack when it has none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrowthKey {
    pub pid: u32,
    pub user_stack: i32,
    pub py_stack: u64,
}

/// Value of `MEM_GROWTH`: bytes of growth and of release the stack's
/// samples stand for, and the samples.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthStats {
    pub grown: u64,
    pub released: u64,
    pub samples: u64,
}

/// Value of `MEM_OOM`, per target process the OOM killer chose
/// (`oom/mark_victim`): when, and its resident memory then (kB, as the
/// tracepoint gives it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomKill {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    pub anon_kb: u64,
    pub file_kb: u64,
    pub shmem_kb: u64,
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::OomKill {}
    unsafe impl aya::Pod for super::MemState {}
    unsafe impl aya::Pod for super::MemSample {}
    unsafe impl aya::Pod for super::GrowthKey {}
    unsafe impl aya::Pod for super::GrowthStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<MemState>(), 88);
        assert_eq!(core::mem::size_of::<MemSample>(), 56);
        assert_eq!(core::mem::size_of::<GrowthKey>(), 16);
        assert_eq!(core::mem::size_of::<GrowthStats>(), 24);
        assert_eq!(core::mem::size_of::<OomKill>(), 32);
    }
}
