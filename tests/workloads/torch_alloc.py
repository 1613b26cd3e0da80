"""Tensors handed out and taken back by a stand-in of PyTorch's caching
allocator (tests/cudasim/torchsim.c, NOT PyTorch: named libc10_cuda.so,
with torch's USDT probes pytorch:malloc/free), for
tests/tests/torch_allocator.rs. $TORCHSIM names the library.

Line `keep` keeps 10 blocks of 1 MiB; `churn` takes 5 of 4 MiB, of which
3 are given back at `churn_free`; `transient` takes 100 of 64 KiB, each
given back at once. With the argument `leak`, instead: `leak` keeps
4 MiB every 100 ms for 6 s (the rate it measured goes in the result too).
With `hold TOKEN`: the same pattern, then `held` on stdout, and the
blocks kept until a line comes on stdin (TOKEN: for a reader to find it).
Writes the semaphores' values (non-zero: a tracer has
the probes on) when the library was loaded and when the work began, as
JSON, to the file $RESULT names.
"""
import ctypes
import json
import os
import sys
import time

MiB = 1 << 20

lib = ctypes.CDLL(os.environ["TORCHSIM"])
lib.torchsim_malloc.restype = ctypes.c_void_p
lib.torchsim_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int8, ctypes.c_uint64]
lib.torchsim_free.argtypes = [ctypes.c_void_p]
lib.torchsim_semaphores.restype = ctypes.c_uint


def main():
    at_load = lib.torchsim_semaphores()
    deadline = time.monotonic() + 10
    while lib.torchsim_semaphores() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    at_work = lib.torchsim_semaphores()
    result = {"semaphores_at_load": at_load, "semaphores_at_work": at_work}
    if sys.argv[1:] == ["leak"]:
        result.update(leak())
    elif sys.argv[1:2] == ["hold"]:
        # Held for a reader (tests/tests/agent.rs): the blocks stay given
        # out until a line comes on stdin.
        held = pattern()
        print("held", flush=True)
        sys.stdin.readline()
        del held
    else:
        pattern()
    time.sleep(0.2)
    with open(os.environ["RESULT"], "w") as f:
        json.dump(result, f)


def leak():
    kept = []
    start = time.monotonic()
    while time.monotonic() - start < 6.0:
        kept.append(lib.torchsim_malloc(4 * MiB, 0, 7))  # @leak
        time.sleep(0.1)
    took = time.monotonic() - start
    return {"leak_bytes": len(kept) * 4 * MiB, "leak_s": took, "leak_allocs": len(kept)}


def pattern():
    kept = []
    for _ in range(10):
        kept.append(lib.torchsim_malloc(MiB, 0, 7))  # @keep
    churned = []
    for _ in range(5):
        churned.append(lib.torchsim_malloc(4 * MiB, 0, 7))  # @churn
    for p in churned[:3]:
        lib.torchsim_free(p)  # @churn_free
    for _ in range(100):
        p = lib.torchsim_malloc(64 * 1024, -1, 7)  # @transient
        lib.torchsim_free(p)
    return kept, churned[3:]


main()
