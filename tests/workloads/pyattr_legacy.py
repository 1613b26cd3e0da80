# Workload for the Python attribution tests (tests/tests/python_attribution.rs)
# on interpreters infertrace does not attribute (2.7, 3.6, 3.7): must run on
# all of them, so no f-strings, no print function.
#
#     pyattr_legacy.py N SECONDS
#
# Calls os.getppid() N times (N getppid syscalls), then burns CPU in pure
# Python for SECONDS.
import os
import sys
import time


def calls(n):
    for _ in range(n):
        os.getppid()


def burn(seconds):
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        for i in range(1000):
            x += i * i
    return x


if __name__ == "__main__":
    calls(int(sys.argv[1]))
    burn(float(sys.argv[2]))
