"""Polling before sleeping follows the CPUs a process may use, also when
they change after start-up (docs/design.md, "Polling instead of
sleeping"): a client confined to one CPU after connecting keeps working,
and a daemon confined after start-up stops polling (its poll_cpus and
poll_budget_seconds figures say so) and polls again once released.
Behaviour only: nothing here measures time."""
import os
import platform
import signal
import subprocess
import sys
import textwrap

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


@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86_64")
def test_a_reader_waits_for_its_reply_in_poll(daemon_factory, monkeypatch):
    """A client waiting for a reply, not polling, sleeps in poll(POLLIN), not
    in recvmsg(): a thread asleep in recvmsg() on a Unix socket is woken
    each time the daemon reads one of its requests (the bytes leaving the
    socket free write space, which wakes every thread asleep on it), a
    wake-up for nothing that the daemon pays for before it answers (an IPI
    to an idle vCPU, ~13 us, traced in docs/design.md, "Publish ->
    watcher"). The daemon is stopped while the request waits, so the
    reader's system call is seen as it sleeps (/proc/TID/syscall)."""
    monkeypatch.setenv("TENSORD_SPIN_US", "0")
    d = daemon_factory()
    code = textwrap.dedent("""
        import sys, threading
        import numpy as np
        import tensord

        with tensord.connect(sys.argv[1]) as c:
            c.put("poll/wait", np.zeros(16, np.uint8))
            print(threading.get_native_id(), flush=True)
            sys.stdin.readline()                 # the daemon is stopped now
            print(c.stat("poll/wait").nbytes, flush=True)
        """)
    p = subprocess.Popen([sys.executable, "-c", code, d.socket], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, TENSORD_SPIN_US="0"))
    try:
        tid = int(p.stdout.readline())
        os.kill(d.pid, signal.SIGSTOP)
        try:
            p.stdin.write("\n")
            p.stdin.flush()

            def sleeping_in():
                with open("/proc/%d/task/%d/syscall" % (p.pid, tid)) as f:
                    nr = f.read().split()[0]
                with open("/proc/%d/task/%d/stat" % (p.pid, tid)) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                return int(nr) if state == "S" and nr.isdigit() else None

            # Past the send: asleep in the wait for the reply (not stdin's read, 0).
            assert wait_until(lambda: sleeping_in() not in (None, 0)), sleeping_in()
            assert sleeping_in() in (7, 271), "asleep in system call %s, not poll" % \
                sleeping_in()  # 47: recvmsg
        finally:
            os.kill(d.pid, signal.SIGCONT)
        assert p.stdout.readline().strip() == "16"
    finally:
        p.stdin.close()
        p.wait(timeout=60)
