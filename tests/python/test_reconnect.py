"""A client outlives its daemon's restart (docs/restart.md, "Clients carry
on"; issue 33, the client's half): what it attached stays readable, its
next request connects anew, a request in flight when the daemon goes
raises a ConnectionError, never hangs, waits go on across the restart, and
a write in flight is done once. Watches: test_reconnect_watch.py; asyncio:
test_reconnect_aio.py."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import tensord
from reconnect_harness import restart, rd, BOTH, lineage  # noqa: F401 (rd: a fixture)
from tdutil import wait_until


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
