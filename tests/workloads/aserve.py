"""An asyncio TCP service for tests/tests/async_record.rs.

`aserve.py [--block]`: serves on 127.0.0.1 one request per line; a client
process of 8 threads (blocking sockets; `aserve.py client PORT`) sends
150 requests each. Each request awaits asyncio.sleep(0.002) (a downstream
call), then computes sum(range(20000)) on the loop. With --block, requests
20, 60, 100 and 140 of client 0 also call time.sleep(0.05) on the loop:
4 blocked steps, one client's, so never two in one loop iteration.

At the end, with `--result FILE`, writes to FILE
as JSON what the service measured itself: the seconds spent in the awaited
sleep (from just before the await to just after), the requests served,
and the blocked requests. The test reads the lines through `# @` markers.
"""
import asyncio
# Imported now, not by the loop's first run_in_executor (an import inside a
# loop step is CPU on the loop: 20-150 ms under load, a true blocked step).
import concurrent.futures.thread  # noqa: F401
import json
import os
import socket
import subprocess
import sys
import threading
import time

CLIENTS = 8
REQUESTS = 150


def client(port):
    def one(c):
        s = socket.create_connection(("127.0.0.1", port))
        f = s.makefile("rb")
        for i in range(REQUESTS):
            s.sendall(b"%d %d\n" % (c, i))
            f.readline()
        s.close()

    threads = [threading.Thread(target=one, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


stats = {"await_s": 0.0, "requests": 0, "blocked": 0}
BLOCK = "--block" in sys.argv


async def handle(reader, writer):
    while True:
        line = await reader.readline()  # @readline
        if not line:
            break
        c, i = map(int, line.split())
        t0 = time.perf_counter()
        await asyncio.sleep(0.002)  # @await_sleep
        stats["await_s"] += time.perf_counter() - t0
        if BLOCK and c == 0 and i % 40 == 20:
            stats["blocked"] += 1
            time.sleep(0.05)  # @blocking
        s = sum(range(20000))  # @cpu
        writer.write(b"%d\n" % s)
        stats["requests"] += 1
        await writer.drain()
    writer.close()


async def main(sock, proc):
    server = await asyncio.start_server(handle, sock=sock)
    # Waiting for the client in a thread: nothing here blocks the loop but
    # the handler's time.sleep.
    await asyncio.get_running_loop().run_in_executor(None, proc.wait)
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "client":
        client(int(sys.argv[2]))
        sys.exit(0)
    # The listening socket and the client exist before the loop runs: a
    # subprocess spawned from the loop would block it while it starts.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    proc = subprocess.Popen([sys.executable, __file__, "client", str(sock.getsockname()[1])])
    asyncio.run(main(sock, proc))
    if "--result" in sys.argv:
        with open(sys.argv[sys.argv.index("--result") + 1], "w") as f:
            json.dump(stats, f)
