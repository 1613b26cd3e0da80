# A Python process that corrupts its own interpreter structures through
# ctypes, as a hostile neighbour would, for tests/tests/hostile_memory.rs.
# A worker thread ("busy-worker") keeps making getppid() calls (in a function
# named `busy_worker_loop`) while the main thread, after the corruption,
# only sleeps: it must never return through a corrupted link, and the
# garbage collector (which walks the thread list on 3.14) is off.
#
# MODE:
#   tstate-cycle     the last PyThreadState's `next` -> a fake thread state
#                    whose `next` points at itself
#   tstate-selfaddr  the last PyThreadState's `next` -> an 8 MiB buffer whose
#                    every word holds its own address (a chain of a million
#                    distinct "thread states")
#   frame-cycle      the main thread's current frame's `previous` (f_back
#                    before 3.11) -> a fake frame whose `previous` points at
#                    itself
#   task-cycle       (3.14+) an event loop with three sleeping tasks, the
#                    last one's list node `next` -> itself (not the head)
#   main-exit        no corruption: the main thread calls pthread_exit, the
#                    worker runs on (a zombie leader)
#
# Prints "ready" once done (from the worker for main-exit), then runs until
# killed.
import ctypes
import gc
import os
import sys
import threading
import time

gc.disable()
MODE = sys.argv[1]
U64 = ctypes.c_uint64
KEEP = []
VERSION = sys.version_info[:2]


def busy_worker_loop():
    while True:
        os.getppid()
        time.sleep(0.002)


def buffer(words):
    b = (U64 * words)()
    KEEP.append(b)
    return ctypes.addressof(b)


def worker():
    if MODE == "main-exit":
        # Wait for the main thread to be gone (a zombie leader; Python
        # itself never learns: pthread_exit skips its clean-up).
        def leader_state():
            with open("/proc/%d/stat" % os.getpid()) as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        while leader_state() != "Z":
            time.sleep(0.01)
        print("ready", flush=True)
    busy_worker_loop()


threading.Thread(target=worker, name="busy-worker", daemon=True).start()
time.sleep(0.05)

# `next` follows `prev` at the start of PyThreadState on every 3.x.
NEXT = 8

if MODE in ("tstate-cycle", "tstate-selfaddr"):
    get = ctypes.pythonapi.PyThreadState_Get
    get.restype = ctypes.c_void_p
    last = get()
    while U64.from_address(last + NEXT).value:
        last = U64.from_address(last + NEXT).value
    if MODE == "tstate-cycle":
        # Large enough for every field a reader may look at.
        fake = buffer(4096)
        U64.from_address(fake + NEXT).value = fake
    else:
        words = 1 << 20
        fake = buffer(words)
        import array
        a = array.array("Q", range(fake, fake + 8 * words, 8))
        ctypes.memmove(fake, a.buffer_info()[0], 8 * words)
        del a
    U64.from_address(last + NEXT).value = fake
elif MODE == "frame-cycle":
    def hold():
        f = sys._getframe()
        fake = buffer(64)
        if VERSION >= (3, 11):
            # PyFrameObject.f_frame (after PyObject_HEAD and f_back) -> the
            # _PyInterpreterFrame, whose `previous` is at 48 on 3.11, 8 after.
            iframe = U64.from_address(id(f) + 24).value
            prev = 48 if VERSION == (3, 11) else 8
            U64.from_address(fake + prev).value = fake
            U64.from_address(iframe + prev).value = fake
        else:
            # PyFrameObject.f_back, after PyObject_VAR_HEAD.
            U64.from_address(fake + 24).value = fake
            U64.from_address(id(f) + 24).value = fake
        print("ready", flush=True)
        while True:
            time.sleep(1)
    hold()
elif MODE == "task-cycle":
    import asyncio

    async def sleeper():
        await asyncio.sleep(3600)

    async def main():
        tasks = [asyncio.create_task(sleeper(), name="sleeper-%d" % i) for i in range(3)]
        await asyncio.sleep(0.05)
        # The offset of a task's list node: where the first task points at
        # the same offset of the second (its successor on the list).
        a, b, c = (id(t) for t in tasks)
        node = next(o for o in range(16, 1024, 8) if U64.from_address(a + o).value == b + o)
        # The last task's `next` (back to the list head) -> itself.
        U64.from_address(c + node).value = c + node
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
elif MODE == "main-exit":
    libc = ctypes.CDLL(None)
    libc.pthread_exit(None)
else:
    raise SystemExit("unknown mode " + MODE)

print("ready", flush=True)
while True:
    time.sleep(1)
