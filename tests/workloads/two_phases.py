"""two_phases: N1 getppid calls, prints `phase1 <pid>`, waits for a line on
stdin, then N2 more getppid calls and exits. A test reads the tracer's
snapshot between the phases.

    two_phases.py N1 N2
"""
import os
import sys

n1, n2 = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n1):
    os.getppid()
print(f"phase1 {os.getpid()}", flush=True)
sys.stdin.readline()
for _ in range(n2):
    os.getppid()
