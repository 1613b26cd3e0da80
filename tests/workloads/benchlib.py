"""The timing protocol shared by the bench workloads (cpu_loop.py,
bench_fib.py, bench_cuda.py): optional ready/go handshake with the driver
(`cargo xtask bench`), a warm-up, then the timed loop in CHUNKS equal chunks
whose median ns/iter is printed (a tracer's steady cost is in every chunk,
while a burst of unrelated load on a shared machine moves a few chunks only).
"""
import os
import statistics
import sys
import time

CHUNKS = 20


def handshake():
    """With --wait: print `ready PID` and wait for the go line. False when
    the driver went away."""
    print(f"ready {os.getpid()}", flush=True)
    return bool(sys.stdin.readline())


def time_chunks(body, iterations, warmup, wait, chunks=CHUNKS):
    """Runs body(n) once for warm-up (n = warmup) and then in `chunks` chunks;
    prints `ns_per_iter VALUE`; with `wait`, stays alive until the driver
    closes stdin."""
    body(warmup)
    per_chunk = max(iterations // chunks, 1)
    samples = []
    for _ in range(chunks):
        start = time.perf_counter_ns()
        body(per_chunk)
        samples.append((time.perf_counter_ns() - start) / per_chunk)
    print(f"ns_per_iter {statistics.median(samples):.1f}", flush=True)
    if wait:
        sys.stdin.read()  # until the driver closes stdin
    return 0


def main(doc, body, warmup_of):
    """`SCRIPT ITERATIONS [--wait]` for a workload that is just `body(n)`:
    the handshake when asked, then `time_chunks` with a warm-up of
    `warmup_of(iterations)` iterations. Returns the exit status."""
    if len(sys.argv) < 2:
        print(doc, file=sys.stderr)
        return 2
    iterations = int(sys.argv[1])
    wait = "--wait" in sys.argv[2:]
    if wait and not handshake():
        return 1  # the driver went away
    return time_chunks(body, iterations, warmup_of(iterations), wait)
