"""tensord for asyncio: the same client, every call a coroutine.

    import asyncio, tensord.aio

    async def main():
        async with await tensord.aio.connect() as c:
            gen = await c.put("frame", array)
            t = await c.attach("frame", after=gen - 1)        # waits for a newer one
            async for ev in c.watch("frames/"):
                ...

Waits (attach with a timeout or after=, attach_many, watch) are driven by
the event loop itself: the connection's descriptor is registered with
loop.add_reader(), and each wait is an operation libtensord completes when
its answer is read. No thread waits; a thousand waits cost a thousand
small objects. Cancelling a task (or its timeout) cancels the wait in the
daemon. Calls that never wait (create, stat, transactions, small puts,
...) are one round trip each and run inline.

A put or put_many of OFFLOAD_BYTES (4 MiB) or more, whose copy would hold
the loop for as long as it takes (about 100 ms for 256 MiB), runs on a
worker thread of the client's (libtensord releases the GIL for the copy):
the loop goes on meanwhile. Calls are still made in the order they are
awaited: a call made while such a put runs waits for it first. A put
cancelled while it copies is not stopped: it ends on its thread as it
would have, publishing its whole version or nothing (a put never publishes
part of one); the cancelled await raises CancelledError at once, and the
client's next call waits for that put's end.

Waits and watches go on across a restart of the daemon (docs/restart.md,
"Clients carry on"), as the blocking client's do: a wait whose connection
was lost starts again over a new one with the time left (its after= kept
by a daemon of the same lineage, else dropped), a watch watches again;
while no daemon answers they try again on the loop's timers, pausing 10 ms
growing to 100 ms, for TENSORD_RECONNECT_MS (30 s) in all, then raise
NoDaemonError.

An AsyncClient owns its connection: use it from its event loop's thread.
"""
import asyncio
import concurrent.futures
import math
import os

from . import _tensord

__all__ = ["AsyncClient", "AsyncWatch", "connect", "OFFLOAD_BYTES"]

# Puts of at least this many bytes (a source whose size is not known without
# exporting it counts as large) copy on a worker thread. Below, the thread
# hop (about 0.2 ms, bench/py_aio.py) costs more than the copy holds the
# loop (0.4 ms for 4 MiB).
OFFLOAD_BYTES = 4 << 20


async def connect(path=None, *, name=None):
    """An AsyncClient connected to the daemon at path (None: the default),
    labelled name (tensord.connect())."""
    return AsyncClient(_tensord.connect(path, name=name))


def _seconds(timeout):
    return None if timeout is None or timeout == math.inf else timeout


def _nbytes(obj):
    """The bytes obj holds, or None when that is not known without exporting it."""
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int):
        return n
    try:
        with memoryview(obj) as m:
            return m.nbytes
    except TypeError:
        return None


def _resumed(fn, *args, **kwargs):
    """fn made again on the loop's worker: the write libtensord kept when it
    was lost on the loop's thread is asked about first (_thread_role(2))."""
    _tensord._thread_role(2)
    try:
        return fn(*args, **kwargs)
    finally:
        _tensord._thread_role(0)


def _large(n):
    return n is None or n >= OFFLOAD_BYTES


def _grace():
    """Seconds to go on reaching a daemon that went away (TENSORD_RECONNECT_MS)."""
    ms = os.environ.get("TENSORD_RECONNECT_MS")
    return (int(ms) if ms else 30000) / 1000


# A call that does not wait waits for a new daemon at most this long (a
# restart's time), as libtensord's own reads (TD_READ_RECONNECT_MS).
_READ_GRACE = 2.0


def _pause(tries):
    """The pause before connect attempt tries + 1: 10 ms growing to 100 ms, as libtensord's."""
    return (10 + 10 * tries if tries < 10 else 100) / 1000


class _Reconnect:
    """One wait's or watch's tries to reach a daemon again: the grace runs
    from the first failure to the next success."""

    def __init__(self, loop, most=None):
        self._loop = loop
        self._most = most     # the grace's bound in seconds, or None
        self._since = None
        self._tries = 0

    def ok(self):
        self._since, self._tries = None, 0

    async def pause(self, error, deadline=None):
        """Sleeps before the next try; raises error when the grace (or the
        wait's deadline) is over."""
        now = self._loop.time()
        if self._since is None:
            self._since = now
        grace = _grace() if self._most is None else min(_grace(), self._most)
        if now - self._since >= grace or (deadline is not None and now >= deadline):
            raise error
        delay = _pause(self._tries)
        self._tries += 1
        if deadline is not None:
            delay = min(delay, max(0.0, deadline - now))
        await asyncio.sleep(delay)


class AsyncClient:
    """A tensord.Client for asyncio. Awaitable methods mirror Client's."""

    def __init__(self, client):
        self._c = client
        self._loop = asyncio.get_running_loop()
        self._waits = {}       # op -> future, for the waits in flight
        self._watches = set()  # AsyncWatch objects with a reader registered
        self._reading = False
        self._fd = -1
        self._epoch = 0        # tensord_epoch() when self._fd was registered
        # Held from a call's start to its end while a put runs off the loop, and
        # by the calls queued behind it (asyncio.Lock wakes waiters in order).
        self._order = asyncio.Lock()
        self._worker = None    # the executor off-loop puts run on, made when needed

    # --- the reader ---------------------------------------------------------------------

    def _want_reader(self):
        """Reads the connection serving now: a new one after the daemon
        restarted (docs/restart.md, "Clients carry on"); none while no
        daemon answers (the waits and watches try again on timers)."""
        if self._c.closed:
            return
        fd = -1
        if not self._c._restart_state()[2]:     # lost: _connected() makes a new one
            try:
                fd = self._c.fileno()
            except ConnectionError:
                pass
        if self._reading and fd == self._fd:
            return
        self._drop_reader(force=True)
        if fd >= 0:
            self._fd = fd
            self._epoch = self._c._restart_state()[0]
            self._loop.add_reader(fd, self._readable)
            self._reading = True

    def _drop_reader(self, force=False):
        if self._reading and (force or (not self._waits and not self._watches)):
            try:
                self._loop.remove_reader(self._fd)
            except (ValueError, OSError):
                pass
            self._reading = False

    def _readable(self):
        try:
            self._c._poll()
        except BaseException as e:  # noqa: BLE001 -- the connection is gone: every wait fails
            # Each with its own answer when it has one (its connection's
            # error: the op and its hold on that connection end now), else e.
            self._settle()
            for op, fut in list(self._waits.items()):
                if not fut.done():
                    fut.set_exception(e)
            self._waits.clear()
            for w in list(self._watches):
                w._wake()
            # That descriptor is done with (a lost connection's reads at EOF forever).
            self._drop_reader(force=True)
            return
        self._settle()
        if self._reading and self._c._restart_state()[0] != self._epoch:
            # The read found the connection lost and went on over a new one:
            # the old descriptor reads at EOF forever.
            self._want_reader()

    def _settle(self):
        """Completes the futures of the operations answered (by any read)."""
        for op, fut in list(self._waits.items()):
            if not op.done:
                continue
            del self._waits[op]
            if fut.done():
                continue
            try:
                fut.set_result(op.result())
            except BaseException as e:  # noqa: BLE001 -- the wait's own error
                fut.set_exception(e)
        for w in list(self._watches):
            w._wake()
        self._drop_reader()

    async def _wait(self, op):
        fut = self._loop.create_future()
        self._waits[op] = fut
        self._want_reader()
        self._settle()  # answered already (read by an earlier call)?
        try:
            return await fut
        except asyncio.CancelledError:
            # The daemon drops the wait; what its answer brings is let go.
            self._waits.pop(op, None)
            op.cancel()
            self._drop_reader()
            raise

    async def _connected(self, retry=None):
        """Replaces a lost connection on a worker thread, never on the loop:
        connecting waits for the daemon's Hello, and a socket that a holder
        or systemd keeps through a restart accepts before any daemon serves
        it (for up to TENSORD_RECONNECT_MS). NoDaemonError when none
        answers; with retry (a _Reconnect), tries again on the loop's
        timers until its grace is over."""
        while not self._c.closed and self._c._restart_state()[2]:
            try:
                await self._loop.run_in_executor(None, self._c._reconnect)
            except _tensord.NoDaemonError as e:
                if retry is None:
                    raise
                await retry.pause(e)

    def _inline(self, fn, *args, **kwargs):
        """A call that never waits: one round trip, then whatever it read for others."""
        try:
            return fn(*args, **kwargs)
        finally:
            if self._waits or self._watches:
                self._settle()

    async def _call(self, fn, *args, **kwargs):
        """An inline call, made after the off-loop put in flight, if any,
        and over a connection made off the loop when the old one was lost."""
        await self._connected()
        if not self._order.locked():
            return self._inline(fn, *args, **kwargs)
        async with self._order:
            return self._inline(fn, *args, **kwargs)

    async def _read(self, fn, *args, **kwargs):
        """A call that changes nothing (stat, list, stats, a plain attach,
        ...), inline. libtensord sends it once more when the daemon goes
        away meanwhile; a connection lost before it is replaced here first,
        so that while no daemon answers the loop's timers wait for one (2 s
        at most, a restart's time, then NoDaemonError), not the call."""
        await self._connected(_Reconnect(self._loop, _READ_GRACE))
        return await self._call(fn, *args, **kwargs)

    async def _offload(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the client's worker thread, in the order of calls.

        The order lock is held until the thread's call ends, also when the
        await is cancelled before: the next call never overtakes it."""
        await self._order.acquire()
        try:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="tensord-aio")
            cf = self._worker.submit(fn, *args, **kwargs)
        except BaseException:
            self._order.release()
            raise
        loop = self._loop

        def over(_):
            try:
                loop.call_soon_threadsafe(self._offload_over)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        cf.add_done_callback(over)
        # Cancelling this await cancels cf only if it has not started (then
        # nothing was sent); a copy under way runs to its end.
        return await asyncio.wrap_future(cf, loop=loop)

    def _offload_over(self):
        self._order.release()
        if self._waits or self._watches:
            self._settle()  # the worker's reads may have answered waits

    # --- waits --------------------------------------------------------------------------

    def _gone(self, e, epoch):
        """Whether e says the daemon went away since epoch: nobody answers,
        or the connection was lost (not a daemon's answer about a peer)."""
        if isinstance(e, _tensord.NoDaemonError):
            return True
        if not isinstance(e, _tensord.ConnectionLostError):
            return False
        now, _, lost = self._c._restart_state()
        return now != epoch or lost

    async def _wait_on(self, start, what, after, timeout):
        """start(what, after, timeout) -> op, awaited on the loop. A wait
        whose daemon went away starts again over a new connection with the
        time left, its after= dropped unless the new daemon is of the same
        lineage (it restored the old one's generations and commit ids)."""
        loop = self._loop
        deadline = None if timeout is None else loop.time() + timeout
        epoch, lineage, _ = self._c._restart_state()
        retry = _Reconnect(loop)
        seen = epoch

        def begin():
            nonlocal seen, after
            self._c.fileno()    # the connection serving now: a new one after a loss
            seen, now_lineage, _ = self._c._restart_state()
            if seen != epoch and not (lineage and now_lineage == lineage):
                after = None    # the old daemon's: nothing to the new one
            left = None if deadline is None else max(0.0, deadline - loop.time())
            return start(what, after, left)

        while True:
            try:
                op = await self._call(begin)
                retry.ok()
                return await self._wait(op)
            except ConnectionError as e:
                if not self._gone(e, seen):
                    raise
                if isinstance(e, _tensord.NoDaemonError):
                    await retry.pause(e, deadline)
                elif deadline is not None and loop.time() >= deadline:
                    raise

    async def attach(self, name, timeout=None, *, after=None):
        """Client.attach(); with after= or a timeout the wait runs on the event loop."""
        if after is None and timeout is None:
            return await self._read(self._c.attach, name)
        t = _seconds(timeout)
        if after is None and t is not None and t <= 0:
            return await self._read(self._c.attach, name, 0)
        return await self._wait_on(self._c._attach_start, name, after, t)

    async def attach_many(self, names_or_prefix, *, after=None, timeout=None):
        """Client.attach_many(): a dict name -> Tensor, waiting on the event loop."""
        if after is None and timeout is None:
            return await self._read(self._c.attach_many, names_or_prefix)
        return await self._wait_on(self._c._attach_many_start, names_or_prefix, after,
                                   _seconds(timeout))

    def watch(self, prefix="", *, after=None, queue=None):
        """An async iterator of Event, live from when watch() returns. On a
        connection found lost, the watch begins once a new one is made, off
        the loop, on its first await (async with, next(), iteration): a
        daemon restarting serves nobody meanwhile."""
        kw = {} if queue is None else {"queue": queue}
        if not self._c.closed and self._c._restart_state()[2]:
            return AsyncWatch(self, None, lambda: self._c.watch(prefix, after=after, **kw))
        return AsyncWatch(self, self._inline(self._c.watch, prefix, after=after, **kw))

    # --- calls that never wait ------------------------------------------------------------

    async def put(self, name, obj, *args, **kwargs):
        """Client.put(); from OFFLOAD_BYTES up the copy runs off the loop."""
        if _large(_nbytes(obj)):
            return await self._offload(self._c.put, name, obj, *args, **kwargs)
        return await self._write(self._c.put, name, obj, *args, **kwargs)

    async def put_many(self, mapping, **kwargs):
        """Client.put_many(); from OFFLOAD_BYTES in all the copies run off the loop."""
        total = 0
        for v in mapping.values():
            n = _nbytes(v)
            total = None if n is None else total + n
            if _large(total):
                return await self._offload(self._c.put_many, mapping, **kwargs)
        return await self._write(self._c.put_many, mapping, **kwargs)

    def _inline_write(self, fn, *args, **kwargs):
        _tensord._thread_role(1)
        try:
            return self._inline(fn, *args, **kwargs)
        finally:
            _tensord._thread_role(0)

    async def _write(self, fn, *args, **kwargs):
        """A write inline, as _call(). One whose connection is lost under it
        never reconnects on the loop (libtensord keeps it: _thread_role()):
        made again on the worker thread, it reconnects there, asks the
        daemon whether it took effect, and returns its result or does it
        again, never twice (docs/restart.md, section 5)."""
        epoch = self._c._restart_state()[0]
        try:
            return await self._call(self._inline_write, fn, *args, **kwargs)
        except _tensord.ConnectionLostError as e:
            if not self._gone(e, epoch):
                raise
        return await self._offload(_resumed, fn, *args, **kwargs)

    async def put_file(self, *args, **kwargs):
        """Client.put_file() on a worker thread: reading a checkpoint never holds the loop."""
        return await self._in_thread(self._c.put_file, *args, **kwargs)

    async def get_file(self, *args, **kwargs):
        """Client.get_file() on a worker thread: writing the file never holds the loop."""
        return await self._in_thread(self._c.get_file, *args, **kwargs)

    async def _in_thread(self, fn, *args, **kwargs):
        # libtensord takes calls from several threads on one client; what the
        # call read for this loop's waits is handed over here, on its thread.
        try:
            return await self._loop.run_in_executor(None, lambda: fn(*args, **kwargs))
        finally:
            if self._waits or self._watches:
                self._settle()

    async def create(self, *args, **kwargs):
        return await self._call(self._c.create, *args, **kwargs)

    async def stat(self, *args, **kwargs):
        return await self._read(self._c.stat, *args, **kwargs)

    async def list(self, *args, **kwargs):
        return await self._read(self._c.list, *args, **kwargs)

    async def unlink(self, *args, **kwargs):
        return await self._write(self._c.unlink, *args, **kwargs)

    async def stats(self):
        return await self._read(self._c.stats)

    async def leases(self, *args, **kwargs):
        return await self._read(self._c.leases, *args, **kwargs)

    async def clients(self):
        return await self._read(self._c.clients)

    async def metrics(self):
        return await self._read(self._c.metrics)

    def transaction(self):
        """A Transaction (its calls are single round trips: use them as is)."""
        return self._inline(self._c.transaction)

    @property
    def client(self):
        """The blocking Client underneath (same connection)."""
        return self._c

    @property
    def closed(self):
        return self._c.closed

    async def close(self):
        if self._order.locked():
            async with self._order:  # a put off the loop ends first
                pass
        if self._worker is not None:
            self._worker.shutdown(wait=False)
            self._worker = None
        for op, fut in list(self._waits.items()):
            op.cancel()
            if not fut.done():
                fut.cancel()
        self._waits.clear()
        for w in list(self._watches):
            w._close_now()
        self._drop_reader()
        self._c.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncWatch:
    """Client.watch() as an async iterator; also an async context manager."""

    def __init__(self, client, watch, begin=None):
        self._ac = client
        self._w = watch
        self._begin = begin    # makes the watch, once connected (watch() on a lost one)
        self._event = asyncio.Event()
        self._retry = _Reconnect(client._loop)   # a new connection while none answers
        client._watches.add(self)
        if watch is not None:
            client._want_reader()

    async def _started(self):
        """Begins a watch made on a lost connection: a new connection off
        the loop (on timers while none answers), then the watch request."""
        while self._begin is not None:
            try:
                await self._ac._connected()
            except _tensord.NoDaemonError as e:
                await self._retry.pause(e)
                continue
            begin, self._begin = self._begin, None
            self._w = self._ac._inline(begin)
            self._retry.ok()
            self._ac._want_reader()

    def _wake(self):
        self._event.set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        await self._started()
        if self._w is None:
            raise StopAsyncIteration
        while True:
            if self._w._fileno() < 0:
                # Its connection was lost: a new one, made off the loop,
                # and on timers while no daemon answers (NoDaemonError
                # past TENSORD_RECONNECT_MS).
                try:
                    await self._ac._connected()
                except _tensord.NoDaemonError as e:
                    await self._retry.pause(e)
                if self._w is None:
                    raise StopAsyncIteration
            # What was read already, or what the socket holds; after a
            # restart, watching again over the new connection first.
            ev = self._w._poll()
            self._ac._settle()
            if ev is not None:
                return ev
            if self._w._fileno() < 0:
                await asyncio.sleep(_pause(0))  # not watching again yet: never a busy loop
                continue
            self._retry.ok()
            self._ac._want_reader()
            self._event.clear()
            await self._event.wait()
            if self._w is None:
                raise StopAsyncIteration

    async def next(self, timeout=None):
        """The next Event, waiting up to timeout seconds (TimeoutError after)."""
        return await asyncio.wait_for(self.__anext__(), _seconds(timeout))

    def _close_now(self):
        w, self._w, self._begin = self._w, None, None
        self._ac._watches.discard(self)
        self._event.set()
        if w is not None:
            w.close()

    async def close(self):
        self._close_now()
        self._ac._drop_reader()

    async def __aenter__(self):
        await self._started()
        return self

    async def __aexit__(self, *exc):
        await self.close()
