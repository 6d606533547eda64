"""tensord.aio: what a put costs its caller and how long it holds the event loop,
inline (the copy on the loop's thread) next to offloaded (on the client's
worker thread), per size. Picks tensord.aio.OFFLOAD_BYTES: below it the
thread hop costs more than the copy holds the loop.

    python3 bench/py_aio.py [--socket PATH] [--sizes 64K,256K,1M,4M,64M,256M] [--rounds 9]

Medians of interleaved rounds (inline, offloaded, inline, ...) of
replace=True puts of one name, 2 ms apart; "stall" is the longest gap a
1 ms ticker task saw between its ticks (so at least 1 ms)."""
import argparse
import asyncio
import statistics
import time

import numpy as np

import tensord.aio
from benchutil import daemon_socket

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(s):
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def label(n):
    for u in "GMK":
        if n >= UNITS[u] and n % UNITS[u] == 0:
            return "%d %siB" % (n // UNITS[u], u)
    return "%d B" % n


async def one(ac, a, offload, reps):
    """(seconds a put, longest loop stall in seconds) over reps puts."""
    tensord.aio.OFFLOAD_BYTES = 0 if offload else 1 << 62
    loop = asyncio.get_running_loop()
    ticks, running = [], True

    async def ticker():
        while running:
            ticks.append(loop.time())
            await asyncio.sleep(0.001)

    t = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    took = []
    t0 = loop.time()
    for _ in range(reps):
        start = time.perf_counter()
        await ac.put("bench/aio", a, replace=True)
        took.append(time.perf_counter() - start)
        await asyncio.sleep(0.002)  # the ticker runs between puts
    t1 = loop.time()
    running = False
    await t
    points = [t0] + [x for x in ticks if t0 < x < t1] + [t1]
    return statistics.median(took), max(b - x for x, b in zip(points, points[1:]))


async def main(args):
    with daemon_socket(args.socket) as sock:
        async with await tensord.aio.connect(sock) as ac:
            print("py_aio: await put(replace=True), medians of %d interleaved rounds"
                  % args.rounds)
            print("  %-9s %12s %12s %14s %14s" % ("size", "inline us", "offload us",
                                                 "inline stall", "offload stall"))
            for n in [size(s) for s in args.sizes.split(",")]:
                a = np.ones(n, np.uint8)
                reps = max(2, min(20, (64 << 20) // n))
                got = {True: [], False: []}
                await one(ac, a, True, 1)  # warm: the worker thread, recycled memory
                for _ in range(args.rounds):
                    for off in (False, True):
                        got[off].append(await one(ac, a, off, reps))
                med = {off: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
                       for off, v in got.items()}
                print("  %-9s %12.1f %12.1f %11.2f ms %11.2f ms"
                      % (label(n), med[False][0] * 1e6, med[True][0] * 1e6,
                         med[False][1] * 1e3, med[True][1] * 1e3))
            await ac.unlink("bench/aio")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket")
    p.add_argument("--sizes", default="64K,256K,1M,4M,64M,256M")
    p.add_argument("--rounds", type=int, default=9)
    asyncio.run(main(p.parse_args()))
