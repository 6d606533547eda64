"""A client outlives its daemon's restart (docs/restart.md, "Clients carry
on"; issue 33, the client's half): what it attached stays readable, its
next request connects anew, a request in flight when the daemon goes
raises a ConnectionError, never hangs, and waits go on across the restart.
Tensors do not survive the restart yet: the tests publish again."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import tensord
from tdutil import wait_until


def restart(d, down_s=0.0):
    """kill -9 of daemon d, then a new one on the same socket after down_s."""
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    time.sleep(down_s)
    d.start()


@pytest.fixture
def rd(request, daemon_factory, tmp_path):
    """The daemon restart() kills and starts again: a plain one, which comes
    back empty (another lineage), or with BOTH also one that comes back
    through a holder (tensord --hold, docs/restart.md) with its tensors,
    generations and commit ids (the same lineage)."""
    if getattr(request, "param", "empty") == "empty":
        yield daemon_factory(sub="r")
        return
    import subprocess
    from sdharness import build_path
    hold = tmp_path / "hold"
    with open(tmp_path / "holder.log", "ab") as log:
        holder = subprocess.Popen([build_path("tensord"), "--hold", str(hold)], stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: (hold / "take").exists(), timeout=10), "no holder"
        d = daemon_factory("--holder", str(hold), sub="r")
        yield d
        d.stop()
    finally:
        holder.terminate()
        assert holder.wait(timeout=30) == 0


# Tests that hold whichever daemon comes back: run with both.
BOTH = pytest.mark.parametrize("rd", ["empty", "restored"], indirect=True)


def test_a_client_carries_on_after_a_restart(rd):
    c = tensord.connect(rd.socket, name="carry-on")
    a = np.arange(1 << 18, dtype=np.int32)          # 1 MiB: memory of its own
    c.put("x", a)
    c.put("small", np.arange(8))                    # a slab
    t = c.attach("x")
    x = np.from_dlpack(t)
    for _ in range(3):
        c.attach("small").release()                 # bound: served without asking
    restart(rd)
    # What it attached never depended on the daemon.
    assert (x == a).all()
    # The next request connects anew (no ConnectionError), under its label.
    assert wait_until(lambda: "x" not in [i.name for i in c.list()], timeout=5)
    assert [i.label for i in c.clients()] == ["carry-on"]
    c.put("x", a + 1)
    with c.attach("x") as t2:
        assert (np.from_dlpack(t2) == a + 1).all()
    # The old daemon's binding of "small" serves nothing any more.
    with pytest.raises(tensord.NotFoundError):
        c.attach("small")
    del x
    t.release()                                     # to a connection that is gone: nothing
    c.close()
    with pytest.raises(ValueError):
        c.put("y", a)


def test_a_request_in_flight_raises_a_connection_error(rd):
    c = tensord.connect(rd.socket)
    got = []

    def waiter():
        try:
            c.attach("never", timeout=60)
        except BaseException as e:      # noqa: BLE001 -- what it raised is the point
            got.append(e)
    os.environ["TENSORD_RECONNECT_MS"] = "300"
    try:
        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.3)     # the attach waits in the daemon (or is about to)
        rd.proc.send_signal(signal.SIGKILL)     # and no daemon comes back
        rd.proc.wait()
        th.join(30)
        assert not th.is_alive()
        assert len(got) == 1 and isinstance(got[0], ConnectionError), got
        assert isinstance(got[0], tensord.Error)
        # No daemon: the next request says so, as a ConnectionError too.
        with pytest.raises(tensord.NoDaemonError):
            c.put("x", np.zeros(4))
    finally:
        del os.environ["TENSORD_RECONNECT_MS"]
        rd.log.close()
        rd.start()
    c.put("x", np.zeros(4))     # and once one is back, the same client works
    c.close()


@BOTH
def test_waits_go_on_across_a_restart(rd):
    w = tensord.connect(rd.socket)
    r = tensord.connect(rd.socket)
    commit = w.put_many({"s/a": np.zeros(4), "s/b": np.zeros(4)})
    got = {}

    def reader():
        try:
            s = r.attach_many(["s/a", "s/b"], after=commit, timeout=60)
            got["set"] = {n: float(np.from_dlpack(t)[0]) for n, t in s.items()}
        except BaseException as e:      # noqa: BLE001
            got["error"] = e

    def single():
        try:
            with r.attach("late", timeout=60) as t:
                got["late"] = float(np.from_dlpack(t)[0])
        except BaseException as e:      # noqa: BLE001
            got["late-error"] = e
    th = [threading.Thread(target=reader), threading.Thread(target=single)]
    for t in th:
        t.start()
    time.sleep(0.3)
    restart(rd, down_s=0.3)             # the waits find no daemon for a while
    w.put_many({"s/a": np.full(4, 2.0), "s/b": np.full(4, 2.0)}, replace=True)
    w.put("late", np.full(4, 3.0))
    for t in th:
        t.join(60)
        assert not t.is_alive()
    assert got.get("set") == {"s/a": 2.0, "s/b": 2.0}, got
    assert got.get("late") == 3.0, got
    w.close()
    r.close()


# --- watches (issue 33: a watch resumes across a restart) -------------------------------

def lineage(c):
    return c._restart_state()[1]


@BOTH
def test_a_watch_goes_on_across_a_restart(rd):
    """A watch that saw commits before a kill -9 sees those after it, also
    the ones made before it looked again. From a daemon that restored its
    predecessor (the same lineage): the commits after the last it
    received, none twice. From one that started empty: a 'restarted'
    event, then everything the new daemon has. The same test runs either
    way: it asks which the new daemon is."""
    w = tensord.connect(rd.socket)
    p = tensord.connect(rd.socket)
    with w.watch("w/") as watch:
        p.put("w/a", np.zeros(4))
        p.put("w/b", np.zeros(4))
        before = [watch.next(timeout=5) for _ in range(2)]
        assert [(e.kind, e.name) for e in before] == [("published", "w/a"),
                                                      ("published", "w/b")], before
        old = lineage(w)
        restart(rd, down_s=0.3)
        p.put("w/c", np.ones(4))        # before the watch looks again: not lost
        p.put("x/other", np.ones(4))    # not under its prefix
        # First what the restart did: 'restarted' (commit ids start anew),
        # or 'lagged' (a replay coalesces each name's versions since).
        ev = watch.next(timeout=10)
        restored = lineage(w) == old
        said = "lagged" if restored else "restarted"
        assert (ev.kind, ev.name, ev.generation, ev.commit) == (said, "", 0, 0), ev
        ev = watch.next(timeout=10)
        assert (ev.kind, ev.name) == ("published", "w/c"), ev
        if restored:
            assert ev.commit > before[-1].commit, (ev, before)
        p.put("w/d", np.ones(4))
        ev = watch.next(timeout=10)
        assert (ev.kind, ev.name) == ("published", "w/d"), ev
        assert watch.poll() is None     # nothing twice
    w.close()
    p.close()


@BOTH
def test_a_replay_watch_replays_the_new_daemon(rd):
    """A watch with after= that is read only after the restart: what it
    had not read yet comes first, then what the restart did ('restarted':
    started empty; 'lagged': restored) and the new daemon's names."""
    c = tensord.connect(rd.socket)
    c.put("r/old", np.zeros(4))
    watch = c.watch("r/", after=0)
    # A round trip after it: the replay the daemon sent is in this client
    # before the kill (a kill -9 loses what the daemon had not written yet).
    c.list()
    restart(rd)
    c.put("r/new", np.ones(4))
    got = [watch.next(timeout=10) for _ in range(2)]
    assert (got[0].kind, got[0].name) == ("published", "r/old"), got
    assert got[1].kind in ("restarted", "lagged"), got
    got[1] = watch.next(timeout=10)
    assert (got[1].kind, got[1].name) == ("published", "r/new"), got
    assert watch.poll() is None
    watch.close()
    c.close()


def test_a_watch_gives_up_when_no_daemon_comes_back(rd):
    """Past TENSORD_RECONNECT_MS with no daemon answering, next() raises
    NoDaemonError, naming the watch: never a hang. Once one is back, the
    same watch goes on."""
    c = tensord.connect(rd.socket)
    watch = c.watch("g/")
    os.environ["TENSORD_RECONNECT_MS"] = "300"
    try:
        rd.proc.send_signal(signal.SIGKILL)
        rd.proc.wait()
        t0 = time.monotonic()
        with pytest.raises(tensord.NoDaemonError, match="watch of 'g/'") as ei:
            watch.next(timeout=30)
        assert time.monotonic() - t0 < 5
        # Why, once: the path, that nobody answers, and for how long.
        msg = str(ei.value)
        assert msg.count("was lost") == 1 and "no tensord at " + rd.socket in msg, msg
        assert "TENSORD_RECONNECT_MS" in msg, msg
        # poll() tries once, and says nothing yet (no daemon)
        assert watch.poll() is None
    finally:
        del os.environ["TENSORD_RECONNECT_MS"]
        rd.log.close()
        rd.start()
    c.put("g/x", np.zeros(4))
    evs = [watch.next(timeout=10) for _ in range(2)]
    # Restored (the same lineage), a live watch that received nothing
    # cannot know what it missed: 'lagged'.
    assert [e.kind for e in evs] in (["restarted", "published"], ["lagged", "published"]), evs
    assert evs[-1].name == "g/x"
    watch.close()
    c.close()


# --- the same lineage, before daemons restore: a daemon played by the test ---------------
#
# A daemon that restores its predecessor keeps its lineage (HelloReply.lineage)
# and its commit ids. Until tensord restores, the test plays such daemons on a
# socket of its own: Hello with a lineage it chooses, then Watch answered and
# the events it is given; it drops the connection as a kill -9 would. The
# messages are encoded by hand (proto/tensord.proto), as tests/integration's
# hostile.py does.

def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _field(num, v):
    if isinstance(v, int):
        return _varint(num << 3) + _varint(v)
    if isinstance(v, str):
        v = v.encode()
    return _varint(num << 3 | 2) + _varint(len(v)) + v


def _fixed64(num, v):
    return _varint(num << 3 | 1) + v.to_bytes(8, "little")


def _decode(buf):
    fields, i = {}, 0
    while i < len(buf):
        key = n = shift = 0
        while True:
            b = buf[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        wt = key & 7
        if wt == 0:
            shift = 0
            while True:
                b = buf[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            v = n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            ln = shift = 0
            while True:
                b = buf[i]
                i += 1
                ln |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            v, i = bytes(buf[i:i + ln]), i + ln
        else:
            raise ValueError(f"wire type {wt}")
        fields.setdefault(key >> 3, []).append(v)
    return fields


def _frame(payload):
    import struct
    return struct.pack("<IHH", len(payload), 1, 0) + payload


def _events(req_id, *events):
    """An Events reply (Reply.events = 12) for watch req_id: (name, commit) each."""
    body = b"".join(_field(1, _field(2, n) + _field(3, 1) + _field(4, c)) for n, c in events)
    return _frame(_field(1, req_id) + _field(12, body))


class _PlayedDaemon:
    """Serves connections on path one after the other, each as a daemon of
    lineages[k]: Hello, then Watch (recorded in .watches, answered, then
    events_for[k] sent), Unwatch; .drop() ends the current connection."""

    def __init__(self, path, lineages, events_for):
        import socket
        self.lineages, self.events_for = lineages, events_for
        self.watches, self.errors = [], []
        self.conn = None
        self.closing = False
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.conn.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def _serve(self):
        try:
            for k, lin in enumerate(self.lineages):
                self.conn, _ = self.sock.accept()
                while True:
                    try:
                        head = self._recv(8)
                    except OSError:
                        head = None
                    if head is None:
                        break
                    req = _decode(self._recv(int.from_bytes(head[:4], "little")))
                    rid = req.get(1, [0])[0]
                    if 2 in req:        # Hello
                        hello = _field(1, 1) + _field(2, os.getpid()) + _field(3, 1 << 17) \
                            + _fixed64(4, 1000 + k) + _fixed64(5, lin)
                        self.conn.sendall(_frame(_field(1, rid) + _field(4, hello)))
                    elif 16 in req:     # Watch
                        m = _decode(req[16][0])
                        self.watches.append({"prefix": m.get(1, [b""])[0].decode(),
                                             "after": m.get(2, [0])[0],
                                             "replay": bool(m.get(4, [0])[0])})
                        self.conn.sendall(_frame(_field(1, rid)))
                        if self.events_for[k]:
                            self.conn.sendall(_events(rid, *self.events_for[k]))
                    elif rid:
                        self.conn.sendall(_frame(_field(1, rid)))
        except Exception as e:      # noqa: BLE001 -- the test reads self.errors
            if not self.closing:
                self.errors.append(e)

    def drop(self):
        import socket
        self.conn.shutdown(socket.SHUT_RDWR)

    def close(self):
        """After the client closed: the thread ends (no thread outlives the test)."""
        import socket
        self.closing = True
        if self.conn is not None:       # a client still on it sees the end
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the played daemon still serves"
        assert not self.errors, self.errors


@pytest.mark.parametrize("restored", [True, False], ids=["same-lineage", "new-lineage"])
def test_a_watch_resumes_by_lineage(tmp_path, restored):
    """A daemon of the same lineage is asked to replay after the newest
    commit the watch received (7): nothing twice, and 'lagged' first (the
    replay coalesces each name's versions since). One of another lineage:
    'restarted', then a replay of all it has (after 0)."""
    path = str(tmp_path / "played.sock")
    played = _PlayedDaemon(path, [11, 11 if restored else 22],
                           [[("m/a", 5), ("m/b", 7)], [("m/c", 9 if restored else 1)]])
    try:
        c = tensord.connect(path)
        watch = c.watch("m/")
        assert [(e.name, e.commit) for e in (watch.next(timeout=5), watch.next(timeout=5))] \
            == [("m/a", 5), ("m/b", 7)]
        played.drop()
        ev = watch.next(timeout=10)
        assert played.watches[1] == {"prefix": "m/", "after": 7 if restored else 0,
                                     "replay": True}
        assert ev.kind == ("lagged" if restored else "restarted"), ev
        ev = watch.next(timeout=10)
        assert (ev.kind, ev.name, ev.commit) == ("published", "m/c", 9 if restored else 1), ev
        assert watch.poll() is None
        watch.close()
        c.close()
    finally:
        played.close()


def test_a_live_watch_that_received_nothing_says_it_may_have_lagged(tmp_path):
    """The same lineage, but the live watch received nothing before the
    daemon went: where the old daemon's commits stood when it began is not
    known, so it goes on live (no replay) and says 'lagged'."""
    path = str(tmp_path / "played.sock")
    played = _PlayedDaemon(path, [11, 11], [[], [("m/c", 9)]])
    try:
        c = tensord.connect(path)
        watch = c.watch("m/")
        assert watch.poll() is None
        played.drop()
        assert watch.next(timeout=10).kind == "lagged"
        assert played.watches[1] == {"prefix": "m/", "after": 0, "replay": False}
        assert watch.next(timeout=10).name == "m/c"
        watch.close()
        c.close()
    finally:
        played.close()


# --- tensord.aio across a restart --------------------------------------------------------

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


# --- reads sent once more (issue 33: a request that changes nothing) ---------------------

@BOTH
def test_reads_in_flight_go_once_more_and_writes_once_in_all(rd):
    """list(), stats() and stat() sent to a daemon that is then killed (it
    was stopped: they are in flight, unanswered) are sent once more over a
    new connection once a daemon is back, and return; a put in flight is
    looked up (docs/restart.md, section 5): it never took effect, so it is
    done again, once: 'y' has generation 1, from either kind of daemon."""
    c = tensord.connect(rd.socket)
    p = tensord.connect(rd.socket)
    c.put("x", np.zeros(4))
    got = {}

    def call(key, fn):
        try:
            got[key] = fn()
        except BaseException as e:      # noqa: BLE001 -- what it raised is the point
            got[key] = e
    calls = {"list": c.list, "stats": c.stats, "clients": c.clients, "leases": c.leases,
             "stat": lambda: c.stat("x"), "put": lambda: c.put("y", np.zeros(4))}
    rd.proc.send_signal(signal.SIGSTOP)
    th = [threading.Thread(target=call, args=kv) for kv in calls.items()]
    for t in th:
        t.start()
    time.sleep(0.5)                     # all sent, none answered
    rd.proc.send_signal(signal.SIGKILL)
    rd.proc.wait()
    rd.log.close()
    time.sleep(0.3)                     # no daemon for a while
    rd.start()
    p.put("x", np.ones(4), replace=True)            # for the stat sent again, if it comes after
    for t in th:
        t.join(30)
        assert not t.is_alive()
    assert isinstance(got["list"], list), got
    assert isinstance(got["stats"], dict), got
    assert isinstance(got["clients"], list) and isinstance(got["leases"], list), got
    assert isinstance(got["stat"], (tensord.TensorInfo, tensord.NotFoundError)), got
    assert got["put"] == 1, got
    assert c.stat("y").generation == 1
    c.close()
    p.close()


@BOTH
def test_a_lost_draft_is_said_and_an_unlink_is_done_once(rd):
    """A publish of a user's draft in flight when the daemon dies cannot be
    done again (the draft died with its connection): ConnectionLostError
    saying so. An unlink in flight never took effect (the daemon was
    stopped): done again on a daemon that kept 'x', NotFoundError from one
    that started empty (docs/restart.md, section 5)."""
    c = tensord.connect(rd.socket)
    c.put("x", np.zeros(4))
    before = lineage(c)
    w = c.create("d", (4,), "float32")
    np.from_dlpack(w)[:] = 1.5
    got = {}

    def call(key, fn):
        try:
            got[key] = fn()
        except BaseException as e:      # noqa: BLE001 -- what it raised is the point
            got[key] = e
    rd.proc.send_signal(signal.SIGSTOP)
    th = [threading.Thread(target=call, args=kv)
          for kv in {"publish": w.publish, "unlink": lambda: c.unlink("x")}.items()]
    for t in th:
        t.start()
    time.sleep(0.5)                     # both sent, none answered
    rd.proc.send_signal(signal.SIGKILL)
    rd.proc.wait()
    rd.log.close()
    rd.start()
    for t in th:
        t.join(30)
        assert not t.is_alive()
    assert isinstance(got["publish"], tensord.ConnectionLostError), got
    assert "lost" in str(got["publish"]) and "'d'" in str(got["publish"]), got
    if lineage(c) == before:            # it kept 'x': the unlink is done, once
        assert got["unlink"] is None, got
    else:                               # it started empty
        assert isinstance(got["unlink"], tensord.NotFoundError), got
        assert "restarted empty" in str(got["unlink"]), got
    names = [i.name for i in c.list()]
    assert "x" not in names and "d" not in names
    c.close()


@BOTH
def test_a_read_after_a_restart_does_not_raise(rd):
    """A client whose socket holds bytes it did not read (a watch's events)
    cannot tell from a look at it that the daemon went: its stat is sent,
    fails, and goes once more over a new connection."""
    c = tensord.connect(rd.socket)
    p = tensord.connect(rd.socket)
    w = c.watch("")
    p.put("x", np.zeros(4))
    time.sleep(0.1)                     # its event waits, unread, in c's socket
    restart(rd)
    p.put("x", np.ones(4), replace=True)
    info = c.stat("x")
    assert info.name == "x"
    w.close()
    c.close()
    p.close()


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


def test_a_replay_watch_that_received_nothing_resumes_from_its_after(tmp_path):
    """The same lineage, a watch with after=3 that received nothing yet:
    the new daemon is asked for what came after 3, as the first was."""
    path = str(tmp_path / "played.sock")
    played = _PlayedDaemon(path, [11, 11], [[], [("m/c", 9)]])
    try:
        c = tensord.connect(path)
        watch = c.watch("m/", after=3)
        assert watch.poll() is None
        played.drop()
        assert watch.next(timeout=10).kind == "lagged"
        assert watch.next(timeout=10).name == "m/c"
        assert played.watches == [{"prefix": "m/", "after": 3, "replay": True}] * 2
        assert watch.poll() is None
        watch.close()
        c.close()
    finally:
        played.close()


def test_a_read_whose_daemon_is_gone_says_so_soon(rd):
    """A read waits for a new daemon a restart's time (2 s), not a wait's
    (TENSORD_RECONNECT_MS, here 60 s): a daemon back 5 s later is too late
    for it, and it raised NoDaemonError instead of waiting for it."""
    c = tensord.connect(rd.socket)
    c.put("x", np.zeros(4))
    rd.proc.send_signal(signal.SIGKILL)
    rd.proc.wait()
    rd.log.close()
    back = threading.Timer(5.0, rd.start)
    os.environ["TENSORD_RECONNECT_MS"] = "60000"
    try:
        back.start()
        with pytest.raises(tensord.NoDaemonError):
            c.stat("x")
        # It gave up before the daemon was back: the timer had not fired.
        assert back.is_alive()
    finally:
        del os.environ["TENSORD_RECONNECT_MS"]
        back.join()
    c.close()


@BOTH
def test_a_polled_watch_goes_on_across_a_restart(rd):
    """Watch.poll(), which never waits for an event, connects anew after a
    restart (the C call without a wait leaves that to its caller)."""
    c = tensord.connect(rd.socket)
    p = tensord.connect(rd.socket)
    watch = c.watch("q/")
    p.put("q/a", np.zeros(4))
    assert wait_until(lambda: watch.poll() is not None, timeout=5)
    restart(rd)
    p.put("q/b", np.zeros(4))
    got = []

    def polled():
        ev = watch.poll()
        if ev is not None:
            got.append((ev.kind, ev.name))
        return bool(got) and got[-1] == ("published", "q/b")
    assert wait_until(polled, timeout=10), got
    assert got in ([("restarted", ""), ("published", "q/b")], [("lagged", ""), ("published", "q/b")]), got
    watch.close()
    c.close()
    p.close()
