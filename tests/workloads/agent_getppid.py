"""Workload of the agent tests: getppid calls spread over time, with its own
counts as ground truth.

    agent_getppid.py SECONDS BATCH [wait] [TOKEN...]

Prints `pid PID`; with `wait`, waits for a line on stdin first. Then, for
SECONDS, makes BATCH getppid calls every 10 ms. At the end it prints
`calls N first_second M batch_ns T` (M: the calls made in its first
second; T: the time spent in the batches, which holds all the getppid
time) and exits.
TOKENs are ignored (they are there for --cmdline selection).
"""
import os
import sys
import time

seconds = float(sys.argv[1])
batch = int(sys.argv[2])
print("pid", os.getpid(), flush=True)
if len(sys.argv) > 3 and sys.argv[3] == "wait":
    sys.stdin.readline()
start = time.monotonic()
end = start + seconds
calls = 0
first = None
batch_ns = 0
while time.monotonic() < end:
    t0 = time.perf_counter_ns()
    for _ in range(batch):
        os.getppid()
    batch_ns += time.perf_counter_ns() - t0
    calls += batch
    if first is None and time.monotonic() - start >= 1.0:
        first = calls
    time.sleep(0.01)
print("calls", calls, "first_second", first if first is not None else calls, "batch_ns", batch_ns, flush=True)
