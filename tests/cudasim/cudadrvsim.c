/*
 * cudadrvsim: a TIMING SIMULATOR standing in for the CUDA driver library
 * (libcuda.so.1) in the tests of infertrace. It is NOT CUDA and uses no GPU:
 * it exports the driver API functions infertrace probes, with their real
 * signatures, under the soname libcuda.so.1, and makes them take time like a
 * GPU behind a PCIe link would. tests/cudasim/cudasim.c (the runtime
 * stand-in, libcudart.so.12) is a thin layer over it, as the real libcudart
 * is over the real libcuda, so runtime calls reach these functions from
 * inside the runtime's: the tests check that such calls are counted once.
 * It prints nothing. docs/cuda.md describes the model.
 *
 * Model (simulated GPU with one copy engine per stream):
 *   - H2D / D2H from pinned host memory (cuMemHostAlloc, cuMemAllocHost,
 *     cuMemHostRegister): 12 GB/s, asynchronous on a stream (the *Async
 *     forms return at once; the stream is busy until the copy ends).
 *   - H2D / D2H from pageable memory: 3 GB/s, and the call blocks until the
 *     stream is idle and the copy is done (as the real driver's staging does).
 *   - D2D: 500 GB/s, asynchronous. H2H: 10 GB/s, blocking.
 *   - cuLaunchKernel[Ex], cuLaunchCooperativeKernel: each kernel keeps its stream busy for 100 us (longer than issuing it
 *     takes under a tracer's uprobes, so that work queues up as on a GPU).
 *   - The synchronous copies: the async form on stream 0, then a sync.
 *   - cuStreamSynchronize sleeps until the stream is idle;
 *     cuCtxSynchronize until every stream is; cuEventRecord marks the end
 *     of its stream's queued work, cuEventSynchronize sleeps until then,
 *     cuEventQuery / cuStreamQuery answer CUDA_ERROR_NOT_READY (600)
 *     before it, cuStreamWaitEvent delays the stream's later work.
 *   - cuMemAlloc hands out fake device addresses (never dereferenced);
 *     cuMemHostAlloc/cuMemAllocHost return real, page-aligned host memory.
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 cudadrvsim.c -lpthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_NOT_READY = 600 };
enum { HtoH = 0, HtoD = 1, DtoH = 2, DtoD = 3, Default = 4 };

#define PINNED_BPS 12e9
#define PAGEABLE_BPS 3e9
#define DTOD_BPS 500e9
#define HTOH_BPS 10e9
#define LAUNCH_NS 100000.0
#define STREAMS 64
#define MAX_PINNED 1024
#define DEVICE_BASE 0x7e0000000000ull

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double busy_until[STREAMS]; /* ns, CLOCK_MONOTONIC */
static struct { uintptr_t start, end; } pinned[MAX_PINNED];
static uint64_t next_device = DEVICE_BASE;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void sleep_until(double t) {
    for (;;) {
        double left = t - now_ns();
        if (left <= 0) return;
        struct timespec ts = {(time_t)(left / 1e9), (long)((uint64_t)left % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static int slot(CUstream s) { return (int)(((uintptr_t)s >> 4) % STREAMS); }

static int is_pinned(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int hit = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_PINNED && !hit; i++)
        hit = pinned[i].end != 0 && a >= pinned[i].start && a < pinned[i].end;
    pthread_mutex_unlock(&mu);
    return hit;
}

static void add_pinned(void *p, size_t n) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_PINNED; i++)
        if (pinned[i].end == 0) {
            pinned[i].start = (uintptr_t)p;
            pinned[i].end = (uintptr_t)p + n;
            break;
        }
    pthread_mutex_unlock(&mu);
}

static int remove_pinned(void *p) {
    int found = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_PINNED; i++)
        if (pinned[i].end != 0 && pinned[i].start == (uintptr_t)p) {
            pinned[i].start = pinned[i].end = 0;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&mu);
    return found;
}

/* Queues `ns` of work on stream `s`; returns when it ends. */
static double enqueue(CUstream s, double ns) {
    pthread_mutex_lock(&mu);
    double start = busy_until[slot(s)] > now_ns() ? busy_until[slot(s)] : now_ns();
    double end = start + ns;
    busy_until[slot(s)] = end;
    pthread_mutex_unlock(&mu);
    return end;
}

/* Not a CUDA function: how the NCCL stand-in (ncclsim.c) queues a
 * collective's transfer on its stream, as the real NCCL launches its
 * kernel there. */
void cudasim_enqueue(CUstream s, double ns) { enqueue(s, ns); }

static int capture_launch(CUstream s);
static CUresult copy(void *dst, const void *src, size_t n, int kind, CUstream s, int blocking) {
    if (kind < HtoH || kind > Default) return CUDA_ERROR_INVALID_VALUE;
    if (!blocking && capture_launch(s)) return CUDA_SUCCESS; /* captured, not run */
    if (kind == Default) {
        int dst_dev = (uintptr_t)dst >= DEVICE_BASE, src_dev = (uintptr_t)src >= DEVICE_BASE;
        kind = dst_dev ? (src_dev ? DtoD : HtoD) : (src_dev ? DtoH : HtoH);
    }
    double end;
    if (kind == DtoD) {
        end = enqueue(s, n / DTOD_BPS * 1e9);
    } else if (kind == HtoH) {
        end = enqueue(s, n / HTOH_BPS * 1e9);
        blocking = 1;
    } else {
        const void *host = kind == HtoD ? src : dst;
        if (is_pinned(host)) {
            end = enqueue(s, n / PINNED_BPS * 1e9);
        } else {
            end = enqueue(s, n / PAGEABLE_BPS * 1e9);
            blocking = 1;
        }
    }
    if (blocking) sleep_until(end);
    return CUDA_SUCCESS;
}


#define P(x) ((void *)(uintptr_t)(x))

/* Synchronous copies. */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(P(dst), P(src), n, Default, 0, 1); }
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpy(dst, src, n); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return copy(P(dst), src, n, HtoD, 0, 1); }
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) { return cuMemcpyHtoD_v2(dst, src, n); }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return copy(dst, P(src), n, DtoH, 0, 1); }
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoH_v2(dst, src, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(P(dst), P(src), n, DtoD, 0, 1); }
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoD_v2(dst, src, n); }

/* Asynchronous copies. */
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(P(dst), P(src), n, Default, s, 0);
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return cuMemcpyAsync(dst, src, n, s); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy(P(dst), src, n, HtoD, s, 0);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return cuMemcpyHtoDAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { return copy(dst, P(src), n, DtoH, s, 0); }
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return cuMemcpyDtoHAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(P(dst), P(src), n, DtoD, s, 0);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return cuMemcpyDtoDAsync_v2(dst, src, n, s);
}

/* Peer copies (one simulated GPU: a device-to-device copy). */
CUresult cuMemcpyPeer(CUdeviceptr dst, void *dst_ctx, CUdeviceptr src, void *src_ctx, size_t n) {
    (void)dst_ctx, (void)src_ctx;
    return copy(P(dst), P(src), n, DtoD, 0, 1);
}
CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, void *dc, CUdeviceptr src, void *sc, size_t n) {
    return cuMemcpyPeer(dst, dc, src, sc, n);
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dst_ctx, CUdeviceptr src, void *src_ctx, size_t n, CUstream s) {
    (void)dst_ctx, (void)src_ctx;
    return copy(P(dst), P(src), n, DtoD, s, 0);
}
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, void *dc, CUdeviceptr src, void *sc, size_t n, CUstream s) {
    return cuMemcpyPeerAsync(dst, dc, src, sc, n, s);
}

/* Synchronization. */
static CUresult ctx_synchronize(void);
CUresult cuStreamSynchronize(CUstream s) {
    pthread_mutex_lock(&mu);
    double t = busy_until[slot(s)];
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
CUresult cuCtxSynchronize(void) { return ctx_synchronize(); }
static CUresult ctx_synchronize(void) {
    double t = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < STREAMS; i++)
        if (busy_until[i] > t) t = busy_until[i];
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return CUDA_SUCCESS;
}
/* Events: an event is any non-null handle (cuEventCreate hands out real
 * heap pointers); cuEventRecord marks the end of its stream's work queued
 * so far. A never-recorded event is complete. cuEventSynchronize(NULL)
 * waits for every stream (the older stand-in's behaviour). */
#define EVENTS 256
static struct { CUevent e; double at; } events[EVENTS];
static double *event_at(CUevent e) { /* under mu; NULL when the table is full */
    int free_slot = -1;
    for (int i = 0; i < EVENTS; i++) {
        if (events[i].e == e) return &events[i].at;
        if (!events[i].e && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0) return NULL;
    events[free_slot].e = e;
    events[free_slot].at = 0;
    return &events[free_slot].at;
}
CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = calloc(1, 16);
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult event_record(CUevent e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    double *at = event_at(e);
    if (at) *at = busy_until[slot(s)];
    pthread_mutex_unlock(&mu);
    return at ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s); }
CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s); }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned flags) { (void)flags; return event_record(e, s); }
CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned flags) { (void)flags; return event_record(e, s); }
static double event_time(CUevent e) {
    pthread_mutex_lock(&mu);
    double *at = event_at(e);
    double t = at ? *at : 0;
    pthread_mutex_unlock(&mu);
    return t;
}
CUresult cuEventSynchronize(CUevent e) {
    if (!e) return ctx_synchronize();
    sleep_until(event_time(e));
    return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    return now_ns() >= event_time(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult stream_query(CUstream s) {
    pthread_mutex_lock(&mu);
    double t = busy_until[slot(s)];
    pthread_mutex_unlock(&mu);
    return now_ns() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuStreamQuery(CUstream s) { return stream_query(s); }
CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s); }
/* The stream's later work starts after the event's. */
static CUresult stream_wait_event(CUstream s, CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    double t = event_time(e);
    pthread_mutex_lock(&mu);
    if (busy_until[slot(s)] < t) busy_until[slot(s)] = t;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) { (void)flags; return stream_wait_event(s, e); }
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned flags) { (void)flags; return stream_wait_event(s, e); }

/* Launches. The runtime stand-in passes its kernel's host stub as `f`.
 * The _ptsz forms call internal functions, never tail-call the exported
 * ones (that would enter them with their caller's return address, as a
 * direct call does); cuLaunchKernelEx enters the exported cuLaunchKernel
 * (a driver launch made from inside the driver). */
/* Stream capture: a capturing stream records its launches and copies
 * into the graph instead of running them. */
static int capturing[STREAMS];
static unsigned captured[STREAMS];
static int capture_launch(CUstream s) {
    int hit = 0;
    pthread_mutex_lock(&mu);
    if (capturing[slot(s)]) {
        captured[slot(s)]++;
        hit = 1;
    }
    pthread_mutex_unlock(&mu);
    return hit;
}
static __attribute__((noinline)) CUresult launch(CUfunction f, CUstream s) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    if (capture_launch(s)) return CUDA_SUCCESS;
    enqueue(s, LAUNCH_NS);
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch(f, s);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    CUresult rc = launch(f, s);
    return rc;
}
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
static __attribute__((noinline)) CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params,
                                                    void **extra) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                                 c->sharedMemBytes, c->hStream, params, extra);
    return rc;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    CUresult rc = launch_ex(c, f, params, extra);
    return rc;
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    CUresult rc = launch_ex(c, f, params, extra);
    return rc;
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shmem, CUstream s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    return launch(f, s);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    CUresult rc = launch(f, s);
    return rc;
}

/* Kernel handles (Triton, NVRTC, cuBLAS look kernels up by name): a
 * CUfunction or CUkernel is a heap block holding the name (or, for a
 * CUfunction got from a CUkernel, the kernel). Launches take either. */
typedef void *CUmodule;
typedef void *CUlibrary;
typedef void *CUkernel;
static CUresult name_handle(void **out, const char *name) {
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    *out = strdup(name);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { (void)m; return name_handle(f, name); }
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) { (void)l; return name_handle(k, name); }
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    if (!f || !k) return CUDA_ERROR_INVALID_VALUE;
    void **h = malloc(sizeof(void *));
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    *h = k;
    *f = h;
    return CUDA_SUCCESS;
}

/* Memory. */
static CUresult device_alloc(CUdeviceptr *p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *p = next_device;
    next_device += (n + 511) & ~(size_t)511;
    if (n == 0) next_device += 512;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return device_alloc(p, n); }
CUresult cuMemFree_v2(CUdeviceptr p) {
    (void)p;
    return CUDA_SUCCESS;
}
/* The stream-ordered allocator: the same, in stream order (no waiting here). */
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    (void)s;
    return device_alloc(p, n);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
    (void)s;
    return device_alloc(p, n);
}
/* Pools: as the stream-ordered allocator. */
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    (void)pool, (void)s;
    return device_alloc(p, n);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    (void)pool, (void)s;
    return device_alloc(p, n);
}
/* Virtual memory management: a physical allocation is a handle (a
 * counter), mapped into and out of address ranges. */
typedef unsigned long long CUmemGenericAllocationHandle;
static CUmemGenericAllocationHandle next_handle = 0x1000;
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const void *prop, unsigned long long flags) {
    (void)prop, (void)flags;
    if (!h || n == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *h = next_handle++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    (void)n, (void)offset, (void)flags;
    return p && h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
    (void)n;
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)p, (void)s;
    return CUDA_SUCCESS;
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    (void)p, (void)s;
    return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (posix_memalign(p, 4096, n ? n : 1)) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(*p, 0, n);
    add_pinned(*p, n);
    return CUDA_SUCCESS;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) { return cuMemHostAlloc(p, n, 0); }
CUresult cuMemFreeHost(void *p) {
    if (!remove_pinned(p)) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)flags;
    add_pinned(p, n);
    return CUDA_SUCCESS;
}
CUresult cuMemHostUnregister(void *p) { return remove_pinned(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* Graphs: a graph is its kernel count; launching it queues that many
 * kernels' time on the stream. */
typedef struct { unsigned kernels; } Graph;
enum { CUDA_ERROR_ILLEGAL_STATE = 401, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901 };
static CUresult begin_capture(CUstream s) {
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (capturing[slot(s)]) rc = CUDA_ERROR_ILLEGAL_STATE;
    capturing[slot(s)] = 1;
    captured[slot(s)] = 0;
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult end_capture(CUstream s, void **graph) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int was = capturing[slot(s)];
    unsigned n = captured[slot(s)];
    capturing[slot(s)] = 0;
    pthread_mutex_unlock(&mu);
    if (!was) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    Graph *g = malloc(sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->kernels = n;
    *graph = g;
    return CUDA_SUCCESS;
}
static CUresult instantiate(void **exec, void *graph) {
    if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
    Graph *e = malloc(sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *e = *(Graph *)graph;
    *exec = e;
    return CUDA_SUCCESS;
}
static __attribute__((noinline)) CUresult graph_launch(void *exec, CUstream s) {
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    enqueue(s, LAUNCH_NS * ((Graph *)exec)->kernels);
    return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    (void)mode;
    return begin_capture(s);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) {
    (void)mode;
    return begin_capture(s);
}
CUresult cuStreamEndCapture(CUstream s, void **graph) { return end_capture(s, graph); }
CUresult cuStreamEndCapture_ptsz(CUstream s, void **graph) { return end_capture(s, graph); }
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    (void)flags;
    return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams(void **exec, void *graph, void *params) {
    (void)params;
    return instantiate(exec, graph);
}
CUresult cuGraphInstantiateWithParams_ptsz(void **exec, void *graph, void *params) {
    (void)params;
    return instantiate(exec, graph);
}
CUresult cuGraphLaunch(void *exec, CUstream s) {
    CUresult rc = graph_launch(exec, s);
    return rc;
}
CUresult cuGraphLaunch_ptsz(void *exec, CUstream s) {
    CUresult rc = graph_launch(exec, s);
    return rc;
}

/* Memsets: device memory at the D2D rate, asynchronous on the stream
 * (recorded instead while it captures). */
static CUresult memset_async(CUdeviceptr p, size_t bytes, CUstream s) {
    (void)p;
    if (capture_launch(s)) return CUDA_SUCCESS;
    enqueue(s, bytes / DTOD_BPS * 1e9);
    return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)v;
    return memset_async(p, n, s);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)v;
    return memset_async(p, n, s);
}
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, CUstream s) {
    (void)v;
    return memset_async(p, 4 * n, s);
}
CUresult cuMemsetD32Async_ptsz(CUdeviceptr p, unsigned v, size_t n, CUstream s) {
    (void)v;
    return memset_async(p, 4 * n, s);
}
/* CUDA 13's libcudart resolves cuCtxSynchronize to this (an internal
 * function, not a tail call of the exported cuCtxSynchronize, which would
 * enter it at the same stack pointer). */
CUresult cuCtxSynchronize_v2(void) { return ctx_synchronize(); }
