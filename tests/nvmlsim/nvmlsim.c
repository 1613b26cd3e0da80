/*
 * nvmlsim: a STAND-IN for libnvidia-ml.so.1 in the tests of infertrace. It is
 * NOT NVML, talks to no driver and knows no GPU: it exports, under the soname
 * libnvidia-ml.so.1 and with NVML's C signatures, the functions infertrace's
 * GPU sampler (tracer-user/src/families/nvml/mod.rs, through the nvml-wrapper crate)
 * calls, and answers them with fixed, known values, so that sampling, the
 * report and the recording can be tested on machines without a GPU. It
 * prints nothing.
 *
 * Two simulated GPUs:
 *   index  name                 uuid                                      util  mem util  used / total    PCIe TX / RX
 *   0      nvmlsim GPU 0 (fake) GPU-00000000-0000-4000-8000-00000000a100  37 %  12 %      1 GiB / 16 GiB  1000 / 2000 KB/s
 *   1      nvmlsim GPU 1 (fake) GPU-00000000-0000-4000-8000-00000000a101  81 %  45 %      3 GiB / 80 GiB  NOT_SUPPORTED
 * Memory: nvmlDeviceGetMemoryInfo_v2 reports `used` as above and
 * reserved = 64 MiB; the v1 nvmlDeviceGetMemoryInfo reports used + reserved
 * (as NVML does), i.e. 1 GiB + 64 MiB / 3 GiB + 64 MiB.
 * NVMLSIM_GPU0_USED_PERCENT=N (environment): GPU 0 has N% of its 16 GiB
 * in use instead (a GPU near capacity).
 *
 * Variants (compile-time):
 *   -DNVMLSIM_OLD     no nvmlDeviceGetMemoryInfo_v2 and no
 *                     nvmlDeviceGetPcieThroughput (an old driver's library)
 *   -DNVMLSIM_BROKEN  no nvmlDeviceGetUtilizationRates and no nvmlShutdown
 *                     (a library missing functions the sampler needs)
 * Build: tests/nvmlsim/build.sh (gcc -O2 -shared -fPIC -Wl,-soname,libnvidia-ml.so.1)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned int nvmlReturn_t;
typedef struct nvmlsim_device { unsigned index; } *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

#define GIB (1024ULL * 1024 * 1024)
#define MIB (1024ULL * 1024)
#define NGPUS 2
#define RESERVED (64 * MIB)

static struct nvmlsim_device devices[NGPUS] = {{0}, {1}};
static const unsigned long long mem_used[NGPUS] = {1 * GIB, 3 * GIB};
static const unsigned long long mem_total[NGPUS] = {16 * GIB, 80 * GIB};
static int initialized;

static int valid(nvmlDevice_t d) {
    return d == &devices[0] || d == &devices[1];
}

#define CHECK(dev, out)                        \
    do {                                       \
        if (!initialized)                      \
            return NVML_ERROR_UNINITIALIZED;   \
        if (!valid(dev) || !(out))             \
            return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

static nvmlReturn_t copy_string(char *buf, unsigned length, const char *s) {
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
    initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) {
    return nvmlInit_v2();
}

#ifndef NVMLSIM_BROKEN
nvmlReturn_t nvmlShutdown(void) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}
#endif

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, "555.55.55-nvmlsim");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length) {
    return copy_string(version, length, "12.555.55-nvmlsim");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = NGPUS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= NGPUS || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned length) {
    char s[64];
    CHECK(d, name);
    snprintf(s, sizeof s, "nvmlsim GPU %u (fake)", d->index);
    return copy_string(name, length, s);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned length) {
    char s[64];
    CHECK(d, uuid);
    snprintf(s, sizeof s, "GPU-00000000-0000-4000-8000-00000000a10%u", d->index);
    return copy_string(uuid, length, s);
}

#ifndef NVMLSIM_BROKEN
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    static const unsigned util_gpu[NGPUS] = {37, 81};
    static const unsigned util_mem[NGPUS] = {12, 45};
    CHECK(d, u);
    u->gpu = util_gpu[d->index];
    u->memory = util_mem[d->index];
    return NVML_SUCCESS;
}
#endif

/* GPU 0's memory in use: NVMLSIM_GPU0_USED_PERCENT percent of its total
 * when set (a GPU near capacity), else the table's. */
static unsigned long long used_of(unsigned index) {
    const char *p = getenv("NVMLSIM_GPU0_USED_PERCENT");
    if (index == 0 && p && *p)
        return mem_total[0] / 100 * (unsigned long long)atoi(p);
    return mem_used[index];
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    CHECK(d, m);
    m->total = mem_total[d->index];
    m->used = used_of(d->index) + RESERVED;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

#ifndef NVMLSIM_OLD
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    CHECK(d, m);
    /* NVML_STRUCT_VERSION(Memory, 2): sizeof | 2 << 24 */
    if (m->version != ((unsigned)sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = mem_total[d->index];
    m->reserved = RESERVED;
    m->used = used_of(d->index);
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, unsigned counter, unsigned *value) {
    CHECK(d, value);
    if (d->index == 1)
        return NVML_ERROR_NOT_SUPPORTED;
    switch (counter) {
    case NVML_PCIE_UTIL_TX_BYTES: *value = 1000; return NVML_SUCCESS;
    case NVML_PCIE_UTIL_RX_BYTES: *value = 2000; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}
#endif
