"""A PyTorch DataLoader input pipeline (issue 26), on the real torch wheel
(CPU): the main loop waits in `next(it)` for 2 worker processes whose
`__getitem__` costs ~5 ms of pure Python each.

    python3 pipeline.py persistent SECONDS   # persistent_workers=True: 2 workers for the whole run
    python3 pipeline.py fresh SECONDS        # persistent_workers=False: 2 new workers per epoch
    python3 pipeline.py attach SECONDS       # persistent; prints `ready PID,PID` (the workers)
                                             # once they run, then waits ~1 s for a tracer to attach

Prints on stderr at the end: `main_pid P`, `worker_pids P,Q,...` (every
worker that ran), `batches N`, `wait_share F` (the loop's time in `next()`
over its wall time, by its own clock), `waited_s F` (that time in
seconds) and `getitem_ms F` (the mean cost of
one `__getitem__`, measured in a worker).
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

WORK = 120_000  # ~5 ms of Python per item here
BATCH = 4
ITEMS = 64  # per epoch


class SlowDS(Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        t0 = time.thread_time()
        s = 0
        for k in range(WORK):
            s += k * k  # @getitem
        return torch.tensor([float(s % 1000), float(i), time.thread_time() - t0])


def step(batch):
    return float(batch.sum())  # @step


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode not in ("persistent", "fresh", "attach"):
        sys.exit(f"unknown mode {mode}")
    torch.set_num_threads(1)
    workers = set()
    loader = DataLoader(
        SlowDS(),
        batch_size=BATCH,
        num_workers=2,
        persistent_workers=mode != "fresh",
        worker_init_fn=lambda _: None,
    )
    batches, waited, item_s, items = 0, 0.0, 0.0, 0
    start = time.monotonic()
    end = start + seconds
    announced = mode != "attach"
    while time.monotonic() < end:
        it = iter(loader)
        workers.update(w.pid for w in getattr(it, "_workers", []))
        while True:
            t0 = time.monotonic()
            try:
                batch = next(it)  # @next
            except StopIteration:
                break
            waited += time.monotonic() - t0
            step(batch)
            batches += 1
            item_s += float(batch[:, 2].sum())
            items += batch.shape[0]
            if not announced:
                # The workers run: the tracer may attach now.
                print("ready " + ",".join(str(p) for p in sorted(workers)), flush=True)
                announced = True
                time.sleep(1.0)
                start = time.monotonic()
                end = start + seconds
                waited = 0.0
            if time.monotonic() >= end:
                break
        del it
    took = time.monotonic() - start
    print(f"main_pid {os.getpid()}", file=sys.stderr)
    print("worker_pids " + ",".join(str(p) for p in sorted(workers)), file=sys.stderr)
    print(f"batches {batches}", file=sys.stderr)
    print(f"wait_share {waited / took:.4f}", file=sys.stderr)
    print(f"waited_s {waited:.4f}", file=sys.stderr)
    print(f"getitem_ms {1000 * item_s / max(items, 1):.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
