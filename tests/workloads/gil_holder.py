"""A thread that holds the GIL, beside one that needs it (issue 26).

    python3 gil_holder.py native SECONDS   # holder: ctypes.PyDLL(None).usleep(50000) in a loop
                                           # (PyDLL keeps the GIL during the call)
    python3 gil_holder.py python SECONDS   # holder: a pure-Python loop
    python3 gil_holder.py cuda SECONDS     # holder: 32 MiB pageable copies and a stream sync
                                           # through ctypes.PyDLL($CUDART) (GIL held; the
                                           # timing stand-in of tests/cudasim, NOT CUDA)

The other thread (`compute`) runs a pure-Python loop all along. Prints on
stderr at the end: `holder_tid T`, `compute_tid T`, `held_s F` (native:
the time the holder spent inside usleep with the GIL, by its own clock),
`compute_wall_s F` and `compute_cpu_s F` (the compute thread's wall and
CPU time: it waited for the GIL for about the difference).
"""
import ctypes
import os
import sys
import threading
import time

out = {}


def holder_native(seconds):
    lib = ctypes.PyDLL(None)
    held = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        lib.usleep(50000)  # @native_call
        held += time.monotonic() - t0
    out["held_s"] = held


def holder_cuda(seconds):
    lib = ctypes.PyDLL(os.environ["CUDART"])
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    n = 32 << 20
    dev = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(dev), n)
    host = ctypes.create_string_buffer(n)
    held = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        lib.cudaMemcpyAsync(dev, host, ctypes.c_size_t(n), 1, None)  # @cuda_copy
        lib.cudaStreamSynchronize(None)  # @cuda_sync
        held += time.monotonic() - t0
    out["held_s"] = held


def holder_python(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(200):
            x += i * i  # @python_loop
    out["held_s"] = 0.0


def compute(seconds):
    w0, c0 = time.monotonic(), time.thread_time()
    end = w0 + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(200):
            x += i * i  # @compute
    out["compute_wall_s"] = time.monotonic() - w0
    out["compute_cpu_s"] = time.thread_time() - c0


def run(target, seconds, key):
    out[key] = threading.get_native_id()
    target(seconds)


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    holder = {"native": holder_native, "python": holder_python, "cuda": holder_cuda}.get(mode)
    if holder is None:
        sys.exit(f"unknown mode {mode}")
    threads = [
        threading.Thread(target=run, args=(holder, seconds, "holder_tid"), name="holder"),
        threading.Thread(target=run, args=(compute, seconds, "compute_tid"), name="compute"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in ("holder_tid", "compute_tid", "held_s", "compute_wall_s", "compute_cpu_s"):
        print(f"{k} {out[k]}", file=sys.stderr)


if __name__ == "__main__":
    main()
