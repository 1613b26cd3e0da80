#!/usr/bin/env python3
"""CUDA probe cost benchmark used by `cargo xtask bench`.

Calls one CUDA runtime function in a loop through ctypes and prints the cost
per call, so that the difference between a traced and an untraced run is
what infertrace's probes add to each call:

  copy    cudaMemcpyAsync(dev, dev2, 0, cudaMemcpyDeviceToDevice, 0): a copy
          API, probed on entry and on return
  launch  cudaLaunchKernel(kernel, grid, block, NULL, 0, 0): a launch API,
          probed on entry only
  graph   cudaGraphLaunch(exec, stream) of a graph captured once (10
          kernels) before the loop: a graph launch, probed on entry only
  event   cudaEventRecord(event, stream): an event record (torch's
          Event.record()), probed on entry and on return
  step    a launch and STEP_WORK (300) iterations of Python arithmetic, a
          model step's framework work between launches (`record
          --max-overhead`): in 5 chunks, each long enough (~2 s) to hold
          whole slicing periods (1 s), not 20

The library is $CUDART, meant to be tests/cudasim's stand-in (NOT CUDA; see
tests/cudasim/cudasim.c), where both calls are near-free: a 0-byte
device-to-device copy is queued asynchronously without sleeping and a launch
only moves the stream's simulated busy time forward, so the loop measures
the call path and the probes, not a simulated GPU. Kernel host stubs come
from $FAKE_KERNELS (tests/cudasim/kernels.c). Any tracer's uprobes on the
library file count, so the bench builds a private copy for itself.

Usage: bench_cuda.py copy|launch|graph|event|step ITERATIONS [--wait] [--probed]

With --probed the timed loop starts only once the probed function's first
byte is int3 (the uprobe is in place; as in cuda_patterns.py), then
$PROBE_SETTLE_S more seconds (default 0.2), giving up with exit code 3 after
$PROBE_WAIT_S seconds (default 20). The loop runs in CHUNKS equal chunks and
the result is the median chunk's ns per call. Otherwise the same protocol as
syscall_loop.py: with --wait it prints `ready PID`, waits for a line on stdin,
runs the timed loop, prints `ns_per_iter VALUE`, and stays alive until stdin
is closed.
"""
import ctypes
import os
import sys
import time

import benchlib

DtoD = 3
FUNCTIONS = {
    "copy": "cudaMemcpyAsync",
    "launch": "cudaLaunchKernel",
    "graph": "cudaGraphLaunch",
    "event": "cudaEventRecord",
    "step": "cudaLaunchKernel",
}
STEP_WORK = 300
STEP_CHUNKS = 5


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def wait_for_probe(lib, name):
    """Waits until `name` starts with int3 (cuda_patterns.py's wait_for_probes)."""
    limit = float(os.environ.get("PROBE_WAIT_S", "20"))
    addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    deadline = time.monotonic() + limit
    while ctypes.string_at(addr, 1) != b"\xcc":
        if time.monotonic() > deadline:
            print(f"the probe never appeared on {name}", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.01)
    # The entry probe shows first; a return probe follows within milliseconds.
    time.sleep(float(os.environ.get("PROBE_SETTLE_S", "0.2")))


def copies(lib, n):
    f = lib.cudaMemcpyAsync
    dst = ctypes.c_void_p(0x7E0000000000)  # device pointers, never dereferenced
    src = ctypes.c_void_p(0x7E0000100000)
    zero = ctypes.c_size_t(0)
    kind = ctypes.c_int(DtoD)
    for _ in range(n):
        f(dst, src, zero, kind, None)


def launches(lib, kernel, n, work=0):
    """n launches, each followed by `work` iterations of Python arithmetic."""
    f = lib.cudaLaunchKernel
    grid, block = dim3(1, 1, 1), dim3(32, 1, 1)
    zero = ctypes.c_size_t(0)
    for _ in range(n):
        f(kernel, grid, block, None, zero, None)
        x = 0
        for i in range(work):
            x += i


def captured_graph(lib, kernel):
    """An executable graph of 10 kernels, captured on a stream once."""
    stream = ctypes.c_void_p(0x6A0)
    lib.cudaGraphInstantiate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong]
    lib.cudaStreamBeginCapture(stream, 0)
    for _ in range(10):
        lib.cudaLaunchKernel(kernel, dim3(1, 1, 1), dim3(32, 1, 1), None, ctypes.c_size_t(0), stream)
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    lib.cudaStreamEndCapture(stream, ctypes.byref(graph))
    lib.cudaGraphInstantiate(ctypes.byref(exe), graph, 0)
    return exe, stream


def graph_launches(lib, exe, stream, n):
    f = lib.cudaGraphLaunch
    for _ in range(n):
        f(exe, stream)


def event_records(lib, n):
    f = lib.cudaEventRecord
    event = ctypes.c_void_p()
    lib.cudaEventCreate(ctypes.byref(event))
    stream = ctypes.c_void_p(0x6C0)
    for _ in range(n):
        f(event, stream)


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in FUNCTIONS:
        print(__doc__, file=sys.stderr)
        return 2
    what = sys.argv[1]
    iterations = int(sys.argv[2])
    wait = "--wait" in sys.argv[3:]
    probed = "--probed" in sys.argv[3:]

    lib = ctypes.CDLL(os.environ["CUDART"])
    kernels = ctypes.CDLL(os.environ["FAKE_KERNELS"])
    kernel = ctypes.cast(kernels.vector_add_kernel, ctypes.c_void_p)
    if what == "copy":
        loop = lambda n: copies(lib, n)  # noqa: E731
    elif what == "launch":
        loop = lambda n: launches(lib, kernel, n)  # noqa: E731
    elif what == "graph":
        exe, stream = captured_graph(lib, kernel)
        loop = lambda n: graph_launches(lib, exe, stream, n)  # noqa: E731
    elif what == "event":
        loop = lambda n: event_records(lib, n)  # noqa: E731
    else:
        loop = lambda n: launches(lib, kernel, n, STEP_WORK)  # noqa: E731

    if wait:
        if not benchlib.handshake():
            return 1  # the driver went away
    if probed:
        wait_for_probe(lib, FUNCTIONS[what])

    chunks = STEP_CHUNKS if what == "step" else benchlib.CHUNKS
    return benchlib.time_chunks(loop, iterations, min(iterations // 10, 10_000), wait, chunks)


if __name__ == "__main__":
    sys.exit(main())
