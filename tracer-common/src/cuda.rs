//! CUDA runtime tracing: uprobes on libcudart. Calls are aggregated in the
//! kernel per (pid, api, copy kind, call site); kernel launches are counted
//! per (pid, kernel function, call site), entry only; copies, syncs and
//! memory management calls also go out as per-call events (ring buffer),
//! which the detector replays in order.

/// Which CUDA runtime function a probe sits on. It is the uprobe's attach
/// cookie, so one program serves every function of the same shape.
pub mod api {
    pub const MEMCPY: u32 = 0;
    pub const MEMCPY_PTDS: u32 = 1;
    pub const MEMCPY_ASYNC: u32 = 2;
    pub const MEMCPY_ASYNC_PTSZ: u32 = 3;
    pub const MEMCPY2D: u32 = 4;
    pub const MEMCPY2D_PTDS: u32 = 5;
    pub const MEMCPY2D_ASYNC: u32 = 6;
    pub const MEMCPY2D_ASYNC_PTSZ: u32 = 7;
    pub const STREAM_SYNC: u32 = 8;
    pub const STREAM_SYNC_PTSZ: u32 = 9;
    pub const DEVICE_SYNC: u32 = 10;
    pub const EVENT_SYNC: u32 = 11;
    pub const LAUNCH: u32 = 12;
    pub const LAUNCH_PTSZ: u32 = 13;
    pub const MALLOC: u32 = 14;
    pub const FREE: u32 = 15;
    pub const HOST_ALLOC: u32 = 16;
    pub const MALLOC_HOST: u32 = 17;
    pub const HOST_REGISTER: u32 = 18;
    pub const FREE_HOST: u32 = 19;
    pub const HOST_UNREGISTER: u32 = 20;
    pub const COUNT: u32 = 21;

    /// Symbol names, indexed by api id.
    pub const NAMES: [&str; COUNT as usize] = [
        "cudaMemcpy",
        "cudaMemcpy_ptds",
        "cudaMemcpyAsync",
        "cudaMemcpyAsync_ptsz",
        "cudaMemcpy2D",
        "cudaMemcpy2D_ptds",
        "cudaMemcpy2DAsync",
        "cudaMemcpy2DAsync_ptsz",
        "cudaStreamSynchronize",
        "cudaStreamSynchronize_ptsz",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaLaunchKernel",
        "cudaLaunchKernel_ptsz",
        "cudaMalloc",
        "cudaFree",
        "cudaHostAlloc",
        "cudaMallocHost",
        "cudaHostRegister",
        "cudaFreeHost",
        "cudaHostUnregister",
    ];

    /// A `cudaMemcpy*` variant.
    #[inline(always)]
    pub fn is_copy(api: u32) -> bool {
        api <= MEMCPY2D_ASYNC_PTSZ
    }

    /// A copy with a stream argument (returns before the copy ends when
    /// the host side is pinned).
    #[inline(always)]
    pub fn is_async_copy(api: u32) -> bool {
        matches!(api, MEMCPY_ASYNC | MEMCPY_ASYNC_PTSZ | MEMCPY2D_ASYNC | MEMCPY2D_ASYNC_PTSZ)
    }

    /// A synchronization call (stream, device or event).
    #[inline(always)]
    pub fn is_sync(api: u32) -> bool {
        matches!(api, STREAM_SYNC | STREAM_SYNC_PTSZ | DEVICE_SYNC | EVENT_SYNC)
    }

    /// Returns a pointer through its first argument (`void **`).
    #[inline(always)]
    pub fn returns_pointer(api: u32) -> bool {
        matches!(api, MALLOC | HOST_ALLOC | MALLOC_HOST)
    }

    pub fn is_launch(api: u32) -> bool {
        matches!(api, LAUNCH | LAUNCH_PTSZ)
    }
}

/// `cudaMemcpyKind` values; `KIND_NONE` for calls that are not copies.
pub const KIND_HTOH: u32 = 0;
pub const KIND_HTOD: u32 = 1;
pub const KIND_DTOH: u32 = 2;
pub const KIND_DTOD: u32 = 3;
pub const KIND_DEFAULT: u32 = 4;
pub const KIND_NONE: u32 = 0xff;

/// Bytes of the host source hashed into `CudaEvent::fingerprint` (H2D copies).
pub const FINGERPRINT_BYTES: u64 = 64;

/// Key of `CUDA_STATS`: one call site of one API in one thread (per
/// thread, so that only one writer updates an entry; userspace sums).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaKey {
    pub pid: u32,
    pub tid: u32,
    pub api: u32,
    /// `cudaMemcpyKind` for copies (as passed, `KIND_*` above), else `KIND_NONE`.
    pub kind: u32,
    /// Id in `STACKS` of the user stack at entry, or negative.
    pub user_stack: i32,
    pub _pad: u32,
    /// Id in `PY_STACKS` of the Python stack at entry, or 0.
    pub py_stack: u64,
    /// Return address of the call (the native caller).
    pub caller: u64,
}

/// Value of `CUDA_STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaStats {
    pub count: u64,
    /// Bytes copied (copies), allocated or registered (memory calls).
    pub bytes: u64,
    pub total_ns: u64,
    /// Calls that returned something other than `cudaSuccess`.
    pub errors: u64,
}

/// Key of `CUDA_LAUNCHES`: launches of one kernel from one site, per thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchKey {
    pub pid: u32,
    pub tid: u32,
    pub api: u32,
    /// Only captured when there is no Python stack (launches are hot).
    pub user_stack: i32,
    /// The `func` argument: the host-side stub of the kernel.
    pub func: u64,
    pub py_stack: u64,
}

/// A call in flight on one thread (`CUDA_INFLIGHT`, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaInflight {
    pub start_ns: u64,
    pub api: u32,
    pub kind: u32,
    pub bytes: u64,
    /// Copies: destination; memory calls: the pointer argument (for
    /// allocations, the address the result is written to).
    pub dst: u64,
    /// Copies: source.
    pub src: u64,
    /// Stream (async copies, stream sync) or event (event sync).
    pub stream: u64,
    pub fingerprint: u64,
    pub py_stack: u64,
    pub caller: u64,
    /// User stack pointer at entry: a probed call entered with a lower one
    /// is nested inside this call; with the same or a higher one, this
    /// call's return was missed (probes attached mid-call, longjmp) and the
    /// slot is reused.
    pub sp: u64,
    pub user_stack: i32,
    /// Calls of probed functions nested inside this one (a probed function
    /// calling another): only the outermost call is accounted.
    pub depth: u32,
    /// 1 while a call is in flight.
    pub active: u32,
    pub _pad: u32,
}

/// One finished call, sent through `CUDA_EVENTS` (not for launches).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaEvent {
    pub pid: u32,
    pub tid: u32,
    pub api: u32,
    pub kind: u32,
    /// `cudaError_t` returned.
    pub rc: i32,
    pub user_stack: i32,
    pub start_ns: u64,
    pub dur_ns: u64,
    pub bytes: u64,
    /// Copies: destination. Allocations: the pointer returned (0 on
    /// failure). Frees and host registration: the pointer argument.
    pub dst: u64,
    /// Copies: source.
    pub src: u64,
    pub stream: u64,
    /// H2D copies: FNV-1a of the first `FINGERPRINT_BYTES` bytes of the
    /// source (fewer for smaller copies); 0 otherwise.
    pub fingerprint: u64,
    pub py_stack: u64,
    pub caller: u64,
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::CudaKey {}
    unsafe impl aya::Pod for super::CudaStats {}
    unsafe impl aya::Pod for super::LaunchKey {}
    unsafe impl aya::Pod for super::CudaInflight {}
    unsafe impl aya::Pod for super::CudaEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<CudaKey>(), 40);
        assert_eq!(core::mem::size_of::<CudaStats>(), 32);
        assert_eq!(core::mem::size_of::<LaunchKey>(), 32);
        assert_eq!(core::mem::size_of::<CudaInflight>(), 96);
        assert_eq!(core::mem::size_of::<CudaEvent>(), 96);
    }

    #[test]
    fn api_classes() {
        assert_eq!(api::NAMES.len(), api::COUNT as usize);
        assert!(api::is_copy(api::MEMCPY2D_ASYNC_PTSZ) && !api::is_copy(api::STREAM_SYNC));
        assert!(api::is_async_copy(api::MEMCPY_ASYNC_PTSZ) && !api::is_async_copy(api::MEMCPY_PTDS));
        assert!(api::is_sync(api::EVENT_SYNC) && !api::is_sync(api::LAUNCH));
    }
}
