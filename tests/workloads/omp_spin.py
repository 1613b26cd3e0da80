"""PyTorch's OpenMP intra-op pool (libgomp, stripped) on small ops (issue 26).

    python3 omp_spin.py spin SECONDS   # set_num_threads(4, or the CPUs), OMP_WAIT_POLICY=ACTIVE,
                                       # small element-wise ops back to
                                       # back: the pool's threads spin at libgomp's barriers
    python3 omp_spin.py idle SECONDS   # the same pool (default wait policy), used once, then
                                       # the loop sleeps

Prints on stderr at the end: `ops N` and `main_tid T`.
"""
import os
import sys
import threading
import time

# libgomp spins at its barriers for a while before it sleeps (GOMP_SPINCOUNT),
# much less when there are more threads than CPUs: `spin` asks for the
# spinning a machine with enough cores does by default; `idle` keeps
# libgomp's default, whose threads go to sleep once idle.
if sys.argv[1:2] == ["spin"]:
    os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

import torch  # noqa: E402


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode not in ("spin", "idle"):
        sys.exit(f"unknown mode {mode}")
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    a = torch.ones(40_000)
    b = torch.ones(40_000)
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
