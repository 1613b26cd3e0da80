#!/usr/bin/env python3
"""A launch-heavy loop for `record --max-overhead` (tests/tests/overhead.rs).

Each iteration launches one kernel through $CUDART (meant to be the
tests/cudasim stand-in: NOT CUDA, a launch only moves a simulated stream
forward) and then does WORK iterations of Python arithmetic, as a model's
step does framework work between launches (a few microseconds per launch
in PyTorch's eager mode). Kernel host stubs come from $FAKE_KERNELS.

Usage: launch_budget.py ITERATIONS [WORK]
       launch_budget.py --chunks SECONDS [WORK]

Prints `launches N` (the launches it made: the truth) and
`cpu_ns_per_iter VALUE`: the loop's own CPU time per iteration (uprobe
traps run in its context and are in it), which other load on a shared
machine moves less than wall time.

With --chunks it prints `ready PID`, then runs for SECONDS in chunks of
about 50 ms, one line each: `chunk START_UNIX_NS END_UNIX_NS LAUNCHES
CPU_NS` (a tracer attached for part of the time is then compared with the
chunks before and after it, in one process on one machine state).
"""
import ctypes
import os
import sys
import time


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def chunks(step, seconds):
    print(f"ready {os.getpid()}", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start, cpu0, n = time.time_ns(), time.thread_time_ns(), 0
        end_by = time.monotonic() + 0.05
        while time.monotonic() < end_by:
            for _ in range(20):
                step()
            n += 20
        print(f"chunk {start} {time.time_ns()} {n} {time.thread_time_ns() - cpu0}", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    chunked = sys.argv[1] == "--chunks"
    args = sys.argv[2:] if chunked else sys.argv[1:]
    iterations = int(float(args[0]))
    work = int(args[1]) if len(args) > 1 else 60
    lib = ctypes.CDLL(os.environ["CUDART"])
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    kernel = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    launch = lib.cudaLaunchKernel
    grid, block = dim3(1, 1, 1), dim3(32, 1, 1)
    zero = ctypes.c_size_t(0)

    def step():
        launch(kernel, grid, block, None, zero, None)
        x = 0
        for i in range(work):
            x += i

    if chunked:
        return chunks(step, iterations)
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
