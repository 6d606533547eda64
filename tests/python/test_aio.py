"""tensord.aio: an AsyncClient whose waits run on the asyncio event loop
through the client's socket, with no thread per wait, and whose
cancellations remove the daemon's waiters."""
import asyncio
import os
import threading

import numpy as np
import pytest

import tensord
import tensord.aio


def threads():
    """OS threads of this process (Python's and libtensord's)."""
    return len(os.listdir("/proc/self/task"))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def stats_until(ac, pred, timeout=30.0):
    """Polls ac.stats() until pred(stats) holds or timeout seconds passed;
    returns the last stats."""
    end = asyncio.get_running_loop().time() + timeout
    while True:
        st = await ac.stats()
        if pred(st) or asyncio.get_running_loop().time() > end:
            return st
        await asyncio.sleep(0.01)


def my_watches(st):
    return sum(u.get("uid_watches", 0) for u in st["uids"] if u["uid"] == os.geteuid())


def test_a_thousand_waits_on_one_client_without_threads(daemon):
    async def main():
        async with await tensord.aio.connect(daemon.socket) as ac:
            gens = {}
            for i in range(10):
                gens[i] = await ac.put(f"aio/{i}", np.full(4, 0, np.int64))
            before = threads()
            waits = [asyncio.ensure_future(ac.attach(f"aio/{i % 10}", after=gens[i % 10]))
                     for i in range(1000)]
            # Every wait reached the daemon (not slept on: a slow start passed unseen).
            st = await stats_until(ac, lambda s: s["waiters"] == 1000)
            assert st["waiters"] == 1000, st["waiters"]
            assert threads() == before, "no thread per wait"
            assert not any(w.done() for w in waits)
            st = await ac.stats()
            assert st["waiters"] == 1000, st["waiters"]
            # One commit of all ten names answers every wait.
            with tensord.connect(daemon.socket) as writer:
                writer.put_many({f"aio/{i}": np.full(4, 1, np.int64) for i in range(10)},
                                replace=True)
            got = await asyncio.gather(*waits)
            assert all(np.from_dlpack(t)[0] == 1 and t.generation == 2 for t in got)
            for t in got:
                t.release()
            assert threads() == before
            assert (await ac.stats())["waiters"] == 0
    run(main())


def test_cancelling_a_wait_removes_it_from_the_daemon(daemon):
    async def main():
        async with await tensord.aio.connect(daemon.socket) as ac:
            gen = await ac.put("cx/a", np.zeros(4))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ac.attach("cx/a", after=gen), 0.3)
            task = asyncio.ensure_future(ac.attach_many(["cx/a", "cx/never"], timeout=60))
            st = await stats_until(ac, lambda s: s["waiters"] == 1)
            assert st["waiters"] == 1, st["waiters"]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(50):
                if (await ac.stats())["waiters"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await ac.stats())["waiters"] == 0
            # The connection is still good, and a wait after still works.
            gen2 = await ac.put("cx/a", np.ones(4), replace=True)
            t = await ac.attach("cx/a", after=gen, timeout=5)
            assert t.generation == gen2
            t.release()
    run(main())


def test_attach_many_and_watch_on_the_loop(daemon):
    async def main():
        async with await tensord.aio.connect(daemon.socket) as ac:
            c1 = await ac.put_many({"aw/a": np.zeros(4), "aw/b": np.zeros(4)})
            seen = []

            async def watcher():
                async with ac.watch("aw/") as w:
                    async for ev in w:
                        seen.append((ev.kind, ev.name))
                        if len(seen) == 3:
                            return

            wt = asyncio.ensure_future(watcher())
            nxt = asyncio.ensure_future(ac.attach_many("aw/", after=c1))
            # The watch and the wait are the daemon's before the writes.
            st = await stats_until(ac, lambda s: s["waiters"] == 1 and my_watches(s) == 1)
            assert st["waiters"] == 1 and my_watches(st) == 1, st

            def write():
                with tensord.connect(daemon.socket) as c:
                    c.put_many({"aw/a": np.ones(4), "aw/b": np.ones(4)}, replace=True)
                    c.unlink("aw/b")

            th = threading.Thread(target=write)
            th.start()
            s = await nxt
            await asyncio.wait_for(wt, 30)
            th.join()
            assert set(s) <= {"aw/a", "aw/b"} and "aw/a" in s
            assert all(t.commit > c1 for t in s.values())
            for t in s.values():
                t.release()
            assert seen == [("published", "aw/a"), ("published", "aw/b"),
                            ("unlinked", "aw/b")]
    run(main())


# --- large puts off the loop ------------------------------------------------------------------

BIG = 256 << 20


class Source:
    """A numpy array as a DLPack producer that says when its export ran, and on
    which thread (the put's copy starts right after)."""

    def __init__(self, array, loop, started):
        self.a, self.nbytes = array, array.nbytes
        self.loop, self.started, self.thread = loop, started, None

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.thread = threading.get_ident()
        self.loop.call_soon_threadsafe(self.started.set)
        return self.a.__dlpack__(**kw)


async def ticking(loop, during):
    """Runs during(); returns (its result, the loop times a 1 ms ticker ran at
    while it ran, the longest time the loop was held, in seconds)."""
    ticks, running = [], True

    async def ticker():
        while running:
            ticks.append(loop.time())
            await asyncio.sleep(0.001)

    t = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    start = loop.time()
    try:
        r = await during()
    finally:
        end = loop.time()
        running = False
        await t
    inside = [x for x in ticks if start < x < end]
    points = [start] + inside + [end]
    return r, inside, max(b - a for a, b in zip(points, points[1:]))


@pytest.mark.parametrize("offload", [True, False], ids=["offloaded", "inline"])
@pytest.mark.parametrize("call", ["put", "put_many"])
def test_a_256_mib_put_copies_off_the_loop(daemon, monkeypatch, offload, call):
    big = np.arange(BIG // 8, dtype=np.int64)
    if not offload:  # as before: the copy holds the loop for its whole length
        monkeypatch.setattr(tensord.aio, "OFFLOAD_BYTES", 1 << 62)

    async def main():
        loop = asyncio.get_running_loop()
        async with await tensord.aio.connect(daemon.socket) as ac:
            if call == "put":
                src = Source(big, loop, asyncio.Event())
                put = lambda: ac.put("stall/x", src)  # noqa: E731
            else:
                parts = {f"stall/{i}": big[i * (BIG // 32):(i + 1) * (BIG // 32)]
                         for i in range(4)}
                put = lambda: ac.put_many(parts)  # noqa: E731
            r, inside, stall = await ticking(loop, put)
            print(f"\n{call} of {BIG >> 20} MiB, {'offloaded' if offload else 'inline'}: "
                  f"the loop ran {len(inside)} times during it, longest stall "
                  f"{stall * 1e3:.1f} ms")
            if offload:
                # The loop went on while the copy ran; never on a loaded VM < 3.
                assert len(inside) >= 3, (len(inside), stall)
                if call == "put":
                    assert src.thread != threading.get_ident()
            else:
                assert inside == []
                if call == "put":
                    assert src.thread == threading.get_ident()
            if call == "put":
                assert r == 1
                t = await ac.attach("stall/x")
                assert np.array_equal(np.from_dlpack(t), big)
            else:
                s = await ac.attach_many("stall/")
                assert all(np.array_equal(np.from_dlpack(s[k]), v) for k, v in parts.items())
                t = s.popitem()[1]
                for x in s.values():
                    x.release()
            t.release()
    run(main())


def test_small_puts_stay_on_the_loop_thread(daemon):
    async def main():
        loop = asyncio.get_running_loop()
        async with await tensord.aio.connect(daemon.socket) as ac:
            before = threads()
            src = Source(np.ones(tensord.aio.OFFLOAD_BYTES // 8 - 1), loop, asyncio.Event())
            await ac.put("small/x", src)
            assert src.thread == threading.get_ident()
            await ac.put_many({f"small/{i}": np.ones(1024) for i in range(8)})
            assert threads() == before, "no worker thread for small puts"
            # One byte more is copied off the loop, on a thread of the client's.
            workers = set()
            for name in ("small/y", "small/z"):
                src = Source(np.ones(tensord.aio.OFFLOAD_BYTES // 8), loop, asyncio.Event())
                await ac.put(name, src)
                workers.add(src.thread)
            assert threading.get_ident() not in workers
            assert len(workers) == 1, "one worker thread a client"
    run(main())


def test_calls_keep_their_order_behind_an_offloaded_put(daemon):
    big = np.full(BIG // 8, 7, np.int64)

    async def main():
        async with await tensord.aio.connect(daemon.socket) as ac:
            first = asyncio.ensure_future(ac.put("ord/x", big))
            # Made while the big put copies: each sees what it would have inline.
            seen = asyncio.ensure_future(ac.stat("ord/x"))
            second = asyncio.ensure_future(ac.put("ord/x", np.zeros(4, np.int64), replace=True))
            attached = asyncio.ensure_future(ac.attach("ord/x"))
            assert await first == 1
            assert (await seen).nbytes == big.nbytes
            assert await second == 2
            t = await attached
            assert t.generation == 2 and list(np.from_dlpack(t)) == [0] * 4
            t.release()
            # An offloaded put's error is the await's, and the client goes on.
            with pytest.raises(tensord.ExistsError, match="ord/x"):
                await ac.put("ord/x", big)
            assert (await ac.stat("ord/x")).generation == 2
    run(main())


def test_a_cancelled_put_publishes_its_whole_version_or_nothing(daemon):
    big = np.full(BIG // 8, 3, np.int64)

    async def main():
        loop = asyncio.get_running_loop()
        async with await tensord.aio.connect(daemon.socket) as ac:
            # Cancelled while it copies: it ends on its thread, the whole version.
            src = Source(big, loop, asyncio.Event())
            copying = asyncio.ensure_future(ac.put("cancel/x", src))
            await src.started.wait()
            # Cancelled while queued behind it: never sent.
            queued = asyncio.ensure_future(ac.put("cancel/y", big))
            await asyncio.sleep(0)
            copying.cancel()
            queued.cancel()
            for task in (copying, queued):
                with pytest.raises(asyncio.CancelledError):
                    await task
            # The next call waits for the copy that was under way.
            st = await ac.stat("cancel/x")
            assert st.generation == 1 and st.nbytes == big.nbytes
            t = await ac.attach("cancel/x")
            assert np.array_equal(np.from_dlpack(t), big)
            t.release()
            with pytest.raises(tensord.NotFoundError):
                await ac.stat("cancel/y")
    run(main())
