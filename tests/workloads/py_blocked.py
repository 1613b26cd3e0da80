"""Python processes in known states, for `infertrace dump` and the Python
frame resolver (runs on CPython 3.8 .. 3.13).

    py_blocked.py block   main thread blocked in os.read on a pipe at a known
                          depth (Worker.run -> level1 -> level2 -> level3), and
                          a second thread ("sleeper") in time.sleep under
                          Worker.nap -> level1 -> level2 -> level3
    py_blocked.py spin    main thread spinning in pure Python (busy_loop)
    py_blocked.py gil     4 CPU-bound threads fighting for the GIL

Each mode prints "ready" once its threads are in place, then runs until
killed (or until stdin closes for `block`: the pipe's write end is never
written, so the main thread stays blocked).
"""
import os
import sys
import threading
import time


class Worker:
    def run(self, fd):
        return level1(fd, "read")

    def nap(self):
        return level1(None, "sleep")


def level1(fd, how):
    return level2(fd, how)


def level2(fd, how):
    return level3(fd, how)


def level3(fd, how):
    if how == "read":
        return os.read(fd, 1)
    while True:
        time.sleep(3600)


def busy_loop(n):
    total = 0
    while True:
        for i in range(n):
            total += i * i
        total %= 1000003


def spin_worker():
    busy_loop(1000)


def block():
    r, _w = os.pipe()
    started = threading.Event()

    def sleeper():
        started.set()
        Worker().nap()

    t = threading.Thread(target=sleeper, name="sleeper", daemon=True)
    t.start()
    started.wait()
    # Give the sleeper time to enter time.sleep.
    time.sleep(0.2)
    print("ready", flush=True)
    Worker().run(r)


def spin():
    print("ready", flush=True)
    busy_loop(1000)


def gil():
    threads = [threading.Thread(target=spin_worker, name="cpu%d" % i, daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    {"block": block, "spin": spin, "gil": gil}[sys.argv[1] if len(sys.argv) > 1 else "block"]()
