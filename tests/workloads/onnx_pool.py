"""An onnxruntime inference service (issue 12): a 6-layer MLP built with
onnx.helper, 64x512 float32 batches, 2 ms between requests.

    python3 onnx_pool.py pool SECONDS     # default session: intra-op pool, spinning on
    python3 onnx_pool.py single SECONDS   # intra_op_num_threads=1, spinning off

Prints on stderr at the end: `requests N`, `intra_op_threads N`,
`sleep_share F` (the serving loop's time in its 2 ms sleeps over the loop's
wall time), `main_tid T`, and `task TID cpu_ns NS` per thread (utime+stime
from /proc/self/task/TID/stat: the oracle for the pool thread's CPU).
"""
import os
import sys
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

LAYERS, WIDTH, BATCH = 6, 512, 64


def build_model():
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(LAYERS):
        w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * 0.05
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.flatten().tolist()))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if i == LAYERS - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def serve(sess, seconds):
    x = np.random.default_rng(1).standard_normal((BATCH, WIDTH), dtype=np.float32)
    n, slept = 0, 0.0
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        sess.run(None, {"x": x})  # @sess_run
        n += 1
        t0 = time.monotonic()
        time.sleep(0.002)  # @between
        slept += time.monotonic() - t0
    return n, slept / (time.monotonic() - start)


def task_cpu():
    hz = os.sysconf("SC_CLK_TCK")
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])
        print(f"task {tid} cpu_ns {(utime + stime) * 10**9 // hz}", file=sys.stderr)


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    so = ort.SessionOptions()
    if mode == "single":
        so.intra_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif mode != "pool":
        sys.exit(f"unknown mode {mode}")
    sess = ort.InferenceSession(build_model(), so, providers=["CPUExecutionProvider"])
    n, sleep_share = serve(sess, seconds)
    print(f"requests {n}", file=sys.stderr)
    print(f"intra_op_threads {so.intra_op_num_threads}", file=sys.stderr)
    print(f"sleep_share {sleep_share:.3f}", file=sys.stderr)
    print(f"main_tid {threading.get_native_id()}", file=sys.stderr)
    task_cpu()


if __name__ == "__main__":
    main()
