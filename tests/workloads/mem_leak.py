"""A service that leaks (issue 25): for $LEAK_S seconds (default 20) it
serves $LEAK_RATE requests a second (default 10); each keeps 1 MiB in a
global list at the line marked @leak, and makes a short-lived 256 KiB
buffer. stderr: `slope BYTES_PER_S` (its own resident size, from
/proc/self/statm, over the serving loop) and `served N`.
"""

import os
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
CACHE = []


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def handle(i):
    CACHE.append(bytearray(1 << 20))  # @leak
    scratch = bytearray(256 << 10)  # @scratch
    return len(scratch) + i


def main():
    duration = float(os.environ.get("LEAK_S", "20"))
    period = 1.0 / float(os.environ.get("LEAK_RATE", "10"))
    t0, r0 = time.monotonic(), rss()
    n = 0
    while time.monotonic() - t0 < duration:
        handle(n)
        n += 1
        time.sleep(period)
    t1, r1 = time.monotonic(), rss()
    print(f"slope {(r1 - r0) / (t1 - t0):.0f}", file=sys.stderr)
    print(f"served {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
    time.sleep(0.3)
