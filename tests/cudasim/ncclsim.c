/*
 * ncclsim: a STAND-IN for NCCL (libnccl.so.2) in the tests of infertrace.
 * It is NOT NCCL, talks to no GPU and no peer: it exports the collective,
 * point-to-point and group functions infertrace probes, with their real
 * names and argument ABI (nccl.h), under the soname libnccl.so.2. Each call
 * returns ncclSuccess (0), or ncclInvalidArgument (4) for a NULL
 * communicator, as the real library does. It prints nothing.
 * Build: gcc -O2 -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl.so.2 ncclsim.c
 */
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

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)stream;
    return check(comm);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)stream;
    return check(comm);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)stream;
    return check(comm);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)root, (void)stream;
    return check(comm);
}
ncclResult_t ncclBcast(void *b, size_t count, ncclDataType_t t, int root, ncclComm_t comm, cudaStream_t stream) {
    (void)b, (void)count, (void)t, (void)root, (void)stream;
    return check(comm);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)op, (void)root, (void)stream;
    return check(comm);
}
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream) {
    (void)s, (void)r, (void)count, (void)t, (void)stream;
    return check(comm);
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)s, (void)count, (void)t, (void)peer, (void)stream;
    return check(comm);
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)r, (void)count, (void)t, (void)peer, (void)stream;
    return check(comm);
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
