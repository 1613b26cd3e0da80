"""CUDA runtime call patterns as PyTorch produces them, made through ctypes.

The library is $CUDART (the real libcudart.so.12 from NVIDIA's wheel, where
every call fails with cudaErrorInsufficientDriver on a machine without a
GPU but is still entered, or tests/cudasim's timing simulator). Kernel host
stubs come from $FAKE_KERNELS (tests/cudasim/kernels.c).

Usage: cuda_patterns.py MODE, MODE one of
  patterns  every pattern the detector knows, plus each probed API once or more
  sim       timing: pinned vs pageable copies, leaks (meant for cudasim)
  forms     every launch form, runtime ($CUDART: the stand-in, over
            $CUDA_DRIVER) and driver: $FORMS_EXC_N (default 10000)
            cudaLaunchKernelExC, $FORMS_N (default 1500) of each other
            runtime form, then ($FORMS_PAUSE_S later, default 1) direct
            driver launches of each form, then runtime and driver ExC
            launches back to back (each to be counted once)
  forms_real  the runtime launch forms only, a few of each ($CUDART: the
            real libcudart, whose calls fail without a driver)
  graphs    CUDA graphs ($CUDART: the stand-in, over $CUDA_DRIVER): a
            capture (10 launches, 2 copies) replayed 50 + 7 times, a driver
            capture (3 launches) replayed 20 times, then a capture in a loop
            (20 captures of 4 launches, each launched once)
  graphs_real  graph calls on the real libcudart (each fails without a driver)
  memsets   memsets at runtime and driver level, cuCtxSynchronize_v2, and
            memsets made while a stream captures ($CUDART: the stand-in,
            over $CUDA_DRIVER)
  memsets_real  cudaMemsetAsync[_ptsz] on the real libcudart (each fails
            without a driver)
  events    events and queries ($CUDART: the stand-in, over $CUDA_DRIVER):
            torch's non_blocking copy + event record + synchronize, vLLM's
            token return, uploads waited for through events, an event
            recorded on another stream, spins on cudaEventQuery and
            cudaStreamQuery_ptsz, a once-per-step check, and the driver's
            forms called directly; stderr `poll NAME NOT_READY WAITS S`
  kernels   driver kernel handles named by cuModuleGetFunction,
            cuLibraryGetKernel and cuKernelGetFunction, launched with
            cuLaunchKernel ($CUDA_DRIVER: the stand-in), then
            $KERNELS_BULK_N (5000) runtime launches from one line
            (launch-bound); stderr `bulk N SECONDS`
  pools     pool allocations (runtime and driver) and the driver's virtual
            memory (cuMemCreate/Map/Unmap/Release), with leaks at two lines
  pools_real  cudaMallocFromPoolAsync[_ptsz] on the real libcudart
            (each fails without a driver; stderr `rc NAME CODE`)
  nccl      NCCL calls on the stand-in $NCCL (tests/cudasim/ncclsim.c)
  nccl_wait  host waits on collectives ($NCCL: the stand-in, whose
            collectives keep their stream busy at 1 GB/s; $CUDART, the
            stand-in over $CUDA_DRIVER): stream, torch (event record +
            cudaStreamWaitEvent + .item()), device, event and polling
            waits, and syncs with no collective queued; stderr
            `waited PHASE N SECONDS` (the workload's own clock)
  nccl_real  NCCL calls on the real $NCCL (fail without a GPU; stderr
            `rc NAME CODE`)
  events_real  each event and query function on the real libcudart, twice
            (each fails without a driver; stderr `rc NAME CODE`)
  nodevice_real  device setup on the real libcudart (no driver here):
            cudaGetDeviceCount x3, cudaSetDevice(0) x1; each return code on
            stderr (`rc NAME CODE`), the truth of the no-device note
  late      like `patterns`' first phase, loading libcudart only after a delay
  threads   copies from 8 short-lived threads, then from the main thread
  driver    the driver API called directly ($CUDA_DRIVER: tests/cudasim's
            driver stand-in, libcuda.so.1), then runtime calls that go
            through the driver (to be counted once, as runtime calls)
  hot       one process, runtime and direct driver calls ($CUDA_DRIVER):
            5 direct cuLaunchKernel + cuMemcpyHtoDAsync_v2; runtime DtoD
            copies (entering cuMemcpyDtoDAsync_v2) and launches (entering
            cuLaunchKernel) until the driver's probe on
            cuMemcpyDtoDAsync_v2 is gone from this process (stderr:
            `phase1 N`), then $HOT_N more of each with a direct
            cuLaunchKernel and cuMemcpyHtoDAsync_v2 every 10th (`phase2 N
            SECONDS`); then for $HOT_DIRECT_S seconds (default 0) direct
            cuMemcpyDtoDAsync_v2 calls every 5 ms (`direct N`). With
            $HOT_SYNC_DIR it waits after each phase for the test
            (phase1.ready -> phase1.go, phase2.ready -> phase2.go)

Lines the tests look for carry a `# @name` marker. Before calling anything
the workload waits until the uprobes are in place (the first byte of every
probed function is int3, then $PROBE_SETTLE_S more seconds, default 0.2), so
that counts are exact; it gives up with exit code 3 after $PROBE_WAIT_S
seconds (default 20; 0 skips the wait). Any tracer's probes count: tests
running at the same time must each use their own copy of the library.
"""

import ctypes
import os
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "patterns"
HtoH, HtoD, DtoH, DtoD, Default = 0, 1, 2, 3, 4
DEV = ctypes.c_void_p(0x7E0000000000)  # a device pointer (never dereferenced)
DEV2 = ctypes.c_void_p(0x7E0000100000)


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def size(n):
    return ctypes.c_size_t(n)


def load():
    lib = ctypes.CDLL(os.environ["CUDART"])
    for name in ("cudaMalloc", "cudaHostAlloc", "cudaMallocHost", "cudaMallocAsync"):
        getattr(lib, name).argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t] + (
            [ctypes.c_uint] if name == "cudaHostAlloc" else [ctypes.c_void_p] if name == "cudaMallocAsync" else []
        )
    return lib


def wait_for_probes(lib, names):
    limit = float(os.environ.get("PROBE_WAIT_S", "20"))
    if limit <= 0:
        return
    addrs = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names]
    deadline = time.monotonic() + limit
    while any(ctypes.string_at(a, 1) != b"\xcc" for a in addrs):
        if time.monotonic() > deadline:
            missing = [n for n, a in zip(names, addrs) if ctypes.string_at(a, 1) != b"\xcc"]
            print("probes never appeared on: " + " ".join(missing), file=sys.stderr)
            sys.exit(3)
        time.sleep(0.01)
    # A function shows int3 from its first probe on; its return probe
    # follows within milliseconds.
    time.sleep(float(os.environ.get("PROBE_SETTLE_S", "0.2")))


ALL = [
    "cudaMemcpy", "cudaMemcpy_ptds", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz",
    "cudaMemcpy2D", "cudaMemcpy2D_ptds", "cudaMemcpy2DAsync", "cudaMemcpy2DAsync_ptsz",
    "cudaStreamSynchronize", "cudaStreamSynchronize_ptsz", "cudaDeviceSynchronize",
    "cudaEventSynchronize", "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMalloc",
    "cudaFree", "cudaHostAlloc", "cudaMallocHost", "cudaHostRegister", "cudaFreeHost",
    "cudaHostUnregister", "cudaMemcpyPeer", "cudaMemcpyPeerAsync", "cudaMallocAsync", "cudaFreeAsync",
]


def small_batches(lib, n):
    """Per-batch small input upload + blocking .to('cuda'): 4 KiB, new data each time."""
    buf = ctypes.create_string_buffer(4096)
    for i in range(n):
        buf[0:8] = i.to_bytes(8, "little")
        lib.cudaMemcpyAsync(DEV, buf, size(4096), HtoD, None)  # @small_copy
        lib.cudaStreamSynchronize(None)  # @small_sync


def item_loop(lib, n):
    """`loss.item()` every step: a 4-byte D2H copy and a sync."""
    out = ctypes.create_string_buffer(8)
    for _ in range(n):
        lib.cudaMemcpyAsync(out, DEV, size(4), DtoH, None)  # @item_copy
        lib.cudaStreamSynchronize(None)  # @item_sync


def constant_upload(lib, n):
    """The same 64 KiB of constants uploaded every step (non_blocking)."""
    const = ctypes.create_string_buffer(b"\x07" * 65536, 65536)
    for _ in range(n):
        lib.cudaMemcpyAsync(DEV, const, size(65536), HtoD, None)  # @const_copy


def pageable_big(lib, n):
    """8 MiB per step from pageable memory through blocking cudaMemcpy."""
    big = ctypes.create_string_buffer(8 << 20)
    for i in range(n):
        big[0:8] = i.to_bytes(8, "little")
        lib.cudaMemcpy(DEV, big, size(8 << 20), HtoD)  # @pageable_copy


def one_large(lib):
    """Loading weights once: one large copy (and one large async copy + sync)."""
    huge = ctypes.create_string_buffer(64 << 20)
    lib.cudaMemcpy(DEV, huge, size(64 << 20), HtoD)  # @large_copy
    lib.cudaMemcpyAsync(DEV, huge, size(64 << 20), HtoD, None)  # @large_async
    lib.cudaStreamSynchronize(None)  # @large_sync


def per_thread_stream(lib, n):
    """Builds with per-thread default streams call the _ptsz/_ptds variants."""
    buf = ctypes.create_string_buffer(2048)
    for i in range(n):
        buf[0:8] = i.to_bytes(8, "little")
        lib.cudaMemcpyAsync_ptsz(DEV, buf, size(2048), HtoD, None)  # @ptsz_copy
        lib.cudaStreamSynchronize_ptsz(None)  # @ptsz_sync
    for _ in range(5):
        lib.cudaMemcpy_ptds(DEV, DEV2, size(1024), DtoD)  # @ptds_copy


def two_d(lib):
    buf = ctypes.create_string_buffer(4096)
    stream = ctypes.c_void_p(0x5A0)
    for i in range(16):
        buf[0:8] = i.to_bytes(8, "little")
        # dst, dpitch, src, spitch, width, height, kind (on the stack), stream
        # (on the stack): the sync pairs with the copy only if the stream read
        # from the stack is right.
        lib.cudaMemcpy2DAsync(DEV, size(256), buf, size(256), size(200), size(10), HtoD, stream)  # @copy2d_async
        lib.cudaStreamSynchronize(stream)  # @copy2d_sync
    lib.cudaMemcpy2DAsync(DEV, size(256), buf, size(256), size(200), size(10), HtoD, stream)  # @copy2d_other
    lib.cudaStreamSynchronize(ctypes.c_void_p(0x5B0))  # @other_stream_sync
    for _ in range(2):
        lib.cudaMemcpy2D(buf, size(128), DEV, size(128), size(100), size(5), DtoH)  # @copy2d
    lib.cudaMemcpy2DAsync_ptsz(DEV, size(64), buf, size(64), size(64), size(4), HtoD, None)  # @copy2d_ptsz
    lib.cudaMemcpy2D_ptds(DEV, size(64), DEV2, size(64), size(32), size(2), DtoD)  # @copy2d_ptds
    for _ in range(3):
        lib.cudaMemcpyAsync(DEV, buf, size(512), Default, None)  # @default_copy


def peers(lib):
    """Copies between two GPUs' memories (device 1 -> device 0)."""
    for _ in range(3):
        lib.cudaMemcpyPeer(DEV, 0, DEV2, 1, size(1 << 20))  # @peer_copy
    for _ in range(2):
        lib.cudaMemcpyPeerAsync(DEV, 0, DEV2, 1, size(4096), ctypes.c_void_p(0x5C0))  # @peer_async


def launches(lib, kernels):
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    mm = ctypes.cast(getattr(kernels, "_Z13matmul_kernelPfS_S_i"), ctypes.c_void_p)
    grid, block = dim3(128, 1, 1), dim3(256, 1, 1)
    for _ in range(300):
        lib.cudaLaunchKernel(vec, grid, block, None, size(0), None)  # @launch_vec
    for _ in range(100):
        lib.cudaLaunchKernel_ptsz(mm, grid, block, None, size(0), None)  # @launch_mm


def memory(lib):
    p = ctypes.c_void_p()
    ptrs = []
    for _ in range(4):
        lib.cudaMalloc(ctypes.byref(p), 1 << 20)  # @malloc
        ptrs.append(p.value)
    for q in ptrs[:2]:
        lib.cudaFree(ctypes.c_void_p(q))  # @free
    stream = ctypes.c_void_p(0x5D0)
    for _ in range(2):
        lib.cudaMallocAsync(ctypes.byref(p), 1 << 20, stream)  # @malloc_async
    lib.cudaFreeAsync(p, stream)  # @free_async
    h = ctypes.c_void_p()
    lib.cudaHostAlloc(ctypes.byref(h), 1 << 20, 0)  # @host_alloc
    lib.cudaFreeHost(h)  # @free_host
    lib.cudaMallocHost(ctypes.byref(h), 2 << 20)  # @malloc_host
    reg = ctypes.create_string_buffer(8192)
    lib.cudaHostRegister(reg, size(8192), 0)  # @host_register
    lib.cudaHostUnregister(reg)  # @host_unregister
    for _ in range(3):
        lib.cudaDeviceSynchronize()  # @device_sync
    for _ in range(2):
        lib.cudaEventSynchronize(None)  # @event_sync


def patterns():
    lib = load()
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    wait_for_probes(lib, ALL)
    small_batches(lib, 200)
    item_loop(lib, 100)
    constant_upload(lib, 64)
    pageable_big(lib, 20)
    one_large(lib)
    per_thread_stream(lib, 40)
    two_d(lib)
    peers(lib)
    launches(lib, kernels)
    memory(lib)


def sim():
    """Timing, for the simulator: pinned vs pageable, syncs, leaks."""
    lib = load()
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    wait_for_probes(lib, ALL)
    n = 32 << 20
    pinned = ctypes.c_void_p()
    lib.cudaHostAlloc(ctypes.byref(pinned), n, 0)  # @sim_host_alloc
    pageable = ctypes.create_string_buffer(n)
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    out = ctypes.create_string_buffer(8)
    dev = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(dev), n)  # @sim_malloc_input
    leaked = ctypes.c_void_p()
    tmp = ctypes.c_void_p()
    for i in range(40):
        ctypes.memset(pinned, i, 8)
        lib.cudaMemcpyAsync(dev, pinned, size(n), HtoD, None)  # @sim_pinned_copy
        lib.cudaStreamSynchronize(None)  # @sim_pinned_sync
        pageable[0:8] = i.to_bytes(8, "little")
        lib.cudaMemcpyAsync(dev, pageable, size(n), HtoD, None)  # @sim_pageable_copy
        lib.cudaStreamSynchronize(None)  # @sim_pageable_sync
        for _ in range(10):
            lib.cudaLaunchKernel(vec, dim3(1, 1, 1), dim3(32, 1, 1), None, size(0), None)  # @sim_launch
        lib.cudaMemcpyAsync(out, dev, size(4), DtoH, None)  # @sim_item_copy
        lib.cudaStreamSynchronize(None)  # @sim_item_sync
        lib.cudaMalloc(ctypes.byref(leaked), 1 << 20)  # @sim_leak
        lib.cudaMalloc(ctypes.byref(tmp), 1 << 20)  # @sim_tmp_malloc
        lib.cudaFree(tmp)  # @sim_tmp_free
    lib.cudaFreeHost(pinned)  # @sim_free_host


def worker(lib, n):
    time.sleep(0.4)  # a tracer publishes new threads' Python states periodically
    buf = ctypes.create_string_buffer(1024)
    for _ in range(n):
        lib.cudaMemcpyAsync(DEV, buf, size(1024), HtoD, None)  # @thread_copy
        lib.cudaStreamSynchronize(None)  # @thread_sync


def threads():
    """Short-lived threads (a pool that churns): 8 threads x 10 copies + syncs."""
    import threading

    lib = load()
    wait_for_probes(lib, ALL)
    ts = [threading.Thread(target=worker, args=(lib, 10)) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    time.sleep(float(os.environ.get("AFTER_THREADS_S", "1.5")))
    small_batches(lib, 10)


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
        ("numAttrs", ctypes.c_uint),
    ]


DRIVER_ALL = [
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemcpyAsync", "cuMemcpyPeerAsync",
]


def driver():
    """The driver API directly, then runtime calls that go through it."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    drv.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
    drv.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
    for name in ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2"):
        getattr(drv, name).argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t] + (
            [ctypes.c_void_p] if "Async" in name else []
        )
    drv.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_size_t]
    drv.cuMemcpyAsync.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p]
    drv.cuMemcpyPeerAsync.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.c_void_p]
    drv.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    drv.cuLaunchKernelEx.argtypes = [ctypes.POINTER(CUlaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, ALL)
    wait_for_probes(drv, DRIVER_ALL)
    dev = ctypes.c_ulonglong()
    drv.cuMemAlloc_v2(ctypes.byref(dev), 1 << 20)  # @drv_alloc
    buf = ctypes.create_string_buffer(4096)
    for i in range(30):
        buf[0:8] = i.to_bytes(8, "little")
        drv.cuMemcpyHtoDAsync_v2(dev.value, buf, 4096, None)  # @drv_h2d_async
        drv.cuStreamSynchronize(None)  # @drv_sync
    out = ctypes.create_string_buffer(8)
    for _ in range(25):
        drv.cuMemcpyDtoH_v2(out, dev.value, 4)  # @drv_item
    for _ in range(3):
        drv.cuMemcpyHtoD_v2(dev.value, buf, 64)  # @drv_h2d
    drv.cuMemcpyAsync(dev.value, dev.value + 4096, 512, None)  # @drv_unified
    for _ in range(2):
        drv.cuMemcpyPeerAsync(dev.value, None, dev.value + 8192, None, 256, None)  # @drv_peer
    drv.cuCtxSynchronize()  # @drv_ctx_sync
    for _ in range(12):
        drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @drv_launch
    cfg = CUlaunchConfig(1, 1, 1, 32, 1, 1, 0, None, None, 0)
    for _ in range(7):
        drv.cuLaunchKernelEx(ctypes.byref(cfg), vec, None, None)  # @drv_launch_ex
    # The runtime over the driver: each call enters the driver inside.
    rdev = ctypes.c_void_p(dev.value)
    for _ in range(20):
        rt.cudaMemcpyAsync(rdev, buf, size(4096), HtoD, None)  # @rt_h2d
        rt.cudaStreamSynchronize(None)  # @rt_sync
    for _ in range(9):
        rt.cudaLaunchKernel(vec, dim3(1, 1, 1), dim3(32, 1, 1), None, size(0), None)  # @rt_launch
    # Runtime and direct driver launches back to back from one Python frame
    # (same C stack depth, microseconds apart): each is counted once.
    for _ in range(6):
        rt.cudaLaunchKernel(vec, dim3(1, 1, 1), dim3(32, 1, 1), None, size(0), None)  # @mixed_rt
        drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @mixed_drv
    rt.cudaMemcpyPeer(rdev, 0, ctypes.c_void_p(dev.value + 4096), 1, size(128))  # @rt_peer
    adev = ctypes.c_void_p()
    rt.cudaMallocAsync(ctypes.byref(adev), 1 << 12, None)  # @rt_malloc_async
    rt.cudaFreeAsync(adev, None)  # @rt_free_async
    tmp = ctypes.c_void_p()
    rt.cudaMalloc(ctypes.byref(tmp), 1 << 16)  # @rt_malloc
    rt.cudaFree(tmp)  # @rt_free
    drv.cuMemFree_v2(dev.value)  # @drv_free


class cudaLaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDim", dim3), ("blockDim", dim3), ("dynamicSmemBytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]


RT_FORMS = [
    "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernel_ptsz",
]
DRV_FORMS = [
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz",
]


def runtime_forms(rt, vec, n_exc, n):
    """Each runtime launch form; each enters the driver inside (the stand-in)."""
    cfg = cudaLaunchConfig(dim3(1, 1, 1), dim3(32, 1, 1), 0, None, None, 0)
    grid, block, zero = dim3(1, 1, 1), dim3(32, 1, 1), size(0)
    exc = rt.cudaLaunchKernelExC
    for _ in range(n_exc):
        exc(ctypes.byref(cfg), vec, None)  # @form_rt_exc
    for _ in range(n):
        rt.cudaLaunchKernelExC_ptsz(ctypes.byref(cfg), vec, None)  # @form_rt_exc_ptsz
        rt.cudaLaunchCooperativeKernel(vec, grid, block, None, zero, None)  # @form_rt_coop
        rt.cudaLaunchCooperativeKernel_ptsz(vec, grid, block, None, zero, None)  # @form_rt_coop_ptsz


def forms():
    """Every launch form, counted once: runtime forms first (hot enough for
    the driver gate), then direct driver launches of each form."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    for name in ("cuLaunchKernel", "cuLaunchKernel_ptsz"):
        getattr(drv, name).argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    for name in ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"):
        getattr(drv, name).argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 2
    for name in ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"):
        getattr(drv, name).argtypes = [ctypes.POINTER(CUlaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p]
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, RT_FORMS)
    wait_for_probes(drv, DRV_FORMS)
    n_exc = int(os.environ.get("FORMS_EXC_N", "10000"))
    n = int(os.environ.get("FORMS_N", "1500"))
    t0 = time.monotonic()
    runtime_forms(rt, vec, n_exc, n)
    print(f"runtime {n_exc} {n} {time.monotonic() - t0:.3f}", file=sys.stderr, flush=True)
    # The driver gate reads its counts every poll: time to act on them.
    time.sleep(float(os.environ.get("FORMS_PAUSE_S", "1.0")))
    dcfg = CUlaunchConfig(1, 1, 1, 32, 1, 1, 0, None, None, 0)
    for _ in range(40):
        drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @form_drv
    for _ in range(35):
        drv.cuLaunchKernel_ptsz(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @form_drv_ptsz
    for _ in range(30):
        drv.cuLaunchKernelEx(ctypes.byref(dcfg), vec, None, None)  # @form_drv_ex
    for _ in range(20):
        drv.cuLaunchKernelEx_ptsz(ctypes.byref(dcfg), vec, None, None)  # @form_drv_ex_ptsz
    for _ in range(25):
        drv.cuLaunchCooperativeKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None)  # @form_drv_coop
    for _ in range(15):
        drv.cuLaunchCooperativeKernel_ptsz(vec, 1, 1, 1, 32, 1, 1, 0, None, None)  # @form_drv_coop_ptsz
    # Runtime and driver ExC launches back to back from one Python frame.
    cfg = cudaLaunchConfig(dim3(1, 1, 1), dim3(32, 1, 1), 0, None, None, 0)
    for _ in range(8):
        rt.cudaLaunchKernelExC(ctypes.byref(cfg), vec, None)  # @form_mixed_rt
        drv.cuLaunchKernelEx(ctypes.byref(dcfg), vec, None, None)  # @form_mixed_drv


def forms_real():
    """The runtime launch forms on the real libcudart (each fails without a
    driver, but is entered)."""
    rt = load()
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, RT_FORMS)
    cfg = cudaLaunchConfig(dim3(1, 1, 1), dim3(32, 1, 1), 0, None, None, 0)
    grid, block, zero = dim3(1, 1, 1), dim3(32, 1, 1), size(0)
    for _ in range(30):
        rt.cudaLaunchKernelExC(ctypes.byref(cfg), vec, None)  # @real_exc
    for _ in range(20):
        rt.cudaLaunchKernelExC_ptsz(ctypes.byref(cfg), vec, None)  # @real_exc_ptsz
    for _ in range(15):
        rt.cudaLaunchCooperativeKernel(vec, grid, block, None, zero, None)  # @real_coop
    for _ in range(10):
        rt.cudaLaunchCooperativeKernel_ptsz(vec, grid, block, None, zero, None)  # @real_coop_ptsz


RT_GRAPH = [
    "cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz", "cudaStreamEndCapture", "cudaStreamEndCapture_ptsz",
    "cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cudaGraphLaunch", "cudaGraphLaunch_ptsz",
]
DRV_GRAPH = ["cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch"]


def graph_types(rt, drv=None):
    for lib in (rt, drv) if drv else (rt,):
        for name in ("cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"):
            if hasattr(lib, name):
                getattr(lib, name).argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong]


def graphs():
    """Capture once and replay; a driver capture; a capture in the loop."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    graph_types(rt, drv)
    drv.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, RT_GRAPH + ["cudaLaunchKernel", "cudaMemcpyAsync"])
    wait_for_probes(drv, DRV_GRAPH)
    stream, dstream = ctypes.c_void_p(0x6A0), ctypes.c_void_p(0x6B0)
    grid, block, zero = dim3(1, 1, 1), dim3(32, 1, 1), size(0)
    buf = ctypes.create_string_buffer(4096)
    for _ in range(5):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, stream)  # @graph_warmup
    rt.cudaStreamBeginCapture(stream, 0)  # @graph_begin
    for _ in range(10):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, stream)  # @graph_captured_launch
    for _ in range(2):
        rt.cudaMemcpyAsync(DEV, buf, size(4096), HtoD, stream)  # @graph_captured_copy
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    rt.cudaStreamEndCapture(stream, ctypes.byref(graph))  # @graph_end
    rt.cudaGraphInstantiate(ctypes.byref(exe), graph, 0)  # @graph_instantiate
    for _ in range(50):
        rt.cudaGraphLaunch(exe, stream)  # @graph_replay
    rt.cudaStreamSynchronize(stream)  # @graph_sync
    drv.cuStreamBeginCapture_v2(dstream, 0)  # @drv_graph_begin
    for _ in range(3):
        drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, dstream, None, None)  # @drv_graph_captured
    dgraph, dexe = ctypes.c_void_p(), ctypes.c_void_p()
    drv.cuStreamEndCapture(dstream, ctypes.byref(dgraph))  # @drv_graph_end
    drv.cuGraphInstantiateWithFlags(ctypes.byref(dexe), dgraph, 0)  # @drv_graph_instantiate
    for _ in range(20):
        drv.cuGraphLaunch(dexe, dstream)  # @drv_graph_replay
    for _ in range(7):
        rt.cudaGraphLaunch_ptsz(exe, stream)  # @graph_replay_ptsz
    for _ in range(20):
        rt.cudaStreamBeginCapture_ptsz(stream, 0)  # @recap_begin
        for _ in range(4):
            rt.cudaLaunchKernel(vec, grid, block, None, zero, stream)  # @recap_launch
        g, e = ctypes.c_void_p(), ctypes.c_void_p()
        rt.cudaStreamEndCapture_ptsz(stream, ctypes.byref(g))  # @recap_end
        rt.cudaGraphInstantiateWithFlags(ctypes.byref(e), g, 0)  # @recap_instantiate
        rt.cudaGraphLaunch(e, stream)  # @recap_replay
    rt.cudaStreamSynchronize(stream)  # @recap_sync


def graphs_real():
    """Graph calls on the real libcudart: each fails (no driver) but is entered."""
    rt = load()
    graph_types(rt)
    wait_for_probes(rt, RT_GRAPH)
    stream = ctypes.c_void_p(0x6A0)
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    for _ in range(3):
        rt.cudaStreamBeginCapture(stream, 0)  # @real_graph_begin
        rt.cudaStreamEndCapture(stream, ctypes.byref(graph))  # @real_graph_end
    for _ in range(2):
        rt.cudaGraphInstantiate(ctypes.byref(exe), graph, 0)  # @real_graph_instantiate
    for _ in range(5):
        rt.cudaGraphLaunch(exe, stream)  # @real_graph_launch


def memsets():
    """Memsets counted with their bytes; captured ones are not run."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    drv.cuMemsetD8Async.argtypes = [ctypes.c_ulonglong, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
    drv.cuMemsetD32Async.argtypes = [ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    wait_for_probes(rt, ["cudaMemsetAsync", "cudaMemsetAsync_ptsz", "cudaStreamBeginCapture"])
    wait_for_probes(drv, ["cuMemsetD8Async", "cuMemsetD32Async", "cuCtxSynchronize_v2"])
    stream = ctypes.c_void_p(0x6C0)
    for _ in range(12):
        rt.cudaMemsetAsync(DEV, 0, size(4096), stream)  # @ms_rt
    for _ in range(5):
        rt.cudaMemsetAsync_ptsz(DEV, 0, size(2048), None)  # @ms_rt_ptsz
    for _ in range(7):
        drv.cuMemsetD8Async(DEV.value, 1, 1000, None)  # @ms_d8
    for _ in range(4):
        drv.cuMemsetD32Async(DEV.value, 2, 256, None)  # @ms_d32
    for _ in range(3):
        drv.cuCtxSynchronize_v2()  # @ms_ctx_sync
    rt.cudaStreamBeginCapture(stream, 0)  # @ms_cap_begin
    for _ in range(2):
        rt.cudaMemsetAsync(DEV, 0, size(512), stream)  # @ms_captured
    graph = ctypes.c_void_p()
    rt.cudaStreamEndCapture(stream, ctypes.byref(graph))  # @ms_cap_end


def memsets_real():
    """cudaMemsetAsync on the real libcudart: fails (no driver), is entered."""
    rt = load()
    wait_for_probes(rt, ["cudaMemsetAsync", "cudaMemsetAsync_ptsz"])
    for _ in range(6):
        rt.cudaMemsetAsync(DEV, 0, size(4096), None)  # @real_ms
    for _ in range(2):
        rt.cudaMemsetAsync_ptsz(DEV, 0, size(100), None)  # @real_ms_ptsz


RT_EVENTS = [
    "cudaEventRecord", "cudaEventRecord_ptsz", "cudaEventRecordWithFlags", "cudaEventRecordWithFlags_ptsz",
    "cudaStreamWaitEvent", "cudaStreamWaitEvent_ptsz", "cudaEventQuery", "cudaStreamQuery", "cudaStreamQuery_ptsz",
    "cudaEventSynchronize", "cudaMemcpyAsync",
]
DRV_EVENTS = [
    "cuEventRecord", "cuEventRecord_ptsz", "cuEventRecordWithFlags", "cuEventRecordWithFlags_ptsz",
    "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz", "cuEventQuery", "cuStreamQuery", "cuStreamQuery_ptsz",
]


def event_types(rt):
    for name in ("cudaEventRecordWithFlags", "cudaEventRecordWithFlags_ptsz", "cudaStreamWaitEvent",
                 "cudaStreamWaitEvent_ptsz"):
        getattr(rt, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]


def events():
    """Events and queries ($CUDART: the stand-in, over $CUDA_DRIVER).
    stderr: `poll NAME NOT_READY WAITS SECONDS` per polling site (the
    workload's own count: the oracle)."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    event_types(rt)
    for name in ("cuEventRecordWithFlags", "cuEventRecordWithFlags_ptsz", "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"):
        getattr(drv, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, RT_EVENTS)
    wait_for_probes(drv, DRV_EVENTS)
    grid, block, zero = dim3(1, 1, 1), dim3(32, 1, 1), size(0)
    main, side = ctypes.c_void_p(0x7A0), ctypes.c_void_p(0x7B0)
    ev, ev2 = ctypes.c_void_p(), ctypes.c_void_p()
    rt.cudaEventCreate(ctypes.byref(ev))
    rt.cudaEventCreate(ctypes.byref(ev2))
    pinned = ctypes.c_void_p()
    rt.cudaHostAlloc(ctypes.byref(pinned), 1 << 20, 0)
    # The driver's, called directly (first: a driver function reached only
    # through the runtime would have its probes taken off): each counted
    # once, as driver calls.
    dev_ev = ctypes.c_void_p()
    drv.cuEventCreate(ctypes.byref(dev_ev), 0)
    for _ in range(3):
        drv.cuEventRecord(dev_ev, main)  # @ev_drv_record
        drv.cuEventRecord_ptsz(dev_ev, main)  # @ev_drv_record_ptsz
        drv.cuEventRecordWithFlags(dev_ev, main, 0)  # @ev_drv_record_flags
        drv.cuEventRecordWithFlags_ptsz(dev_ev, main, 0)  # @ev_drv_record_flags_ptsz
        drv.cuStreamWaitEvent(side, dev_ev, 0)  # @ev_drv_wait
        drv.cuStreamWaitEvent_ptsz(side, dev_ev, 0)  # @ev_drv_wait_ptsz
        drv.cuEventSynchronize(dev_ev)
        drv.cuEventQuery(dev_ev)  # @ev_drv_query
        drv.cuStreamQuery(side)  # @ev_drv_stream_query
        drv.cuStreamQuery_ptsz(side)  # @ev_drv_stream_query_ptsz
    # torch: loss.to("cpu", non_blocking=True); event.record(); event.synchronize()
    for _ in range(40):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, main)
        rt.cudaMemcpyAsync(pinned, DEV, size(4), DtoH, main)  # @ev_torch_copy
        rt.cudaEventRecord(ev, main)  # @ev_torch_record
        rt.cudaEventSynchronize(ev)  # @ev_torch_sync
    # vLLM's token return: the side stream waits for the main one, copies
    # the tokens, records; the host synchronizes later, after more work.
    for _ in range(30):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, main)
        rt.cudaEventRecord(ev2, main)  # @ev_vllm_record_main
        rt.cudaStreamWaitEvent(side, ev2, 0)  # @ev_vllm_wait
        rt.cudaMemcpyAsync(pinned, DEV, size(256), DtoH, side)  # @ev_vllm_copy
        rt.cudaEventRecordWithFlags(ev, side, 0)  # @ev_vllm_record
        for _ in range(3):
            rt.cudaLaunchKernel(vec, grid, block, None, zero, main)  # @ev_vllm_next
        rt.cudaEventSynchronize(ev)  # @ev_vllm_sync
    # Pinned uploads, each waited for through an event: sync_after_copy.
    for i in range(20):
        ctypes.memset(pinned, i, 8)
        rt.cudaMemcpyAsync(DEV, pinned, size(65536), HtoD, side)  # @ev_upload_copy
        rt.cudaEventRecord_ptsz(ev, side)  # @ev_upload_record
        rt.cudaEventSynchronize(ev)  # @ev_upload_sync
    # Recorded on another stream than the copy's: the sync waits for nothing of it.
    for _ in range(20):
        rt.cudaMemcpyAsync(pinned, DEV, size(4), DtoH, side)  # @ev_other_copy
        rt.cudaEventRecordWithFlags_ptsz(ev2, main, 0)  # @ev_other_record
        rt.cudaEventSynchronize(ev2)  # @ev_other_sync
    rt.cudaStreamWaitEvent_ptsz(main, ev, 0)  # @ev_wait_ptsz
    # Spinning on an event, then on a stream: 20 kernels (2 ms) each time.
    polls = {"event": [0, 0, 0.0], "stream": [0, 0, 0.0]}
    for _ in range(30):
        for _ in range(20):
            rt.cudaLaunchKernel(vec, grid, block, None, zero, main)
        rt.cudaEventRecord(ev, main)
        t0, n = time.monotonic(), 0
        while rt.cudaEventQuery(ev) == 600:  # @ev_poll_event
            n += 1
        secs = time.monotonic() - t0
        polls["event"][0] += n
        polls["event"][1] += n > 0
        polls["event"][2] += secs
    for _ in range(20):
        for _ in range(20):
            rt.cudaLaunchKernel(vec, grid, block, None, zero, side)
        t0, n = time.monotonic(), 0
        while rt.cudaStreamQuery_ptsz(side) == 600:  # @ev_poll_stream
            n += 1
        secs = time.monotonic() - t0
        polls["stream"][0] += n
        polls["stream"][1] += n > 0
        polls["stream"][2] += secs
    # A check once per step of other work: not a spin.
    ready = 0
    for _ in range(20):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, main)
        time.sleep(0.002)
        ready += rt.cudaStreamQuery(main) == 0  # @ev_poll_check
    for name, (n, w, secs) in polls.items():
        print(f"poll {name} {n} {w} {secs:.6f}", file=sys.stderr, flush=True)
    print(f"check ready {ready}", file=sys.stderr, flush=True)


def kernels():
    """Driver kernels named by their lookups, and a launch-bound line
    ($CUDA_DRIVER: the stand-in; $CUDART over it)."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    drv.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    drv.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    drv.cuLibraryGetKernel.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    drv.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, ["cudaLaunchKernel"])
    wait_for_probes(drv, ["cuLaunchKernel", "cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction"])
    module, library = ctypes.c_void_p(0x4D0), ctypes.c_void_p(0x4E0)
    f_vec, f_triton, k_gelu, f_gelu = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    drv.cuModuleGetFunction(ctypes.byref(f_vec), module, b"_Z10vec_kernelPfS_i")  # @kn_get_vec
    drv.cuModuleGetFunction(ctypes.byref(f_triton), module, b"triton_poi_fused_add_0")  # @kn_get_triton
    drv.cuLibraryGetKernel(ctypes.byref(k_gelu), library, b"_ZN3ops11gelu_kernelIfEEvPT_i")  # @kn_get_kernel
    drv.cuKernelGetFunction(ctypes.byref(f_gelu), k_gelu)  # @kn_get_function
    missing = ctypes.c_void_p()
    drv.cuModuleGetFunction(ctypes.byref(missing), module, None)  # @kn_get_fails
    go = drv.cuLaunchKernel
    for _ in range(30):
        go(f_vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @kn_launch_vec
    for _ in range(20):
        go(f_triton, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @kn_launch_triton
    for _ in range(5):
        go(k_gelu, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @kn_launch_kernel
    for _ in range(7):
        go(f_gelu, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @kn_launch_function
    for _ in range(3):
        go(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @kn_launch_unnamed
    # Launch-bound: many small kernels from one line, as fast as it goes.
    grid, block, zero = dim3(1, 1, 1), dim3(32, 1, 1), size(0)
    t0 = time.monotonic()
    n = int(os.environ.get("KERNELS_BULK_N", "5000"))
    for _ in range(n):
        rt.cudaLaunchKernel(vec, grid, block, None, zero, None)  # @kn_bulk
    print(f"bulk {n} {time.monotonic() - t0:.3f}", file=sys.stderr, flush=True)


def pools():
    """Pool allocations and the driver's virtual memory ($CUDART: the
    stand-in, over $CUDA_DRIVER): both halves of each seen, the leaks at
    their lines."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    rt.cudaMallocFromPoolAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaMallocFromPoolAsync_ptsz.argtypes = rt.cudaMallocFromPoolAsync.argtypes
    drv.cuMemAllocFromPoolAsync.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    drv.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_ulonglong]
    drv.cuMemRelease.argtypes = [ctypes.c_ulonglong]
    drv.cuMemMap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_ulonglong]
    drv.cuMemUnmap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t]
    drv.cuMemFreeAsync.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p]
    wait_for_probes(rt, ["cudaMallocFromPoolAsync", "cudaMallocFromPoolAsync_ptsz", "cudaFreeAsync"])
    wait_for_probes(drv, ["cuMemAllocFromPoolAsync", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap"])
    pool, stream = ctypes.c_void_p(0x9A0), ctypes.c_void_p(0x9B0)
    p = ctypes.c_void_p()
    ptrs = []
    for _ in range(40):
        rt.cudaMallocFromPoolAsync(ctypes.byref(p), 1 << 16, pool, stream)  # @pool_alloc
        ptrs.append(p.value)
    for q in ptrs[:10]:
        rt.cudaFreeAsync(ctypes.c_void_p(q), stream)  # @pool_free
    for _ in range(3):
        rt.cudaMallocFromPoolAsync_ptsz(ctypes.byref(p), 4096, pool, stream)  # @pool_alloc_ptsz
        rt.cudaFreeAsync(p, stream)  # @pool_free_ptsz
    d = ctypes.c_ulonglong()
    for _ in range(5):
        drv.cuMemAllocFromPoolAsync(ctypes.byref(d), 8192, pool, stream)  # @drv_pool_alloc
        drv.cuMemFreeAsync(d.value, stream)  # @drv_pool_free
    # expandable_segments: physical chunks created, mapped, unmapped, released.
    h = ctypes.c_ulonglong()
    va = 0x7F0000000000
    for i in range(20):
        drv.cuMemCreate(ctypes.byref(h), 2 << 20, None, 0)  # @vmm_create
        drv.cuMemMap(va + i * (2 << 20), 2 << 20, 0, h.value, 0)  # @vmm_map
        drv.cuMemUnmap(va + i * (2 << 20), 2 << 20)  # @vmm_unmap
        drv.cuMemRelease(h.value)  # @vmm_release
    for _ in range(18):
        drv.cuMemCreate(ctypes.byref(h), 2 << 20, None, 0)  # @vmm_leak


def pools_real():
    """cudaMallocFromPoolAsync[_ptsz] on the real libcudart: each fails
    without a driver (stderr `rc NAME CODE`), but is entered."""
    rt = load()
    rt.cudaMallocFromPoolAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaMallocFromPoolAsync_ptsz.argtypes = rt.cudaMallocFromPoolAsync.argtypes
    wait_for_probes(rt, ["cudaMallocFromPoolAsync", "cudaMallocFromPoolAsync_ptsz"])
    p = ctypes.c_void_p()
    for _ in range(3):
        rc = rt.cudaMallocFromPoolAsync(ctypes.byref(p), 4096, ctypes.c_void_p(0x9A0), None)  # @real_pool_alloc
        print(f"rc cudaMallocFromPoolAsync {rc}", file=sys.stderr)
    for _ in range(2):
        rc = rt.cudaMallocFromPoolAsync_ptsz(ctypes.byref(p), 4096, ctypes.c_void_p(0x9A0), None)  # @real_pool_alloc_ptsz
        print(f"rc cudaMallocFromPoolAsync_ptsz {rc}", file=sys.stderr)


NCCL_ALL = ["ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast", "ncclReduce",
            "ncclAlltoAll", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"]
FLOAT32, FLOAT16, BFLOAT16, INT8, UINT8, INT32, FLOAT64 = 7, 6, 9, 0, 1, 2, 8


def nccl_types(nc):
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    nc.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
    nc.ncclAllGather.argtypes = [vp, vp, sz, i, vp, vp]
    nc.ncclReduceScatter.argtypes = [vp, vp, sz, i, i, vp, vp]
    nc.ncclBroadcast.argtypes = [vp, vp, sz, i, i, vp, vp]
    nc.ncclBcast.argtypes = [vp, sz, i, i, vp, vp]
    nc.ncclReduce.argtypes = [vp, vp, sz, i, i, i, vp, vp]
    nc.ncclAlltoAll.argtypes = [vp, vp, sz, i, vp, vp]
    nc.ncclSend.argtypes = [vp, sz, i, i, vp, vp]
    nc.ncclRecv.argtypes = [vp, sz, i, i, vp, vp]


def nccl():
    """NCCL calls through the stand-in $NCCL (NOT NCCL): each collective on
    one of two communicators, a send/recv group, a call with no
    communicator (fails)."""
    nc = ctypes.CDLL(os.environ["NCCL"])
    nccl_types(nc)
    wait_for_probes(nc, NCCL_ALL)
    a, b, s = ctypes.c_void_p(0x1100), ctypes.c_void_p(0x2200), ctypes.c_void_p(0x6E0)
    send, recv = DEV, DEV2
    for _ in range(10):
        nc.ncclAllReduce(send, recv, 1024, FLOAT32, 0, a, s)  # @nc_allreduce
    for _ in range(5):
        nc.ncclAllGather(send, recv, 256, BFLOAT16, a, s)  # @nc_allgather
    for _ in range(4):
        nc.ncclReduceScatter(send, recv, 512, INT8, 0, b, s)  # @nc_reducescatter
    for _ in range(3):
        nc.ncclBroadcast(send, recv, 100, FLOAT64, 0, b, s)  # @nc_broadcast
    for _ in range(2):
        nc.ncclBcast(send, 64, INT32, 0, a, s)  # @nc_bcast
    for _ in range(2):
        nc.ncclReduce(send, recv, 32, FLOAT16, 0, 0, a, s)  # @nc_reduce
    for _ in range(3):
        nc.ncclAlltoAll(send, recv, 128, UINT8, b, s)  # @nc_alltoall
    for _ in range(4):
        nc.ncclGroupStart()  # @nc_group_start
        nc.ncclSend(send, 16, FLOAT32, 1, a, s)  # @nc_send
        nc.ncclRecv(recv, 16, FLOAT32, 1, a, s)  # @nc_recv
        nc.ncclGroupEnd()  # @nc_group_end
    nc.ncclAllReduce(send, recv, 8, FLOAT32, 0, None, s)  # @nc_bad


def nccl_wait():
    """Host waits on collectives: the stand-in NCCL queues each
    collective's transfer on its stream (1 GB/s), the runtime stand-in's
    syncs wait for it. stderr: `waited PHASE N SECONDS`, the time the
    phase's waiting calls took by the workload's clock."""
    rt = load()
    nc = ctypes.CDLL(os.environ["NCCL"])
    nccl_types(nc)
    event_types(rt)
    wait_for_probes(nc, ["ncclAllReduce", "ncclAllGather"])
    wait_for_probes(rt, ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaEventRecord",
                         "cudaStreamWaitEvent", "cudaStreamQuery", "cudaMemcpyAsync"])
    comm, s, s2 = ctypes.c_void_p(0x1100), ctypes.c_void_p(0x6E0), ctypes.c_void_p(0x7E0)
    ev, ev2 = ctypes.c_void_p(), ctypes.c_void_p()
    rt.cudaEventCreate(ctypes.byref(ev))
    rt.cudaEventCreate(ctypes.byref(ev2))
    pinned = ctypes.c_void_p()
    rt.cudaHostAlloc(ctypes.byref(pinned), 1 << 20, 0)
    mib = 1 << 18  # float32 elements in 1 MiB

    def timed(phase, n, step):
        spent = 0.0
        for _ in range(n):
            spent += step()
        print(f"waited {phase} {n} {spent:.6f}", file=sys.stderr)

    def stream_step():
        nc.ncclAllReduce(DEV, DEV2, 16 * mib, FLOAT32, 0, comm, s)  # @nw_allreduce
        t = time.perf_counter()
        rt.cudaStreamSynchronize(s)  # @nw_stream_sync
        return time.perf_counter() - t

    def torch_step():
        # ProcessGroupNCCL: the collective on its stream, an event behind
        # it, the compute stream made to wait; then `.item()`.
        nc.ncclAllReduce(DEV, DEV2, 8 * mib, FLOAT32, 0, comm, s)  # @nw_torch_allreduce
        rt.cudaEventRecord(ev, s)  # @nw_torch_record
        rt.cudaStreamWaitEvent(s2, ev, 0)  # @nw_torch_wait_event
        rt.cudaMemcpyAsync(pinned, DEV, size(4), DtoH, s2)  # @nw_torch_item_copy
        t = time.perf_counter()
        rt.cudaStreamSynchronize(s2)  # @nw_torch_item_sync
        return time.perf_counter() - t

    def device_step():
        nc.ncclAllGather(DEV, DEV2, 4 * mib, FLOAT32, comm, s)  # @nw_allgather
        t = time.perf_counter()
        rt.cudaDeviceSynchronize()  # @nw_device_sync
        return time.perf_counter() - t

    def event_step():
        nc.ncclAllReduce(DEV, DEV2, 4 * mib, FLOAT32, 0, comm, s)  # @nw_event_allreduce
        rt.cudaEventRecord(ev2, s)  # @nw_event_record
        t = time.perf_counter()
        rt.cudaEventSynchronize(ev2)  # @nw_event_sync
        return time.perf_counter() - t

    def poll_step():
        nc.ncclAllReduce(DEV, DEV2, 8 * mib, FLOAT32, 0, comm, s)  # @nw_poll_allreduce
        t = time.perf_counter()
        while rt.cudaStreamQuery(s) == 600:  # @nw_poll_query
            pass
        return time.perf_counter() - t

    def plain_step():
        # No collective queued since the last wait: not a collective wait.
        rt.cudaMemcpyAsync(DEV, pinned, size(4096), HtoD, s)
        t = time.perf_counter()
        rt.cudaStreamSynchronize(s)  # @nw_plain_sync
        return time.perf_counter() - t

    timed("stream", 80, stream_step)
    timed("torch", 20, torch_step)
    timed("device", 10, device_step)
    timed("event", 10, event_step)
    timed("poll", 10, poll_step)
    timed("plain", 20, plain_step)


def nccl_real():
    """NCCL calls on the real $NCCL (libnccl.so.2 from nvidia-nccl-cu12):
    without a communicator (no GPU here) each collective fails, the group
    calls succeed; stderr `rc NAME CODE`."""
    nc = ctypes.CDLL(os.environ["NCCL"])
    nccl_types(nc)
    wait_for_probes(nc, NCCL_ALL)
    for _ in range(3):
        print("rc ncclAllReduce", nc.ncclAllReduce(DEV, DEV2, 1024, FLOAT32, 0, None, None), file=sys.stderr)  # @real_nc_allreduce
    for _ in range(2):
        print("rc ncclSend", nc.ncclSend(DEV, 16, FLOAT16, 1, None, None), file=sys.stderr)  # @real_nc_send
    print("rc ncclGroupStart", nc.ncclGroupStart(), file=sys.stderr)  # @real_nc_group_start
    print("rc ncclGroupEnd", nc.ncclGroupEnd(), file=sys.stderr)  # @real_nc_group_end


def events_real():
    """Event and query calls on the real libcudart: each fails without a
    driver (stderr: `rc NAME CODE`), but is entered."""
    rt = load()
    event_types(rt)
    wait_for_probes(rt, RT_EVENTS[:-2])
    ev, s = ctypes.c_void_p(0x1230), ctypes.c_void_p(0x6A0)
    calls = [
        ("cudaEventRecord", lambda: rt.cudaEventRecord(ev, s)),  # @real_ev_record
        ("cudaEventRecord_ptsz", lambda: rt.cudaEventRecord_ptsz(ev, s)),  # @real_ev_record_ptsz
        ("cudaEventRecordWithFlags", lambda: rt.cudaEventRecordWithFlags(ev, s, 0)),  # @real_ev_record_flags
        ("cudaEventRecordWithFlags_ptsz", lambda: rt.cudaEventRecordWithFlags_ptsz(ev, s, 0)),  # @real_ev_record_flags_ptsz
        ("cudaStreamWaitEvent", lambda: rt.cudaStreamWaitEvent(s, ev, 0)),  # @real_ev_wait
        ("cudaStreamWaitEvent_ptsz", lambda: rt.cudaStreamWaitEvent_ptsz(s, ev, 0)),  # @real_ev_wait_ptsz
        ("cudaEventQuery", lambda: rt.cudaEventQuery(ev)),  # @real_ev_query
        ("cudaStreamQuery", lambda: rt.cudaStreamQuery(s)),  # @real_ev_stream_query
        ("cudaStreamQuery_ptsz", lambda: rt.cudaStreamQuery_ptsz(s)),  # @real_ev_stream_query_ptsz
    ]
    for name, call in calls:
        for _ in range(2):
            print(f"rc {name} {call()}", file=sys.stderr, flush=True)


def handshake(name):
    """With $HOT_SYNC_DIR: creates DIR/NAME.ready, waits for DIR/NAME.go
    (the test reads the kernel's counters in between)."""
    d = os.environ.get("HOT_SYNC_DIR")
    if not d:
        return
    open(os.path.join(d, name + ".ready"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, name + ".go")):
        if time.monotonic() > deadline:
            print(f"no {name}.go", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.01)


def hot():
    """Runtime calls hot enough for the driver's probes to come off, with
    direct driver calls of other functions in the same process."""
    rt = load()
    drv = ctypes.CDLL(os.environ["CUDA_DRIVER"])
    drv.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    drv.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p]
    drv.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    vec = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    wait_for_probes(rt, ["cudaMemcpyAsync", "cudaLaunchKernel"])
    wait_for_probes(drv, ["cuMemcpyDtoDAsync_v2", "cuLaunchKernel", "cuMemcpyHtoDAsync_v2"])
    copy, launch = rt.cudaMemcpyAsync, rt.cudaLaunchKernel
    grid, block, zero, kind = dim3(1, 1, 1), dim3(32, 1, 1), size(0), ctypes.c_int(DtoD)
    buf = ctypes.create_string_buffer(64)
    # Direct driver calls from the start (as a program's own driver code).
    for _ in range(5):
        drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @hot_drv_launch0
        drv.cuMemcpyHtoDAsync_v2(DEV.value, buf, 64, None)  # @hot_drv_h2d0
    # Runtime calls until the driver's probe on the function the runtime
    # copy enters is gone from this process.
    gate = ctypes.cast(drv.cuMemcpyDtoDAsync_v2, ctypes.c_void_p).value
    deadline = time.monotonic() + float(os.environ.get("PROBE_WAIT_S", "20"))
    phase1 = 0
    while ctypes.string_at(gate, 1) == b"\xcc":
        if time.monotonic() > deadline:
            print("the driver probe never came off", file=sys.stderr)
            sys.exit(3)
        for _ in range(100):
            copy(DEV, DEV2, zero, kind, None)  # @hot_rt_copy1
            launch(vec, grid, block, None, zero, None)  # @hot_rt_launch1
        phase1 += 100
    print(f"phase1 {phase1}", file=sys.stderr, flush=True)
    handshake("phase1")
    n = int(os.environ.get("HOT_N", "20000"))
    t0 = time.monotonic()
    for i in range(n):
        copy(DEV, DEV2, zero, kind, None)  # @hot_rt_copy
        launch(vec, grid, block, None, zero, None)  # @hot_rt_launch
        if i % 10 == 0:
            drv.cuLaunchKernel(vec, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # @hot_drv_launch
            drv.cuMemcpyHtoDAsync_v2(DEV.value, buf, 64, None)  # @hot_drv_h2d
    print(f"phase2 {n} {time.monotonic() - t0:.3f}", file=sys.stderr, flush=True)
    handshake("phase2")
    direct = 0
    end = time.monotonic() + float(os.environ.get("HOT_DIRECT_S", "0"))
    while time.monotonic() < end:
        drv.cuMemcpyDtoDAsync_v2(DEV.value, DEV2.value, 0, None)  # @hot_drv_dtod
        direct += 1
        time.sleep(0.005)
    print(f"direct {direct}", file=sys.stderr, flush=True)


def nodevice_real():
    """What torch.cuda.is_available() does first: count the devices (and
    pick one), on a machine without a driver."""
    rt = load()
    wait_for_probes(rt, ["cudaGetDeviceCount", "cudaSetDevice"])
    n = ctypes.c_int(-1)
    for _ in range(3):
        rc = rt.cudaGetDeviceCount(ctypes.byref(n))  # @nodev_count
        print(f"rc cudaGetDeviceCount {rc}", file=sys.stderr, flush=True)
    rc = rt.cudaSetDevice(0)  # @nodev_set
    print(f"rc cudaSetDevice {rc}", file=sys.stderr, flush=True)


def late():
    """libcudart is loaded with dlopen well after start (as PyTorch does)."""
    time.sleep(float(os.environ.get("LATE_S", "1.0")))
    lib = load()
    wait_for_probes(lib, ALL)
    small_batches(lib, 50)


{
    "patterns": patterns, "sim": sim, "late": late, "threads": threads, "driver": driver, "hot": hot,
    "forms": forms, "forms_real": forms_real, "graphs": graphs, "graphs_real": graphs_real,
    "memsets": memsets, "memsets_real": memsets_real, "nodevice_real": nodevice_real,
    "events": events, "events_real": events_real, "kernels": kernels, "pools": pools, "pools_real": pools_real,
    "nccl": nccl, "nccl_real": nccl_real, "nccl_wait": nccl_wait,
}[MODE]()
print("done", MODE, file=sys.stderr)
# Stay a moment: a tracer resolves Python stacks from the live process.
time.sleep(float(os.environ.get("END_SLEEP_S", "0.5")))
