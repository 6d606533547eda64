"""The loop stays free while the GPU worker allocates.

Runs the daemon built over the unit tests' fake GPU driver
(build/tests/helpers/tensord-fakegpu), where each cuMemCreate takes
--alloc-ms (400). One client creates a cuda:0 tensor; another makes stats
round trips until that create is answered. Baseline in the same run: the
same round trips with no allocation in flight, for as long. Rounds
interleave (A B A B); the figures are medians over rounds of each round's
slowest and median round trip, and their ratio to the baseline. A daemon
that allocated on its loop (before 2026-11-24) showed a slowest round trip
of the whole allocation time.

    python3 bench/py_gpu_async.py [--rounds 7] [--alloc-ms 400]
"""
import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from hostile import F_CREATE, Raw, create_body, frame, request, stats_req  # noqa: E402


def start(tmp, alloc_ms):
    build = os.environ.get("TENSORD_BUILD") or os.path.join(HERE, "..", "build")
    binary = os.path.join(build, "tests", "helpers", "tensord-fakegpu")
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: run make all")
    sock = os.path.join(tmp, "tensord.sock")
    r, w = os.pipe()
    p = subprocess.Popen([binary, "--socket", sock, "--ready-fd", str(w), "--log-level", "warn"],
                         pass_fds=(w,), env=dict(os.environ, TENSORD_FAKE_ALLOC_MS=str(alloc_ms)),
                         stderr=subprocess.DEVNULL)
    os.close(w)
    if os.read(r, 1) != b"R":
        sys.exit("tensord-fakegpu did not start")
    os.close(r)
    return p, sock


def round_trips(b, until):
    """Stats round trips on b until until() is true; their durations."""
    rtts = []
    while not until():
        t0 = time.perf_counter()
        r = b.call(stats_req(9))
        rtts.append(time.perf_counter() - t0)
        assert r.status == 0, r
    return rtts


def during(sock, i):
    a, b = Raw(sock), Raw(sock)
    a.hello()
    b.hello()
    a.send(frame(request(5, F_CREATE, create_body(f"bench/g{i}", [256], device=(2, 0)))))
    t0 = time.perf_counter()
    rtts = round_trips(b, lambda: select.select([a.sock], [], [], 0)[0])
    took = time.perf_counter() - t0
    assert a.reply().status == 0
    a.close()
    b.close()
    return rtts, took


def idle(sock, seconds):
    b = Raw(sock)
    b.hello()
    end = time.perf_counter() + seconds
    rtts = round_trips(b, lambda: time.perf_counter() >= end)
    b.close()
    return rtts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--alloc-ms", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        p, sock = start(tmp, args.alloc_ms)
        try:
            base, busy = [], []
            for i in range(args.rounds):
                base.append(idle(sock, args.alloc_ms / 1e3))
                rtts, _ = during(sock, i)
                busy.append(rtts)
        finally:
            p.terminate()
            p.wait()

    def med(rounds, f):
        return statistics.median(f(r) for r in rounds) * 1e6

    b_max, d_max = med(base, max), med(busy, max)
    b_med, d_med = med(base, statistics.median), med(busy, statistics.median)
    print(f"stats round trips while a cuda:0 create allocates for {args.alloc_ms} ms "
          f"(fake driver), medians of {args.rounds} rounds:")
    print(f"  idle baseline:    median {b_med:8.1f} us, slowest {b_max:9.1f} us")
    print(f"  during the alloc: median {d_med:8.1f} us, slowest {d_max:9.1f} us "
          f"({d_med / b_med:.2f}x / {d_max / b_max:.2f}x the baseline)")


if __name__ == "__main__":
    main()
