"""tensord.aio's waits, watches and reads across a daemon's restart
(docs/restart.md, section 5): they go on, on the event loop, and give up
with a ConnectionError when no daemon comes back."""
import asyncio
import os
import signal
import time

import numpy as np
import pytest

import tensord
from reconnect_harness import restart, rd, BOTH, lineage  # noqa: F401 (rd: a fixture)


@BOTH
def test_aio_waits_go_on_across_a_restart(rd):
    """attach(after=), attach(timeout=) and attach_many(after=) waiting on
    a real asyncio loop while the daemon is killed and, 0.3 s later,
    started again: they wait on over a new connection and get the new
    daemon's versions; the loop runs throughout."""
    import asyncio
    import tensord.aio

    async def main():
        async with await tensord.aio.connect(rd.socket) as ac:
            gen = await ac.put("a/x", np.zeros(4))
            commit = await ac.put_many({"a/s1": np.zeros(4), "a/s2": np.zeros(4)})
            one = asyncio.ensure_future(ac.attach("a/x", after=gen))
            late = asyncio.ensure_future(ac.attach("a/late", timeout=60))
            many = asyncio.ensure_future(ac.attach_many(["a/s1", "a/s2"], after=commit,
                                                        timeout=60))
            for _ in range(500):
                if (await ac.stats())["waiters"] == 3:
                    break
                await asyncio.sleep(0.01)
            assert (await ac.stats())["waiters"] == 3
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1
            tk = asyncio.ensure_future(ticker())
            await asyncio.to_thread(restart, rd, 0.3)
            assert ticks > 10, "the loop ran while the daemon was away"
            await asyncio.sleep(0.3)        # the waits are the new daemon's
            assert not any(f.done() for f in (one, late, many)), (one, late, many)
            with tensord.connect(rd.socket) as w:
                w.put("a/x", np.full(4, 2.0), replace=True)
                w.put_many({"a/s1": np.full(4, 2.0), "a/s2": np.full(4, 2.0)}, replace=True)
                w.put("a/late", np.full(4, 3.0))
            t1, t2, s = await asyncio.wait_for(asyncio.gather(one, late, many), 30)
            tk.cancel()
            assert float(np.from_dlpack(t1)[0]) == 2.0
            assert float(np.from_dlpack(t2)[0]) == 3.0
            assert {n: float(np.from_dlpack(t)[0]) for n, t in s.items()} == \
                {"a/s1": 2.0, "a/s2": 2.0}
            for t in (t1, t2, *s.values()):
                t.release()
    asyncio.run(asyncio.wait_for(main(), 120))


@BOTH
def test_aio_watch_goes_on_across_a_restart(rd):
    import asyncio
    import tensord.aio

    async def main():
        async with await tensord.aio.connect(rd.socket) as ac:
            seen = []
            async with ac.watch("aw/") as w:
                await ac.put("aw/a", np.zeros(4))
                ev = await w.next(timeout=10)
                seen.append((ev.kind, ev.name))
                old = lineage(ac.client)
                nxt = asyncio.ensure_future(w.next(timeout=30))
                await asyncio.to_thread(restart, rd, 0.3)
                with tensord.connect(rd.socket) as p:
                    p.put("aw/b", np.zeros(4))
                ev = await nxt
                seen.append((ev.kind, ev.name))
                assert ev.kind == ("lagged" if lineage(ac.client) == old else "restarted"), seen
                ev = await w.next(timeout=10)
                seen.append((ev.kind, ev.name))
            assert seen[0] == ("published", "aw/a") and seen[-1] == ("published", "aw/b"), seen
    asyncio.run(asyncio.wait_for(main(), 120))


def test_aio_wait_gives_up_when_no_daemon_comes_back(rd):
    import asyncio
    import tensord.aio

    async def main():
        async with await tensord.aio.connect(rd.socket) as ac:
            gen = await ac.put("g/x", np.zeros(4))
            wait = asyncio.ensure_future(ac.attach("g/x", after=gen))
            await asyncio.sleep(0.2)
            rd.proc.send_signal(signal.SIGKILL)
            rd.proc.wait()
            t0 = time.monotonic()
            with pytest.raises(tensord.NoDaemonError):
                await asyncio.wait_for(wait, 30)
            assert time.monotonic() - t0 < 5
    os.environ["TENSORD_RECONNECT_MS"] = "300"
    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        del os.environ["TENSORD_RECONNECT_MS"]
        rd.log.close()
        rd.start()


def test_aio_reads_wait_for_a_daemon_on_the_loop(rd):
    """An AsyncClient's list() whose daemon is gone waits for a new one on
    the loop's timers: the loop runs on (here it starts the daemon), and
    the list returns."""
    import asyncio
    import tensord.aio

    async def main():
        async with await tensord.aio.connect(rd.socket) as ac:
            await ac.put("x", np.zeros(4))
            rd.proc.send_signal(signal.SIGKILL)
            rd.proc.wait()
            rd.log.close()
            ls = asyncio.ensure_future(ac.list())
            await asyncio.sleep(0.3)
            assert not ls.done(), ls
            await asyncio.to_thread(rd.start)
            assert isinstance(await asyncio.wait_for(ls, 10), list)
            assert isinstance(await ac.stats(), dict)
    asyncio.run(asyncio.wait_for(main(), 60))


@BOTH
def test_aio_watch_made_while_the_daemon_is_away_leaves_the_loop_free(rd):
    """watch() on a connection found lost returns at once (before, it
    connected on the loop's thread: a NoDaemonError at once on a plain
    socket, the loop held until a daemon answered on one a holder keeps);
    the watch begins at its first await, once the daemon is back, and sees
    what is published after."""
    import threading
    import tensord.aio

    async def main():
        async with await tensord.aio.connect(rd.socket) as ac:
            gen = await ac.put("wp/x", np.zeros(4))
            wait = asyncio.ensure_future(ac.attach("wp/x", after=gen, timeout=60))
            await asyncio.sleep(0.1)
            rd.proc.send_signal(signal.SIGKILL)
            rd.proc.wait()
            rd.log.close()
            for _ in range(500):
                if ac.client._restart_state()[2]:
                    break
                await asyncio.sleep(0.01)
            assert ac.client._restart_state()[2], "the loss was not seen"
            back = threading.Timer(1.0, rd.start)
            back.start()
            try:
                t0 = time.monotonic()
                w = ac.watch("wp/")
                assert time.monotonic() - t0 < 0.5, "watch() held the loop"
                async with w:
                    back.join()
                    with tensord.connect(rd.socket) as p:
                        p.put("wp/a", np.ones(4))
                    ev = await w.next(timeout=10)
                    assert (ev.kind, ev.name) == ("published", "wp/a"), ev
            finally:
                # Started before the fixture stops it, also when the test failed.
                back.join()
            wait.cancel()
    asyncio.run(asyncio.wait_for(main(), 60))
