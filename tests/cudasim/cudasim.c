/*
 * cudasim: a TIMING SIMULATOR standing in for libcudart.so.12 in the tests of
 * infertrace. It is NOT CUDA and uses no GPU: it exports the CUDA runtime
 * functions infertrace probes, with their real signatures, under the soname
 * libcudart.so.12, and makes them take time like a GPU behind a PCIe link
 * would, so that durations, pinned-vs-pageable behaviour and stream
 * synchronization can be tested on machines without a GPU. It prints
 * nothing. docs/cuda.md describes the model; the real libcudart.so.12 (from
 * the nvidia-cuda-runtime-cu12 wheel) is used for everything else.
 *
 * Model (simulated GPU with one copy engine per stream):
 *   - H2D / D2H from pinned host memory (cudaHostAlloc, cudaMallocHost,
 *     cudaHostRegister): 12 GB/s, asynchronous on a stream (cudaMemcpyAsync
 *     returns at once; the stream is busy until the copy ends).
 *   - H2D / D2H from pageable memory: 3 GB/s, and the call blocks until the
 *     stream is idle and the copy is done (as the real driver's staging does).
 *   - D2D: 500 GB/s, asynchronous. H2H: 10 GB/s, blocking.
 *   - cudaLaunchKernel: each kernel keeps its stream busy for 20 us.
 *   - cudaMemcpy / cudaMemcpy2D: the async form on stream 0, then a sync.
 *   - cudaStreamSynchronize sleeps until the stream is idle;
 *     cudaDeviceSynchronize until every stream is.
 *   - cudaMalloc hands out fake device addresses (never dereferenced);
 *     cudaHostAlloc/cudaMallocHost return real, page-aligned host memory.
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libcudart.so.12 -o libcudart.so.12 cudasim.c -lpthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned x, y, z; } dim3;

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum { HtoH = 0, HtoD = 1, DtoH = 2, DtoD = 3, Default = 4 };

#define PINNED_BPS 12e9
#define PAGEABLE_BPS 3e9
#define DTOD_BPS 500e9
#define HTOH_BPS 10e9
#define LAUNCH_NS 20000.0
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

static int slot(cudaStream_t s) { return (int)(((uintptr_t)s >> 4) % STREAMS); }

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
static double enqueue(cudaStream_t s, double ns) {
    pthread_mutex_lock(&mu);
    double start = busy_until[slot(s)] > now_ns() ? busy_until[slot(s)] : now_ns();
    double end = start + ns;
    busy_until[slot(s)] = end;
    pthread_mutex_unlock(&mu);
    return end;
}

static cudaError_t copy(void *dst, const void *src, size_t n, int kind, cudaStream_t s, int blocking) {
    if (kind < HtoH || kind > Default) return cudaErrorInvalidValue;
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
    return cudaSuccess;
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

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    pthread_mutex_lock(&mu);
    double t = busy_until[slot(s)];
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) { return cudaStreamSynchronize(s); }
cudaError_t cudaDeviceSynchronize(void) {
    double t = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < STREAMS; i++)
        if (busy_until[i] > t) t = busy_until[i];
    pthread_mutex_unlock(&mu);
    sleep_until(t);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaDeviceSynchronize();
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    (void)grid, (void)block, (void)args, (void)shmem;
    if (!func) return cudaErrorInvalidValue;
    enqueue(s, LAUNCH_NS);
    return cudaSuccess;
}
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    return cudaLaunchKernel(func, grid, block, args, shmem, s);
}

cudaError_t cudaMalloc(void **p, size_t n) {
    if (!p) return cudaErrorInvalidValue;
    pthread_mutex_lock(&mu);
    *p = (void *)(uintptr_t)next_device;
    next_device += (n + 511) & ~(size_t)511;
    if (n == 0) next_device += 512;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    (void)p;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (!p) return cudaErrorInvalidValue;
    if (posix_memalign(p, 4096, n ? n : 1)) return cudaErrorMemoryAllocation;
    memset(*p, 0, n);
    add_pinned(*p, n);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) {
    if (!remove_pinned(p)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
    (void)flags;
    add_pinned(p, n);
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) { return remove_pinned(p) ? cudaSuccess : cudaErrorInvalidValue; }
