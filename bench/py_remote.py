"""Remote attach (docs/remote.md): two daemons on this machine, peered over
127.0.0.1, UCX over TCP loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo), as
bench/ucx_get measures its GET and active-message baselines. Prints, from
node-b's client:

- 4 KiB: an attach that pulls (a name not yet on node-b), p50 and p99;
  an attach of a live replica from a new connection (node-a asked whether
  it is current: a round trip, no bytes); a local attach for scale;
- 1 GiB: an attach that pulls, GB/s (median of --rounds, each after a
  replace on node-a so that each pulls again).

    PYTHONPATH=build/python python3 bench/py_remote.py [--small 300] [--rounds 3] [--big 1G]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import tensord

ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp, name, args):
    build = os.environ.get("TENSORD_BUILD") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")
    sock = os.path.join(tmp, name + ".sock")
    r, w = os.pipe()
    env = dict(os.environ, **ENV)
    proc = subprocess.Popen([os.path.join(build, "tensord"), "--socket", sock, "--ready-fd",
                             str(w), "--log-level", "warn"] + args, pass_fds=(w,), env=env,
                            stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        if rf.read(1) != b"R":
            sys.exit("tensord did not start")
    return proc, sock


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=300, help="4 KiB pulls to time")
    ap.add_argument("--rounds", type=int, default=3, help="1 GiB pulls to time")
    ap.add_argument("--big", type=size_arg, default=1 << 30)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "peer.key")
        with open(key, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        os.chmod(key, 0o600)
        pa, pb = free_port(), free_port()
        procs = []
        try:
            p, sa = start(tmp, "a", ["--node-name", "node-a", "--peer-listen",
                                     "127.0.0.1:%d" % pa, "--peer", "node-b=127.0.0.1:%d" % pb,
                                     "--peer-secret-file", key, "--export", "bench/"])
            procs.append(p)
            p, sb = start(tmp, "b", ["--node-name", "node-b", "--peer-listen",
                                     "127.0.0.1:%d" % pb, "--peer", "node-a=127.0.0.1:%d" % pa,
                                     "--peer-secret-file", key, "--replica-keep", "600000"])
            procs.append(p)
            run(sa, sb, a)
        finally:
            for p in procs:
                p.terminate()
                p.wait()


def run(sa, sb, a):
    ca = tensord.connect(sa)
    small = np.arange(1024, dtype=np.float32)
    for i in range(a.small + 1):
        ca.put("bench/s%d" % i, small, mode=0o644)
    ca.put("local/s", small)
    cb = tensord.connect(sb)
    end = time.monotonic() + 10
    while True:  # until the peers are up and their UCX addresses crossed
        try:
            cb.attach("@node-a/bench/s0").release()
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    pulls = []
    for i in range(1, a.small + 1):
        t0 = time.perf_counter()
        t = cb.attach("@node-a/bench/s%d" % i)
        pulls.append(time.perf_counter() - t0)
        t.release()
    hits = []
    for i in range(1, min(a.small, 100) + 1):
        with tensord.connect(sb) as c2:
            t0 = time.perf_counter()
            t = c2.attach("@node-a/bench/s%d" % i)
            hits.append(time.perf_counter() - t0)
            t.release()
    cl = tensord.connect(sa)
    local = []
    for _ in range(200):
        t0 = time.perf_counter()
        t = cl.attach("local/s")
        local.append(time.perf_counter() - t0)
        t.release()
    us = 1e6
    print("py_remote: 4 KiB remote attach (pull) p50 %.1f us p99 %.1f us (%d pulls)"
          % (pct(pulls, .5) * us, pct(pulls, .99) * us, len(pulls)))
    print("py_remote: 4 KiB remote attach of a live replica (current? round trip, no bytes) "
          "p50 %.1f us" % (pct(hits, .5) * us))
    print("py_remote: 4 KiB local attach p50 %.1f us (for scale)" % (pct(local, .5) * us))
    big = np.ones(a.big, np.uint8)
    rates = []
    for r in range(a.rounds):
        big[0] = r
        ca.put("bench/big", big, mode=0o644, replace=r > 0)
        with tensord.connect(sb) as c2:
            t0 = time.perf_counter()
            t = c2.attach("@node-a/bench/big")
            dt = time.perf_counter() - t0
            assert np.from_dlpack(t)[0] == r
            t.release()
        rates.append(a.big / dt / 1e9)
    print("py_remote: %d MiB remote attach (pull) %.2f GB/s (median of %d; min %.2f, max %.2f)"
          % (a.big >> 20, statistics.median(rates), len(rates), min(rates), max(rates)))


if __name__ == "__main__":
    main()
