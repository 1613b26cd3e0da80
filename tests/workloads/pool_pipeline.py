"""A loop fed by a process pool (issue 26): the main loop takes results
from 2 forked worker processes whose `work` costs ~5 ms of pure Python
per item.

    python3 pool_pipeline.py pool SECONDS      # multiprocessing.Pool(2).imap
    python3 pool_pipeline.py futures SECONDS   # concurrent.futures.ProcessPoolExecutor(2).map
    python3 pool_pipeline.py forkserver SECONDS  # Pool(2).imap, workers forked by a fork server
                                               # (3.14's default start method)

Prints on stderr at the end: `main_pid P`, `worker_pids P,Q` (the pool's
processes), `items N` and `waited_s F` (the loop's time in `next()`, by
its own clock).
"""
import concurrent.futures
import multiprocessing
import os
import sys
import time

WORK = 120_000  # ~5 ms of Python per item here


def work(i):
    s = 0
    for k in range(WORK):
        s += k * k  # @work
    return os.getpid()


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    # fork: the workers are the main process's children; forkserver (3.14's
    # default) makes them children of the fork server, itself a child.
    ctx = multiprocessing.get_context("forkserver" if mode == "forkserver" else "fork")
    if mode in ("pool", "forkserver"):
        pool = ctx.Pool(2)
        results = lambda: pool.imap(work, range(16))  # noqa: E731
    elif mode == "futures":
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx)
        results = lambda: pool.map(work, range(16))  # noqa: E731
    else:
        sys.exit(f"unknown mode {mode}")
    pids, items, waited = set(), 0, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        it = iter(results())
        while True:
            t0 = time.monotonic()
            try:
                pid = next(it)  # @next
            except StopIteration:
                break
            waited += time.monotonic() - t0
            pids.add(pid)
            items += 1
    if mode != "futures":
        pool.close()
        pool.join()
    else:
        pool.shutdown()
    print(f"main_pid {os.getpid()}", file=sys.stderr)
    print("worker_pids " + ",".join(str(p) for p in sorted(pids)), file=sys.stderr)
    print(f"items {items}", file=sys.stderr)
    print(f"waited_s {waited:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
