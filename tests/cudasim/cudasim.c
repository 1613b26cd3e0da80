/*
 * cudasim: a TIMING SIMULATOR standing in for libcudart.so.12 in the tests of
 * infertrace. It is NOT CUDA and uses no GPU: it exports the CUDA runtime
 * functions infertrace probes, with their real signatures, under the soname
 * libcudart.so.12. Like the real runtime over the real driver, it is a thin
 * layer over the driver stand-in (cudadrvsim.c, libcuda.so.1, found next to
 * it through its $ORIGIN run path), which holds the timing model: durations,
 * pinned-vs-pageable behaviour and stream synchronization can be tested on
 * machines without a GPU. It prints nothing. docs/cuda.md describes the
 * model; the real libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel)
 * is used for everything else.
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libcudart.so.12 -Wl,-rpath,'$ORIGIN' -o libcudart.so.12 cudasim.c libcuda.so.1
 */
#include <stddef.h>
#include <stdint.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned x, y, z; } dim3;
typedef unsigned long long CUdeviceptr;

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum { HtoH = 0, HtoD = 1, DtoH = 2, DtoD = 3, Default = 4 };

/* The driver stand-in (cudadrvsim.c). */
int cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
int cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, void *);
int cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
int cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
int cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
int cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
int cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, void *);
int cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, void *);
int cuMemcpyPeer(CUdeviceptr, void *, CUdeviceptr, void *, size_t);
int cuMemcpyPeerAsync(CUdeviceptr, void *, CUdeviceptr, void *, size_t, void *);
int cuStreamSynchronize(void *);
int cuCtxSynchronize(void);
int cuEventSynchronize(void *);
int cuEventCreate(void **, unsigned);
int cuEventRecord(void *, void *);
int cuEventRecord_ptsz(void *, void *);
int cuEventRecordWithFlags(void *, void *, unsigned);
int cuEventRecordWithFlags_ptsz(void *, void *, unsigned);
int cuEventQuery(void *);
int cuStreamQuery(void *);
int cuStreamQuery_ptsz(void *);
int cuStreamWaitEvent(void *, void *, unsigned);
int cuStreamWaitEvent_ptsz(void *, void *, unsigned);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                   void **);
int cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                              void **);
/* The driver's CUlaunchConfig and CUlaunchAttribute (cuda.h, CUDA 12). */
typedef struct {
    int id;
    char pad[8 - sizeof(int)];
    union { char pad[64]; int cooperative; } value;
} CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    CUlaunchAttribute *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
int cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
int cuLaunchKernelEx_ptsz(const CUlaunchConfig *, void *, void **, void **);
int cuStreamBeginCapture_v2(void *, int);
int cuStreamEndCapture(void *, void **);
int cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
int cuGraphInstantiateWithParams(void **, void *, void *);
int cuGraphLaunch(void *, void *);
int cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, void *);
/* Keeps a forwarding call a call: a tail call of an exported driver
 * function would enter it with this function's caller's return address. */
#define NO_TAIL __attribute__((noinline, optimize("no-optimize-sibling-calls")))
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
int cuMemHostAlloc(void **, size_t, unsigned);
int cuMemFreeHost(void *);
int cuMemHostRegister_v2(void *, size_t, unsigned);
int cuMemHostUnregister(void *);

#define D(p) ((CUdeviceptr)(uintptr_t)(p))

/* A copy of `kind` (HtoH and Default go through the unified cuMemcpy). */
static cudaError_t copy(void *dst, const void *src, size_t n, int kind, cudaStream_t s, int blocking) {
    if (kind < HtoH || kind > Default) return cudaErrorInvalidValue;
    if (blocking) {
        switch (kind) {
        case HtoD: return cuMemcpyHtoD_v2(D(dst), src, n);
        case DtoH: return cuMemcpyDtoH_v2(dst, D(src), n);
        case DtoD: return cuMemcpyDtoD_v2(D(dst), D(src), n);
        default: return cuMemcpy(D(dst), D(src), n);
        }
    }
    switch (kind) {
    case HtoD: return cuMemcpyHtoDAsync_v2(D(dst), src, n, s);
    case DtoH: return cuMemcpyDtoHAsync_v2(dst, D(src), n, s);
    case DtoD: return cuMemcpyDtoDAsync_v2(D(dst), D(src), n, s);
    default: return cuMemcpyAsync(D(dst), D(src), n, s);
    }
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) { return copy(dst, src, n, kind, 0, 1); }
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, int kind) { return copy(dst, src, n, kind, 0, 1); }
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
    return copy(dst, src, n, kind, s, 0);
}
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
    return copy(dst, src, n, kind, s, 0);
}
cudaError_t cudaMemcpy2D(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, int kind) {
    (void)dp, (void)sp;
    return copy(dst, src, w * h, kind, 0, 1);
}
cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, int kind) {
    (void)dp, (void)sp;
    return copy(dst, src, w * h, kind, 0, 1);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, int kind,
                              cudaStream_t s) {
    (void)dp, (void)sp;
    return copy(dst, src, w * h, kind, s, 0);
}
cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, int kind,
                                   cudaStream_t s) {
    (void)dp, (void)sp;
    return copy(dst, src, w * h, kind, s, 0);
}

cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
    (void)dst_dev, (void)src_dev;
    return cuMemcpyPeer(D(dst), NULL, D(src), NULL, n);
}
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n, cudaStream_t s) {
    (void)dst_dev, (void)src_dev;
    return cuMemcpyPeerAsync(D(dst), NULL, D(src), NULL, n, s);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return cuStreamSynchronize(s); }
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) { return cuStreamSynchronize(s); }
cudaError_t cudaDeviceSynchronize(void) { return cuCtxSynchronize(); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cuEventSynchronize(e); }
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cuEventCreate(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) { return cuEventCreate(e, flags); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cuEventRecord(e, s); }
cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) { return cuEventRecord_ptsz(e, s); }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    return cuEventRecordWithFlags(e, s, flags);
}
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    return cuEventRecordWithFlags_ptsz(e, s, flags);
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cuEventQuery(e); }
cudaError_t cudaStreamQuery(cudaStream_t s) { return cuStreamQuery(s); }
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) { return cuStreamQuery_ptsz(s); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) { return cuStreamWaitEvent(s, e, flags); }
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    return cuStreamWaitEvent_ptsz(s, e, flags);
}

/* Launches reach the driver through internal functions, as in the real
 * runtime (never a tail call of an exported launch function: that would
 * enter it with the caller's return address, as a direct call does). */
static __attribute__((noinline)) cudaError_t launch(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                                                    cudaStream_t s) {
    if (!func) return cudaErrorInvalidValue;
    int rc = cuLaunchKernel((void *)func, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem, s, args,
                            NULL);
    return rc;
}
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    return launch(func, grid, block, args, shmem, s);
}
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    return launch(func, grid, block, args, shmem, s);
}

/* cudaLaunchConfig_t and cudaLaunchAttribute (cuda_runtime_api.h, CUDA 12). */
typedef struct {
    int id;
    char pad[8 - sizeof(int)];
    union { char pad[64]; int cooperative; } val;
} cudaLaunchAttribute;
typedef struct {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;
enum { cudaLaunchAttributeCooperative = 2 };

/* The launch forms forward to different driver functions, as a runtime may:
 * ExC to cuLaunchKernelEx (which enters cuLaunchKernel in turn), the
 * cooperative launch to cuLaunchCooperativeKernel, its _ptsz form to
 * cuLaunchKernelEx_ptsz with the cooperative attribute. */
static cudaError_t launch_ex(const cudaLaunchConfig_t *c, const void *func, void **args, int ptsz,
                             CUlaunchAttribute *attrs, unsigned n) {
    if (!c || !func) return cudaErrorInvalidValue;
    CUlaunchConfig d = {c->gridDim.x, c->gridDim.y, c->gridDim.z, c->blockDim.x, c->blockDim.y, c->blockDim.z,
                        (unsigned)c->dynamicSmemBytes, c->stream, attrs, n};
    return ptsz ? cuLaunchKernelEx_ptsz(&d, (void *)func, args, NULL) : cuLaunchKernelEx(&d, (void *)func, args, NULL);
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    return launch_ex(config, func, args, 0, NULL, 0);
}
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args) {
    return launch_ex(config, func, args, 1, NULL, 0);
}
cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                                        cudaStream_t s) {
    if (!func) return cudaErrorInvalidValue;
    return cuLaunchCooperativeKernel((void *)func, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem,
                                     s, args);
}
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                                             cudaStream_t s) {
    cudaLaunchConfig_t c = {grid, block, shmem, s, NULL, 0};
    CUlaunchAttribute coop = {cudaLaunchAttributeCooperative, {0}, {{0}}};
    coop.value.cooperative = 1;
    return launch_ex(&c, func, args, 1, &coop, 1);
}

cudaError_t cudaMalloc(void **p, size_t n) {
    if (!p) return cudaErrorInvalidValue;
    CUdeviceptr d = 0;
    int rc = cuMemAlloc_v2(&d, n);
    *p = (void *)(uintptr_t)d;
    return rc;
}
cudaError_t cudaFree(void *p) { return cuMemFree_v2(D(p)); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
    if (!p) return cudaErrorInvalidValue;
    CUdeviceptr d = 0;
    int rc = cuMemAllocAsync(&d, n, s);
    *p = (void *)(uintptr_t)d;
    return rc;
}
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s) { return cudaMallocAsync(p, n, s); }
static __attribute__((noinline)) cudaError_t pool_alloc(void **p, size_t n, void *pool, cudaStream_t s) {
    CUdeviceptr d = 0;
    int rc = cuMemAllocFromPoolAsync(&d, n, pool, s);
    if (rc == 0 && p) *p = (void *)(uintptr_t)d;
    return rc;
}
/* Not tail calls of each other (an exported function entered at its
 * caller's stack pointer would look like a call whose return was missed). */
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, void *pool, cudaStream_t s) {
    cudaError_t rc = pool_alloc(p, n, pool, s);
    return rc;
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t n, void *pool, cudaStream_t s) {
    cudaError_t rc = pool_alloc(p, n, pool, s);
    return rc;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return cuMemFreeAsync(D(p), s); }
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return cuMemFreeAsync(D(p), s); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) { return cuMemHostAlloc(p, n, flags); }
cudaError_t cudaMallocHost(void **p, size_t n) { return cuMemHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) { return cuMemFreeHost(p); }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) { return cuMemHostRegister_v2(p, n, flags); }
cudaError_t cudaHostUnregister(void *p) { return cuMemHostUnregister(p); }

/* Graphs: capture, instantiation and launch forward to the driver, whose
 * stand-in records the launches made on a capturing stream. */
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode) { return cuStreamBeginCapture_v2(s, mode); }
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode) { return cuStreamBeginCapture_v2(s, mode); }
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { return cuStreamEndCapture(s, g); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g) { return cuStreamEndCapture(s, g); }
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    return cuGraphInstantiateWithFlags(e, g, flags);
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    return cuGraphInstantiateWithFlags(e, g, flags);
}
cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *e, cudaGraph_t g, void *params) {
    return cuGraphInstantiateWithParams(e, g, params);
}
cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *e, cudaGraph_t g, void *params) {
    return cuGraphInstantiateWithParams(e, g, params);
}
static NO_TAIL cudaError_t graph_launch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidValue;
    return cuGraphLaunch(e, s);
}
NO_TAIL cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { return graph_launch(e, s); }
NO_TAIL cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t e, cudaStream_t s) { return graph_launch(e, s); }

/* Memsets: bytes, on a stream. */
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    return cuMemsetD8Async(D(p), (unsigned char)value, n, s);
}
cudaError_t cudaMemsetAsync_ptsz(void *p, int value, size_t n, cudaStream_t s) {
    return cuMemsetD8Async(D(p), (unsigned char)value, n, s);
}
