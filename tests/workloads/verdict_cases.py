"""Workloads with a known bottleneck, for the verdict tests
(tests/tests/verdict.rs) and the diff test.

    verdict_cases.py CASE SECONDS [ARG]

CASE:
  cpu      one thread computing in burn()                -> Python compute at burn's loop
  gil      ARG (4) threads computing in burn()           -> GIL contention
  pipe     reads a pipe a child process fills slowly     -> I/O at the os.read line
  queue    3 consumers on a queue.Queue fed slowly       -> waiting on other threads at q.get()
  sleep    a time.sleep loop                             -> sleeping at the sleep line
  starve   ARG (4) processes spinning on one CPU         -> CPU starvation
  cuda     copies then syncs through $CUDART (tests/cudasim's timing
           stand-in, NOT CUDA): a 32 MiB pageable host->device copy and a
           cudaStreamSynchronize per step      -> GPU synchronisation
  paced    a loop paced at 50 ms a step: work_a() then work_b(), ARG (1.0)
           times work_b's usual amount                   -> for diff

Each prints `cpu_ratio R` on stderr at the end: its CPU time (all threads) over
its wall time, what the tests bound their checks by on a loaded machine.

The workload first idles STARTUP_S: infertrace finds a launched interpreter
and publishes its thread states within ~25 ms (docs/python.md).
"""
import os
import queue
import subprocess
import sys
import threading
import time

STARTUP_S = 0.3


def burn(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:  # @burn_while
        for i in range(300):  # @burn_for
            x += i * i  # @burn_add
    return x


def case_cpu(seconds, _arg):
    burn(seconds)  # @cpu_call


def case_gil(seconds, arg):
    threads = [threading.Thread(target=burn, args=(seconds,), name="burn%d" % i) for i in range(int(arg or 4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


WRITER = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    time.sleep(0.05)
    sys.stdout.buffer.write(b"x" * 64)
    sys.stdout.flush()
"""


def read_all(fd):
    n = 0
    while True:
        data = os.read(fd, 65536)  # @pipe_read
        if not data:
            return n
        n += len(data)


def case_pipe(seconds, _arg):
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(seconds)], stdout=subprocess.PIPE)
    read_all(child.stdout.fileno())
    child.wait()


def consume(q):
    while True:
        item = q.get()  # @q_get
        if item is None:
            return


def produce(q, seconds, consumers):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
        q.put(1)
    for _ in range(consumers):
        q.put(None)


def case_queue(seconds, _arg):
    q = queue.Queue()
    helpers = [threading.Thread(target=consume, args=(q,), name="consumer%d" % i) for i in range(2)]
    producer = threading.Thread(target=produce, args=(q, seconds, 3), name="producer")
    for t in helpers + [producer]:
        t.start()
    consume(q)
    for t in helpers + [producer]:
        t.join()


def case_sleep(seconds, _arg):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)  # @sleep_line


def case_starve(seconds, arg):
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    children = []
    for _ in range(int(arg or 4) - 1):
        pid = os.fork()
        if pid == 0:
            burn(seconds)
            os._exit(0)
        children.append(pid)
    burn(seconds)
    for pid in children:
        os.waitpid(pid, 0)


def wait_for_probes(lib, names):
    """Waits until every function in `names` starts with int3 (a uprobe),
    at most 20 s, then 0.2 s more for the return probes."""
    import ctypes

    addrs = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names]
    deadline = time.monotonic() + 20
    while any(ctypes.string_at(a, 1) != b"\xcc" for a in addrs):
        if time.monotonic() > deadline:
            sys.exit("probes never appeared")
        time.sleep(0.01)
    time.sleep(0.2)


def case_cuda(seconds, _arg):
    import ctypes

    lib = ctypes.CDLL(os.environ["CUDART"])
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    wait_for_probes(lib, ["cudaMemcpyAsync", "cudaStreamSynchronize"])
    n = 32 << 20
    dev = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(dev), n)
    host = ctypes.create_string_buffer(n)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lib.cudaMemcpyAsync(dev, host, ctypes.c_size_t(n), 1, None)  # @cuda_copy
        lib.cudaStreamSynchronize(None)  # @cuda_sync


def work_a():
    x = 0
    for i in range(30000): x += i * i  # @work_a
    return x


def work_b(scale):
    x = 0
    for i in range(int(60000 * scale)): x += i * i  # @work_b
    return x


def case_paced(seconds, arg):
    """Steps of PERIOD: work_a(), work_b(ARG), then sleep to the next step.
    Prints `site_cpu_ms A B`: the CPU time spent in work_a and work_b."""
    scale = float(arg or 1.0)
    period = 0.05
    start = time.monotonic()
    in_a = in_b = 0.0
    step = 0
    while True:
        step += 1
        tick = start + step * period
        if tick > start + seconds:
            break
        t0 = time.thread_time()
        work_a()
        t1 = time.thread_time()
        work_b(scale)
        t2 = time.thread_time()
        in_a += t1 - t0
        in_b += t2 - t1
        delay = tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # @paced_sleep
    sys.stderr.write("site_cpu_ms %.1f %.1f\n" % (in_a * 1e3, in_b * 1e3))


CASES = {
    "cpu": case_cpu,
    "gil": case_gil,
    "pipe": case_pipe,
    "queue": case_queue,
    "sleep": case_sleep,
    "starve": case_starve,
    "cuda": case_cuda,
    "paced": case_paced,
}


def main():
    case, seconds = sys.argv[1], float(sys.argv[2])
    arg = sys.argv[3] if len(sys.argv) > 3 else None
    time.sleep(STARTUP_S)
    w0, c0 = time.monotonic(), time.process_time()
    CASES[case](seconds, arg)
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    sys.stderr.write("cpu_ratio %.3f\n" % (cpu / wall if wall > 0 else 0))


if __name__ == "__main__":
    main()
