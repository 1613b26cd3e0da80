#!/usr/bin/env python3
"""A launch-heavy loop for `record --max-overhead` (tests/tests/overhead.rs).

Each iteration launches one kernel through $CUDART (meant to be the
tests/cudasim stand-in: NOT CUDA, a launch only moves a simulated stream
forward) and then does WORK iterations of Python arithmetic, as a model's
step does framework work between launches (a few microseconds per launch
in PyTorch's eager mode). Kernel host stubs come from $FAKE_KERNELS.

Usage: launch_budget.py ITERATIONS [WORK]

Prints `launches N` (the launches it made: the truth) and
`cpu_ns_per_iter VALUE`: the loop's own CPU time per iteration (uprobe
traps run in its context and are in it), which other load on a shared
machine moves less than wall time.
"""
import ctypes
import os
import sys
import time


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    iterations = int(sys.argv[1])
    work = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    lib = ctypes.CDLL(os.environ["CUDART"])
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    kernel = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    launch = lib.cudaLaunchKernel
    grid, block = dim3(1, 1, 1), dim3(32, 1, 1)
    zero = ctypes.c_size_t(0)
    launches = 0
    start = time.thread_time_ns()
    for _ in range(iterations):
        launch(kernel, grid, block, None, zero, None)
        launches += 1
        x = 0
        for i in range(work):
            x += i
    cpu = time.thread_time_ns() - start
    print(f"launches {launches}", flush=True)
    print(f"cpu_ns_per_iter {cpu / iterations:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
