/* cuda_burst: an inference-service-shaped burst of CUDA runtime calls, for
 * the infertrace tests and benchmark of CUDA event loss at high rates.
 *
 * THREADS worker threads (default 4), each on a stream of its own, call in a
 * loop, for SECONDS seconds (default 10):
 *   cudaMemcpyAsync(dev, pinned, 256, HostToDevice, stream)   @burst_copy
 *   cudaStreamSynchronize(stream)                             @burst_sync
 * (the upload-then-wait pattern of `t.to('cuda')` in a request handler).
 * The library is dlopen'ed from $CUDART: the tests use tests/cudasim's timing
 * stand-in (libcudart.so.12 over libcuda.so.1; NOT CUDA), where a small
 * pinned copy and its sync cost next to nothing, so the loop runs at the rate
 * the call path (and a tracer's probes) allows. The pinned buffer comes from
 * cudaHostAlloc, so every copy is pinned.
 *
 * With --probed it starts (cudaHostAlloc first) only once the first byte of
 * each of the three functions it calls is int3 (a tracer's uprobes are in
 * place), then 0.2 s more (a function's entry probe follows its return
 * probe); exit code 3 after 20 s without them.
 *
 * Prints, after the run, on stdout or into the file $BURST_RESULT when set,
 * the exact numbers of calls it made (the ground truth of the tests) and
 * the rate:
 *   threads 4
 *   seconds 10.003
 *   cudaMemcpyAsync 123456
 *   cudaStreamSynchronize 123456
 *   calls_per_s 24680.1
 *   errors 0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*memcpy_async_t)(void *, const void *, size_t, int, void *);
typedef int (*sync_t)(void *);
typedef int (*host_alloc_t)(void **, size_t, unsigned);

#define MAX_THREADS 64
#define COPY_BYTES 256

static memcpy_async_t memcpy_async;
static sync_t stream_sync;
static double seconds = 10;
static volatile int go;

struct worker {
    pthread_t th;
    int idx;
    void *host;
    unsigned long long copies, syncs, errors;
    char pad[64];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int probed(const void *f) { return *(const volatile unsigned char *)f == 0xcc; }

__attribute__((noinline)) static void request(struct worker *w, void *stream) {
    void *dev = (void *)(0x7e0000000000ull + ((uint64_t)w->idx << 20));
    w->errors += memcpy_async(dev, w->host, COPY_BYTES, 1, stream) != 0; /* @burst_copy */
    w->copies++;
    w->errors += stream_sync(stream) != 0; /* @burst_sync */
    w->syncs++;
}

static void *run(void *arg) {
    struct worker *w = arg;
    void *stream = (void *)(uintptr_t)(0x1000 + w->idx);
    while (!go) {
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
    double end = now_s() + seconds;
    /* The clock is read every 64 requests. */
    for (;;) {
        for (int i = 0; i < 64; i++) request(w, stream);
        if (now_s() >= end) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = 4, wait = 0;
    int pos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probed")) wait = 1;
        else if (pos++ == 0) threads = atoi(argv[i]);
        else seconds = atof(argv[i]);
    }
    if (threads < 1 || threads > MAX_THREADS || seconds <= 0) {
        fprintf(stderr, "usage: cuda_burst [THREADS [SECONDS]] [--probed]\n");
        return 2;
    }
    const char *lib = getenv("CUDART");
    void *h = dlopen(lib ? lib : "libcudart.so.12", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    memcpy_async = (memcpy_async_t)dlsym(h, "cudaMemcpyAsync");
    stream_sync = (sync_t)dlsym(h, "cudaStreamSynchronize");
    host_alloc_t host_alloc = (host_alloc_t)dlsym(h, "cudaHostAlloc");
    if (!memcpy_async || !stream_sync || !host_alloc) {
        fprintf(stderr, "missing CUDA runtime functions in %s\n", lib);
        return 2;
    }
    if (wait) {
        double deadline = now_s() + 20;
        while (!(probed((const void *)memcpy_async) && probed((const void *)stream_sync) &&
                 probed((const void *)host_alloc))) {
            if (now_s() > deadline) {
                fprintf(stderr, "probes never appeared\n");
                return 3;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    static struct worker w[MAX_THREADS];
    for (int i = 0; i < threads; i++) {
        w[i].idx = i;
        if (host_alloc(&w[i].host, 4096, 0) != 0) { /* @burst_alloc */
            fprintf(stderr, "cudaHostAlloc failed\n");
            return 2;
        }
        memset(w[i].host, i, 4096);
        if (pthread_create(&w[i].th, NULL, run, &w[i]) != 0) {
            perror("pthread_create");
            return 2;
        }
    }
    double t0 = now_s();
    go = 1;
    unsigned long long copies = 0, syncs = 0, errors = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].th, NULL);
        copies += w[i].copies;
        syncs += w[i].syncs;
        errors += w[i].errors;
    }
    double el = now_s() - t0;
    const char *result = getenv("BURST_RESULT");
    FILE *out = result && *result ? fopen(result, "w") : stdout;
    if (!out) {
        perror(result);
        return 2;
    }
    fprintf(out, "threads %d\nseconds %.3f\ncudaMemcpyAsync %llu\ncudaStreamSynchronize %llu\ncalls_per_s %.1f\nerrors %llu\n",
           threads, el, copies, syncs, (copies + syncs) / el, errors);
    return fclose(out) == 0 ? 0 : 2;
}
