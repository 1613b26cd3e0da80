#!/usr/bin/env python3
"""GIL hand-off benchmark used by `cargo xtask bench` (issue 26).

A pure-Python loop (the cpu_loop.py step) run while a second thread spins
pure Python too, with the switch interval at 5 us: a thread leaves the CPU
to wait for the GIL ~8,000 times a second (on a 2-CPU VM). What a tracer costs a GIL-bound program: the scheduler probes at
each hand-off, the GIL wait's off-CPU stack and its holder (the GIL's
`last_holder` and the holder's entry, read in the kernel).

Usage: bench_gil.py ITERATIONS [--wait]   (protocol: benchlib.py)
"""
import sys
import threading

import benchlib
from cpu_loop import spin  # the same step as the cpu loop

sys.setswitchinterval(5e-6)


def rival():
    x = 1
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


if __name__ == "__main__":
    threading.Thread(target=rival, daemon=True, name="rival").start()
    sys.exit(benchlib.main(__doc__, spin, lambda n: min(n // 10, 100_000)))
