"""Maps and unmaps a page of an executable file PROT_EXEC, as fast as it can,
for SECONDS (argv[1], default 30): each mapping is a new executable region
for a tracer that follows the libraries a process maps. Prints `pid N`
first, then `done MAPPINGS` at the end."""
import mmap
import os
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
print("pid", os.getpid(), flush=True)
n = 0
with open(sys.executable, "rb") as f:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        m = mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        m.close()
        n += 1
print("done", n, flush=True)
