"""Python put() throughput next to its peers, measured in one interleaved run.

For each size, one round runs every variant once, in turn (A B C A B C ...),
and the medians of all rounds are printed with their ratio to np.copyto into
warm memory (memcpy speed, the ceiling):

  memcpy      np.copyto into an array that is already allocated and touched
  shm         multiprocessing.shared_memory: create + copy + close + unlink
  tensord     c.put(name, array): create, copy, publish (the unlinks are not timed)
  ray         ray.put(array) (when ray imports; skipped with the reason if not)

Pin with `taskset -c 0` to see round trips without cross-CPU wake-ups (the
daemon this starts inherits the affinity).

Uses the daemon at --socket (or $TENSORD_SOCKET); with neither, starts its
own from $TENSORD_BUILD (default: build/) on a temporary socket.

    PYTHONPATH=build/python python3 bench/py_put.py [--sizes 4K,64M,1G] [--rounds 7]
"""
import argparse
import os
import statistics
import time
from multiprocessing import shared_memory

import numpy as np

import tensord
from benchutil import daemon_socket

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return "%d %s" % (n // k, unit)
    return "%d B" % n



def variants(client, src, use_ray):
    warm = np.empty_like(src)
    warm.fill(1)
    seq = iter(range(1 << 62))

    def memcpy():
        np.copyto(warm, src)

    def shm():
        m = shared_memory.SharedMemory(create=True, size=src.nbytes)
        np.copyto(np.ndarray(src.shape, src.dtype, buffer=m.buf), src)
        m.close()
        m.unlink()

    done = []

    def put():
        name = "bench/put/%d" % next(seq)
        client.put(name, src)
        done.append(name)

    def cleanup():  # untimed: the unlinks of the puts just timed
        while done:
            client.unlink(done.pop())

    put.cleanup = cleanup
    out = [("memcpy", memcpy), ("shm", shm), ("tensord", put)]
    if use_ray:
        import ray

        def rayput():
            ray.put(src)

        out.append(("ray", rayput))
    return out


def timed(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t = (time.perf_counter() - t0) / reps
    if hasattr(fn, "cleanup"):
        fn.cleanup()
    return t


def bench_size(client, size, rounds, use_ray):
    src = np.ones(size // 4, np.float32)
    vs = variants(client, src, use_ray)
    reps = max(1, min(2000, (64 << 20) // size))
    for _, fn in vs:  # warm-up: first-touch costs of the source and the pool
        timed(fn, 1)
    times = {name: [] for name, _ in vs}
    pool0 = client.stats()
    for _ in range(rounds):
        for name, fn in vs:
            times[name].append(timed(fn, reps))
    pool1 = client.stats()
    base = statistics.median(times["memcpy"])
    print("put %s (%d rounds x %d, medians)" % (human(size), rounds, reps))
    for name, _ in vs:
        t = statistics.median(times[name])
        print("  %-8s %10.1f us  %8.2f GB/s  %5.2fx memcpy" %
              (name, t * 1e6, size / t / 1e9, base / t))
    hits = pool1["host_pool_hits_total"] - pool0["host_pool_hits_total"]
    misses = pool1["host_pool_misses_total"] - pool0["host_pool_misses_total"]
    if hits + misses:
        # A miss is a put that found no memfd ready: the pool's refill fell behind.
        print("  pool: %d of %d puts found memory ready (%d fell behind the refill)" %
              (hits, hits + misses, misses))
    return times


SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def shmem_policy():
    """The kernel's huge-page policy for shared memory: the word in brackets."""
    try:
        text = open(SHMEM_ENABLED).read()
        return text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--sizes", default="4K,64M,1G")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--daemon-args", default="", help="extra tensord arguments")
    args = ap.parse_args()
    try:
        import ray
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        use_ray = True
    except Exception as e:  # noqa: BLE001 - any failure means: no ray here
        print("ray: skipped (%s: %s)" % (type(e).__name__, e))
        use_ray = False
    # The pool uses huge pages when this allows them ("advise" and up): a large
    # put then costs a lookup per 2 MiB instead of per 4 KiB (docs/design.md).
    print("shmem_enabled: %s" % shmem_policy())
    with daemon_socket(args.socket, args.daemon_args.split()) as sock:
        with tensord.connect(sock) as c:
            for s in args.sizes.split(","):
                bench_size(c, parse_size(s), args.rounds, use_ray)


if __name__ == "__main__":
    main()
