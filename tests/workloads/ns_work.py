"""A Python process meant to run in a PID namespace of its own (`unshare -p
-f`, maybe with `-m --mount-proc`), for tests/tests/namespaces.rs; CPython
3.8 .. 3.13. Inside it, its thread ids are not the host's.

    ns_work.py SECONDS launch|attach

At once a daemon thread starts blocking for good in idle() (a read of a
pipe nobody writes, line @idle). `launch`: idles STARTUP_S (a launched
interpreter is found and its threads published within ~25 ms of its
start). `attach`: prints `ready NSPID` on stdout and waits for a line on
stdin in wait_go() (line @wait): the tracer attaches meanwhile. Then a
thread named `blocker` (its kernel comm) sleeps SETTLE_S, then SECONDS in
block() (line @block) while the main thread burns CPU in burn() (line @burn) for SECONDS;
writes `done` on stderr and exits 0.

Lines the tests look for carry a `# @name` marker.
"""
import os
import sys
import threading
import time

STARTUP_S = 0.3
# A new thread's state reaches the tracer within ~25 ms (polled); a busy
# machine can delay the tracer's poll by hundreds of milliseconds.
SETTLE_S = 0.6
PR_SET_NAME = 15


def idle(fd):
    os.read(fd, 1)  # @idle


def wait_go():
    return sys.stdin.readline()  # @wait


def block(seconds):
    import ctypes  # here: the main thread's start-up stays short

    ctypes.CDLL(None).prctl(PR_SET_NAME, b"blocker", 0, 0, 0)
    time.sleep(SETTLE_S)
    time.sleep(seconds)  # @block


def burn(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end: pass  # @burn


def main():
    seconds, mode = float(sys.argv[1]), sys.argv[2]
    r, _w = os.pipe()
    threading.Thread(target=idle, args=(r,), daemon=True).start()
    if mode == "attach":
        print("ready %d" % os.getpid(), flush=True)
        wait_go()
    else:
        time.sleep(STARTUP_S)
    t = threading.Thread(target=block, args=(seconds,))
    t.start()
    burn(seconds)
    t.join()
    sys.stderr.write("done\n")


if __name__ == "__main__":
    main()
