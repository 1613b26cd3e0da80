"""Python function blocked on a slow pipe, for the Python attribution tests
(tests/tests/python_attribution.rs); CPython 3.8 .. 3.13.

    pyattr_io.py DELAY_SECONDS

reader() blocks in os.read on a pipe that a writer thread fills after
DELAY_SECONDS. Prints `reader tid TID line LINE` on stderr (LINE: the line of
the os.read call).

The workload first idles STARTUP_S: infertrace finds a launched interpreter
and publishes its thread states within ~25 ms of its initialization (docs/python.md);
an interval that begins before that carries native frames only.
"""
import os
import sys
import threading
import time


def writer(fd, delay):
    time.sleep(delay)
    os.write(fd, b"x")


def reader(fd):
    data = os.read(fd, 1)  # the blocking read
    return data


STARTUP_S = 0.3


def main():
    delay = float(sys.argv[1])
    time.sleep(STARTUP_S)
    r, w = os.pipe()
    t = threading.Thread(target=writer, args=(w, delay), name="writer")
    t.start()
    line = reader.__code__.co_firstlineno + 1
    sys.stderr.write("reader tid %d line %d\n" % (threading.get_native_id(), line))
    sys.stderr.flush()
    assert reader(r) == b"x"
    t.join()


if __name__ == "__main__":
    main()
