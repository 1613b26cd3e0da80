"""A script whose last work ends with the process, for the Python
attribution tests (tests/tests/python_attribution.rs); CPython 3.8 .. 3.13.

Burns CPU in work() for SECONDS, then in tail() -- a function compiled from
a string right before (file name `generated_tail.py`), so no reader could
have seen its code object before -- for TAIL seconds, and leaves with
os._exit(0) at once: the tracer's userspace cannot read the process's
memory after that. Writes `cpu WORK_S TAIL_S` (thread CPU seconds) and
`tail line LINE` on stderr first.

    pyattr_exit.py SECONDS TAIL [kill]

With `kill`, it ends by SIGKILL-ing itself instead (a crash).
"""
import os
import signal
import sys
import time


def work(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return x


TAIL = """\
import time
def tail(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return x
"""


def main():
    seconds, tail_s = float(sys.argv[1]), float(sys.argv[2])
    # Start-up is not what this is about: give a tracer that launched us
    # (and may share a loaded machine) time to find the interpreter.
    time.sleep(0.2)
    t0 = time.thread_time()
    work(seconds)
    t1 = time.thread_time()
    ns = {}
    exec(compile(TAIL, "generated_tail.py", "exec"), ns)
    ns["tail"](tail_s)
    t2 = time.thread_time()
    sys.stderr.write("cpu %.6f %.6f\n" % (t1 - t0, t2 - t1))
    sys.stderr.flush()
    if sys.argv[3:] == ["kill"]:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    main()
