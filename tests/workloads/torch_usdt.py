"""Imports the real PyTorch (the PyPI wheel, CUDA build; no GPU needed)
and watches the semaphores of its allocator's USDT probes in its own
libc10_cuda.so, for tests/tests/torch_allocator.rs: argv[1:] are their
addresses in the file (from `readelf -n`, the test's oracle). The kernel
raises a semaphore in every process that maps the file while a tracer has
a uprobe with that reference counter on it. Writes, as JSON, to the file
$RESULT names: the library's path and the semaphores' values after the
import and once all are non-zero (or after 10 s).
"""
import ctypes
import json
import os
import sys
import time

import torch  # noqa: F401  (loads libc10_cuda.so)


def base_and_path():
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith("/libc10_cuda.so") and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16), parts[5]
    raise SystemExit("libc10_cuda.so is not mapped")


def main():
    base, path = base_and_path()
    addrs = [int(a, 16) for a in sys.argv[1:]]
    read = lambda: [ctypes.c_ushort.from_address(base + a).value for a in addrs]
    after_import = read()
    deadline = time.monotonic() + 10
    while not all(read()) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(os.environ["RESULT"], "w") as f:
        json.dump({"path": path, "after_import": after_import, "later": read(), "torch": torch.__version__}, f)


main()
