"""The loop of issue 11's syscall-time bug: `os.getppid(); time.sleep(0.001)`
for SECONDS, then `calls N`. Prints `pid PID` (its pid as it sees it: 1
inside a new PID namespace) first.

    getppid_sleep.py SECONDS
"""
import os
import sys
import time

print("pid", os.getpid(), flush=True)
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    os.getppid()
    n += 1
    time.sleep(0.001)
print("calls", n, flush=True)
