"""A million leases in one process, and the mappings they take.

Puts --tensors small tensors, then attaches them round-robin until
--leases leases are held, over as many connections as the per-connection
cap (262,144 leases) requires; prints the time per attach, the mappings
the process gained (/proc/self/maps lines; vm.max_map_count beside it) and
its peak RSS, then checks some bytes. Before leases shared clean mappings
(issue 22), each lease was a mapping and the process aborted near 65,000.

    PYTHONPATH=build/python python3 bench/py_leases.py [--leases 1000000] [--tensors 200]
"""
import argparse
import os
import resource
import time

import numpy as np

import tensord
from benchutil import daemon_socket

CAP = 262144


def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--leases", type=int, default=1000000)
    ap.add_argument("--tensors", type=int, default=200)
    args = ap.parse_args()
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
