"""Python put() throughput next to its peers, measured in one interleaved run.

For each size, one round runs every variant once, in turn (A B C A B C ...),
and the medians of all rounds are printed with their ratio to np.copyto into
warm memory (memcpy speed, the ceiling):

  memcpy      np.copyto into an array that is already allocated and touched
  shm         multiprocessing.shared_memory: create + copy + close + unlink
  put         c.put(name, array): create, copy, publish (the unlinks are not timed)
  cfp         the zero-copy producer path: c.create(), np.copyto into
              np.from_dlpack() of it, publish(), release()
  cfp/rc      the same with create(recycle=True): the view is a buffer of this
              writer's ring of recycled memory (docs/recycle.md), mapped already
  cfp/rc/t    cfp/rc filled by torch (torch.from_dlpack(view).copy_(src)), which
              copies with its intra-op threads as put does with its copy pool
              (np.copyto has one thread); when torch imports
  put/nr, cfp/nr  the same on a client that keeps no reserve (--without-reserve)
  ray         ray.put(array) (when ray imports; skipped with the reason if not)
  vineyard    vineyard client.put(array) (when vineyard imports and a vineyardd
              socket is given with --vineyard-socket or $VINEYARD_IPC_SOCKET)

--replace measures something else: back-to-back puts of ONE name, each
replace=True of the previous version, nothing between two puts (a training
loop republishing its weights), default sizes 64M,1G. Per round, in turn:

  recycled    c.put(name, array, replace=True) on a client of the default
              environment (versions whose leases ended are reused, already
              mapped: one memcpy, where the library recycles)
  sealed      the same on a client connected with TENSORD_RECYCLE=0 (fresh
              memory every version; the same as recycled where nothing recycles)
  sealed/kw   put(..., sealed=True) per call, only where put() takes it
  copyto      np.copyto into a warm preallocated array (memcpy, the ceiling)
  ray         ray.put(array), the previous ObjectRef dropped first (skipped with
              the reason when ray does not import or init)

Each variant is warmed (a few puts), then each round (in an order rotated by
one each round) times K back-to-back puts
(--k; default 20 up to 64 MiB, 5 above) and keeps their median; the medians of
the rounds are printed, in ms and GB/s, with recycled's speed next to copyto,
ray.put and sealed (other / recycled, in time).

    PYTHONPATH=build/python python3 bench/py_put.py --replace [--sizes 64M,1G]

Nothing is installed: a peer that is missing is skipped with the reason.
Before each timed call the process sleeps --gap-ms (default 0), the same
for every variant: a producer that computes between puts gives background
work (the daemon's pool, the library's reserve) that time; with 0 every
variant runs back to back, and background work competes with the timed
calls (on one CPU, with all of them).

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
from benchutil import connect_env, daemon_socket

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


def variants(client, src, peers, skip, plain=None):
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

    def putter(c):
        def put():
            name = "bench/put/%d" % next(seq)
            c.put(name, src)
            done.append(name)
        put.cleanup = cleanup
        return put

    def creator(c, fill=None, **kw):
        # create + fill through the view + publish; recycle=True: the view is
        # a buffer of this writer's ring (docs/recycle.md), mapped already.
        # fill(view) fills it (np.copyto of src by default).
        def cfp():
            name = "bench/put/%d" % next(seq)
            w = c.create(name, src.shape, "float32", **kw)
            if fill:
                fill(w)
            else:
                a = np.from_dlpack(w)
                np.copyto(a, src)
                del a
            w.publish()
            w.release()
            done.append(name)
        cfp.cleanup = cleanup
        return cfp

    def cleanup():  # untimed: the unlinks of the puts just timed
        while done:
            client.unlink(done.pop())

    out = [("memcpy", memcpy), ("shm", shm), ("put", putter(client)), ("cfp", creator(client)),
           ("cfp/rc", creator(client, recycle=True))]
    try:
        import torch
        tsrc = torch.from_numpy(src)

        def torch_fill(w):
            torch.from_dlpack(w).copy_(tsrc)

        out.append(("cfp/rc/t", creator(client, fill=torch_fill, recycle=True)))
    except ImportError as e:
        print("py_put: cfp/rc/t skipped: %s" % e)
    if plain is not None:
        # The same calls on a client that keeps no reserve (TENSORD_RESERVE=0).
        out += [("put/nr", putter(plain)), ("cfp/nr", creator(plain))]
    if "ray" in peers:
        import ray

        def rayput():
            ray.put(src)

        out.append(("ray", rayput))
    if "vineyard" in peers:
        vc = peers["vineyard"]
        ids = []

        def vput():
            ids.append(vc.put(src))

        def vcleanup():
            if ids:
                vc.delete(ids)
                ids.clear()

        vput.cleanup = vcleanup
        out.append(("vineyard", vput))
    return [(n, f) for n, f in out if n not in skip]


def timed(fn, reps, gap):
    total = 0.0
    for _ in range(reps):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    if hasattr(fn, "cleanup"):
        fn.cleanup()
    return total / reps


def figure(stats, name):
    return stats.get(name, 0)


def bench_size(client, size, rounds, peers, gap, skip, plain=None):
    src = np.ones(size // 4, np.float32)
    vs = variants(client, src, peers, skip, plain)
    reps = max(1, min(2000, (64 << 20) // size))
    for _, fn in vs:  # warm-up: first-touch costs of the source and the pool
        timed(fn, 1, gap)
    times = {name: [] for name, _ in vs}
    s0 = client.stats()
    for _ in range(rounds):
        for name, fn in vs:
            times[name].append(timed(fn, reps, gap))
    s1 = client.stats()
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["memcpy"]
    print("put %s (%d rounds x %d, medians, gap %g ms)" % (human(size), rounds, reps,
                                                        gap * 1e3))
    for name, _ in vs:
        t = med[name]
        peers_txt = "".join("  %5.2fx %s" % (med[p] / t, p) for p in ("ray", "vineyard")
                            if p in med and name in ("put", "cfp", "cfp/rc", "cfp/rc/t", "put/nr",
                                                     "cfp/nr"))
        print("  %-8s %10.1f us  %8.2f GB/s  %5.2fx memcpy%s" %
              (name, t * 1e6, size / t / 1e9, base / t, peers_txt))
    if "put" in med and "cfp" in med:
        print("  cfp/put  %5.2fx (create + fill + publish over put)" % (med["put"] / med["cfp"]))
    if "put" in med and "cfp/rc" in med:
        print("  cfp/rc/put %5.2fx (create(recycle=True) + fill + publish over put)" %
              (med["put"] / med["cfp/rc"]))
    if "put" in med and "cfp/rc/t" in med:
        print("  cfp/rc/t/put %5.2fx (the same, filled by torch's copy_ with its threads, "
              "over put)" % (med["put"] / med["cfp/rc/t"]))
    hits = figure(s1, "host_pool_hits_total") - figure(s0, "host_pool_hits_total")
    misses = figure(s1, "host_pool_misses_total") - figure(s0, "host_pool_misses_total")
    if hits + misses:
        # A miss is a create that found no memfd ready: the pool's refill fell behind.
        print("  pool: %d of %d creates found memory ready (%d fell behind the refill)" %
              (hits, hits + misses, misses))
    rh = figure(s1, "host_reserve_creates_total") - figure(s0, "host_reserve_creates_total")
    if rh:
        print("  reserve: %d creates wrote into memory this process had mapped ahead" % rh)
    return times


SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def shmem_policy():
    """The kernel's huge-page policy for shared memory: the word in brackets."""
    try:
        text = open(SHMEM_ENABLED).read()
        return text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        return "unknown"


def find_peers(vineyard_socket):
    peers = {}
    try:
        import ray
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        peers["ray"] = ray
    except Exception as e:  # noqa: BLE001 - any failure means: no ray here
        print("ray: skipped (%s: %s)" % (type(e).__name__, e))
    try:
        import vineyard
        if not vineyard_socket:
            raise RuntimeError("no vineyardd socket (--vineyard-socket, $VINEYARD_IPC_SOCKET)")
        peers["vineyard"] = vineyard.connect(vineyard_socket)
    except Exception as e:  # noqa: BLE001 - any failure means: no vineyard here
        print("vineyard: skipped (%s: %s)" % (type(e).__name__, e))
    return peers


# --- --replace: back-to-back versions of one name ----------------------------------------

def takes_sealed(client):
    """Whether put() takes sealed= (the per-call way to the old path)."""
    try:
        client.put("bench/put/replace/probe", np.zeros(1, np.float32), sealed=True)
    except TypeError:
        return False
    client.unlink("bench/put/replace/probe")
    return True


def replace_variants(client, sealed, src, peers, skip):
    warm = np.empty_like(src)
    warm.fill(1)
    out = []

    def versions(c, name, **kw):
        def put():
            c.put(name, src, replace=True, **kw)
        put.name = name
        put.client = c
        return put

    out.append(("recycled", versions(client, "bench/put/replace/recycled")))
    out.append(("sealed", versions(sealed, "bench/put/replace/sealed")))
    if takes_sealed(client):
        out.append(("sealed/kw", versions(client, "bench/put/replace/sealedkw", sealed=True)))

    def copyto():
        np.copyto(warm, src)

    out.append(("copyto", copyto))
    if "ray" in peers:
        import ray
        refs = []

        def rayput():
            refs.clear()   # the previous version's ObjectRef goes first
            refs.append(ray.put(src))

        rayput.refs = refs
        out.append(("ray", rayput))
    return [(n, f) for n, f in out if n not in skip]


def back_to_back(fn, k):
    """The median of k back-to-back calls, each timed alone, in seconds."""
    ts = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_replace(client, sealed, size, rounds, k, peers, skip, warmups=3):
    src = np.ones(size // 4, np.float32)
    vs = replace_variants(client, sealed, src, peers, skip)
    k = k or (20 if size <= 64 << 20 else 5)
    s0 = client.stats()
    for _, fn in vs:
        back_to_back(fn, warmups)
    times = {name: [] for name, _ in vs}
    for r in range(rounds):
        # A B C D, B C D A, ...: no variant always runs right after the same one
        # (the daemon's pool refills, the reserve maps ahead, in the next one's time).
        for name, fn in vs[r % len(vs):] + vs[:r % len(vs)]:
            times[name].append(back_to_back(fn, k))
    s1 = client.stats()
    med = {name: statistics.median(t) for name, t in times.items()}
    print("put --replace %s: one name, back to back (%d rounds x %d puts, medians of "
          "per-put medians)" % (human(size), rounds, k))
    for name, _ in vs:
        t = med[name]
        print("  %-10s %9.2f ms  %7.2f GB/s" % (name, t * 1e3, size / t / 1e9))
    if "recycled" in med:
        r = med["recycled"]
        rel = ["%.2fx %s" % (med[p] / r, p) for p in ("copyto", "ray", "sealed", "sealed/kw")
               if p in med]
        print("  recycled speed: " + ", ".join(rel) + " (their time / recycled's; > 1: "
              "recycled faster)")
    moved = {key: figure(s1, key) - figure(s0, key) for key in s1
             if "recycl" in key and isinstance(s1.get(key), (int, float))}
    if moved:
        print("  stats: " + ", ".join("%s +%d" % kv for kv in sorted(moved.items())))
    for _, fn in vs:  # untimed: the last versions go, before the next size
        if hasattr(fn, "name"):
            fn.client.unlink(fn.name)
        if hasattr(fn, "refs"):
            fn.refs.clear()
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--sizes", default=None, help="default 4K,64M,1G; with --replace 64M,1G")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle time before every timed call, the same for each variant")
    ap.add_argument("--skip", default="", help="variants to leave out, comma-separated")
    ap.add_argument("--vineyard-socket", default=os.environ.get("VINEYARD_IPC_SOCKET"))
    ap.add_argument("--without-reserve", action="store_true",
                    help="also time put and cfp on a client with TENSORD_RESERVE=0 (put/nr, "
                         "cfp/nr): the reserve's effect, A/B in the same rounds")
    ap.add_argument("--daemon-args", default="", help="extra tensord arguments")
    ap.add_argument("--replace", action="store_true",
                    help="back-to-back replace=True puts of one name: recycled, sealed "
                         "(TENSORD_RECYCLE=0), np.copyto, ray.put")
    ap.add_argument("--k", type=int, default=0,
                    help="--replace: puts per round (default 20 up to 64 MiB, 5 above)")
    args = ap.parse_args()
    if args.sizes is None:
        args.sizes = "64M,1G" if args.replace else "4K,64M,1G"
    skip = set(s for s in args.skip.split(",") if s)
    peers = find_peers(args.vineyard_socket)
    # The pool uses huge pages when this allows them ("advise" and up): a large
    # put then costs a lookup per 2 MiB instead of per 4 KiB (docs/design.md).
    cpus = os.sched_getaffinity(0)
    print("shmem_enabled: %s; CPUs: %s" % (shmem_policy(),
                                          "%d of %d" % (len(cpus), os.cpu_count())))
    with daemon_socket(args.socket, args.daemon_args.split()) as sock:
        if args.replace:
            if "TENSORD_RECYCLE" in os.environ:  # "recycled" then measures that setting
                print("note: TENSORD_RECYCLE=%s in this environment: recycled is not the default" %
                      os.environ["TENSORD_RECYCLE"])
            sealed = connect_env(sock, TENSORD_RECYCLE="0")
            with tensord.connect(sock) as c:
                for s in args.sizes.split(","):
                    bench_replace(c, sealed, parse_size(s), args.rounds, args.k, peers, skip)
            sealed.close()
            return
        plain = None
        if args.without_reserve:
            os.environ["TENSORD_RESERVE"] = "0"  # read when a client connects
            plain = tensord.connect(sock)
            del os.environ["TENSORD_RESERVE"]
        with tensord.connect(sock) as c:
            for s in args.sizes.split(","):
                bench_size(c, parse_size(s), args.rounds, peers, args.gap_ms / 1e3, skip, plain)
        if plain is not None:
            plain.close()


if __name__ == "__main__":
    main()
