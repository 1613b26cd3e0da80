"""Waits on memory at known lines (issue 25, memory stalls).

`pagein FILE MIB`: writes FILE (MIB MiB), drops its pages from the page
cache (fsync, then posix_fadvise DONTNEED), maps it and reads one byte of
every page at @pagein_touch: each first touch of a page is a page fault
that waits for the disk (no syscall).

`reclaim FILE MIB`: for a run in a memory cgroup limited below MIB:
writes FILE, 1 MiB per write() at @reclaim_write; the page cache it fills
is charged to the cgroup, whose reclaim must wait for the dirty pages to
be written back to make room.

stderr: `loop WALL_NS CPU_NS UNITS RUNQ_NS` for the touching (or writing)
loop: its wall time, the thread's own CPU time around it, pages (or MiB),
and its run-queue delay (the kernel's schedstat; -1 when unreadable).
"""

import mmap
import os
import sys
import time


def clocks():
    """(monotonic ns, thread CPU ns, thread run-queue ns or None)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            runq = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        runq = None
    return time.monotonic_ns(), time.thread_time_ns(), runq


def report(before, after, units):
    (w0, c0, r0), (w1, c1, r1) = before, after
    runq = r1 - r0 if r0 is not None and r1 is not None else -1
    print(f"loop {w1 - w0} {c1 - c0} {units} {runq}", file=sys.stderr, flush=True)


def write_file(path, mib):
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def touch(path):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        page = mmap.PAGESIZE
        total = 0
        before = clocks()
        for off in range(0, size, page):
            total += m[off]  # @pagein_touch
        after = clocks()
        m.close()
    report(before, after, size // page)
    return total


def write_under_limit(path, mib):
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        before = clocks()
        for _ in range(mib):
            f.write(chunk)  # @reclaim_write
        after = clocks()
    report(before, after, mib)


def main():
    mode, path, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "pagein":
        write_file(path, mib)
        drop_cache(path)
        touch(path)
    elif mode == "reclaim":
        write_under_limit(path, mib)
    else:
        sys.exit(f"mem_stall.py: unknown mode {mode!r} (pagein, reclaim)")
    os.unlink(path)


if __name__ == "__main__":
    main()
