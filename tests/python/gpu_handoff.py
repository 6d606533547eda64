"""torch.multiprocessing's own CUDA hand-off, timed for comparison with
tensord's attach (tests/python/test_gpu.py::test_attach_latency_report).

measure(n, rounds) sends a CUDA tensor of n bytes to a spawned process
through a torch.multiprocessing queue `rounds` times; the receiver touches
it and answers. Returns (first, median of the rest) round trips in us; the
first includes opening the CUDA IPC handle in the receiver for the first
time. Needs torch with CUDA.
"""
import statistics
import time

import torch
import torch.multiprocessing as mp


def _receiver(inq, outq):
    while True:
        x = inq.get()
        if x is None:
            return
        outq.put(int(x[0]))
        del x


def measure(n, rounds):
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(inq, outq))
    proc.start()
    x = torch.ones(n, dtype=torch.uint8, device="cuda:0")
    times = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            inq.put(x)
            assert outq.get(timeout=120) == 1
            times.append((time.perf_counter() - t0) * 1e6)
    finally:
        inq.put(None)
        proc.join(60)
    return times[0], statistics.median(times[1:])
