#!/usr/bin/env python3
"""Syscall-bound benchmark loop used by `cargo xtask bench`.

Runs `os.write(out, os.read(fd, 64))` (one read(2) from /dev/zero and one
write(2) to /dev/null per iteration) and prints the cost per iteration.

Usage: syscall_loop.py ITERATIONS [--wait]

With --wait the script opens its files, prints `ready PID` on stdout and
blocks until a line arrives on stdin, so that a tracer can attach to the
already running process before the timed loop starts. The result is printed
as `ns_per_iter VALUE` on stdout, followed by `cpu_ns_per_iter VALUE`
(the process's CPU time per iteration); with --wait the script then stays alive
until stdin is closed, so that the tracer can be stopped while its target
still runs.
"""
import os
import sys
import time


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    iterations = int(sys.argv[1])
    wait = "--wait" in sys.argv[2:]

    fd = os.open("/dev/zero", os.O_RDONLY)
    out = os.open("/dev/null", os.O_WRONLY)

    if wait:
        print(f"ready {os.getpid()}", flush=True)
        if not sys.stdin.readline():
            return 1  # the driver went away

    # A short warm-up under the same conditions as the timed loop.
    for _ in range(min(iterations // 10, 10_000)):
        os.write(out, os.read(fd, 64))

    start = time.perf_counter_ns()
    cpu_start = time.process_time_ns()
    for _ in range(iterations):
        os.write(out, os.read(fd, 64))
    cpu = time.process_time_ns() - cpu_start
    elapsed = time.perf_counter_ns() - start

    print(f"ns_per_iter {elapsed / iterations:.1f}", flush=True)
    # The process's CPU time (user + system, probes included: they run in
    # its context), less moved by other load than wall time.
    print(f"cpu_ns_per_iter {cpu / iterations:.1f}", flush=True)
    if wait:
        sys.stdin.read()  # until the driver closes stdin
    os.close(fd)
    os.close(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
