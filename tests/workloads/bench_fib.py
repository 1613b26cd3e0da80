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
import os
import statistics
import sys
import time

CHUNKS = 20
FIB_N = 15


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def run(iterations: int) -> int:
    acc = 0
    for _ in range(iterations):
        acc += fib(FIB_N)
    return acc


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    iterations = int(sys.argv[1])
    wait = "--wait" in sys.argv[2:]

    if wait:
        print(f"ready {os.getpid()}", flush=True)
        if not sys.stdin.readline():
            return 1  # the driver went away

    run(max(iterations // 100, 10))  # warm-up

    per_chunk = max(iterations // CHUNKS, 1)
    samples = []
    for _ in range(CHUNKS):
        start = time.perf_counter_ns()
        run(per_chunk)
        samples.append((time.perf_counter_ns() - start) / per_chunk)

    print(f"ns_per_iter {statistics.median(samples):.1f}", flush=True)
    if wait:
        sys.stdin.read()  # until the driver closes stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
