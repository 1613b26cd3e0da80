#!/usr/bin/env python3
"""CPU-bound recursive benchmark used by `cargo xtask bench` (Python attribution).

Each iteration computes fib(FIB_N) with the naive recursive function: about
two thousand Python calls and returns, a deep and constantly changing Python
stack, no syscalls. It shows what walking the Python stack at every CPU
sample costs a busy interpreter whose stack is never the same twice (and what
an outside sampler such as py-spy costs at the same rate).

Usage: bench_fib.py ITERATIONS [--wait]

The timed loop runs in CHUNKS equal chunks and the result is the median
chunk's ns/iter: a tracer's steady cost (sampling interrupts, stack walks) is
in every chunk, while a burst of unrelated load on a shared machine moves a
few chunks only.

Same protocol as syscall_loop.py: with --wait it prints `ready PID`, waits for
a line on stdin, runs the timed loop, prints `ns_per_iter VALUE`, and stays
alive until stdin is closed.
"""
import sys

import benchlib

FIB_N = 15


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def run(iterations: int) -> int:
    acc = 0
    for _ in range(iterations):
        acc += fib(FIB_N)
    return acc


if __name__ == "__main__":
    sys.exit(benchlib.main(__doc__, run, lambda n: max(n // 100, 10)))
