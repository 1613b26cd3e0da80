"""Calls into the CUDA runtimes REAL CuPy (cupy-cuda12x from PyPI) links
statically into its extension modules (no libcudart.so is loaded). Without
a GPU driver every call fails (cudaErrorInsufficientDriver) but is entered.

Before calling anything it waits until the probes are in place: the first
byte of the static `cudaMemcpy` of cupy_backends' runtime module is int3
(its address from `nm`: a local symbol), then $PROBE_SETTLE_S more seconds
(default 0.2); it gives up with exit code 3 after $PROBE_WAIT_S seconds
(default 30). stderr: `rc NAME CODE` per call (the oracle), and `runtimes
N` (the modules of this process that define a static cudaLaunchKernel).
Lines the tests look for carry a `# @name` marker.
"""

import ctypes
import os
import subprocess
import sys
import time

import cupy  # noqa: F401  (its modules, each with a runtime of its own)
import cupy.cuda.cub  # noqa: F401
import cupy.cuda.thrust  # noqa: F401
import cupy_backends.cuda.api.runtime as rt


def static_symbol(path, name):
    """The address of local symbol `name` of mapped file `path` in this process."""
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    value = next(int(l.split()[0], 16) for l in out.splitlines() if l.split()[-1:] == [name] and l.split()[1] in "tT")
    base = None
    for line in open("/proc/self/maps"):
        f = line.split()
        if len(f) >= 6 and f[5] == path and int(f[2], 16) == 0:
            base = int(f[0].split("-")[0], 16)
            break
    return base + value


def wait_for_probe(addr):
    deadline = time.monotonic() + float(os.environ.get("PROBE_WAIT_S", "30"))
    while ctypes.string_at(addr, 1) != b"\xcc":
        if time.monotonic() > deadline:
            print("the probe never appeared on the static cudaMemcpy", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.01)
    time.sleep(float(os.environ.get("PROBE_SETTLE_S", "0.2")))


def code(call):
    try:
        call()
        return 0
    except rt.CUDARuntimeError as e:
        return e.status


def main():
    runtimes = 0
    for line in open("/proc/self/maps"):
        f = line.split()
        if len(f) >= 6 and "r-xp" == f[1] and "cupy" in f[5]:
            out = subprocess.run(["nm", f[5]], capture_output=True, text=True).stdout
            runtimes += any(l.split()[-1:] == ["cudaLaunchKernel"] for l in out.splitlines())
    print(f"runtimes {runtimes}", file=sys.stderr, flush=True)
    wait_for_probe(static_symbol(rt.__file__, "cudaMemcpy"))
    for _ in range(3):
        print("rc cudaMemcpy", code(lambda: rt.memcpy(0, 0, 16, 1)), file=sys.stderr)  # @cupy_memcpy
    for _ in range(4):
        print("rc cudaMemcpyAsync", code(lambda: rt.memcpyAsync(0, 0, 16, 1, 0)), file=sys.stderr)  # @cupy_memcpy_async
    for _ in range(2):
        print("rc cudaStreamSynchronize", code(lambda: rt.streamSynchronize(0)), file=sys.stderr)  # @cupy_sync
    print("rc cudaGetDeviceCount", code(lambda: rt.getDeviceCount()), file=sys.stderr)  # @cupy_count
    print("done", file=sys.stderr)
    time.sleep(float(os.environ.get("END_SLEEP_S", "0.5")))


if __name__ == "__main__":
    main()
