"""Watches across a daemon's restart (docs/restart.md, section 5): a watch
resumes after the last commit it delivered (same lineage) or from the new
daemon's start (another), says when it may have lagged, and gives up with a
ConnectionError when no daemon comes back. Some tests play the daemon
(_PlayedDaemon) to send exactly the frames a case needs."""
import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

import tensord
from reconnect_harness import restart, rd, BOTH, lineage  # noqa: F401 (rd: a fixture)
from tdutil import wait_until


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
