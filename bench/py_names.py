"""Attach latency with few names and with very many, and what many names cost.

Measures attach + np.from_dlpack + release, p50 and p99, among 10 names; then
fills the daemon up to --names 4 KiB tensors (they share slabs) and measures
again, alternating rounds over the same 10 names and over random ones of all
of them. Prints the p99 ratio (target: at most 2) and the daemon's
descriptors and resident memory at that many names.

    PYTHONPATH=build/python python3 bench/py_names.py [--names 1000000]
"""
import argparse
import random
import time

import numpy as np

import tensord
from benchutil import daemon_socket


def lat(c, names, n, rng):
    out = []
    for _ in range(n):
        name = rng.choice(names)
        t0 = time.perf_counter_ns()
        t = c.attach(name)
        np.from_dlpack(t)
        t.release()
        out.append(time.perf_counter_ns() - t0)
    return out


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] / 1e3


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    rng = random.Random(1)
    a = np.ones(1024, np.float32)
    with daemon_socket() as sock:
        c = tensord.connect(sock)
        few = ["few/%d" % i for i in range(10)]
        for n in few:
            c.put(n, a)
        lat(c, few, 2000, rng)  # warm up
        before = lat(c, few, args.samples, rng)
        t0 = time.perf_counter()
        for i in range(args.names - len(few)):
            c.put("many/%07d" % i, a)
        fill = time.perf_counter() - t0
        all_names = few + ["many/%07d" % i for i in range(args.names - len(few))]
        hot, spread = [], []
        for _ in range(args.rounds):  # alternate: same 10 names, then any name
            hot += lat(c, few, args.samples // args.rounds, rng)
            spread += lat(c, all_names, args.samples // args.rounds, rng)
        s = c.stats()
        print("py_names: 10 names:        attach p50 %7.1f us  p99 %7.1f us" %
              (pct(before, 0.5), pct(before, 0.99)))
        print("py_names: %d names: same 10 p50 %7.1f us  p99 %7.1f us; any name p50 %7.1f "
              "us  p99 %7.1f us" % (args.names, pct(hot, 0.5), pct(hot, 0.99),
                                    pct(spread, 0.5), pct(spread, 0.99)))
        print("py_names: p99 ratio %.2f (any of %d names / 10 names); filled in %.1f s "
              "(%.0f puts/s); daemon: %d descriptors, %d slabs, RSS %.0f MiB" %
              (pct(spread, 0.99) / pct(before, 0.99), args.names, fill,
               (args.names - 10) / fill, s["open_fds"], s["host_slabs"],
               rss_kib(s["daemon_pid"]) / 1024))
        c.close()


if __name__ == "__main__":
    main()
