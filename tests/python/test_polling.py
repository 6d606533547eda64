"""Polling before sleeping follows the CPUs a process may use, also when
they change after start-up (docs/design.md, "Polling instead of
sleeping"): a client confined to one CPU after connecting keeps working,
and a daemon confined after start-up stops polling (its poll_cpus and
poll_budget_seconds figures say so) and polls again once released.
Behaviour only: nothing here measures time."""
import os

import numpy as np
import pytest

import tensord
from tdutil import wait_until

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="one CPU: nothing to confine to")


def confine(pid, cpus):
    """Every thread of pid onto cpus (taskset -a -p)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


@pytest.fixture
def adaptive_env(monkeypatch):
    """Daemons and children started by the test poll adaptively."""
    monkeypatch.delenv("TENSORD_SPIN_US", raising=False)


@needs_two
def test_client_confined_after_connect_still_works(adaptive_env, child, client):
    client.put("poll/src", np.arange(1024, dtype=np.int32))
    c = child("""
        import os, sys
        import numpy as np
        import tensord
        c = tensord.connect(os.environ["TENSORD_SOCKET"])
        want = np.arange(1024, dtype=np.int32)
        def cycles(n, tag):
            for i in range(n):
                t = c.attach("poll/src")
                assert (np.from_dlpack(t) == want).all()
                t.release()
                c.put("poll/%s" % tag, want + i, replace=True)
            t = c.attach("poll/%s" % tag)
            assert (np.from_dlpack(t) == want + n - 1).all()
            t.release()
        cycles(300, "free")
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), {CPU})
        cycles(300, "confined")
        print("ok", len(os.sched_getaffinity(0)), flush=True)
        sys.stdin.readline()
        c.close()
    """.replace("CPU", str(CPUS[0])), env={"TENSORD_SPIN_US": ""})
    assert c.expect("ok") == "ok 1"
    c.finish()
    # The daemon served both halves, and still does.
    t = client.attach("poll/confined")
    assert (np.from_dlpack(t) == np.arange(1024, dtype=np.int32) + 299).all()
    t.release()


@needs_two
def test_daemon_confined_after_start_stops_polling(adaptive_env, daemon_factory):
    d = daemon_factory()
    with tensord.connect(d.socket) as c:
        c.put("poll/x", np.zeros(16, np.uint8))

        def figures():
            t = c.attach("poll/x")  # a request: the daemon looks at its CPUs again
            t.release()
            return c.stats()

        assert wait_until(lambda: figures()["poll_cpus"] >= 2)
        confine(d.pid, {CPUS[0]})
        assert wait_until(lambda: figures()["poll_cpus"] == 1), figures()
        s = figures()
        assert s["poll_cpus"] == 1
        assert s["poll_budget_seconds"] == 0
        # While confined, it never polls: no outcome is counted.
        before = {k: s[k] for k in ("poll_hits_total", "poll_misses_total", "poll_lost_total")}
        for _ in range(200):
            t = c.attach("poll/x")
            t.release()
        s = c.stats()
        assert s["poll_cpus"] == 1 and s["poll_budget_seconds"] == 0
        assert {k: s[k] for k in before} == before
        # Released: it looks again and may poll (unless backing off, which
        # a figure of its own counts).
        confine(d.pid, set(CPUS))
        assert wait_until(lambda: figures()["poll_cpus"] >= 2), figures()


def test_spin_us_zero_never_polls(daemon_factory, monkeypatch):
    monkeypatch.setenv("TENSORD_SPIN_US", "0")
    d = daemon_factory()
    with tensord.connect(d.socket) as c:
        c.put("poll/x", np.zeros(16, np.uint8))
        for _ in range(500):
            t = c.attach("poll/x")
            t.release()
        s = c.stats()
    assert s["poll_budget_seconds"] == 0
    assert s["poll_hits_total"] == s["poll_misses_total"] == s["poll_lost_total"] == 0
    assert s["poll_cpus"] >= 1  # still looked at, for the figure
