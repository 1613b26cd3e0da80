#!/usr/bin/env python3
"""Context-switch-heavy benchmark used by `cargo xtask bench`.

Two processes bounce one byte over two pipes: the parent writes to the
child and blocks reading the reply, the child echoes it back. Every round
trip is two writes, two blocking reads and (at least) two context switches,
so a tracer's scheduler probes fire several times per round trip. Prints the
cost per round trip.

Usage: pingpong.py ROUND_TRIPS [--wait]

The timed loop runs in CHUNKS equal chunks and the result is the median
chunk's ns per round trip (a burst of unrelated load on a shared machine
moves a few chunks only; a tracer's steady cost is in all of them).

The child is forked before anything else. With --wait the parent prints
`ready PARENT_PID CHILD_PID` (so a tracer can attach to both), waits for a
line on stdin, runs the timed loop, prints `ns_per_iter VALUE` (per round
trip), and stays alive until stdin is closed; then it stops the child.
"""
import os
import statistics
import sys
import time

CHUNKS = 10


def child(rd: int, wr: int) -> None:
    while True:
        b = os.read(rd, 1)
        if not b or b == b"q":
            os._exit(0)
        os.write(wr, b)


def bounce(to_child: int, from_child: int, n: int) -> None:
    for _ in range(n):
        os.write(to_child, b"x")
        os.read(from_child, 1)


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    round_trips = int(sys.argv[1])
    wait = "--wait" in sys.argv[2:]

    down_r, down_w = os.pipe()  # parent -> child
    up_r, up_w = os.pipe()  # child -> parent
    pid = os.fork()
    if pid == 0:
        os.close(down_w)
        os.close(up_r)
        child(down_r, up_w)
    os.close(down_r)
    os.close(up_w)

    status = 1
    try:
        if wait:
            print(f"ready {os.getpid()} {pid}", flush=True)
            if not sys.stdin.readline():
                return 1  # the driver went away

        bounce(down_w, up_r, min(round_trips // 10, 10_000))  # warm-up

        per_chunk = max(round_trips // CHUNKS, 1)
        samples = []
        for _ in range(CHUNKS):
            start = time.perf_counter_ns()
            bounce(down_w, up_r, per_chunk)
            samples.append((time.perf_counter_ns() - start) / per_chunk)

        print(f"ns_per_iter {statistics.median(samples):.1f}", flush=True)
        if wait:
            sys.stdin.read()  # until the driver closes stdin
        status = 0
    finally:
        os.write(down_w, b"q")
        _, st = os.waitpid(pid, 0)
        if st != 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
