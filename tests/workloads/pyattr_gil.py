"""CPU-bound threads fighting for the GIL, for the Python attribution tests
(tests/tests/python_attribution.rs); CPython 3.8 .. 3.13.

    pyattr_gil.py THREADS SECONDS

Starts THREADS threads that each run spin() for SECONDS of wall time, and
joins them. Each prints `worker tid TID` on stderr when it starts.
"""
import sys
import threading
import time


def spin(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(500):
            x += i * i
    return x


def worker(seconds):
    sys.stderr.write("worker tid %d\n" % threading.get_native_id())
    sys.stderr.flush()
    spin(seconds)


def main():
    n, seconds = int(sys.argv[1]), float(sys.argv[2])
    threads = [threading.Thread(target=worker, args=(seconds,), name="spin%d" % i) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
