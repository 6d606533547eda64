"""Leases re-adopted after a restart (docs/restart.md, section 5; issue 33):
a process holding tensors when its daemon is killed or restarted offers
its leases to the daemon that restored them, on its next call or, idle,
from its flusher thread; they show in leases() again and end there. The
daemon holds every restored tensor for the grace period (--readopt-grace),
so a version whose name went meanwhile is re-adopted too, and one nobody
re-adopted is freed at its end."""
import gc
import signal

import numpy as np
import pytest

import tensord
from sdharness import managed
from testlib import wait_until


def held_by(c, pid):
    """name -> leases pid holds, as the daemon c reaches lists them."""
    return {h.name: h.count for h in c.leases() if h.pid == pid}


def hold_every_kind(c):
    """Arrays on a slab tensor (twice: the second a bound attach), a memfd
    of its own, a ring buffer and a set member; what each must read."""
    rng = np.random.default_rng(3)
    c.put("small", np.arange(16, dtype=np.int64))
    c.put("own", rng.random(1 << 16), sealed=True)
    c.put("ring", rng.random(1 << 17))
    c.put_many({f"set/{i}": rng.random(1 << 15) for i in range(4)})
    names = ["small", "small", "own", "ring", "set/2"]
    arrays = [np.from_dlpack(c.attach(n)) for n in names]
    return names, arrays, [a.copy() for a in arrays]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_leases_are_readopted_on_the_next_call(tmp_path, sig):
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        names, arrays, want = hold_every_kind(c)
        before = held_by(c, os.getpid())
        assert before == {"small": 2, "own": 1, "ring": 1, "set/2": 1}
        sm.restart(sig)
        c.stat("small")                       # reconnects, and re-adopts first
        other = tensord.connect(sm.socket)
        assert held_by(other, os.getpid()) == before
        st = other.stats()
        assert st["restart_readopted_leases_total"] == 5
        assert st["restart_held_tensors"] == st["restart_restored_tensors"]
        for a, w in zip(arrays, want):
            assert (a == w).all()
        # Their ends reach the new daemon.
        del arrays, a
        gc.collect()
        assert wait_until(lambda: held_by(other, os.getpid()) == {})
        assert "released unknown lease" not in sm.read_log()
        other.close()
        c.close()


def test_an_idle_client_readopts_without_a_call(tmp_path):
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        c.put("w", np.arange(1 << 14, dtype=np.float32))
        arr = np.from_dlpack(c.attach("w"))
        sm.restart()
        other = tensord.connect(sm.socket)
        # c makes no call: its flusher thread finds the daemon gone.
        assert wait_until(lambda: held_by(other, os.getpid()) == {"w": 1}, timeout=20)
        assert other.stats()["restart_readopted_leases_total"] == 1
        del arr
        gc.collect()
        assert wait_until(lambda: held_by(other, os.getpid()) == {})
        other.close()
        c.close()


def test_the_hold_keeps_replaced_versions_until_the_grace_period_ends(tmp_path):
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        c.put("x", np.full(1 << 15, 1.0))
        c.put("y", np.full(1 << 15, 2.0))
        x1 = np.from_dlpack(c.attach("x"))
        sm.restart(extra_args=["--readopt-grace", "3000"])
        w = tensord.connect(sm.socket)
        # Both names go to new versions before anyone re-adopts anything.
        w.put("x", np.full(1 << 15, 3.0), replace=True)
        w.put("y", np.full(1 << 15, 4.0), replace=True)
        assert w.stats()["restart_held_tensors"] == 2
        c.stat("x")                       # c re-adopts x's first version
        assert held_by(w, os.getpid()) == {"x": 1}
        assert (x1 == 1.0).all()
        # At the end: y's old version, which nobody holds, is freed; x's stays
        # while c holds it.
        assert wait_until(lambda: w.stats()["restart_held_tensors"] == 0, timeout=20)
        st = w.stats()
        assert st["restart_hold_freed_total"] == 1
        assert held_by(w, os.getpid()) == {"x": 1}
        assert "grace period for re-adoption ended" in sm.read_log()
        del x1
        gc.collect()
        assert wait_until(lambda: held_by(w, os.getpid()) == {})
        w.close()
        c.close()


def test_a_daemon_of_another_lineage_readopts_nothing(tmp_path):
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        c.put("z", np.arange(100))
        z = np.from_dlpack(c.attach("z"))
        # --fdstore 0 forgets the store: the new daemon starts empty.
        sm.restart(extra_args=["--fdstore", "0"])
        with pytest.raises(FileNotFoundError):
            c.stat("z")
        other = tensord.connect(sm.socket)
        assert held_by(other, os.getpid()) == {}
        assert other.stats()["restart_readopted_leases_total"] == 0
        assert (z == np.arange(100)).all()
        del z
        other.close()
        c.close()


def test_no_hold_with_a_grace_of_zero(tmp_path):
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        c.put("q", np.arange(100))
        q = np.from_dlpack(c.attach("q"))
        sm.restart(extra_args=["--readopt-grace", "0"])
        c.stat("q")
        other = tensord.connect(sm.socket)
        assert held_by(other, os.getpid()) == {}
        assert other.stats()["restart_held_tensors"] == 0
        assert (q == np.arange(100)).all()
        del q
        other.close()
        c.close()


@pytest.mark.parametrize("log_size", [None, "4096"], ids=["appended", "rewritten"])
def test_versions_replaced_or_unlinked_before_the_crash_are_readopted(tmp_path, log_size):
    """A version that lost its name while leased (replaced, or unlinked) is
    in the state as retired (ENTRY_RETIRED), so a restart holds it and its
    holder re-adopts it; one whose last lease ended before the crash
    (ENTRY_RETIRED_GONE) is not restored. With a log of 4 KiB the state is
    rewritten whole many times meanwhile: the retired versions go into each
    new log too."""
    import os
    args = ["--state-log-size", log_size] if log_size else []
    with managed(tmp_path, args=args) as sm:
        c = tensord.connect(sm.socket)
        c.put("x", np.full(1 << 12, 1.0))                # a slab tensor
        c.put("z", np.full(1 << 16, 5.0), sealed=True)   # a memfd of its own
        c.put("w", np.full(1 << 12, 7.0))
        x1 = np.from_dlpack(c.attach("x"))
        z1 = np.from_dlpack(c.attach("z"))
        w1 = c.attach("w")
        c.put("x", np.full(1 << 12, 2.0), replace=True)  # x1 retired
        c.unlink("z")                                    # z1 retired
        c.put("w", np.full(1 << 12, 8.0), replace=True)
        w1.release()                                     # w1 retired, then gone
        for i in range(60):                              # steps (and rewrites at 4 KiB)
            c.put(f"n{i % 5}", np.full(8, i), replace=True)
        if log_size:
            assert c.stats()["state_log_rewrites_total"] >= 3
        # w1's last lease ends once its release arrives, and the binding the
        # attach made is let go (the client's watcher, later): then w1 is
        # freed and its end logged. Live: x, w, n0..n4, x1 and z1.
        assert wait_until(lambda: c.stats()["tensors"] == 9), c.stats()["tensors"]
        sm.restart()
        c.stat("x")                                      # reconnects, re-adopts
        other = tensord.connect(sm.socket)
        assert held_by(other, os.getpid()) == {"x": 1, "z": 1}
        st = other.stats()
        assert st["restart_readopted_leases_total"] == 2
        # x, w and n0..n4 by name; x1 and z1 held under no name; not w1.
        assert st["restart_restored_tensors"] == 9, st
        assert sorted(i.name for i in other.list()) == ["n0", "n1", "n2", "n3", "n4", "w", "x"]
        assert (x1 == 1.0).all() and (z1 == 5.0).all()
        with other.attach("x") as t:
            assert (np.from_dlpack(t) == 2.0).all()
        del x1, z1
        gc.collect()
        assert wait_until(lambda: held_by(other, os.getpid()) == {})
        other.close()
        c.close()


def test_a_retired_version_readopted_and_ended_is_not_restored_again(tmp_path):
    """A retired version re-adopted after one restart, then released: once
    the hold ended too, its end is logged, so the next restart does not
    bring it back."""
    import os
    with managed(tmp_path) as sm:
        c = tensord.connect(sm.socket)
        c.put("x", np.full(1 << 12, 1.0))
        x1 = np.from_dlpack(c.attach("x"))
        c.put("x", np.full(1 << 12, 2.0), replace=True)
        sm.restart(extra_args=["--readopt-grace", "1000"])
        c.stat("x")
        other = tensord.connect(sm.socket)
        assert held_by(other, os.getpid()) == {"x": 1}
        assert other.stats()["restart_restored_tensors"] == 2
        del x1
        gc.collect()
        assert wait_until(lambda: other.stats()["leases"] == 0)
        assert wait_until(lambda: other.stats()["restart_held_tensors"] == 0, timeout=20)
        assert other.stats()["restart_hold_freed_total"] == 1
        other.close()
        sm.restart(extra_args=["--readopt-grace", "0"])
        other = tensord.connect(sm.socket)
        assert other.stats()["restart_restored_tensors"] == 1
        other.close()
        c.close()
