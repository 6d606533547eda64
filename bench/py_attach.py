"""attach -> numpy.from_dlpack -> release cycles per second, from Python.

Measures one client, then next to multiprocessing.shared_memory (attach by
name + a numpy view + close, interleaved rounds), then four client processes
at once. Uses the daemon
at --socket (or $TENSORD_SOCKET); with neither, starts its own from
$TENSORD_BUILD (default: build/) on a temporary socket.

    PYTHONPATH=build/python python3 bench/py_attach.py [--seconds 3] [--size 4096]
"""
import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing import shared_memory

import numpy as np

import tensord
from benchutil import daemon_socket, print_floors

NAME = "bench/py_attach"


def cycles(socket, seconds, start=None):
    """Runs cycles for about `seconds`; returns (count, elapsed)."""
    with tensord.connect(socket) as c:
        if start is not None:
            start.wait()
        n = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            for _ in range(256):
                t = c.attach(NAME)
                np.from_dlpack(t)
                t.release()
            n += 256
            now = time.perf_counter()
            if now >= end:
                return n, now - t0


def shm_cycles(name, size, seconds):
    """SharedMemory(name) + a numpy view + close, the peer of one attach cycle."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(256):
            m = shared_memory.SharedMemory(name)
            a = np.ndarray((size,), np.uint8, buffer=m.buf)
            del a
            m.close()
        n += 256
        now = time.perf_counter()
        if now >= end:
            return n, now - t0


def versus_shm(sock, size, seconds, rounds=5):
    """Interleaved rounds (tensord, shm, tensord, shm ...), medians and the ratio."""
    m = shared_memory.SharedMemory(create=True, size=size)
    try:
        td, sh = [], []
        for _ in range(rounds):
            n, dt = cycles(sock, seconds / rounds)
            td.append(dt / n)
            n, dt = shm_cycles(m.name, size, seconds / rounds)
            sh.append(dt / n)
        a, b = statistics.median(td), statistics.median(sh)
        print(f"py_attach: tensord {a * 1e6:.1f} us, SharedMemory(name)+view+close "
              f"{b * 1e6:.1f} us per cycle ({rounds} interleaved rounds, medians): "
              f"{b / a:.2f}x shm")
    finally:
        m.close()
        m.unlink()


def worker(socket, seconds, start, out, shm=None, size=0):
    if shm:
        start.wait()
        out.put(shm_cycles(shm, size, seconds))
    else:
        out.put(cycles(socket, seconds, start))


def concurrent(sock, procs, seconds, shm=None, size=0):
    """procs processes cycling at once: tensord's, or SharedMemory's (shm: its name)."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(sock, seconds, start, out, shm, size))
          for _ in range(procs)]
    for p in ps:
        p.start()
    results = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return sum(n / dt for n, dt in results)



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=4096, help="tensor bytes")
    ap.add_argument("--procs", type=int, default=4)
    args = ap.parse_args()

    with daemon_socket(args.socket) as sock:
        with tensord.connect(sock) as c:
            try:
                c.unlink(NAME)
            except FileNotFoundError:
                pass
            c.put(NAME, np.zeros(args.size, np.uint8), lifetime="connection")
            cycles(sock, 0.3)  # warm up
            n, dt = cycles(sock, args.seconds)
            print(f"py_attach: 1 client:   {n / dt:10,.0f} attach+from_dlpack+release/s "
                  f"({dt / n * 1e6:.1f} us each, {args.size} B tensor)")
            versus_shm(sock, args.size, args.seconds)
            print_floors("py_attach")

            # Interleaved: tensord, SharedMemory, tensord, SharedMemory.
            m = shared_memory.SharedMemory(create=True, size=args.size)
            try:
                td, sh = [], []
                for _ in range(2):
                    td.append(concurrent(sock, args.procs, args.seconds / 2))
                    sh.append(concurrent(sock, args.procs, args.seconds / 2, m.name,
                                         args.size))
            finally:
                m.close()
                m.unlink()
            total, peer = statistics.median(td), statistics.median(sh)
            print(f"py_attach: {args.procs} clients:  {total:10,.0f} "
                  f"attach+from_dlpack+release/s in total "
                  f"({total / args.procs:,.0f} per client); SharedMemory(name)+view+close "
                  f"{peer:,.0f}/s: {total / peer:.2f}x shm")


if __name__ == "__main__":
    main()
