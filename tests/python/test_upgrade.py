"""An upgrade through a holder drains (docs/restart.md, section 6; issue 33):
the old daemon stops accepting and recording and serves reads on the
connections it has until the new one serves; only then is it stopped.
Every order is asserted from the holder's log and from what the clients
saw (pids, connection ids), never from timings. The new daemon is held
between its restore and its READY=1 by $TENSORD_TEST_READY_GATE (a FIFO),
so that the drain is a state the test can look at."""
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensord
from sdharness import build_path
from testlib import wait_until


def start(tmp_path, args, name, ready=False, **env_extra):
    """A tensord (or holder) process outside any service manager; with
    ready, once it listens (--ready-fd)."""
    log = open(tmp_path / f"{name}.log", "ab")
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.update(env_extra)
    if not ready:
        return subprocess.Popen([build_path("tensord")] + args, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    r, w = os.pipe()
    p = subprocess.Popen([build_path("tensord")] + args + ["--ready-fd", str(w)],
                         pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT, env=env)
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        assert rf.read(1) == b"R", text(tmp_path, name)
    return p


def text(tmp_path, name):
    return (tmp_path / f"{name}.log").read_text()


def in_order(log, *parts):
    """Each part is in log, after the one before it."""
    at = 0
    for p in parts:
        i = log.find(p, at)
        if i < 0:
            return False
        at = i + len(p)
    return True


def says(log, *parts):
    """log() has each part after the one before it, once the writer got there."""
    return wait_until(lambda: in_order(log(), *parts), timeout=30)


class Upgrade:
    """A holder, an old daemon serving, and the means to start the new one."""

    def __init__(self, tmp_path, drain_ms=None, **env):
        self.tmp = tmp_path
        self.hold = str(tmp_path / "hold")
        self.sock = str(tmp_path / "tensord.sock")
        if drain_ms:
            env["TENSORD_HOLD_DRAIN_MS"] = str(drain_ms)
        self.holder = start(tmp_path, ["--hold", self.hold], "holder", **env)
        assert wait_until(lambda: os.path.exists(os.path.join(self.hold, "take")))
        self.procs = []

    def daemon(self, name, gate=False, ready=False, args=(), **env):
        if gate:
            fifo = str(self.tmp / f"{name}.gate")
            os.mkfifo(fifo)
            env["TENSORD_TEST_READY_GATE"] = fifo
        p = start(self.tmp, ["--holder", self.hold, "--socket", self.sock,
                             "--readopt-grace", "60000", *args], name, ready, **env)
        self.procs.append(p)
        return p

    def open_gate(self, name):
        with open(self.tmp / f"{name}.gate", "wb") as f:
            f.write(b"g")

    def holder_log(self):
        return text(self.tmp, "holder")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        self.holder.terminate()
        assert self.holder.wait(timeout=30) == 0


@pytest.fixture
def up(tmp_path):
    u = Upgrade(tmp_path)
    yield u
    u.close()


def serving(sock):
    """A client of the daemon that listens at sock (started with ready)."""
    return tensord.connect(sock)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port):
    """The readiness probe of deploy/k8s/daemonset.yaml: GET /metrics."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


READER = textwrap.dedent("""
    import os, sys, numpy as np, tensord
    sock, out, stop = sys.argv[1:4]
    c = tensord.connect(sock, name="reader")
    want = np.arange(4096, dtype=np.int32)
    with open(out, "a", buffering=1) as f:
        while not os.path.exists(stop):
            try:
                # Which daemon served, asked before and after: a line
                # whose two differ is the one where the old daemon went.
                pid = c.stats()["daemon_pid"]
                with c.attach("r") as t:
                    ok = int((np.from_dlpack(t) == want).all())
                conn = [x.conn_id for x in c.clients() if x.pid == os.getpid()][0]
                after = c.stats()["daemon_pid"]
                f.write(f"{pid} {after} {conn} {ok}\\n")
            except Exception as e:
                f.write(f"ERR {e!r}\\n")
""")


def lines(path):
    try:
        return [l.split(" ") for l in open(path).read().splitlines()]
    except FileNotFoundError:
        return []


def test_readers_are_served_through_the_drain_and_the_old_daemon_exits_last(up, tmp_path):
    a = up.daemon("old", ready=True)
    c = serving(up.sock)
    c.put("r", np.arange(4096, dtype=np.int32))
    # A slab tensor, held by a reader, replaced just before the drain.
    c.put("s", np.arange(16, dtype=np.int64))
    held = c.attach("s")
    held_bytes = np.from_dlpack(held).copy()
    c.put("s", np.full(16, -1, dtype=np.int64), replace=True)
    lessee = tensord.connect(up.sock)
    out, stop = tmp_path / "reader.out", tmp_path / "reader.stop"
    script = tmp_path / "reader.py"
    script.write_text(READER)
    reader = subprocess.Popen([sys.executable, str(script), up.sock, str(out), str(stop)])
    try:
        assert wait_until(lambda: len(lines(out)) >= 5, timeout=30)
        b = up.daemon("new", gate=True)
        assert wait_until(lambda: f"daemon {a.pid} drained" in up.holder_log(), timeout=30), \
            up.holder_log()
        # The drain: the old daemon serves the reader's attaches on its
        # connection, and a lease taken now is re-adopted later.
        n0 = len(lines(out))
        assert wait_until(lambda: len(lines(out)) >= n0 + 20, timeout=30)
        lease = lessee.attach("r")
        assert lessee.stats()["daemon_pid"] == a.pid
        assert (np.from_dlpack(held) == held_bytes).all()
        assert a.poll() is None and b.poll() is None
        up.open_gate("new")
        assert a.wait(timeout=60) == 0          # stopped by the holder once b served
        assert wait_until(lambda: sum(1 for l in lines(out) if l[1] == str(b.pid)) >= 5,
                          timeout=60)
    finally:
        stop.touch()
        reader.wait(timeout=60)
    seen = lines(out)
    assert not [l for l in seen if l[0] == "ERR"], seen
    pids = [(int(l[0]), int(l[1])) for l in seen]
    old = [p == (a.pid, a.pid) for p in pids].index(False)
    # The old daemon's lines, then at most one that saw both, then the new one's.
    assert all(p == (a.pid, a.pid) for p in pids[:old]), pids
    rest = pids[old + 1:] if pids[old] == (a.pid, b.pid) else pids[old:]
    assert rest and all(p == (b.pid, b.pid) for p in rest), pids
    assert old >= n0 + 20
    # One connection to the old daemon throughout, never lost before it was told to exit.
    assert len({l[2] for l in seen[:old]}) == 1, seen[:old]
    assert all(l[3] == "1" for l in seen)
    assert says(up.holder_log, f"asking daemon {a.pid} to drain", f"daemon {a.pid} drained",
                f"handed", f"daemon {b.pid} serves: stopping drained daemon {a.pid}",
                f"drained daemon {a.pid} exited"), up.holder_log()
    log = up.holder_log()
    assert "stopping it first" not in log and "takes over: stopping daemon" not in log, log
    assert "draining for the next daemon" in text(tmp_path, "old")
    # The lease taken during the drain lives on the new daemon.
    lessee.stat("r")
    assert wait_until(lambda: any(h.pid == os.getpid() for h in lessee.leases("r")),
                      timeout=30)
    assert lessee.stats()["restart_readopted_leases_total"] >= 1
    assert (np.from_dlpack(lease) == np.arange(4096, dtype=np.int32)).all()
    # The slab's old version kept its bytes, also once the new daemon writes.
    c2 = tensord.connect(up.sock)
    for i in range(8):
        c2.put("s", np.full(16, i, dtype=np.int64), replace=True)
    assert (np.from_dlpack(held) == held_bytes).all()
    lease.release()
    held.release()
    for cl in (c, c2, lessee):
        cl.close()


WRITER = textwrap.dedent("""
    import os, sys, numpy as np, tensord
    sock, out, stop = sys.argv[1:4]
    c = tensord.connect(sock, name="writer")
    with open(out, "a", buffering=1) as f:
        i = 0
        while not os.path.exists(stop):
            try:
                g = c.put("w", np.full(64, i, dtype=np.int64), replace=True)
                f.write(f"{g} {c.stats()['daemon_pid']}\\n")
            except Exception as e:
                f.write(f"ERR {e!r}\\n")
                break
            i += 1
""")


def test_a_writer_through_the_upgrade_puts_each_version_once(up, tmp_path):
    a = up.daemon("old", ready=True)
    c = serving(up.sock)
    c.put("w", np.zeros(64, dtype=np.int64))
    watcher = tensord.connect(up.sock)
    watch = watcher.watch("w")
    out, stop = tmp_path / "writer.out", tmp_path / "writer.stop"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), up.sock, str(out), str(stop)])
    events = []
    try:
        assert wait_until(lambda: len(lines(out)) >= 20, timeout=30)
        b = up.daemon("new", gate=True)
        # The writer's next put reaches the drained daemon, which closes its
        # connection; the put waits in the backlog for the new daemon.
        assert wait_until(lambda: "while draining: closing the connection" in
                          text(tmp_path, "old"), timeout=30)
        up.open_gate("new")
        assert a.wait(timeout=60) == 0
        assert wait_until(lambda: sum(1 for l in lines(out) if l[1] == str(b.pid)) >= 20,
                          timeout=60)
    finally:
        stop.touch()
        writer.wait(timeout=60)
    seen = lines(out)
    assert not [l for l in seen if l[0] == "ERR"], seen
    gens = [int(l[0]) for l in seen]
    # Exactly once: consecutive, none twice, none lost.
    assert gens == list(range(gens[0], gens[0] + len(gens))), gens
    assert {l[1] for l in seen} == {str(a.pid), str(b.pid)}
    last = c.stat("w").generation
    assert last == gens[-1]
    # Every event once: commits only grow, a generation never comes twice, and
    # generations skip only after a 'lagged' event (a replay coalesces).
    while True:
        ev = watch.next(timeout=10)
        events.append(ev)
        if ev.kind == "published" and ev.generation == last:
            break
    assert watch.poll() is None
    published = [e for e in events if e.kind == "published"]
    assert len({e.generation for e in published}) == len(published)
    commits = [e.commit for e in published]
    assert commits == sorted(commits)
    for prev, ev in zip(events, events[1:]):
        if ev.kind == "published" and prev.kind == "published":
            assert ev.generation == prev.generation + 1, (prev, ev)
    assert f"daemon {a.pid} drained" in up.holder_log()
    watch.close()
    for cl in (c, watcher):
        cl.close()


def test_an_old_daemon_that_ignores_the_drain_is_stopped_first(tmp_path):
    """A tensord from before the drain logs SIGUSR2 and ignores it (played
    by $TENSORD_TEST_NO_DRAIN): past the bound the holder stops it as
    before, and the upgrade completes."""
    u = Upgrade(tmp_path, drain_ms=300)
    try:
        a = u.daemon("old", ready=True, TENSORD_TEST_NO_DRAIN="1")
        c = serving(u.sock)
        c.put("x", np.arange(100, dtype=np.float32))
        b = u.daemon("new")
        assert a.wait(timeout=60) == 0
        assert c.stat("x").generation == 1
        assert c.stats()["daemon_pid"] == b.pid
        with c.attach("x") as t:
            assert (np.from_dlpack(t) == np.arange(100, dtype=np.float32)).all()
        assert says(u.holder_log, f"asking daemon {a.pid} to drain",
                    f"daemon {a.pid} did not drain", "stopping it first",
                    f"stopping daemon {a.pid} first", "handed"), u.holder_log()
        assert "received SIGUSR2, ignoring" in text(tmp_path, "old")
        c.close()
    finally:
        u.close()


def test_an_old_daemon_killed_while_drained_leaves_the_new_one_to_serve(up, tmp_path):
    a = up.daemon("old", ready=True)
    c = serving(up.sock)
    c.put("x", np.arange(100, dtype=np.float32))
    b = up.daemon("new", gate=True)
    assert wait_until(lambda: f"daemon {a.pid} drained" in up.holder_log(), timeout=30)
    a.kill()
    a.wait()
    up.open_gate("new")
    assert c.stat("x").generation == 1
    assert c.stats()["daemon_pid"] == b.pid
    c.put("x", np.zeros(100, dtype=np.float32), replace=True)
    assert c.stat("x").generation == 2
    assert says(up.holder_log, f"daemon {b.pid} serves; drained daemon {a.pid} had exited")
    assert "stopping drained daemon" not in up.holder_log()
    c.close()


def test_a_new_daemon_that_dies_before_serving_leaves_the_old_one_reading(up, tmp_path):
    """The drained daemon never writes again; it serves its readers until a
    daemon that serves takes the store, then goes."""
    a = up.daemon("old", ready=True)
    c = serving(up.sock)
    c.put("x", np.arange(100, dtype=np.float32))
    b = up.daemon("new", gate=True)
    assert wait_until(lambda: f"daemon {a.pid} drained" in up.holder_log(), timeout=30)
    b.kill()
    b.wait()
    assert wait_until(lambda: f"daemon {b.pid} exited before it served" in up.holder_log(),
                      timeout=30), up.holder_log()
    # Still reading on the old daemon's connection.
    assert c.stats()["daemon_pid"] == a.pid
    with c.attach("x") as t:
        assert (np.from_dlpack(t) == np.arange(100, dtype=np.float32)).all()
    third = up.daemon("third")
    assert a.wait(timeout=60) == 0
    assert c.stats()["daemon_pid"] == third.pid
    c.put("x", np.zeros(100, dtype=np.float32), replace=True)
    assert c.stat("x").generation == 2
    assert says(up.holder_log, f"daemon {third.pid} serves: stopping drained daemon {a.pid}")
    c.close()


def test_a_hung_old_daemon_is_stopped_first_and_the_upgrade_completes(tmp_path):
    """An old daemon that cannot answer (SIGSTOPped: hung) is past the
    drain's bound stopped as before the drain; once it runs again it
    exits, and the new daemon serves what it had."""
    u = Upgrade(tmp_path, drain_ms=300)
    try:
        a = u.daemon("old", ready=True)
        c = serving(u.sock)
        c.put("x", np.arange(100, dtype=np.float32))
        os.kill(a.pid, signal.SIGSTOP)
        b = u.daemon("new")
        assert wait_until(lambda: f"stopping daemon {a.pid} first" in u.holder_log(),
                          timeout=30), u.holder_log()
        assert b.poll() is None
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=60) == 0
        with c.attach("x") as t:
            assert (np.from_dlpack(t) == np.arange(100, dtype=np.float32)).all()
        assert c.stats()["daemon_pid"] == b.pid
        assert f"daemon {a.pid} did not drain" in u.holder_log()
        assert "stopping drained daemon" not in u.holder_log()
        c.close()
    finally:
        u.close()


def test_sigusr2_without_a_holder_drains_nothing(tmp_path):
    """Nobody would take over from a daemon outside a holder: a stray
    SIGUSR2 is logged and ignored, and it goes on taking writes."""
    sock = str(tmp_path / "plain.sock")
    d = start(tmp_path, ["--socket", sock], "plain", ready=True)
    try:
        c = serving(sock)
        c.put("x", np.ones(8))
        d.send_signal(signal.SIGUSR2)
        assert says(lambda: text(tmp_path, "plain"),
                    "received SIGUSR2, ignoring: only a daemon under a holder drains")
        assert c.put("x", np.zeros(8), replace=True) == 2
        c2 = tensord.connect(sock)          # still accepting
        assert c2.stat("x").generation == 2
        assert "draining" not in text(tmp_path, "plain")
        c.close()
        c2.close()
    finally:
        d.terminate()
        assert d.wait(timeout=30) == 0


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_the_metrics_endpoint_passes_through_the_drain(up, tmp_path, kind):
    """--metrics on a TCP port: under a holder it is bound with
    SO_REUSEPORT, so the new daemon binds it while the old one drains
    (before, it exited there and left the old one drained). On a unix
    socket: the draining daemon removes its socket and the new one binds it
    once it has the store (before, the new one met the old one's live
    socket there and exited, leaving the old one drained). Either way the
    old one is stopped once the new one serves, and the endpoint answers on."""
    import socket
    import urllib.request
    port, path = free_port(), str(tmp_path / "metrics.sock")
    metrics = ["--metrics", f"127.0.0.1:{port}" if kind == "tcp" else "unix:" + path]

    def scrape():
        if kind == "tcp":
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(path)
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            return b"".join(iter(lambda: s.recv(65536), b"")).decode()
    a = up.daemon("old", ready=True, args=metrics)
    c = serving(up.sock)
    c.put("x", np.arange(10))
    assert "tensord_tensors" in scrape()
    b = up.daemon("new", args=metrics)
    assert a.wait(timeout=60) == 0
    assert says(up.holder_log, f"daemon {a.pid} drained",
                f"daemon {b.pid} serves: stopping drained daemon {a.pid}"), up.holder_log()
    assert b.poll() is None, text(tmp_path, "new")
    assert "tensord_tensors" in scrape()
    assert c.stat("x").generation == 1
    assert c.stats()["daemon_pid"] == b.pid
    c.close()


# The tensors of the tests below, put on the old daemon: a memfd of its
# own, slab tensors, and one of them replaced later.
TENSORS = {
    "big": np.arange(1 << 16, dtype=np.int32),
    "small": np.linspace(0, 1, 100),
    "s": np.arange(16, dtype=np.int64),
}


@pytest.fixture
def managed(tmp_path):
    """A holder that leaves a drained daemon to its manager (a DaemonSet's
    rolling update: deploy/k8s/daemonset.yaml)."""
    u = Upgrade(tmp_path, TENSORD_HOLD_STOP_DRAINED="0")
    yield u
    u.close()


def old_with_tensors(u, args=()):
    """The old daemon, serving TENSORS to a client: (it, the client)."""
    a = u.daemon("old", ready=True, args=args)
    c = serving(u.sock)
    for name, v in TENSORS.items():
        c.put(name, v)
    return a, c


def drained_for(u, gate=False):
    """The old daemon serving TENSORS to a client, then the new one started
    (held before its READY=1 with gate): once the old one drained, and
    without gate once the new one serves and the holder left the old one
    to its manager. (old, new, the client)."""
    a, c = old_with_tensors(u)
    b = u.daemon("new", gate=gate, ready=not gate)
    if gate:
        assert says(u.holder_log, f"daemon {a.pid} drained"), u.holder_log()
    else:
        assert says(u.holder_log, f"asking daemon {a.pid} to drain", f"daemon {a.pid} drained",
                    "handed",
                    f"daemon {b.pid} serves; leaving drained daemon {a.pid} to its manager"), \
            u.holder_log()
    return a, b, c


def same_bytes(c, want):
    """Every tensor in want is at c's daemon, byte for byte."""
    for name, v in want.items():
        with c.attach(name) as t:
            got = np.from_dlpack(t)
            assert got.dtype == v.dtype and got.tobytes() == v.tobytes(), name


def warnings(log):
    return [l for l in log.splitlines() if " warn " in l or " error " in l]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_drained_daemon_left_to_its_manager_reads_until_stopped_and_changes_nothing(
        managed, tmp_path, sig):
    """$TENSORD_HOLD_STOP_DRAINED=0: the old daemon is left running drained
    once the new one serves, and told so: it lets its clients go (their
    frozen reads would lag the new daemon's versions, their waits never
    end), who reconnect to the new one with their leases; a write is done
    there, once. The old one's stop (the old pod's deletion) changes
    nothing: not the new daemon's log, memory or socket, nor the store a
    third daemon restores."""
    u = managed
    want = dict(TENSORS)
    a, b, c = drained_for(u)
    assert a.poll() is None and b.poll() is None
    assert says(lambda: text(tmp_path, "old"), "draining for the next daemon",
                "the next daemon serves: letting 1 clients and 0 peer links go"), \
        text(tmp_path, "old")
    # The client, let go, is the new daemon's, and reads everything there.
    same_bytes(c, want)
    assert c.stats()["daemon_pid"] == b.pid
    want["s"] = np.full(16, -1, dtype=np.int64)
    assert c.put("s", want["s"], replace=True) == 2
    assert c.stat("s").generation == 2
    assert a.poll() is None
    before = c.stats()
    new_log = text(tmp_path, "new")
    # Its manager stops it.
    os.kill(a.pid, sig)
    assert a.wait(timeout=60) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert says(u.holder_log, f"drained daemon {a.pid} exited (stopped by its manager)"), \
        u.holder_log()
    assert b.poll() is None
    assert os.path.exists(u.sock)               # not unlinked by the drained daemon
    c2 = serving(u.sock)
    assert c2.stats()["daemon_pid"] == b.pid
    after = c2.stats()
    for k in ("tensors", "restart_stored_fds", "restart_held_tensors", "restart_dropped"):
        assert after[k] == before[k], k
    assert after["devices"][0]["device_used_bytes"] == before["devices"][0]["device_used_bytes"]
    assert not warnings(text(tmp_path, "new")[len(new_log):]), text(tmp_path, "new")
    # Published after the old daemon went: kept as well.
    want["later"] = np.arange(300, dtype=np.float32)
    c2.put("later", want["later"])
    want["small"] = np.linspace(1, 2, 100)
    assert c.put("small", want["small"], replace=True) == 2
    same_bytes(c2, want)
    # The new daemon crashes; a third restores every tensor.
    b.kill()
    b.wait()
    third = u.daemon("third", ready=True)
    c3 = serving(u.sock)
    assert c3.stats()["daemon_pid"] == third.pid
    same_bytes(c3, want)
    assert c3.stat("s").generation == 2 and c3.stat("small").generation == 2
    assert not warnings(text(tmp_path, "third")), text(tmp_path, "third")
    log = u.holder_log()
    assert "stopping drained daemon" not in log and "stopping daemon" not in log, log
    for cl in (c, c2, c3):
        cl.close()


@pytest.mark.parametrize("served", [True, False], ids=["after-serving", "before-serving"])
def test_a_left_drained_daemon_is_stopped_when_the_one_it_drained_for_exits(
        managed, tmp_path, served):
    """A drained daemon left to its manager would serve reads on forever
    with nobody taking writes if the new one exits (its pod deleted in a
    rollback, a crash), before or after it served: the holder stops it, so
    that its manager starts it again, and that daemon takes the store."""
    u = managed
    a, b, c = drained_for(u, gate=not served)
    b.kill()
    b.wait()
    assert a.wait(timeout=60) == 0
    assert says(u.holder_log, f"daemon {b.pid} exited{'' if served else ' before it served'}: "
                f"stopping drained daemon {a.pid}, so that its manager starts it again",
                f"drained daemon {a.pid} exited"), u.holder_log()
    again = u.daemon("again", ready=True)
    c2 = serving(u.sock)
    assert c2.stats()["daemon_pid"] == again.pid
    same_bytes(c2, TENSORS)
    assert c2.put("s", np.zeros(16, dtype=np.int64), replace=True) == 2
    for cl in (c, c2):
        cl.close()


@pytest.mark.parametrize("var,value", [("TENSORD_HOLD_STOP_DRAINED", "no"),
                                       ("TENSORD_HOLD_STOP_DRAINED", "2"),
                                       ("TENSORD_HOLD_DRAIN_MS", "10s"),
                                       ("TENSORD_HOLD_DRAIN_MS", "-1")])
def test_a_bad_holder_setting_is_refused_naming_it(tmp_path, var, value):
    """A holder that guessed what a bad value meant would stop or drain
    daemons its operator meant it not to: it exits, naming the variable."""
    hold = tmp_path / "hold"
    p = start(tmp_path, ["--hold", str(hold)], "holder", **{var: value})
    assert p.wait(timeout=30) == 1
    assert f"tensord --hold {hold}: ${var} is '{value}': it must be " in text(tmp_path, "holder")
    assert not hold.exists()


def test_a_rolling_update_as_the_daemonset_runs_it(managed, tmp_path):
    """deploy/k8s/daemonset.yaml's rolling update, each pod's metrics port
    played by a port of its own: the new pod is not ready while its daemon
    waits for the store (the old one, stopped here, cannot drain yet),
    although the shared socket answers; it is once it restored; then the
    controller deletes the old pod, and the new daemon serves on."""
    u = managed
    old_port, new_port = free_port(), free_port()
    a, c = old_with_tensors(u, args=["--metrics", f"127.0.0.1:{old_port}"])
    assert answers(old_port)
    os.kill(a.pid, signal.SIGSTOP)
    b = u.daemon("new", args=["--metrics", f"127.0.0.1:{new_port}"])
    assert says(u.holder_log, f"asking daemon {a.pid} to drain")
    assert not answers(new_port) and b.poll() is None
    os.kill(a.pid, signal.SIGCONT)
    assert wait_until(lambda: answers(new_port), timeout=30), text(tmp_path, "new")
    assert says(u.holder_log, f"daemon {a.pid} drained", "handed",
                f"daemon {b.pid} serves; leaving drained daemon {a.pid} to its manager")
    assert answers(old_port)                    # the old pod stays ready until deleted
    a.terminate()
    assert a.wait(timeout=60) == 0
    c2 = serving(u.sock)
    assert c2.stats()["daemon_pid"] == b.pid and answers(new_port)
    same_bytes(c2, TENSORS)
    assert "did not drain" not in u.holder_log()
    for cl in (c, c2):
        cl.close()
