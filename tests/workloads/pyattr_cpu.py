"""CPU-bound Python workloads for the Python attribution tests
(tests/tests/python_attribution.rs); CPython 3.8 .. 3.13.

    pyattr_cpu.py fib SECONDS     recursive fib, for SECONDS of CPU time
    pyattr_cpu.py split SECONDS   busy_a 70% / busy_b 30% of the thread's CPU
                                  time, alternating in slices of ~10 ms

Slices are measured in the thread's own CPU time (time.thread_time_ns), so
preemption by other processes does not skew the split: CPU samples land in
proportion to CPU time. Slice lengths vary (8 .. 12 ms, fixed seed) so the
alternation cannot phase-lock with a 99 Hz sampler.

`split` prints `split busy_a_ns N busy_b_ns M` on stderr: the CPU time each
function actually got (stdout belongs to the tracer's report).
"""
import random
import sys
import time


def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def run_fib(seconds):
    end = time.thread_time_ns() + int(seconds * 1e9)
    while time.thread_time_ns() < end:
        fib(22)


def busy_a(until):
    x = 0
    while time.thread_time_ns() < until:
        for i in range(1000):
            x += i * i
    return x


def busy_b(until):
    x = 0
    while time.thread_time_ns() < until:
        for i in range(1000):
            x += i * i
    return x


def run_split(seconds):
    rng = random.Random(1234)
    now = time.thread_time_ns()
    end = now + int(seconds * 1e9)
    spent_a = spent_b = 0
    while now < end:
        slice_ns = rng.uniform(8e6, 12e6)
        busy_a(now + int(0.7 * slice_ns))
        t = time.thread_time_ns()
        spent_a += t - now
        busy_b(t + int(0.3 * slice_ns))
        now = time.thread_time_ns()
        spent_b += now - t
    sys.stderr.write("split busy_a_ns %d busy_b_ns %d\n" % (spent_a, spent_b))


if __name__ == "__main__":
    mode, seconds = sys.argv[1], float(sys.argv[2])
    {"fib": run_fib, "split": run_split}[mode](seconds)
