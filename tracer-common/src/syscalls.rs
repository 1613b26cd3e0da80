//! In-kernel syscall accounting: one `SyscallStats` per (pid, tid, syscall nr).

/// Number of log2 latency buckets. Bucket `i` counts calls with a latency in
/// `[2^i, 2^(i+1))` ns (bucket 0 also holds 0 ns); the last bucket holds
/// everything from `2^(HIST_BUCKETS-1)` ns (about 9 minutes) up.
pub const HIST_BUCKETS: usize = 40;

/// Key of the `SYSCALL_STATS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallKey {
    pub pid: u32,
    pub tid: u32,
    pub nr: u32,
    pub _pad: u32,
}

/// Value of the `SYSCALL_STATS` map. Only the owning thread writes it, so no
/// atomics are needed on the kernel side.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallStats {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for SyscallStats {
    fn default() -> Self {
        Self { count: 0, errors: 0, total_ns: 0, max_ns: 0, hist: [0; HIST_BUCKETS] }
    }
}

impl SyscallStats {
    /// Adds `other` into `self` (used when merging drained snapshots).
    pub fn merge(&mut self, other: &SyscallStats) {
        self.count += other.count;
        self.errors += other.errors;
        self.total_ns += other.total_ns;
        if other.max_ns > self.max_ns {
            self.max_ns = other.max_ns;
        }
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
            *a += *b;
        }
    }

    /// Field by field the larger of `self` and `other`: two reads of the
    /// same growing counts, of which either may have missed calls that
    /// were moving from `SYSCALL_PENDING` to `SYSCALL_STATS` (a read never
    /// counts a call twice).
    pub fn max_with(&mut self, other: &SyscallStats) {
        self.count = self.count.max(other.count);
        self.errors = self.errors.max(other.errors);
        self.total_ns = self.total_ns.max(other.total_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
            *a = (*a).max(*b);
        }
    }

    /// Accounts one call of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64, is_error: bool) {
        self.count += 1;
        if is_error {
            self.errors += 1;
        }
        self.total_ns += ns;
        if ns > self.max_ns {
            self.max_ns = ns;
        }
        // `get_mut`: no bounds-check panic in the kernel programs.
        if let Some(b) = self.hist.get_mut(hist_bucket(ns)) {
            *b += 1;
        }
    }

    /// Back to no calls.
    pub fn clear(&mut self) {
        self.count = 0;
        self.errors = 0;
        self.total_ns = 0;
        self.max_ns = 0;
        for b in self.hist.iter_mut() {
            *b = 0;
        }
    }
}

/// The log2 bucket for a latency in ns; loop-free so the BPF verifier is happy.
#[inline(always)]
pub fn hist_bucket(ns: u64) -> usize {
    let b = if ns == 0 { 0 } else { 63 - ns.leading_zeros() as usize };
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Slots of the `SYSCALL_SLOTS` array (a power of two): a thread's
/// syscall in flight lives in slot `tid % SYSCALL_SLOT_COUNT` when the
/// thread owns that slot (`SYSCALL_SLOT_OWNER`), else in `SYSCALL_START`.
pub const SYSCALL_SLOT_COUNT: u32 = 65536;

/// A syscall in flight, per thread: the `SYSCALL_SLOTS` array (a slot the
/// thread owns; `tid` is the owner's tag) or the `SYSCALL_START` hash map
/// hold these.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallStart {
    /// `bpf_ktime_get_ns()` at sys_enter; 0 when no syscall is in flight.
    pub ts: u64,
    pub nr: u32,
    pub tid: u32,
    /// First argument, kept for futex only (the address waited on: GIL
    /// detection); 0 otherwise.
    pub arg0: u64,
}

/// Rows of a [`SyscallPending`]: a call of number `nr` goes to row
/// `nr % PENDING_ROWS` (a power of two).
pub const PENDING_ROWS: usize = 4;

/// One syscall number's calls not yet in `SYSCALL_STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingRow {
    pub nr: u32,
    pub _pad: u32,
    pub stats: SyscallStats,
}

/// The `SYSCALL_PENDING` per-CPU array's one value: the latest calls of the
/// thread running on this CPU, summed here (an array read) instead of in
/// `SYSCALL_STATS` (a hash lookup per call). They move into
/// `SYSCALL_STATS` when the thread is switched out or exits, when another
/// thread's call returns on this CPU, and when a call of another number
/// needs the row. `tid` 0: empty. Readers add these to `SYSCALL_STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallPending {
    pub pid: u32,
    pub tid: u32,
    pub rows: [PendingRow; PENDING_ROWS],
}

/// Key of the `SYSCALL_ERRNO` map: how often a syscall failed with one errno.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrnoKey {
    pub pid: u32,
    pub tid: u32,
    pub nr: u32,
    pub errno: u32,
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::SyscallKey {}
    unsafe impl aya::Pod for super::SyscallStats {}
    unsafe impl aya::Pod for super::SyscallStart {}
    unsafe impl aya::Pod for super::ErrnoKey {}
    unsafe impl aya::Pod for super::SyscallPending {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(2), 1);
        assert_eq!(hist_bucket(3), 1);
        assert_eq!(hist_bucket(1023), 9);
        assert_eq!(hist_bucket(1024), 10);
        // 10 ms lies in [2^23, 2^24) ns.
        assert_eq!(hist_bucket(10_000_000), 23);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn layout_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<SyscallKey>(), 16);
        assert_eq!(core::mem::size_of::<ErrnoKey>(), 16);
        assert_eq!(core::mem::size_of::<SyscallStart>(), 24);
        assert_eq!(core::mem::size_of::<SyscallStats>(), 32 + 8 * HIST_BUCKETS);
        assert_eq!(core::mem::size_of::<PendingRow>(), 8 + core::mem::size_of::<SyscallStats>());
        assert_eq!(core::mem::size_of::<SyscallPending>(), 8 + PENDING_ROWS * core::mem::size_of::<PendingRow>());
    }

    #[test]
    fn merge_adds_and_keeps_max() {
        let mut a = SyscallStats::default();
        a.record(5, false);
        let mut b = SyscallStats::default();
        b.record(100, true);
        b.record(7, false);
        a.merge(&b);
        assert_eq!((a.count, a.errors, a.total_ns, a.max_ns), (3, 1, 112, 100));
        assert_eq!(a.hist.iter().sum::<u64>(), 3);
    }

    #[test]
    fn max_with_keeps_the_later_of_two_reads_field_by_field() {
        // A read that missed a call in transit, then one that did not.
        let mut missed = SyscallStats::default();
        missed.record(5, false);
        let mut full = missed;
        full.record(300, true);
        let mut a = missed;
        a.max_with(&full);
        assert_eq!(a, full);
        let mut b = full;
        b.max_with(&missed);
        assert_eq!(b, full);
    }
}
