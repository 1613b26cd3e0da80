"""Load for the agent's soak (`cargo xtask soak --agent`, tests/tests/agent_soak.rs).

    agent_soak_load.py churn SECONDS RATE   RATE new Python processes per second,
                                            each with an environment of its own,
                                            each living ~1.5 s
    agent_soak_load.py busy SECONDS N       N Python processes busy for SECONDS

Arguments after these are passed on to every child (a token for the
agent's --cmdline selection). The load runs at nice 10 (`INFERTRACE_SOAK_NICE`
changes it): the agent keeps a CPU share of its own, as a pod's CPU request
gives it in a cluster (every process of a node in one cgroup, 50 busy ones
on 2 cores would leave it 1/55 of the CPU, and the soak would measure the
scheduler, not the agent). Every child calls getppid in a Python function, stats a file and sleeps a
little, in a loop (syscalls, Python stacks, CPU samples and off-CPU time).
It prints one line when done: the number of processes it started.
"""
import os
import subprocess
import sys
import time

CHILD = r'''
import os, sys, time
end = time.time() + float(sys.argv[1])
pause = float(sys.argv[2])
def work(n):
    return os.getppid() + n
while time.time() < end:
    for i in range(200):
        work(i)
    os.stat("/")
    time.sleep(pause)
'''


def main():
    os.nice(int(os.environ.get("INFERTRACE_SOAK_NICE", "10")))
    mode, seconds, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    tokens = sys.argv[4:]
    py = sys.executable
    t0 = time.time()
    procs = []
    started = 0
    if mode == "busy":
        for i in range(int(n)):
            env = dict(os.environ, SOAK_ID=str(i))
            procs.append(subprocess.Popen([py, "-c", CHILD, str(seconds), "0.05"] + tokens, env=env))
            started += 1
        while time.time() - t0 < seconds:
            time.sleep(0.5)
    elif mode == "churn":
        while time.time() - t0 < seconds:
            # A distinct environment each: its size and values change.
            env = dict(os.environ, SOAK_ID=str(started), SOAK_PAD="x" * (started % 512))
            procs.append(subprocess.Popen([py, "-c", CHILD, "1.5", "0.05"] + tokens, env=env))
            started += 1
            procs = [p for p in procs if p.poll() is None]
            time.sleep(max(0.0, t0 + started / n - time.time()))
    else:
        sys.exit("mode is churn or busy")
    for p in procs:
        p.wait()
    print(started, flush=True)


if __name__ == "__main__":
    main()
