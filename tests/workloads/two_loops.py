"""Two asyncio event loops in two threads, for tests/tests/async_record.rs.

Thread `loop-a` runs tasks named a-0..a-2 that compute in `work_a`;
thread `loop-b` runs tasks b-0..b-2 that compute in `work_b`, and its
task b-0 blocks its loop with time.sleep(0.03) three times, late in the
run (the loop is found by then). Many short steps, not a few long ones:
each loop is busy ~0.2 s in all (enough 200 Hz samples to name its lines)
while the two threads seldom contend for the GIL long; the threads meet
at a barrier before their loops start, so that wait blocks no loop. Writes
`{"a": TID, "b": TID}` (the loop threads' kernel ids) to the file named
by its first argument at the end.
"""
import asyncio
import json
import os
import sys
import threading
import time

tids = {}
started = threading.Barrier(3)


def work_a():
    return sum(range(30000))  # @work_a


def work_b():
    return sum(range(30000))  # @work_b


async def worker_a(k):
    for _ in range(300):
        work_a()
        await asyncio.sleep(0.003)  # @await_a


async def worker_b(k):
    for n in range(300):
        work_b()
        if k == 0 and n % 100 == 50:
            time.sleep(0.03)  # @block_b
        await asyncio.sleep(0.003)  # @await_b


async def run(name, worker):
    async with asyncio.TaskGroup() as tg:
        for k in range(3):
            tg.create_task(worker(k), name=f"{name}-{k}")


def thread(name, worker):
    tids[name] = threading.get_native_id()
    started.wait()
    asyncio.run(run(name, worker))


if __name__ == "__main__":
    ts = [
        threading.Thread(target=thread, args=("a", worker_a), name="loop-a"),
        threading.Thread(target=thread, args=("b", worker_b), name="loop-b"),
    ]
    for t in ts:
        t.start()
    started.wait()
    for t in ts:
        t.join()
    with open(sys.argv[1], "w") as f:
        json.dump(tids, f)
