/*
 * ncclsim: a STAND-IN for NCCL (libnccl.so.2) in the tests of infertrace.
 * It is NOT NCCL, talks to no GPU and no peer: it exports the collective,
 * point-to-point and group functions infertrace probes, with their real
 * names and argument ABI (nccl.h), under the soname libnccl.so.2. Each call
 * returns ncclSuccess (0), or ncclInvalidArgument (4) for a NULL
 * communicator, as the real library does. It prints nothing.
 * Timing: when the driver stand-in (cudadrvsim.c, libcuda.so.1) is loaded
 * in the process, a collective keeps its stream busy for its transfer at
 * a simulated 1 GB/s link plus 50 us (cudasim_enqueue), as the real
 * NCCL's kernel does on the GPU; a sync of that stream then waits for it.
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl.so.2 ncclsim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef void *cudaStream_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;

enum { ncclSuccess = 0, ncclInvalidArgument = 4 };

/* Not inlined into one another: each exported function is entered from
 * its caller, as in the real library. */
static __attribute__((noinline)) ncclResult_t check(ncclComm_t comm) {
    return comm ? ncclSuccess : ncclInvalidArgument;
}

/* The simulated link: 1 GB/s, 50 us per call. */
#define LINK_BPS 1e9
#define CALL_NS 50e3

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case 0: case 1: case 10: case 11: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    default: return 8;
    }
}

/* Queues the transfer of `count` elements on `stream` in the driver
 * stand-in, when it is loaded; returns `rc`. */
static __attribute__((noinline)) ncclResult_t queue(ncclResult_t rc, size_t count, ncclDataType_t t, cudaStream_t stream) {
    static void (*enqueue)(cudaStream_t, double);
    static int looked;
    if (rc != ncclSuccess) return rc;
    if (!looked) {
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (drv) enqueue = (void (*)(cudaStream_t, double))dlsym(drv, "cudasim_enqueue");
        looked = 1;
    }
    if (enqueue) enqueue(stream, CALL_NS + (double)(count * type_size(t)) / LINK_BPS * 1e9);
    return rc;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)root, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclBcast(void *b, size_t count, ncclDataType_t t, int root, ncclComm_t comm, cudaStream_t stream) {
    (void)b, (void)count, (void)t, (void)root, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)root, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)count, (void)t, (void)peer, (void)stream;
    return queue(check(comm), count, t, stream);
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)r, (void)count, (void)t, (void)peer, (void)stream;
    return queue(check(comm), count, t, stream);
}
static int depth;
ncclResult_t ncclGroupStart(void) {
    depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (depth > 0) depth--;
    return ncclSuccess;
}
