"""Known resident growth by line (issue 25), with its own measurements:
the resident size (/proc/self/statm) before and after each line, as
`delta NAME BYTES` on stderr, the resident size at each plateau of a
stepped growth (`plateau N BYTES`, each held 150 ms), and the kernel's
high-water mark at the end (`hwm BYTES`, VmHWM).

Line A keeps 200 x 1 MiB bytearrays, line B a 300 MiB one (bytearray()
zero-fills: every page is touched), line C makes a 100 MiB transient that
the next line frees. Lines the tests look for carry a `# @name` marker.

Run with `-X tracemalloc=1`, it also prints what tracemalloc holds at
each marked line, `tracemalloc NAME BYTES` (a peer to compare with): C
right after its allocation, the others at the end.
"""

import os
import sys
import time
import tracemalloc

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def marker_lines():
    with open(__file__) as f:
        return {l.rsplit("# @", 1)[1].strip(): i for i, l in enumerate(f, 1) if "# @" in l and "marker_lines" not in l}


def traced(names):
    """Prints tracemalloc's live bytes at the lines marked `names`."""
    if not tracemalloc.is_tracing():
        return
    lines = marker_lines()
    stats = tracemalloc.take_snapshot().statistics("lineno")
    for name in names:
        size = sum(s.size for s in stats if s.traceback[0].filename == __file__ and s.traceback[0].lineno == lines[name])
        print(f"tracemalloc {name} {size}", file=sys.stderr)


def main():
    keep = []
    r0 = rss()
    for _ in range(200):
        keep.append(bytearray(1 << 20))  # @mem_a
    r1 = rss()
    big = bytearray(300 << 20)  # @mem_b
    r2 = rss()
    t = bytearray(100 << 20)  # @mem_c
    r3 = rss()
    traced(["mem_c"])
    del t  # @mem_c_free
    r4 = rss()
    print(f"delta a {r1 - r0}", file=sys.stderr)
    print(f"delta b {r2 - r1}", file=sys.stderr)
    print(f"delta c {r3 - r2}", file=sys.stderr)
    print(f"delta c_free {r3 - r4}", file=sys.stderr)
    steps = []
    for i in range(8):
        steps.append(bytearray(16 << 20))  # @mem_step
        time.sleep(0.15)
        print(f"plateau {i} {rss()}", file=sys.stderr)
    print(f"hwm {hwm()}", file=sys.stderr)
    traced(["mem_a", "mem_b", "mem_step"])
    sys.stderr.flush()
    return keep, big, steps


if __name__ == "__main__":
    held = main()
    # Stay a moment: a tracer resolves Python stacks from the live process.
    time.sleep(0.3)
