"""PyTorch's OpenMP intra-op pool (libgomp, stripped) on small ops (issue 26).

    python3 omp_spin.py spin SECONDS   # set_num_threads(4), small element-wise ops back to
                                       # back: the pool's threads spin at libgomp's barriers
    python3 omp_spin.py idle SECONDS   # the same pool, used once, then the loop sleeps

Prints on stderr at the end: `ops N` and `main_tid T`.
"""
import os
import sys
import threading
import time

import torch


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode not in ("spin", "idle"):
        sys.exit(f"unknown mode {mode}")
    torch.set_num_threads(4)
    a = torch.ones(200_000)
    b = torch.ones(200_000)
    ops = 0
    end = time.monotonic() + seconds
    if mode == "idle":
        a.add_(b)  # the pool starts
        while time.monotonic() < end:
            time.sleep(0.05)  # @idle
    else:
        while time.monotonic() < end:
            for _ in range(50):
                a.add_(b)  # @small_op
                a.mul_(0.5)
                ops += 2
    print(f"ops {ops}", file=sys.stderr)
    print(f"main_tid {threading.get_native_id()}", file=sys.stderr)
    _ = os.getpid()


if __name__ == "__main__":
    main()
