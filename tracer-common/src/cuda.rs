//! CUDA runtime tracing: uprobes on libcudart (and on libcuda, the driver
//! API, whose calls made from inside a runtime call are not counted twice). Calls are aggregated in the
//! kernel per (pid, api, copy kind, call site); kernel launches are counted
//! per (pid, kernel function, call site), entry only; copies, syncs and
//! memory management calls also go out as per-call events (ring buffer),
//! which the detector replays in order.

/// Which CUDA runtime function a probe sits on. It is the uprobe's attach
/// cookie, so one program serves every function of the same shape.
pub mod api {
    // CUDA runtime (libcudart): ids 0..FIRST_DRIVER. The ids are internal
    // (reports and recordings carry names), so they may be renumbered.
    pub const MEMCPY: u32 = 0;
    pub const MEMCPY_PTDS: u32 = 1;
    pub const MEMCPY_ASYNC: u32 = 2;
    pub const MEMCPY_ASYNC_PTSZ: u32 = 3;
    pub const MEMCPY2D: u32 = 4;
    pub const MEMCPY2D_PTDS: u32 = 5;
    pub const MEMCPY2D_ASYNC: u32 = 6;
    pub const MEMCPY2D_ASYNC_PTSZ: u32 = 7;
    pub const MEMCPY_PEER: u32 = 8;
    pub const MEMCPY_PEER_ASYNC: u32 = 9;
    pub const STREAM_SYNC: u32 = 10;
    pub const STREAM_SYNC_PTSZ: u32 = 11;
    pub const DEVICE_SYNC: u32 = 12;
    pub const EVENT_SYNC: u32 = 13;
    pub const LAUNCH: u32 = 14;
    pub const LAUNCH_PTSZ: u32 = 15;
    pub const MALLOC: u32 = 16;
    pub const FREE: u32 = 17;
    pub const HOST_ALLOC: u32 = 18;
    pub const MALLOC_HOST: u32 = 19;
    pub const HOST_REGISTER: u32 = 20;
    pub const FREE_HOST: u32 = 21;
    pub const HOST_UNREGISTER: u32 = 22;
    pub const MALLOC_ASYNC: u32 = 23;
    pub const MALLOC_ASYNC_PTSZ: u32 = 24;
    pub const FREE_ASYNC: u32 = 25;
    pub const FREE_ASYNC_PTSZ: u32 = 26;
    pub const LAUNCH_EX_C: u32 = 27;
    pub const LAUNCH_EX_C_PTSZ: u32 = 28;
    pub const LAUNCH_COOP: u32 = 29;
    pub const LAUNCH_COOP_PTSZ: u32 = 30;
    pub const GRAPH_LAUNCH: u32 = 31;
    pub const GRAPH_LAUNCH_PTSZ: u32 = 32;
    pub const GRAPH_INSTANTIATE: u32 = 33;
    pub const GRAPH_INSTANTIATE_FLAGS: u32 = 34;
    pub const GRAPH_INSTANTIATE_PARAMS: u32 = 35;
    pub const GRAPH_INSTANTIATE_PARAMS_PTSZ: u32 = 36;
    pub const BEGIN_CAPTURE: u32 = 37;
    pub const BEGIN_CAPTURE_PTSZ: u32 = 38;
    pub const END_CAPTURE: u32 = 39;
    pub const END_CAPTURE_PTSZ: u32 = 40;
    pub const MEMSET_ASYNC: u32 = 41;
    pub const MEMSET_ASYNC_PTSZ: u32 = 42;
    // Device setup (issue 24, part 8): what says a process found no usable device.
    pub const GET_DEVICE_COUNT: u32 = 43;
    pub const SET_DEVICE: u32 = 44;
    // Events and queries (issue 24, part 3): `(event, stream[, flags])`,
    // `(stream, event, flags)`, `(event)`, `(stream)`.
    pub const EVENT_RECORD: u32 = 45;
    pub const EVENT_RECORD_PTSZ: u32 = 46;
    pub const EVENT_RECORD_FLAGS: u32 = 47;
    pub const EVENT_RECORD_FLAGS_PTSZ: u32 = 48;
    pub const STREAM_WAIT_EVENT: u32 = 49;
    pub const STREAM_WAIT_EVENT_PTSZ: u32 = 50;
    pub const EVENT_QUERY: u32 = 51;
    pub const STREAM_QUERY: u32 = 52;
    pub const STREAM_QUERY_PTSZ: u32 = 53;
    // Pools and virtual memory (issue 24, part 7): `(void **ptr, size, pool,
    // stream)`.
    pub const MALLOC_FROM_POOL_ASYNC: u32 = 54;
    pub const MALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 55;
    // NCCL (issue 24, part 5; libnccl, or linked into another library):
    // collectives, point-to-point and group calls (the kernel's
    // `cuda_nccl_enter` reads their arguments). Not the driver.
    pub const NCCL_ALL_REDUCE: u32 = 56;
    pub const NCCL_ALL_GATHER: u32 = 57;
    pub const NCCL_REDUCE_SCATTER: u32 = 58;
    pub const NCCL_BROADCAST: u32 = 59;
    pub const NCCL_BCAST: u32 = 60;
    pub const NCCL_REDUCE: u32 = 61;
    pub const NCCL_ALL_TO_ALL: u32 = 62;
    pub const NCCL_SEND: u32 = 63;
    pub const NCCL_RECV: u32 = 64;
    pub const NCCL_GROUP_START: u32 = 65;
    pub const NCCL_GROUP_END: u32 = 66;
    // CUDA driver API (libcuda): ids FIRST_DRIVER..END_DRIVER. Copies take
    // (dst, src, bytes[, stream]); the direction is in the name.
    pub const CU_MEMCPY: u32 = 67;
    pub const CU_MEMCPY_ASYNC: u32 = 68;
    pub const CU_MEMCPY_HTOD: u32 = 69;
    pub const CU_MEMCPY_DTOH: u32 = 70;
    pub const CU_MEMCPY_DTOD: u32 = 71;
    pub const CU_MEMCPY_HTOD_ASYNC: u32 = 72;
    pub const CU_MEMCPY_DTOH_ASYNC: u32 = 73;
    pub const CU_MEMCPY_DTOD_ASYNC: u32 = 74;
    pub const CU_MEMCPY_PTDS: u32 = 75;
    pub const CU_MEMCPY_ASYNC_PTSZ: u32 = 76;
    pub const CU_MEMCPY_HTOD_PTDS: u32 = 77;
    pub const CU_MEMCPY_DTOH_PTDS: u32 = 78;
    pub const CU_MEMCPY_DTOD_PTDS: u32 = 79;
    pub const CU_MEMCPY_HTOD_ASYNC_PTSZ: u32 = 80;
    pub const CU_MEMCPY_DTOH_ASYNC_PTSZ: u32 = 81;
    pub const CU_MEMCPY_DTOD_ASYNC_PTSZ: u32 = 82;
    pub const CU_MEMCPY_PEER: u32 = 83;
    pub const CU_MEMCPY_PEER_ASYNC: u32 = 84;
    pub const CU_MEMCPY_PEER_PTDS: u32 = 85;
    pub const CU_MEMCPY_PEER_ASYNC_PTSZ: u32 = 86;
    pub const CU_STREAM_SYNC: u32 = 87;
    pub const CU_STREAM_SYNC_PTSZ: u32 = 88;
    pub const CU_CTX_SYNC: u32 = 89;
    pub const CU_EVENT_SYNC: u32 = 90;
    pub const CU_LAUNCH: u32 = 91;
    pub const CU_LAUNCH_PTSZ: u32 = 92;
    pub const CU_LAUNCH_EX: u32 = 93;
    pub const CU_LAUNCH_EX_PTSZ: u32 = 94;
    pub const CU_MEM_ALLOC: u32 = 95;
    pub const CU_MEM_FREE: u32 = 96;
    pub const CU_MEM_HOST_ALLOC: u32 = 97;
    pub const CU_MEM_ALLOC_HOST: u32 = 98;
    pub const CU_MEM_HOST_REGISTER: u32 = 99;
    pub const CU_MEM_FREE_HOST: u32 = 100;
    pub const CU_MEM_HOST_UNREGISTER: u32 = 101;
    pub const CU_MEM_ALLOC_ASYNC: u32 = 102;
    pub const CU_MEM_ALLOC_ASYNC_PTSZ: u32 = 103;
    pub const CU_MEM_FREE_ASYNC: u32 = 104;
    pub const CU_MEM_FREE_ASYNC_PTSZ: u32 = 105;
    pub const CU_LAUNCH_COOP: u32 = 106;
    pub const CU_LAUNCH_COOP_PTSZ: u32 = 107;
    pub const CU_GRAPH_LAUNCH: u32 = 108;
    pub const CU_GRAPH_LAUNCH_PTSZ: u32 = 109;
    pub const CU_GRAPH_INSTANTIATE_FLAGS: u32 = 110;
    pub const CU_GRAPH_INSTANTIATE_PARAMS: u32 = 111;
    pub const CU_GRAPH_INSTANTIATE_PARAMS_PTSZ: u32 = 112;
    pub const CU_BEGIN_CAPTURE: u32 = 113;
    pub const CU_BEGIN_CAPTURE_PTSZ: u32 = 114;
    pub const CU_END_CAPTURE: u32 = 115;
    pub const CU_END_CAPTURE_PTSZ: u32 = 116;
    pub const CU_MEMSET_D8_ASYNC: u32 = 117;
    pub const CU_MEMSET_D8_ASYNC_PTSZ: u32 = 118;
    pub const CU_MEMSET_D32_ASYNC: u32 = 119;
    pub const CU_MEMSET_D32_ASYNC_PTSZ: u32 = 120;
    pub const CU_CTX_SYNC_V2: u32 = 121;
    // Device setup.
    pub const CU_INIT: u32 = 122;
    pub const CU_DEVICE_GET: u32 = 123;
    pub const CU_DEVICE_GET_COUNT: u32 = 124;
    // Events and queries.
    pub const CU_EVENT_RECORD: u32 = 125;
    pub const CU_EVENT_RECORD_PTSZ: u32 = 126;
    pub const CU_EVENT_RECORD_FLAGS: u32 = 127;
    pub const CU_EVENT_RECORD_FLAGS_PTSZ: u32 = 128;
    pub const CU_STREAM_WAIT_EVENT: u32 = 129;
    pub const CU_STREAM_WAIT_EVENT_PTSZ: u32 = 130;
    pub const CU_EVENT_QUERY: u32 = 131;
    pub const CU_STREAM_QUERY: u32 = 132;
    pub const CU_STREAM_QUERY_PTSZ: u32 = 133;
    // Kernel handles and their names (issue 24, part 6): `(CUfunction *,
    // CUmodule, const char *name)`, `(CUkernel *, CUlibrary, const char
    // *name)`, `(CUfunction *, CUkernel)`.
    pub const CU_MODULE_GET_FUNCTION: u32 = 134;
    pub const CU_LIBRARY_GET_KERNEL: u32 = 135;
    pub const CU_KERNEL_GET_FUNCTION: u32 = 136;
    // Pools and virtual memory: `cuMemAllocFromPoolAsync(CUdeviceptr *, size,
    // pool, stream)`, `cuMemCreate(handle *, size, prop *, flags)`,
    // `cuMemRelease(handle)`, `cuMemMap(ptr, size, offset, handle, flags)`,
    // `cuMemUnmap(ptr, size)`.
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC: u32 = 137;
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 138;
    pub const CU_MEM_CREATE: u32 = 139;
    pub const CU_MEM_RELEASE: u32 = 140;
    pub const CU_MEM_MAP: u32 = 141;
    pub const CU_MEM_UNMAP: u32 = 142;
    /// One past the last driver API id.
    pub const END_DRIVER: u32 = 143;
    // USDT probes of PyTorch's CUDA caching allocator (`libc10_cuda.so`):
    // `pytorch:malloc(ptr, device, size, stream)` when a block is handed to
    // a tensor, `pytorch:free(ptr)` when it comes back. Not functions: no
    // return, no duration; the collector reads their arguments by the
    // probes' SDT notes (`CUDA_USDT_SPECS`).
    pub const TORCH_MALLOC: u32 = 143;
    pub const TORCH_FREE: u32 = 144;
    pub const COUNT: u32 = 145;
    /// First driver API id.
    pub const FIRST_DRIVER: u32 = CU_MEMCPY;

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
        "cudaMemcpyPeer",
        "cudaMemcpyPeerAsync",
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
        "cudaMallocAsync",
        "cudaMallocAsync_ptsz",
        "cudaFreeAsync",
        "cudaFreeAsync_ptsz",
        "cudaLaunchKernelExC",
        "cudaLaunchKernelExC_ptsz",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernel_ptsz",
        "cudaGraphLaunch",
        "cudaGraphLaunch_ptsz",
        "cudaGraphInstantiate",
        "cudaGraphInstantiateWithFlags",
        "cudaGraphInstantiateWithParams",
        "cudaGraphInstantiateWithParams_ptsz",
        "cudaStreamBeginCapture",
        "cudaStreamBeginCapture_ptsz",
        "cudaStreamEndCapture",
        "cudaStreamEndCapture_ptsz",
        "cudaMemsetAsync",
        "cudaMemsetAsync_ptsz",
        "cudaGetDeviceCount",
        "cudaSetDevice",
        "cudaEventRecord",
        "cudaEventRecord_ptsz",
        "cudaEventRecordWithFlags",
        "cudaEventRecordWithFlags_ptsz",
        "cudaStreamWaitEvent",
        "cudaStreamWaitEvent_ptsz",
        "cudaEventQuery",
        "cudaStreamQuery",
        "cudaStreamQuery_ptsz",
        "cudaMallocFromPoolAsync",
        "cudaMallocFromPoolAsync_ptsz",
        "ncclAllReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclBroadcast",
        "ncclBcast",
        "ncclReduce",
        "ncclAlltoAll",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "cuMemcpy",
        "cuMemcpyAsync",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoD_v2",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpy_ptds",
        "cuMemcpyAsync_ptsz",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemcpyDtoH_v2_ptds",
        "cuMemcpyDtoD_v2_ptds",
        "cuMemcpyHtoDAsync_v2_ptsz",
        "cuMemcpyDtoHAsync_v2_ptsz",
        "cuMemcpyDtoDAsync_v2_ptsz",
        "cuMemcpyPeer",
        "cuMemcpyPeerAsync",
        "cuMemcpyPeer_ptds",
        "cuMemcpyPeerAsync_ptsz",
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemHostAlloc",
        "cuMemAllocHost_v2",
        "cuMemHostRegister_v2",
        "cuMemFreeHost",
        "cuMemHostUnregister",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz",
        "cuStreamBeginCapture_v2",
        "cuStreamBeginCapture_v2_ptsz",
        "cuStreamEndCapture",
        "cuStreamEndCapture_ptsz",
        "cuMemsetD8Async",
        "cuMemsetD8Async_ptsz",
        "cuMemsetD32Async",
        "cuMemsetD32Async_ptsz",
        "cuCtxSynchronize_v2",
        "cuInit",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuEventRecord",
        "cuEventRecord_ptsz",
        "cuEventRecordWithFlags",
        "cuEventRecordWithFlags_ptsz",
        "cuStreamWaitEvent",
        "cuStreamWaitEvent_ptsz",
        "cuEventQuery",
        "cuStreamQuery",
        "cuStreamQuery_ptsz",
        "cuModuleGetFunction",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "pytorch:malloc",
        "pytorch:free",
    ];

    /// The runtime function with the same behaviour as `api` (driver
    /// functions map to their runtime twin; runtime ids map to themselves).
    /// Everything that reasons about calls (async or not, sync, frees...)
    /// goes through this.
    #[inline(always)]
    pub fn canonical(api: u32) -> u32 {
        match api {
            CU_MEMCPY | CU_MEMCPY_HTOD | CU_MEMCPY_DTOH | CU_MEMCPY_DTOD => MEMCPY,
            CU_MEMCPY_PTDS | CU_MEMCPY_HTOD_PTDS | CU_MEMCPY_DTOH_PTDS | CU_MEMCPY_DTOD_PTDS => MEMCPY_PTDS,
            CU_MEMCPY_ASYNC | CU_MEMCPY_HTOD_ASYNC | CU_MEMCPY_DTOH_ASYNC | CU_MEMCPY_DTOD_ASYNC => MEMCPY_ASYNC,
            CU_MEMCPY_ASYNC_PTSZ | CU_MEMCPY_HTOD_ASYNC_PTSZ | CU_MEMCPY_DTOH_ASYNC_PTSZ | CU_MEMCPY_DTOD_ASYNC_PTSZ => {
                MEMCPY_ASYNC_PTSZ
            }
            CU_MEMCPY_PEER | CU_MEMCPY_PEER_PTDS => MEMCPY_PEER,
            CU_MEMCPY_PEER_ASYNC | CU_MEMCPY_PEER_ASYNC_PTSZ => MEMCPY_PEER_ASYNC,
            CU_STREAM_SYNC => STREAM_SYNC,
            CU_STREAM_SYNC_PTSZ => STREAM_SYNC_PTSZ,
            CU_CTX_SYNC => DEVICE_SYNC,
            CU_EVENT_SYNC => EVENT_SYNC,
            // Every launch form is a launch (entry only, counted once: the
            // kernel's `nested_launch`).
            CU_LAUNCH | CU_LAUNCH_EX | CU_LAUNCH_COOP | LAUNCH_EX_C | LAUNCH_COOP => LAUNCH,
            CU_LAUNCH_PTSZ | CU_LAUNCH_EX_PTSZ | CU_LAUNCH_COOP_PTSZ | LAUNCH_EX_C_PTSZ | LAUNCH_COOP_PTSZ => LAUNCH_PTSZ,
            CU_MEM_ALLOC | CU_MEM_ALLOC_ASYNC | CU_MEM_ALLOC_ASYNC_PTSZ => MALLOC,
            CU_MEM_FREE | CU_MEM_FREE_ASYNC | CU_MEM_FREE_ASYNC_PTSZ => FREE,
            // The stream-ordered allocator: allocations and frees all the same.
            MALLOC_ASYNC | MALLOC_ASYNC_PTSZ => MALLOC,
            // Pools (onnxruntime, PyTorch's cudaMallocAsync backend): allocations too.
            MALLOC_FROM_POOL_ASYNC | MALLOC_FROM_POOL_ASYNC_PTSZ => MALLOC,
            CU_MEM_ALLOC_FROM_POOL_ASYNC | CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => MALLOC,
            FREE_ASYNC | FREE_ASYNC_PTSZ => FREE,
            CU_MEM_HOST_ALLOC => HOST_ALLOC,
            CU_MEM_ALLOC_HOST => MALLOC_HOST,
            CU_MEM_HOST_REGISTER => HOST_REGISTER,
            CU_MEM_FREE_HOST => FREE_HOST,
            CU_MEM_HOST_UNREGISTER => HOST_UNREGISTER,
            CU_GRAPH_LAUNCH => GRAPH_LAUNCH,
            CU_GRAPH_LAUNCH_PTSZ => GRAPH_LAUNCH_PTSZ,
            CU_GRAPH_INSTANTIATE_FLAGS => GRAPH_INSTANTIATE_FLAGS,
            CU_GRAPH_INSTANTIATE_PARAMS => GRAPH_INSTANTIATE_PARAMS,
            CU_GRAPH_INSTANTIATE_PARAMS_PTSZ => GRAPH_INSTANTIATE_PARAMS_PTSZ,
            CU_BEGIN_CAPTURE => BEGIN_CAPTURE,
            CU_BEGIN_CAPTURE_PTSZ => BEGIN_CAPTURE_PTSZ,
            CU_END_CAPTURE => END_CAPTURE,
            CU_END_CAPTURE_PTSZ => END_CAPTURE_PTSZ,
            CU_MEMSET_D8_ASYNC | CU_MEMSET_D32_ASYNC => MEMSET_ASYNC,
            CU_MEMSET_D8_ASYNC_PTSZ | CU_MEMSET_D32_ASYNC_PTSZ => MEMSET_ASYNC_PTSZ,
            // CUDA 13's libcudart resolves cuCtxSynchronize to this.
            CU_CTX_SYNC_V2 => DEVICE_SYNC,
            CU_DEVICE_GET_COUNT => GET_DEVICE_COUNT,
            CU_EVENT_RECORD => EVENT_RECORD,
            CU_EVENT_RECORD_PTSZ => EVENT_RECORD_PTSZ,
            CU_EVENT_RECORD_FLAGS => EVENT_RECORD_FLAGS,
            CU_EVENT_RECORD_FLAGS_PTSZ => EVENT_RECORD_FLAGS_PTSZ,
            CU_STREAM_WAIT_EVENT => STREAM_WAIT_EVENT,
            CU_STREAM_WAIT_EVENT_PTSZ => STREAM_WAIT_EVENT_PTSZ,
            CU_EVENT_QUERY => EVENT_QUERY,
            CU_STREAM_QUERY => STREAM_QUERY,
            CU_STREAM_QUERY_PTSZ => STREAM_QUERY_PTSZ,
            other => other,
        }
    }

    /// A driver API function (libcuda).
    #[inline(always)]
    pub fn is_driver(api: u32) -> bool {
        (FIRST_DRIVER..END_DRIVER).contains(&api)
    }

    /// A USDT probe of PyTorch's caching allocator (a tensor's block given
    /// or taken back), not a CUDA call.
    #[inline(always)]
    pub fn is_torch_allocator(api: u32) -> bool {
        matches!(api, TORCH_MALLOC | TORCH_FREE)
    }

    /// Device setup: counting, choosing and initialising devices (a
    /// failure says the process found no usable device or driver).
    #[inline(always)]
    pub fn is_device_setup(api: u32) -> bool {
        matches!(canonical(api), GET_DEVICE_COUNT | SET_DEVICE | CU_INIT | CU_DEVICE_GET)
    }

    /// A driver API function's name (`cu...`, not `cuda...`).
    pub fn is_driver_name(name: &str) -> bool {
        name.starts_with("cu") && !name.starts_with("cuda")
    }

    /// The copy direction a driver copy function implies by its name
    /// (`KIND_*`); `KIND_DEFAULT` for the unified `cuMemcpy[Async]`.
    #[inline(always)]
    pub fn driver_copy_kind(api: u32) -> u32 {
        match api {
            CU_MEMCPY_HTOD | CU_MEMCPY_HTOD_ASYNC | CU_MEMCPY_HTOD_PTDS | CU_MEMCPY_HTOD_ASYNC_PTSZ => super::KIND_HTOD,
            CU_MEMCPY_DTOH | CU_MEMCPY_DTOH_ASYNC | CU_MEMCPY_DTOH_PTDS | CU_MEMCPY_DTOH_ASYNC_PTSZ => super::KIND_DTOH,
            CU_MEMCPY_DTOD | CU_MEMCPY_DTOD_ASYNC | CU_MEMCPY_DTOD_PTDS | CU_MEMCPY_DTOD_ASYNC_PTSZ => super::KIND_DTOD,
            CU_MEMCPY_PEER | CU_MEMCPY_PEER_ASYNC | CU_MEMCPY_PEER_PTDS | CU_MEMCPY_PEER_ASYNC_PTSZ => super::KIND_DTOD,
            _ => super::KIND_DEFAULT,
        }
    }

    /// A `cudaMemcpy*` variant or a driver copy.
    #[inline(always)]
    pub fn is_copy(api: u32) -> bool {
        canonical(api) <= MEMCPY_PEER_ASYNC
    }

    /// A peer copy (`(dst, dst device, src, src device, bytes[, stream])`):
    /// device to device, across GPUs.
    #[inline(always)]
    pub fn is_peer_copy(api: u32) -> bool {
        matches!(canonical(api), MEMCPY_PEER | MEMCPY_PEER_ASYNC)
    }

    /// A copy with a stream argument (returns before the copy ends when
    /// the host side is pinned).
    #[inline(always)]
    pub fn is_async_copy(api: u32) -> bool {
        matches!(canonical(api), MEMCPY_ASYNC | MEMCPY_ASYNC_PTSZ | MEMCPY2D_ASYNC | MEMCPY2D_ASYNC_PTSZ | MEMCPY_PEER_ASYNC)
    }

    /// A synchronization call (stream, device or event).
    #[inline(always)]
    pub fn is_sync(api: u32) -> bool {
        matches!(canonical(api), STREAM_SYNC | STREAM_SYNC_PTSZ | DEVICE_SYNC | EVENT_SYNC)
    }

    /// Returns a pointer (or `cuMemCreate`'s handle) through its first
    /// argument (`void **`).
    #[inline(always)]
    pub fn returns_pointer(api: u32) -> bool {
        matches!(canonical(api), MALLOC | HOST_ALLOC | MALLOC_HOST | CU_MEM_CREATE)
    }

    /// Frees or unregisters the pointer (or `cuMemRelease`'s handle) in
    /// its first argument.
    #[inline(always)]
    pub fn releases_pointer(api: u32) -> bool {
        matches!(canonical(api), FREE | FREE_HOST | HOST_UNREGISTER | CU_MEM_RELEASE)
    }

    /// The driver's virtual memory management (PyTorch's
    /// `expandable_segments`, vLLM's sleep mode): `cuMemCreate` makes
    /// physical memory (a handle), `cuMemRelease` frees it, `cuMemMap` /
    /// `cuMemUnmap` map it into address ranges.
    #[inline(always)]
    pub fn is_vmm(api: u32) -> bool {
        matches!(api, CU_MEM_CREATE | CU_MEM_RELEASE | CU_MEM_MAP | CU_MEM_UNMAP)
    }

    /// A kernel launch, any form (entry only).
    #[inline(always)]
    pub fn is_launch(api: u32) -> bool {
        matches!(canonical(api), LAUNCH | LAUNCH_PTSZ)
    }

    /// A graph launch (`cudaGraphLaunch(exec, stream)`, `cuGraphLaunch`;
    /// entry only, like kernel launches).
    #[inline(always)]
    pub fn is_graph_launch(api: u32) -> bool {
        matches!(canonical(api), GRAPH_LAUNCH | GRAPH_LAUNCH_PTSZ)
    }

    /// Probed on entry only (no return probe): launches of kernels and
    /// graphs, the hottest calls.
    #[inline(always)]
    pub fn entry_only(api: u32) -> bool {
        is_launch(api) || is_graph_launch(api)
    }

    /// `cudaStreamBeginCapture(stream, mode)`, `cuStreamBeginCapture_v2`.
    #[inline(always)]
    pub fn is_capture_begin(api: u32) -> bool {
        matches!(canonical(api), BEGIN_CAPTURE | BEGIN_CAPTURE_PTSZ)
    }

    /// `cudaStreamEndCapture(stream, cudaGraph_t *graph)`, `cuStreamEndCapture`.
    #[inline(always)]
    pub fn is_capture_end(api: u32) -> bool {
        matches!(canonical(api), END_CAPTURE | END_CAPTURE_PTSZ)
    }

    /// `cudaGraphInstantiate*(cudaGraphExec_t *exec, cudaGraph_t graph,
    /// ...)`, `cuGraphInstantiate*`.
    #[inline(always)]
    pub fn is_instantiate(api: u32) -> bool {
        matches!(canonical(api), GRAPH_INSTANTIATE | GRAPH_INSTANTIATE_FLAGS | GRAPH_INSTANTIATE_PARAMS | GRAPH_INSTANTIATE_PARAMS_PTSZ)
    }

    /// `cudaMemsetAsync(ptr, value, bytes, stream)`,
    /// `cuMemsetD8Async(ptr, value, n, stream)`, `cuMemsetD32Async` (n
    /// words of 4 bytes).
    #[inline(always)]
    pub fn is_memset(api: u32) -> bool {
        matches!(canonical(api), MEMSET_ASYNC | MEMSET_ASYNC_PTSZ)
    }

    /// Bytes per element a memset's count is in.
    #[inline(always)]
    pub fn memset_unit(api: u32) -> u64 {
        if matches!(api, CU_MEMSET_D32_ASYNC | CU_MEMSET_D32_ASYNC_PTSZ) { 4 } else { 1 }
    }

    /// `cudaEventRecord[WithFlags][_ptsz](event, stream[, flags])`,
    /// `cuEventRecord*`: the event marks the stream's work so far.
    #[inline(always)]
    pub fn is_event_record(api: u32) -> bool {
        matches!(canonical(api), EVENT_RECORD | EVENT_RECORD_PTSZ | EVENT_RECORD_FLAGS | EVENT_RECORD_FLAGS_PTSZ)
    }

    /// `cudaStreamWaitEvent[_ptsz](stream, event, flags)`,
    /// `cuStreamWaitEvent*`: a stream waits on the device, not the host.
    #[inline(always)]
    pub fn is_stream_wait_event(api: u32) -> bool {
        matches!(canonical(api), STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ)
    }

    /// `cudaEventQuery(event)`, `cudaStreamQuery[_ptsz](stream)` and the
    /// driver's: whether the work is done, without waiting
    /// ([`NOT_READY`] when not). Hot in polling loops: aggregated in the
    /// kernel; only a call that fails sends a per-call event.
    #[inline(always)]
    pub fn is_query(api: u32) -> bool {
        matches!(canonical(api), EVENT_QUERY | STREAM_QUERY | STREAM_QUERY_PTSZ)
    }

    /// `cuModuleGetFunction(&f, module, name)`, `cuLibraryGetKernel(&k,
    /// library, name)`: a kernel handle made for a name (driver only).
    #[inline(always)]
    pub fn is_kernel_lookup(api: u32) -> bool {
        matches!(api, CU_MODULE_GET_FUNCTION | CU_LIBRARY_GET_KERNEL)
    }

    /// Returns a kernel handle through its first argument: a lookup by
    /// name, or `cuKernelGetFunction(&f, kernel)`.
    #[inline(always)]
    pub fn returns_handle(api: u32) -> bool {
        is_kernel_lookup(api) || api == CU_KERNEL_GET_FUNCTION
    }

    /// An NCCL function (collective, point-to-point or group call).
    #[inline(always)]
    pub fn is_nccl(api: u32) -> bool {
        (NCCL_ALL_REDUCE..=NCCL_GROUP_END).contains(&api)
    }

    /// An NCCL collective or point-to-point call (moves data), not
    /// `ncclGroupStart`/`ncclGroupEnd`.
    #[inline(always)]
    pub fn is_collective(api: u32) -> bool {
        (NCCL_ALL_REDUCE..=NCCL_RECV).contains(&api)
    }

    /// Bytes of one element of `ncclDataType_t` `t` (0 for an unknown type).
    #[inline(always)]
    pub fn nccl_type_size(t: u64) -> u64 {
        match t {
            0 | 1 | 10 | 11 => 1,
            6 | 9 => 2,
            2 | 3 | 7 => 4,
            4 | 5 | 8 => 8,
            _ => 0,
        }
    }

    /// `cudaErrorNotReady` / `CUDA_ERROR_NOT_READY`: what a query returns
    /// while the work is still running (not an error).
    pub const NOT_READY: i32 = 600;

    /// Capture and instantiation: what names a graph.
    #[inline(always)]
    pub fn is_graph_setup(api: u32) -> bool {
        is_capture_begin(api) || is_capture_end(api) || is_instantiate(api)
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
    /// Copy and sync pairs, counted in the kernel (exact when per-call
    /// events are lost): for an async copy, the copies followed, as the
    /// thread's next copy or sync, by a sync of their stream (or of the
    /// device); for a sync, the syncs that followed such a copy. The same
    /// rule as the replay's (`tracer-user/src/families/cuda/replay.rs`).
    pub sync_pairs: u64,
    /// Time of the syncs counted in `sync_pairs`.
    pub sync_pair_ns: u64,
    /// Queries (`api::is_query`) that found the work still running
    /// (`api::NOT_READY`; not counted in `errors`): polls.
    pub not_ready: u64,
    /// Waits that polling ended: a query that found the work done after
    /// one or more not-ready answers on the same thread.
    pub poll_waits: u64,
    /// Wall time of those waits, from the start of the first not-ready
    /// query to the end of the query that ended the wait: how long the
    /// thread spun.
    pub poll_ns: u64,
    /// Waits on NCCL collectives (schema 1.x): for a sync, or a query that
    /// ended a polling wait, the waits whose stream (or event, or device)
    /// had a collective queued since it was last waited on, directly or
    /// through `cudaEventRecord` + `cudaStreamWaitEvent`; for a
    /// collective, the host waits that covered it.
    pub coll_waits: u64,
    /// Time of those waits.
    pub coll_wait_ns: u64,
}

impl CudaStats {
    /// Adds `other` into `self`, field by field (the calls of two
    /// aggregates: a retired thread's, the entries of one call site).
    pub fn merge(&mut self, other: &CudaStats) {
        self.count += other.count;
        self.bytes += other.bytes;
        self.total_ns += other.total_ns;
        self.errors += other.errors;
        self.sync_pairs += other.sync_pairs;
        self.sync_pair_ns += other.sync_pair_ns;
        self.not_ready += other.not_ready;
        self.poll_waits += other.poll_waits;
        self.poll_ns += other.poll_ns;
        self.coll_waits += other.coll_waits;
        self.coll_wait_ns += other.coll_wait_ns;
    }
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

/// A stream capture in progress on one thread (`CUDA_CAPTURE`, keyed by
/// tid; from a successful `cudaStreamBeginCapture` to its
/// `cudaStreamEndCapture`): what the thread's calls put into the graph
/// instead of running (they are not counted as launches or copies).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCapture {
    pub stream: u64,
    /// Kernel (and graph) launches captured.
    pub launches: u64,
    /// Copies and memsets captured, and their bytes.
    pub copies: u64,
    pub copy_bytes: u64,
}

/// Arguments a USDT spec reads (`pytorch:malloc` has 4).
pub const USDT_ARGS: usize = 4;
/// Entries of `CUDA_USDT_SPECS`: one per probe site attached (torch's
/// `libc10_cuda.so` has 4; several torch builds in one recording add theirs).
pub const USDT_SPECS: u32 = 256;

/// Where a USDT argument is: `USDT_ARG_*`.
pub const USDT_ARG_NONE: u8 = 0;
/// In a register (`pt_regs_offset`).
pub const USDT_ARG_REG: u8 = 1;
/// In user memory at a register plus `value` (a displacement).
pub const USDT_ARG_MEM: u8 = 2;
/// The constant `value`.
pub const USDT_ARG_CONST: u8 = 3;

/// One argument of a USDT probe site, as its SDT note says.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArgSpec {
    /// Displacement (`USDT_ARG_MEM`) or constant (`USDT_ARG_CONST`).
    pub value: i64,
    pub pt_regs_offset: u16,
    /// `USDT_ARG_*`.
    pub kind: u8,
    /// 1, 2, 4 or 8.
    pub size: u8,
    /// 1: sign-extended from `size` bytes.
    pub signed: u8,
    pub _pad: [u8; 3],
}

/// Value of `CUDA_USDT_SPECS` (index: the probe site's attach cookie): what
/// the site is (`api`: `TORCH_MALLOC`, `TORCH_FREE`) and where its
/// arguments are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    pub api: u32,
    pub nargs: u32,
    pub args: [UsdtArgSpec; USDT_ARGS],
}

/// Code ranges per process in `CUDA_TEXT`: its probed runtimes (a
/// `libcudart`, and the copies linked statically into other libraries:
/// CuPy has 5, JAX 11) and its driver.
pub const TEXT_RANGES: usize = 16;
/// Value of `CUDA_TEXT`: `[start, end)` pairs, unused ones zero.
pub type CudaText = [u64; 2 * TEXT_RANGES];

/// Key of `CUDA_EVENT_COPY`: one CUDA event (`cudaEvent_t`, `CUevent`) of
/// one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub pid: u32,
    pub _pad: u32,
    pub event: u64,
}

/// A collective queued and not yet waited on (`CUDA_COLL_PENDING`, per
/// (pid, stream or event); `CUDA_COLL_EPOCH`, per pid, for device-wide
/// syncs). `epoch` counts the process's device-wide syncs: a stream's or
/// event's entry from an earlier epoch was covered by one of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollPending {
    pub epoch: u64,
    /// `CUDA_COLL_EPOCH`: 1 while a collective was queued since the last
    /// device-wide sync; `CUDA_COLL_PENDING`: always 1.
    pub live: u32,
    pub _pad: u32,
    /// The collective's `CUDA_STATS` key.
    pub key: CudaKey,
}

/// Bytes of a kernel name kept (`CudaName`); longer names are cut.
pub const NAME_BYTES: usize = 256;

/// A kernel handle and its name, sent through `CUDA_NAMES` when
/// `cuModuleGetFunction` / `cuLibraryGetKernel` return 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaName {
    pub pid: u32,
    /// Bytes of `name` read (with the NUL), 0 when unreadable.
    pub len: u32,
    /// The `CUfunction` or `CUkernel` made.
    pub handle: u64,
    pub name: [u8; NAME_BYTES],
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
    /// 1 while `last_copy` holds the thread's last async copy, not yet
    /// followed by a copy or sync (kept across calls).
    pub last_copy_active: u32,
    /// The `CUDA_STATS` key and the stream of that copy.
    pub last_copy: CudaKey,
    pub last_copy_stream: u64,
    /// Start of the thread's first not-ready query since its last query
    /// that found the work done (0: not polling; kept across calls).
    pub poll_start: u64,
}

/// One finished call, sent through `CUDA_EVENTS` (not for launches).
///
/// Graph setup calls use the fields so: `cudaStreamEndCapture`: `dst` the
/// graph made (0 on failure), `stream` the stream, `src` the launches
/// captured, `fingerprint` the copies captured, `bytes` their bytes;
/// `cudaGraphInstantiate*`: `dst` the executable graph made (0 on
/// failure), `src` the graph; `cudaStreamBeginCapture`: `stream`.
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
    /// Events: the event. Kernel handle calls: the handle made (0 on
    /// failure).
    pub dst: u64,
    /// Copies: source. `cuModuleGetFunction`, `cuLibraryGetKernel`: the
    /// name's address; `cuKernelGetFunction`: the `CUkernel`.
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
    unsafe impl aya::Pod for super::CudaCapture {}
    unsafe impl aya::Pod for super::EventKey {}
    unsafe impl aya::Pod for super::CudaName {}
    unsafe impl aya::Pod for super::CollPending {}
    unsafe impl aya::Pod for super::UsdtSpec {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<CudaKey>(), 40);
        assert_eq!(core::mem::size_of::<CudaStats>(), 88);
        assert_eq!(core::mem::size_of::<CollPending>(), 56);
        assert_eq!(core::mem::size_of::<EventKey>(), 16);
        assert_eq!(core::mem::size_of::<CudaName>(), 16 + NAME_BYTES);
        assert_eq!(core::mem::size_of::<LaunchKey>(), 32);
        assert_eq!(core::mem::size_of::<CudaInflight>(), 152);
        assert_eq!(core::mem::size_of::<CudaEvent>(), 96);
        assert_eq!(core::mem::size_of::<CudaCapture>(), 32);
        assert_eq!(core::mem::size_of::<UsdtArgSpec>(), 16);
        assert_eq!(core::mem::size_of::<UsdtSpec>(), 8 + 16 * USDT_ARGS);
    }

    #[test]
    fn stats_merge_adds_every_field() {
        let mut a = CudaStats { count: 1, bytes: 2, total_ns: 3, errors: 4, sync_pairs: 5, sync_pair_ns: 6, not_ready: 7, poll_waits: 8, poll_ns: 9, coll_waits: 1, coll_wait_ns: 2 };
        let b = CudaStats { count: 10, bytes: 20, total_ns: 30, errors: 40, sync_pairs: 50, sync_pair_ns: 60, not_ready: 70, poll_waits: 80, poll_ns: 90, coll_waits: 10, coll_wait_ns: 20 };
        a.merge(&b);
        assert_eq!(a, CudaStats { count: 11, bytes: 22, total_ns: 33, errors: 44, sync_pairs: 55, sync_pair_ns: 66, not_ready: 77, poll_waits: 88, poll_ns: 99, coll_waits: 11, coll_wait_ns: 22 });
        a.merge(&CudaStats::default());
        assert_eq!(a.count, 11);
        let mut z = CudaStats::default();
        z.merge(&b);
        assert_eq!(z, b);
    }

    #[test]
    fn api_classes() {
        assert_eq!(api::NAMES.len(), api::COUNT as usize);
        assert!(api::is_copy(api::MEMCPY2D_ASYNC_PTSZ) && !api::is_copy(api::STREAM_SYNC));
        assert!(api::is_async_copy(api::MEMCPY_ASYNC_PTSZ) && !api::is_async_copy(api::MEMCPY_PTDS));
        assert!(api::is_sync(api::EVENT_SYNC) && !api::is_sync(api::LAUNCH));
    }

    #[test]
    fn driver_twins() {
        for id in (api::FIRST_DRIVER..api::COUNT).filter(|id| api::is_driver(*id)) {
            let name = api::NAMES[id as usize];
            assert!(name.starts_with("cu") && !name.starts_with("cuda"), "{name}");
            // Driver-only: initialisation and device handles.
            if matches!(id, api::CU_INIT | api::CU_DEVICE_GET) || api::returns_handle(id) || api::is_vmm(id) {
                assert_eq!(api::canonical(id), id);
                continue;
            }
            assert!(!api::is_driver(api::canonical(id)), "{name} has no runtime twin");
            // The twin's per-thread-stream flavour matches the name's.
            let twin = api::NAMES[api::canonical(id) as usize];
            // (The runtime has no per-thread-stream peer copies; stream-ordered
            // allocations and frees count as plain ones.)
            let stream_ordered = !api::is_copy(id) && name.contains("Async");
            if !api::is_peer_copy(id) && !stream_ordered {
                assert_eq!(name.ends_with("_ptsz") || name.ends_with("_ptds"), twin.ends_with("_ptsz") || twin.ends_with("_ptds"), "{name} -> {twin}");
                assert_eq!(name.contains("Async"), twin.contains("Async"), "{name} -> {twin}");
            }
        }
        assert!(api::is_copy(api::CU_MEMCPY_HTOD_ASYNC_PTSZ) && api::is_async_copy(api::CU_MEMCPY_DTOD_ASYNC));
        assert!(api::is_copy(api::MEMCPY_PEER_ASYNC) && api::is_async_copy(api::CU_MEMCPY_PEER_ASYNC_PTSZ));
        assert!(api::is_peer_copy(api::CU_MEMCPY_PEER_PTDS) && !api::is_async_copy(api::MEMCPY_PEER));
        assert!(!api::is_copy(api::STREAM_SYNC) && !api::is_peer_copy(api::MEMCPY_ASYNC));
        assert_eq!(api::driver_copy_kind(api::CU_MEMCPY_PEER), KIND_DTOD);
        assert!(!api::is_async_copy(api::CU_MEMCPY_HTOD));
        assert!(api::is_sync(api::CU_CTX_SYNC) && api::is_launch(api::CU_LAUNCH_EX));
        assert!(api::returns_pointer(api::CU_MEM_ALLOC) && api::releases_pointer(api::CU_MEM_FREE_HOST));
        assert_eq!(api::driver_copy_kind(api::CU_MEMCPY_DTOH_PTDS), KIND_DTOH);
        assert_eq!(api::driver_copy_kind(api::CU_MEMCPY), KIND_DEFAULT);
        for id in 0..api::FIRST_DRIVER {
            let stream_ordered = api::NAMES[id as usize].contains("Async") && !api::is_copy(id) && !api::is_memset(id);
            let launch_form = api::is_launch(id) && id != api::LAUNCH && id != api::LAUNCH_PTSZ;
            assert_eq!(api::canonical(id) == id, !stream_ordered && !launch_form, "{}", api::NAMES[id as usize]);
        }
        for id in [api::LAUNCH_EX_C, api::LAUNCH_COOP, api::CU_LAUNCH_COOP] {
            assert_eq!(api::canonical(id), api::LAUNCH, "{}", api::NAMES[id as usize]);
        }
        for id in [api::LAUNCH_EX_C_PTSZ, api::LAUNCH_COOP_PTSZ, api::CU_LAUNCH_COOP_PTSZ] {
            assert_eq!(api::canonical(id), api::LAUNCH_PTSZ, "{}", api::NAMES[id as usize]);
        }
        assert!(api::is_driver(api::CU_LAUNCH_COOP_PTSZ) && !api::is_driver(api::LAUNCH_COOP_PTSZ));
        assert!(api::is_graph_launch(api::CU_GRAPH_LAUNCH_PTSZ) && api::entry_only(api::GRAPH_LAUNCH));
        assert!(!api::is_launch(api::GRAPH_LAUNCH) && !api::entry_only(api::END_CAPTURE));
        assert!(api::is_capture_begin(api::CU_BEGIN_CAPTURE) && api::is_capture_end(api::CU_END_CAPTURE_PTSZ));
        assert!(api::is_instantiate(api::CU_GRAPH_INSTANTIATE_FLAGS) && api::is_graph_setup(api::GRAPH_INSTANTIATE));
        assert!(api::is_memset(api::CU_MEMSET_D32_ASYNC_PTSZ) && !api::is_copy(api::MEMSET_ASYNC));
        assert_eq!((api::memset_unit(api::CU_MEMSET_D32_ASYNC), api::memset_unit(api::MEMSET_ASYNC)), (4, 1));
        assert!(api::is_sync(api::CU_CTX_SYNC_V2) && api::is_driver(api::CU_CTX_SYNC_V2));
        for id in [api::GET_DEVICE_COUNT, api::SET_DEVICE] {
            assert!(api::is_device_setup(id) && !api::is_driver(id), "{}", api::NAMES[id as usize]);
        }
        for id in [api::CU_INIT, api::CU_DEVICE_GET, api::CU_DEVICE_GET_COUNT] {
            assert!(api::is_device_setup(id) && api::is_driver(id), "{}", api::NAMES[id as usize]);
        }
        assert!(!api::is_copy(api::GET_DEVICE_COUNT) && !api::is_sync(api::CU_INIT) && !api::entry_only(api::CU_DEVICE_GET));
        assert!(api::is_event_record(api::CU_EVENT_RECORD_FLAGS_PTSZ) && api::is_event_record(api::EVENT_RECORD));
        assert!(api::is_stream_wait_event(api::CU_STREAM_WAIT_EVENT_PTSZ) && !api::is_sync(api::STREAM_WAIT_EVENT));
        assert!(api::is_query(api::CU_STREAM_QUERY_PTSZ) && api::is_query(api::EVENT_QUERY) && !api::is_sync(api::STREAM_QUERY));
        assert!(api::is_kernel_lookup(api::CU_LIBRARY_GET_KERNEL) && api::returns_handle(api::CU_KERNEL_GET_FUNCTION));
        for id in [api::MALLOC_FROM_POOL_ASYNC_PTSZ, api::CU_MEM_ALLOC_FROM_POOL_ASYNC] {
            assert!(api::returns_pointer(id) && api::canonical(id) == api::MALLOC, "{}", api::NAMES[id as usize]);
        }
        assert!(api::returns_pointer(api::CU_MEM_CREATE) && api::releases_pointer(api::CU_MEM_RELEASE) && api::is_vmm(api::CU_MEM_UNMAP));
        assert!(api::is_nccl(api::NCCL_GROUP_END) && !api::is_collective(api::NCCL_GROUP_START) && api::is_collective(api::NCCL_RECV));
        assert!(!api::is_driver(api::NCCL_ALL_REDUCE) && !api::is_nccl(api::MALLOC_FROM_POOL_ASYNC_PTSZ));
        for id in 0..api::COUNT {
            assert_eq!(api::is_nccl(id), api::NAMES[id as usize].starts_with("nccl"), "{}", api::NAMES[id as usize]);
        }
        assert_eq!((api::nccl_type_size(7), api::nccl_type_size(9), api::nccl_type_size(4), api::nccl_type_size(12)), (4, 2, 8, 0));
        assert!(!api::is_kernel_lookup(api::CU_KERNEL_GET_FUNCTION) && api::is_driver(api::CU_MODULE_GET_FUNCTION));
        // Runtime ids first, then the driver's: one range each.
        assert!((0..api::FIRST_DRIVER).all(|id| !api::is_driver_name(api::NAMES[id as usize])));
        // Every name's kind agrees with is_driver.
        for (id, name) in api::NAMES.iter().enumerate() {
            assert_eq!(api::is_driver(id as u32), api::is_driver_name(name), "{name}");
        }
        assert!(api::returns_pointer(api::MALLOC_ASYNC_PTSZ) && api::releases_pointer(api::CU_MEM_FREE_ASYNC));
    }
}
