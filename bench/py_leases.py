"""A million leases in one process, and the mappings they take.

Puts --tensors small tensors, then attaches them round-robin until
--leases leases are held, over as many connections as the per-connection
cap (262,144 leases) requires; prints the time per attach, the mappings
the process gained (/proc/self/maps lines; vm.max_map_count beside it) and
its peak RSS, then checks some bytes. Before leases shared clean mappings
(issue 22), each lease was a mapping and the process aborted near 65,000.

    PYTHONPATH=build/python python3 bench/py_leases.py [--leases 1000000] [--tensors 200]

--distinct N instead puts N distinct 8-byte tensors (slab tensors) and
leases each once, all held together (issue 32: a slab is mapped once per
client, and each lease points into it); beside it, the same process
attaching 10 fresh tensors at a time (the median of 200 such rounds). It
prints the time per attach of both (wall, and this process's CPU, which
a busy machine disturbs less), their ratios, and the mappings the N
leases gained. Every lease is the daemon's (TENSORD_BIND=0 unless set).

    PYTHONPATH=build/python python3 bench/py_leases.py --distinct 1000000
"""
import argparse
import os
import resource
import statistics
import time

import numpy as np

import tensord
from benchutil import daemon_socket

CAP = 262144


def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def distinct(sock, n):
    """N distinct tensors each leased once, beside rounds of 10."""
    rounds, small = 200, 10
    w = tensord.connect(sock)
    cs = [tensord.connect(sock) for _ in range((n + CAP - 1) // CAP)]
    t0 = time.perf_counter()
    for k in range(0, n, 10000):
        w.put_many({f"bench/distinct/{i}": np.full(1, i, np.int64)
                    for i in range(k, min(n, k + 10000))}, lifetime="connection")
    w.put_many({f"bench/ten/{i}": np.full(1, i, np.int64) for i in range(rounds * small)},
               lifetime="connection")
    put_s = time.perf_counter() - t0
    # Rounds of 10 fresh tensors, each leased once and released: the
    # process maps their slab once, as for the N below.
    per10, cpu10 = [], []
    for r in range(rounds):
        names = [f"bench/ten/{r * small + i}" for i in range(small)]
        t1, c1 = time.perf_counter(), time.process_time()
        ts = [cs[0].attach(x) for x in names]
        per10.append((time.perf_counter() - t1) / small)
        cpu10.append((time.process_time() - c1) / small)
        for t in ts:
            t.release()
    m0 = mappings()
    t1, c1 = time.perf_counter(), time.process_time()
    held = [cs[i // CAP].attach(f"bench/distinct/{i}") for i in range(n)]
    per_n = (time.perf_counter() - t1) / n
    cpu_n = (time.process_time() - c1) / n
    gained = mappings() - m0
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    ok = all(int(np.from_dlpack(held[j])[0]) == j for j in list(range(0, n, 997)) + [n - 1])
    ten, ten_cpu = statistics.median(per10), statistics.median(cpu10)
    print(f"py_leases --distinct: {n:,} distinct 8-byte tensors leased once each, held "
          f"together over {len(cs)} connections: {per_n * 1e6:.1f} us an attach "
          f"({cpu_n * 1e6:.1f} us of this process's CPU); 10 tensors: {ten * 1e6:.1f} us an "
          f"attach ({ten_cpu * 1e6:.1f} us CPU; medians of {rounds} rounds); ratio "
          f"{per_n / ten:.2f} ({cpu_n / ten_cpu:.2f} in CPU); mappings +{gained} "
          f"(vm.max_map_count {limit}); puts "
          f"{put_s:.1f} s; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
          f"bytes {'ok' if ok else 'WRONG'}")
    for t in held:
        t.release()
    for c in cs + [w]:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--leases", type=int, default=1000000)
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--distinct", type=int, default=0, metavar="N",
                    help="N distinct tensors, each leased once (see above)")
    args = ap.parse_args()
    if args.distinct:
        os.environ.setdefault("TENSORD_BIND", "0")
        with daemon_socket(args.socket) as sock:
            distinct(sock, args.distinct)
        return
    with daemon_socket(args.socket) as sock:
        cs = [tensord.connect(sock) for _ in range((args.leases + CAP - 1) // CAP)]
        for i in range(args.tensors):
            cs[0].put(f"bench/leases/{i}", np.full(64, i, np.float32), lifetime="connection")
        m0 = mappings()
        held = []
        t0 = time.perf_counter()
        for k in range(args.leases):
            held.append(cs[k // CAP].attach(f"bench/leases/{k % args.tensors}"))
        dt = time.perf_counter() - t0
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        ok = all(np.from_dlpack(held[j])[0] == j % args.tensors
                 for j in range(0, len(held), 997))
        print(f"py_leases: {len(held):,} leases of {args.tensors} tensors over {len(cs)} "
              f"connections: {dt / len(held) * 1e6:.1f} us an attach, mappings "
              f"+{mappings() - m0} (vm.max_map_count {limit}), peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
              f"bytes {'ok' if ok else 'WRONG'}")
        for t in held:
            t.release()
        for c in cs:
            c.close()


if __name__ == "__main__":
    main()
