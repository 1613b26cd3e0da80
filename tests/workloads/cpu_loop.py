#!/usr/bin/env python3
"""CPU-bound benchmark loop used by `cargo xtask bench`.

A pure-Python arithmetic loop (a linear congruential step and an add per
iteration, no syscalls) that prints its cost per iteration: what a tracer
costs a busy interpreter that rarely leaves the CPU (sampling, scheduler
events from timer ticks only).

Usage: cpu_loop.py ITERATIONS [--wait]

The timed loop runs in CHUNKS equal chunks and the result is the median
chunk's ns/iter: a tracer's steady cost (sampling interrupts, probes) is in
every chunk, while a burst of unrelated load on a shared machine moves a few
chunks only.

Same protocol as syscall_loop.py: with --wait it prints `ready PID`, waits for
a line on stdin, runs the timed loop, prints `ns_per_iter VALUE`, and stays
alive until stdin is closed.
"""
import sys

import benchlib



def spin(iterations: int) -> int:
    x = 1
    acc = 0
    for _ in range(iterations):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        acc += x >> 16
    return acc


if __name__ == "__main__":
    sys.exit(benchlib.main(__doc__, spin, lambda n: min(n // 10, 100_000)))
