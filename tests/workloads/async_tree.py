"""asyncio task trees with known shapes, for `infertrace dump --async`
(tests/tests/async_dump.rs), compared with `python -m asyncio pstree`.

Modes (prints "ready ..." once the tasks are suspended, then waits):
  tree       the main task (unnamed: Task-1) awaits the task "root", whose
             TaskGroup holds three named workers (mid -> leaf -> sleep), one
             unnamed worker, and "group-b", whose own TaskGroup holds
             "inner-1" and "inner-2"; two workers wait on one asyncio.Lock
             held by "holder"; "joiner-1" and "joiner-2" both await the
             task "shared" (its awaiters are then a set) ("ready").
  two_loops  two threads, each running its own event loop with tasks
             "A-..." and "B-..." ("ready TID_A TID_B": their native ids).
  spin       a task "spinner" runs spin() on the CPU without yielding while
             "idle-1" sleeps and "queued", created by the spinner, waits for
             its first step ("ready").
  churn      tasks "short-N" created and finished all the time, 50 per
             TaskGroup ("ready").
"""

import asyncio
import sys
import threading

LONG = 600.0


async def leaf(delay):
    await asyncio.sleep(delay)  # @await-sleep


async def mid(delay):
    await leaf(delay)  # @await-leaf


async def nested():
    async with asyncio.TaskGroup() as tg:  # @group-b-exit
        tg.create_task(mid(LONG), name="inner-1")
        tg.create_task(mid(LONG), name="inner-2")


async def locked(lock):
    async with lock:  # @await-lock
        pass


async def holder(lock):
    async with lock:
        await asyncio.sleep(LONG)  # @holder-sleep


async def join(task):
    await task  # @await-shared


async def root():
    lock = asyncio.Lock()
    shared = asyncio.create_task(mid(LONG), name="shared")
    async with asyncio.TaskGroup() as tg:  # @root-exit
        for i in range(1, 4):
            tg.create_task(mid(LONG), name=f"worker-{i}")
        tg.create_task(mid(LONG))
        tg.create_task(nested(), name="group-b")
        tg.create_task(holder(lock), name="holder")
        await asyncio.sleep(0)
        tg.create_task(locked(lock), name="waiter-1")
        tg.create_task(locked(lock), name="waiter-2")
        tg.create_task(join(shared), name="joiner-1")
        tg.create_task(join(shared), name="joiner-2")


async def tree():
    t = asyncio.create_task(root(), name="root")
    await asyncio.sleep(0.3)
    print("ready", flush=True)
    await t  # @main-await-root


def run_loop(tag, ids, started):
    async def loop_main():
        tasks = [asyncio.create_task(mid(LONG), name=f"{tag}-worker-{i}") for i in range(1, 4)]
        ids[tag] = threading.get_native_id()
        await asyncio.sleep(0.3)
        started.release()
        await asyncio.gather(*tasks)  # @loop-gather

    asyncio.run(loop_main())


def two_loops():
    ids = {}
    started = threading.Semaphore(0)
    threads = [threading.Thread(target=run_loop, args=(tag, ids, started), name=f"loop-{tag}", daemon=True) for tag in "AB"]
    for t in threads:
        t.start()
    started.acquire()
    started.acquire()
    print("ready", ids["A"], ids["B"], flush=True)
    threading.Event().wait(LONG)


def spin():
    while True:  # @spin-loop
        pass


async def busy():
    asyncio.create_task(mid(LONG), name="queued")  # never started: the loop is blocked
    print("ready", flush=True)
    spin()  # @busy-calls-spin


async def spin_main():
    idle = asyncio.create_task(mid(LONG), name="idle-1")
    await asyncio.sleep(0.2)
    await asyncio.create_task(busy(), name="spinner")
    await idle


async def short():
    await asyncio.sleep(0)


async def churn():
    print("ready", flush=True)
    n = 0
    while True:
        async with asyncio.TaskGroup() as tg:
            for _ in range(50):
                n += 1
                tg.create_task(short(), name=f"short-{n}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "tree":
        asyncio.run(tree())
    elif mode == "two_loops":
        two_loops()
    elif mode == "spin":
        asyncio.run(spin_main())
    elif mode == "churn":
        asyncio.run(churn())
    else:
        sys.exit(f"unknown mode {mode}")
