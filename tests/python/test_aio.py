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
