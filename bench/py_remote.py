"""Remote attach (docs/remote.md): two daemons on this machine, peered over
127.0.0.1, UCX over TCP loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo), as
bench/ucx_get measures its GET and active-message baselines. Prints, from
node-b's client:

- 4 KiB: an attach that pulls (a name not yet on node-b), p50 and p99;
  a second attach of a live replica, from a new connection (node-b serves
  it after one sync round trip to node-a, no pull: docs/remote.md,
  "Freshness") next to the same of a tensor of node-b's own, and again on
  the connection that holds it (a request: replicas are never bound)
  next to a local bound attach (no request);
- 1 GiB: an attach that pulls, GB/s (median of --rounds, each after a
  replace on node-a so that each pulls again).

Next to it, in the same run, the same transfer through Ray when ray imports
(skipped with the reason if not, or with --no-ray): two raylets on this
machine (ray.cluster_utils.Cluster), node_a and node_b, each with its own
object store. An actor on node_a ray.puts the array; an actor on node_b
ray.gets it and reads its first element, timed inside that actor (the
call's dispatch is not timed, as tensord's connect is not). 4 KiB: a fresh
object each get, p50 and p99; 1 GiB: GB/s, a fresh object each round. The
rounds alternate, tensord then Ray. A check prints where Ray holds the
objects before and after node_b's get (node_a alone, then both) and a
second get on node_b (its local copy), so that the figures are known to
cross object stores.

    PYTHONPATH=build/python python3 bench/py_remote.py [--small 300] [--rounds 3] [--big 1G]
        [--interleave 3] [--no-ray] [--ray-store 3G]
"""
import argparse
import logging
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


class Maker:
    """A Ray actor on node_a: puts the arrays there. It returns the refs in
    a list so that the caller gets the refs, not the values."""

    def node(self):
        return ray_mod().get_runtime_context().get_node_id()

    def small(self, arr, n):
        return [ray_mod().put(arr) for _ in range(n)]

    def big(self, size, first):
        arr = np.ones(size, np.uint8)
        arr[0] = first
        return [ray_mod().put(arr)]


class Taker:
    """A Ray actor on node_b: gets each ref (given nested in a list, so that
    Ray does not fetch it before the call starts) and reads its first
    element; returns the seconds each took."""

    def node(self):
        return ray_mod().get_runtime_context().get_node_id()

    def get(self, refs, first):
        took = []
        for ref in refs:
            t0 = time.perf_counter()
            got = int(ray_mod().get(ref)[0])
            took.append(time.perf_counter() - t0)
            if got != first:
                raise ValueError("ray: node_b read %d as the first element, not %d" % (got, first))
        return took


def ray_mod():
    """ray, imported only where the Ray part runs: it is optional."""
    import ray
    return ray


class RayPair:
    """Two raylets on this machine, each with its own object store: Maker on
    node_a, Taker on node_b. close() stops both raylets."""

    def __init__(self, store):
        ray = ray_mod()
        from ray.cluster_utils import Cluster
        self.cluster = Cluster(shutdown_at_exit=True)
        try:
            self.cluster.add_node(num_cpus=1, resources={"node_a": 1}, object_store_memory=store,
                                  include_dashboard=False)
            self.cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=store)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, log_to_driver=False,
                     logging_level=logging.WARNING)
            self.maker = ray.remote(num_cpus=0, resources={"node_a": 1})(Maker).remote()
            self.taker = ray.remote(num_cpus=0, resources={"node_b": 1})(Taker).remote()
            self.node_a, self.node_b = ray.get([self.maker.node.remote(),
                                                self.taker.node.remote()])
            if self.node_a == self.node_b:
                raise RuntimeError("both actors landed on node %s" % self.node_a)
            print("py_remote: ray %s: two raylets, GCS at %s, object stores of %d MiB each"
                  % (ray.__version__, self.cluster.gcs_address, store >> 20), flush=True)
        except BaseException:
            self.close()
            raise
        self.checked = 0
        self.before_a = self.after_both = 0
        self.first = self.second = []
        self.big_on_b = 0

    def close(self):
        try:
            ray_mod().shutdown()
        finally:
            self.cluster.shutdown()

    def where(self, refs):
        """The nodes holding each object, as its owner (Maker) knows them."""
        locs = ray_mod().experimental.get_object_locations(refs)
        return [set(locs[r]["node_ids"]) for r in refs]

    def on_b_after(self, refs, timeout=2.0):
        """How many of refs node_b holds after its get: the owner learns of
        the new copy asynchronously, so this waits a little for it."""
        end = time.monotonic() + timeout
        while True:
            n = sum(self.node_b in loc for loc in self.where(refs))
            if n == len(refs) or time.monotonic() > end:
                return n
            time.sleep(0.05)

    def small_gets(self, arr, n, check):
        """Seconds of n gets on node_b, each of a fresh object put on node_a.
        With check: where the objects are before and after, and a second get
        of each on node_b (now local)."""
        ray = ray_mod()
        refs = ray.get(self.maker.small.remote(arr, n))
        if check:
            self.checked = n
            self.before_a = sum(loc == {self.node_a} for loc in self.where(refs))
        took = ray.get(self.taker.get.remote(refs, int(arr[0])))
        if check:
            self.on_b_after(refs)
            self.after_both = sum({self.node_a, self.node_b} <= loc for loc in self.where(refs))
            self.first = took
            self.second = ray.get(self.taker.get.remote(refs, int(arr[0])))
        del refs
        return took

    def big_get(self, size, r):
        """Seconds of one get on node_b of a fresh object of size bytes put
        on node_a; counts it in big_on_b when node_b holds it after."""
        ray = ray_mod()
        refs = ray.get(self.maker.big.remote(size, r))
        took = ray.get(self.taker.get.remote(refs, r))[0]
        self.big_on_b += self.on_b_after(refs)
        del refs
        return took

    def check_line(self):
        """Whether the 4 KiB gets crossed object stores: node_a alone held
        the objects before node_b's get, both after, and a second get on
        node_b (its local copy) was faster than the first."""
        first, second = pct(self.first, .5), pct(self.second, .5)
        crossed = (self.before_a == self.checked and self.after_both == self.checked
                   and second < first)
        return ("py_remote: ray check: node_a %s, node_b %s; of %d fresh 4 KiB objects %d on "
                "node_a alone before node_b's get, %d on both after; node_b's first get p50 "
                "%.1f us, second (its local copy) p50 %.1f us: crosses object stores: %s"
                % (self.node_a[:12], self.node_b[:12], self.checked, self.before_a,
                   self.after_both, first * 1e6, second * 1e6, "yes" if crossed else "NO"))


def start_ray(a):
    """The two raylets, or None after printing why not."""
    if a.no_ray:
        print("py_remote: ray: skipped (--no-ray)", flush=True)
        return None
    try:
        ray_mod()
    except ImportError as e:
        print("py_remote: ray: skipped (ray does not import: %s)" % e, flush=True)
        return None
    try:
        return RayPair(a.ray_store)
    except Exception as e:  # noqa: BLE001 - any failure means: no Ray figures, say why
        print("py_remote: ray: skipped (two raylets did not start: %s: %s)"
              % (type(e).__name__, e), flush=True)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=300, help="4 KiB pulls to time")
    ap.add_argument("--rounds", type=int, default=3, help="1 GiB pulls to time")
    ap.add_argument("--big", type=size_arg, default=1 << 30)
    ap.add_argument("--interleave", type=int, default=3,
                    help="rounds the 4 KiB pulls are split into, tensord and Ray in turn")
    ap.add_argument("--no-ray", action="store_true", help="no Ray figures")
    ap.add_argument("--ray-store", type=size_arg, default=3 << 30,
                    help="each raylet's object store")
    a = ap.parse_args()
    if a.big * 2 > a.ray_store and not a.no_ray:
        sys.exit("py_remote: --ray-store %d holds less than two of --big %d" % (a.ray_store, a.big))
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "peer.key")
        with open(key, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        os.chmod(key, 0o600)
        pa, pb = free_port(), free_port()
        procs = []
        rp = None
        try:
            p, sa = start(tmp, "a", ["--node-name", "node-a", "--peer-listen",
                                     "127.0.0.1:%d" % pa, "--peer", "node-b=127.0.0.1:%d" % pb,
                                     "--peer-secret-file", key, "--export", "bench/"])
            procs.append(p)
            p, sb = start(tmp, "b", ["--node-name", "node-b", "--peer-listen",
                                     "127.0.0.1:%d" % pb, "--peer", "node-a=127.0.0.1:%d" % pa,
                                     "--peer-secret-file", key, "--replica-keep", "600000"])
            procs.append(p)
            rp = start_ray(a)
            run(sa, sb, a, rp)
        finally:
            try:
                if rp is not None:
                    rp.close()
            finally:
                for p in procs:
                    p.terminate()
                    p.wait()


def td_pulls(cb, first, n):
    """Seconds of n attaches on node-b that each pull a name not there yet."""
    took = []
    for i in range(first, first + n):
        t0 = time.perf_counter()
        t = cb.attach("@node-a/bench/s%d" % i)
        took.append(time.perf_counter() - t0)
        t.release()
    return took


def td_big(ca, sb, big, r):
    """Seconds of one attach on node-b pulling big, replaced on node-a with
    r as its first element (so that each round pulls again)."""
    big[0] = r
    ca.put("bench/big", big, mode=0o644, replace=r > 0)
    with tensord.connect(sb) as c2:
        t0 = time.perf_counter()
        t = c2.attach("@node-a/bench/big")
        dt = time.perf_counter() - t0
        assert np.from_dlpack(t)[0] == r
        t.release()
    return dt


def shares(total, parts):
    """total split into parts (at least one each while there are enough)."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def run(sa, sb, a, rp):
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
    if rp is not None:
        rp.small_gets(small, 5, check=False)  # the actors' first calls, as s0 above
    pulls, gets, per_round = [], [], []
    first = 1
    for k, n in enumerate(shares(a.small, a.interleave)):
        td = td_pulls(cb, first, n)
        first += n
        pulls += td
        if rp is not None:
            rg = rp.small_gets(small, n, check=k == 0)
            gets += rg
            per_round.append("%.0f/%.0f" % (pct(td, .5) * 1e6, pct(rg, .5) * 1e6))
    cb.put("local/s", small)
    sa_stats = tensord.connect(sa).stats()
    asked, synced = sa_stats["remote_pull_requests_total"], sa_stats.get("remote_sync_requests_total", 0)
    hits, local_new = [], []
    for i in range(1, min(a.small, 100) + 1):  # interleaved: replica, local
        for name, out in (("@node-a/bench/s%d" % i, hits), ("local/s", local_new)):
            with tensord.connect(sb) as c2:
                t0 = time.perf_counter()
                t = c2.attach(name)
                out.append(time.perf_counter() - t0)
                t.release()
    sa_stats = tensord.connect(sa).stats()
    asked = sa_stats["remote_pull_requests_total"] - asked
    synced = sa_stats.get("remote_sync_requests_total", 0) - synced
    bound, local = [], []
    for _ in range(200):
        for name, out in (("@node-a/bench/s1", bound), ("local/s", local)):
            t0 = time.perf_counter()
            t = cb.attach(name)
            out.append(time.perf_counter() - t0)
            t.release()
    us = 1e6
    print("py_remote: 4 KiB remote attach (pull) p50 %.1f us p99 %.1f us (%d pulls)"
          % (pct(pulls, .5) * us, pct(pulls, .99) * us, len(pulls)))
    print("py_remote: 4 KiB second attach of a live replica, new connection p50 %.1f us, a "
          "local tensor the same way %.1f us: %.2fx (node-a asked %d times, synced %d)"
          % (pct(hits, .5) * us, pct(local_new, .5) * us, pct(hits, .5) / pct(local_new, .5),
             asked, synced))
    print("py_remote: 4 KiB second attach of a live replica, same connection p50 %.1f us, a "
          "local tensor bound %.1f us: %.2fx" % (pct(bound, .5) * us, pct(local, .5) * us,
                                   pct(bound, .5) / pct(local, .5)))
    if rp is not None:
        print("py_remote: ray 4 KiB get on node_b of an object put on node_a p50 %.1f us p99 %.1f "
              "us (%d gets): Ray / tensord p50 %.1fx" % (pct(gets, .5) * us, pct(gets, .99) * us,
                                                         len(gets), pct(gets, .5) / pct(pulls, .5)))
        print("py_remote: 4 KiB p50 by round, tensord/Ray us: %s" % " ".join(per_round))
        print(rp.check_line(), flush=True)
    big = np.ones(a.big, np.uint8)
    rates, ray_rates = [], []
    for r in range(a.rounds):
        rates.append(a.big / td_big(ca, sb, big, r) / 1e9)
        if rp is not None:
            ray_rates.append(a.big / rp.big_get(a.big, r) / 1e9)
    print("py_remote: %d MiB remote attach (pull) %.2f GB/s (median of %d; min %.2f, max %.2f)"
          % (a.big >> 20, statistics.median(rates), len(rates), min(rates), max(rates)))
    if rp is not None:
        print("py_remote: ray %d MiB get on node_b of an object put on node_a %.2f GB/s (median "
              "of %d; min %.2f, max %.2f; on node_b after its get: %d of %d): tensord / Ray %.2fx"
              % (a.big >> 20, statistics.median(ray_rates), len(ray_rates), min(ray_rates),
                 max(ray_rates), rp.big_on_b, len(ray_rates),
                 statistics.median(rates) / statistics.median(ray_rates)))
        print("py_remote: %d MiB GB/s by round, tensord/Ray: %s"
              % (a.big >> 20, " ".join("%.2f/%.2f" % x for x in zip(rates, ray_rates))))


if __name__ == "__main__":
    main()
