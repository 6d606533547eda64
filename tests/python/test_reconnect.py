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
def rd(daemon_factory):
    return daemon_factory(sub="r")


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
    w.put_many({"s/a": np.full(4, 2.0), "s/b": np.full(4, 2.0)})
    w.put("late", np.full(4, 3.0))
    for t in th:
        t.join(60)
        assert not t.is_alive()
    assert got.get("set") == {"s/a": 2.0, "s/b": 2.0}, got
    assert got.get("late") == 3.0, got
    w.close()
    r.close()
