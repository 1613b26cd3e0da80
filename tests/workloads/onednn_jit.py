"""Code generated at run time with a perf map (issue 26): PyTorch's oneDNN
JIT-compiles its convolution kernels into anonymous executable memory and,
with ONEDNN_JIT_PROFILE=2, names them in /tmp/perf-PID.map (perf's
convention). One intra-op thread, convolutions back to back.

    python3 onednn_jit.py SECONDS

Prints on stderr at the end: `pid P` and `convs N`.
"""
import os
import sys
import time

os.environ.setdefault("ONEDNN_JIT_PROFILE", "2")

import torch  # noqa: E402


def main():
    seconds = float(sys.argv[1])
    torch.set_num_threads(1)
    x = torch.randn(8, 16, 64, 64)
    w = torch.randn(32, 16, 3, 3)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.nn.functional.conv2d(x, w)  # @conv
        n += 1
    print(f"pid {os.getpid()}", file=sys.stderr)
    print(f"convs {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
