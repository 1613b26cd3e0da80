"""Grows until the OOM killer ends it (issue 25): 1 MiB kept every 2 ms
($OOM_SLEEP_S: another pause) at the line marked @oom_grow, for at most
$OOM_MAX_MIB MiB (default 4096). Arguments are ignored (a reader may tag
the command line with one).
Run in a memory cgroup with a limit below that. stderr: `grown N` every
16 MiB (MiB kept so far), so the tests know how far it got.
"""

import os
import sys
import time

KEEP = []


def main():
    limit = int(os.environ.get("OOM_MAX_MIB", "4096"))
    pause = float(os.environ.get("OOM_SLEEP_S", "0.002"))
    for i in range(limit):
        KEEP.append(bytearray(1 << 20))  # @oom_grow
        if i % 16 == 0:
            print(f"grown {i}", file=sys.stderr, flush=True)
        time.sleep(pause)
    print("not killed", file=sys.stderr)


if __name__ == "__main__":
    main()
