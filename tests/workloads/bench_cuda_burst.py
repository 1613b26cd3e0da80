#!/usr/bin/env python3
"""CUDA burst benchmark used by `cargo xtask bench`.

Runs tests/cudasim/cuda_burst.c (found next to $CUDART, which is meant to be
tests/cudasim's stand-in libcudart: NOT CUDA, see tests/cudasim/cudasim.c)
as a child: 4 threads, each a pinned 256-byte cudaMemcpyAsync and a
cudaStreamSynchronize of its own stream in a loop, for SECONDS seconds, as
fast as the call path (and a tracer's probes) allow. The child is forked
after the handshake, so a tracer attached to this process follows it.

Usage: bench_cuda_burst.py SECONDS [--wait] [--probed]

Prints `ns_per_iter VALUE`, where an iteration is one CUDA call of any of
the threads: 1e9 / (calls per second, all threads together). --probed is
passed to the driver (it starts once the probes are in place). With --wait,
the protocol of benchlib.py: `ready PID`, a line on stdin, the result, and
alive until stdin is closed.
"""
import os
import subprocess
import sys
import tempfile

import benchlib

THREADS = 4


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = sys.argv[1]
    wait = "--wait" in sys.argv[2:]
    probed = "--probed" in sys.argv[2:]
    driver = os.path.join(os.path.dirname(os.environ["CUDART"]), "cuda_burst")
    if wait and not benchlib.handshake():
        return 1  # the driver went away
    with tempfile.NamedTemporaryFile("r", suffix=".burst") as result:
        env = dict(os.environ, BURST_RESULT=result.name)
        args = [driver, str(THREADS), seconds] + (["--probed"] if probed else [])
        rc = subprocess.run(args, env=env, check=False).returncode
        if rc != 0:
            print(f"{driver} exited with {rc}", file=sys.stderr)
            return 1
        values = dict(line.split(" ", 1) for line in result.read().splitlines())
    rate = float(values["calls_per_s"])
    print(f"ns_per_iter {1e9 / rate:.1f}", flush=True)
    if wait:
        sys.stdin.read()  # until the driver closes stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
