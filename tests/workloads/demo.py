#!/usr/bin/env python3
"""A small, deterministic stand-in for a Python inference service.

`cargo xtask demo` runs it under `infertrace record`. It takes about two
seconds and exercises every kind of time infertrace attributes:

- file I/O: loads a "model" file (written at start-up) in 64 KiB reads;
- on-CPU Python: a pure-Python matrix-vector "forward pass" per request;
- syscalls: each response is written with os.write to /dev/null;
- off-CPU waits: time.sleep between requests (batching delay);
- errors: a cache lookup opens a file that does not exist (ENOENT);
- process creation: one helper subprocess (`true`) is forked and exec'd;
- GPU input copies, when $CUDART names a libcudart (`cargo xtask demo` passes
  tests/cudasim's timing SIMULATOR, not CUDA): every request copies its
  input batch host-to-device from pageable memory and synchronizes right
  after, the `.to('cuda')` pattern infertrace's detector names.

Everything is fixed (sizes, counts, seeds), so two runs make the same
syscalls in the same order; only the timings differ.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

DIM = 48                 # model is DIM x DIM weights
REQUESTS = 24            # requests served
SLEEP_S = 0.025          # batching delay per request
MODEL_BYTES = 512 * 1024 # size of the model file on disk
CHUNK = 64 * 1024


def write_model(path):
    # Deterministic bytes: a simple linear congruential generator.
    x = 12345
    buf = bytearray(MODEL_BYTES)
    for i in range(0, MODEL_BYTES, 4):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        buf[i:i + 4] = x.to_bytes(4, "little")
    with open(path, "wb") as f:
        f.write(buf)


def load_model(path):
    data = bytearray()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    weights = [[(data[(r * DIM + c) % len(data)] - 128) / 128.0 for c in range(DIM)]
               for r in range(DIM)]
    return weights


def lookup_cache(request_id):
    # The cache directory does not exist: every lookup fails with ENOENT.
    try:
        with open(f"/nonexistent/infertrace-demo/cache/{request_id}.bin", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def preprocess(request_id):
    return [((request_id * 31 + i * 7) % 97) / 97.0 for i in range(DIM)]


def forward(weights, x, layers=160):
    for _ in range(layers):
        x = [sum(w * v for w, v in zip(row, x)) / DIM for row in weights]
        x = [v if v > 0 else 0.01 * v for v in x]
    return x


def postprocess(y):
    best = max(range(len(y)), key=lambda i: y[i])
    return f"label={best} score={y[best]:.6f}\n".encode()


BATCH_BYTES = 256 * 1024  # one request's input batch, copied to the "GPU"
HOST_TO_DEVICE = 1


class Gpu:
    """The CUDA runtime calls PyTorch makes for `batch.to('cuda')`:
    cudaMemcpyAsync from a pageable buffer, then cudaStreamSynchronize."""

    def __init__(self, path):
        self.rt = ctypes.CDLL(path)
        self.device = ctypes.c_void_p()
        self.rt.cudaMalloc(ctypes.byref(self.device), ctypes.c_size_t(BATCH_BYTES))
        self.batch = ctypes.create_string_buffer(BATCH_BYTES)  # pageable
        time.sleep(0.5)  # lets a tracer notice the library loaded just now

    def to_device(self):
        self.rt.cudaMemcpyAsync(self.device, self.batch, ctypes.c_size_t(BATCH_BYTES),
                                HOST_TO_DEVICE, None)
        self.rt.cudaStreamSynchronize(None)


def handle_request(weights, out_fd, request_id, gpu=None):
    if lookup_cache(request_id) is not None:
        return 0
    if gpu is not None:
        gpu.to_device()
    y = forward(weights, preprocess(request_id))
    response = postprocess(y)
    os.write(out_fd, response)
    return len(response)


def spawn_helper():
    # What services do to run a tokenizer, a health check, nvidia-smi...
    subprocess.run(["true"], check=True)


def main():
    workdir = tempfile.mkdtemp(prefix="infertrace-demo-")
    try:
        model = os.path.join(workdir, "model.bin")
        write_model(model)
        weights = load_model(model)
        out_fd = os.open(os.devnull, os.O_WRONLY)
        gpu = Gpu(os.environ["CUDART"]) if os.environ.get("CUDART") else None
        sent = 0
        start = time.monotonic()
        for request_id in range(REQUESTS):
            sent += handle_request(weights, out_fd, request_id, gpu)
            if request_id == REQUESTS // 2:
                spawn_helper()
            time.sleep(SLEEP_S)
        os.close(out_fd)
        elapsed = time.monotonic() - start
        print(f"demo: served {REQUESTS} requests, {sent} bytes, in {elapsed:.2f}s",
              file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
