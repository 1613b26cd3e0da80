/* A native program calling the CUDA runtime (libcudart.so.12, linked
 * dynamically): for the infertrace tests of native call sites. Lines the
 * tests look for carry an `@name` marker. Waits (up to 20 s) until the
 * uprobes are in place, like tests/workloads/cuda_patterns.py. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
extern cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
extern cudaError_t cudaStreamSynchronize(void *stream);

static int probed(const void *f) { return *(const volatile unsigned char *)f == 0xcc; }

__attribute__((noinline)) static void upload_batch(char *buf, int i) {
    memcpy(buf, &i, sizeof i);
    cudaMemcpyAsync((void *)0x7e0000000000ull, buf, 4096, 1, NULL); /* @native_copy */
    cudaStreamSynchronize(NULL); /* @native_sync */
}

int main(void) {
    static char buf[4096];
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; !(probed((const void *)cudaMemcpyAsync) && probed((const void *)cudaStreamSynchronize)); i++) {
        if (i > 2000) {
            fprintf(stderr, "probes never appeared\n");
            return 3;
        }
        nanosleep(&ts, NULL);
    }
    /* The first int3 is the return probe's (attached before the entry
     * probe): settle like cuda_patterns.py and cuda_burst.c. */
    ts.tv_nsec = 200 * 1000 * 1000;
    nanosleep(&ts, NULL);
    for (int i = 0; i < 32; i++) upload_batch(buf, i);
    ts.tv_nsec = 300 * 1000 * 1000;
    nanosleep(&ts, NULL);
    return 0;
}
