"""An interpreter started before the tracer, for the Python attribution
tests (tests/tests/python_attribution.rs); CPython 3.8 .. 3.13.

Prints `ready PID` on stdout, sleeps 0.5 s, then works in early_work() until a
line arrives on stdin (the tracer is attached by then). Then it starts two new
threads running Late.run for SECONDS each (each prints `late tid TID` on
stdout when it starts) and one whose first act is a 0.3 s sleep in
first_sleep() (it prints `sleeper tid TID line LINE` after it, LINE being
the sleep's), joins them, prints `done` and exits 0 while the tracer is
still recording.

    pyattr_attach.py SECONDS
"""
import os
import sys
import threading
import time


def burn(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def early_work(go):
    while not go.is_set():
        burn(2000)


class Late:
    def __init__(self, seconds):
        self.seconds = seconds

    def run(self):
        # One write per line: print() writes the text and the newline
        # separately, so two threads' lines could interleave.
        sys.stdout.write("late tid %d\n" % threading.get_native_id())
        sys.stdout.flush()
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            burn(2000)


def first_sleep():
    time.sleep(0.3)
    line = first_sleep.__code__.co_firstlineno + 1
    sys.stdout.write("sleeper tid %d line %d\n" % (threading.get_native_id(), line))
    sys.stdout.flush()


def main():
    seconds = float(sys.argv[1])
    go = threading.Event()

    def wait_go():
        sys.stdin.readline()
        go.set()

    threading.Thread(target=wait_go, name="stdin", daemon=True).start()
    print("ready %d" % os.getpid(), flush=True)
    time.sleep(0.5)
    early_work(go)
    threads = [threading.Thread(target=Late(seconds).run, name="late%d" % i) for i in range(2)]
    threads.append(threading.Thread(target=first_sleep, name="sleeper"))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done", flush=True)


if __name__ == "__main__":
    main()
