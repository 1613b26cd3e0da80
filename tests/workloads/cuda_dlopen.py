"""CUDA calls made the moment the runtime is loaded (dlopen), through ctypes.

$CUDART names the library as ctypes.CDLL gets it: a path, or a bare soname
the dynamic loader looks up (LD_LIBRARY_PATH). The tests use the real
libcudart.so.12 from NVIDIA's wheel: without a GPU every call fails with
cudaErrorInsufficientDriver (35) but is entered, so uprobes fire. Unlike
cuda_patterns.py this workload never waits for the probes: calls start as
soon as CDLL returns.

Usage: cuda_dlopen.py MODE, MODE one of
  now      load, then at once upload() (cudaMemcpyAsync HtoD + sync, $N
           times) and readback() (cudaMemcpy DtoH, $M times)
  serve    an inference service: a loader thread loads the runtime and
           feeds a serving loop, which uploads 8 samples per step and reads
           one scalar back (`.item()`: a 4-byte DtoH copy + sync), 200 steps
  probed   not traced: load, then wait until the first byte of every
           function called here is int3 (any process's uprobes on the
           file), exit 0 (3 after $PROBE_WAIT_S seconds, default 20)

$WAIT_FILE: wait (polling every ms) until that file exists before loading
(a process a tracer attaches to while it waits). $BEFORE_S (default 0):
seconds to sleep before loading (an interpreter that runs a while before
it loads CUDA, as one importing torch does). $STAY_S (default 1.0):
seconds to stay after the calls. Lines the tests look for carry a `# @name`
marker.
"""

import ctypes
import os
import queue
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "now"
HtoD, DtoH = 1, 2
DEV = ctypes.c_void_p(0x7E0000000000)  # a device pointer (never dereferenced)
CALLED = ("cudaMemcpyAsync", "cudaMemcpy", "cudaStreamSynchronize")


def size(n):
    return ctypes.c_size_t(n)


def wait_for_go():
    time.sleep(float(os.environ.get("BEFORE_S", "0")))
    path = os.environ.get("WAIT_FILE")
    while path and not os.path.exists(path):
        time.sleep(0.001)


def upload(lib, n):
    buf = ctypes.create_string_buffer(4096)
    for i in range(n):
        buf[0:8] = i.to_bytes(8, "little")
        lib.cudaMemcpyAsync(DEV, buf, size(4096), HtoD, None)  # @upload_copy
        lib.cudaStreamSynchronize(None)  # @upload_sync


def readback(lib, m):
    out = ctypes.create_string_buffer(256)
    for _ in range(m):
        lib.cudaMemcpy(out, DEV, size(256), DtoH)  # @readback_copy


def now():
    wait_for_go()
    lib = ctypes.CDLL(os.environ["CUDART"])
    upload(lib, int(os.environ.get("N", "20")))
    readback(lib, int(os.environ.get("M", "7")))


def loader(q, steps):
    """Loads the runtime, then prepares the batches the loop consumes."""
    lib = ctypes.CDLL(os.environ["CUDART"])
    q.put(lib)
    for step in range(steps):
        batch = [ctypes.create_string_buffer(bytes([step % 256]) * 8192, 8192) for _ in range(8)]
        q.put(batch)
    q.put(None)


def serve_step(lib, batch, out):
    for sample in batch:
        lib.cudaMemcpyAsync(DEV, sample, size(8192), HtoD, None)  # @serve_upload
    lib.cudaMemcpyAsync(out, DEV, size(4), DtoH, None)  # @serve_item_copy
    lib.cudaStreamSynchronize(None)  # @serve_item_sync


def serve():
    wait_for_go()
    q = queue.Queue(maxsize=16)
    t = threading.Thread(target=loader, args=(q, 200), name="loader")
    t.start()
    lib = q.get()
    out = ctypes.create_string_buffer(8)
    while True:
        batch = q.get()
        if batch is None:
            break
        serve_step(lib, batch, out)
    t.join()


def probed():
    lib = ctypes.CDLL(os.environ["CUDART"])
    addrs = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in CALLED]
    deadline = time.monotonic() + float(os.environ.get("PROBE_WAIT_S", "20"))
    while any(ctypes.string_at(a, 1) != b"\xcc" for a in addrs):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.005)


{"now": now, "serve": serve, "probed": probed}[MODE]()
if MODE != "probed":
    # Stay a moment: Python call sites are resolved from the live process
    # (frames of a process gone before the tracer reads them show as
    # [unknown] until Python frames are captured in the kernel).
    time.sleep(float(os.environ.get("STAY_S", "1.0")))
