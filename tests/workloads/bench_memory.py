#!/usr/bin/env python3
"""Resident-memory benchmark loop used by `cargo xtask bench`.

Each iteration maps 1 MiB of anonymous memory, touches each of its pages
(256 page faults, each an `rss_stat` event) and unmaps it (its release):
an allocator that takes and returns memory at about 3 GiB/s on this
machine, the case the memory family's per-page tracepoint pays for most.

Usage: bench_memory.py ITERATIONS [--wait]

Same protocol as cpu_loop.py (benchlib): with --wait it prints `ready PID`,
waits for a line on stdin, runs the timed loop, prints `ns_per_iter VALUE`,
and stays alive until stdin is closed.
"""
import mmap
import sys

import benchlib

SIZE = 1 << 20
PAGE = mmap.PAGESIZE


def churn(iterations: int) -> int:
    for _ in range(iterations):
        m = mmap.mmap(-1, SIZE)
        for off in range(0, SIZE, PAGE):
            m[off] = 1
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.main(__doc__, churn, lambda n: min(n // 10, 100)))
