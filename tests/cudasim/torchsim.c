/*
 * A stand-in for PyTorch's CUDA caching allocator (libc10_cuda.so), NOT
 * PyTorch: no device, no memory. It carries the USDT probes torch's
 * allocator carries (sys/sdt.h, provider `pytorch`, with semaphores, as
 * c10/util/static_tracepoint.h declares them): `pytorch:malloc(ptr, device,
 * size, stream)` when a block is handed to a tensor and `pytorch:free(ptr)`
 * when it comes back. The blocks are addresses from a counter.
 * tests/tests/torch_allocator.rs loads it (named libc10_cuda.so) through
 * ctypes from tests/workloads/torch_alloc.py.
 */
#define _SDT_HAS_SEMAPHORES 1
#include <stdint.h>
#include <stddef.h>
#include <sys/sdt.h>

__extension__ unsigned short pytorch_malloc_semaphore __attribute__((unused)) __attribute__((section(".probes")));
__extension__ unsigned short pytorch_free_semaphore __attribute__((unused)) __attribute__((section(".probes")));

static uint64_t next_block = 0x7f0000000000ull;

/* A block of `size` bytes (rounded up to 512, as torch rounds) on `device`
 * for `stream`. */
void *torchsim_malloc(size_t size, int8_t device, uint64_t stream)
{
    size_t rounded = (size + 511) & ~(size_t)511;
    void *ptr = (void *)(uintptr_t)next_block;
    next_block += rounded + 4096;
    if (pytorch_malloc_semaphore)
        STAP_PROBE4(pytorch, malloc, ptr, device, rounded, stream);
    return ptr;
}

void torchsim_free(void *ptr)
{
    if (pytorch_free_semaphore)
        STAP_PROBE1(pytorch, free, ptr);
}

/* The semaphores' values: non-zero while a tracer has the probes on. */
unsigned torchsim_semaphores(void)
{
    return ((unsigned)pytorch_malloc_semaphore << 16) | pytorch_free_semaphore;
}
