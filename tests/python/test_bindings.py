"""Attach without a round trip (issue 22; docs/design.md, "Attach without a
round trip").

An attach asks the daemon to bind its lease to a slot of the connection's
binding page; later attaches of the name in this process are served from
that lease while the slot holds, with no request. These tests check that
such attaches see exactly what a round-trip attach would: no request
reaches the daemon; unlink and replace are exact for any attach that starts
after they returned, in this process or another; a racing reader never
sees another tensor's bytes; what is no longer named is let go without
the client's help; mutable tensors, fork, kill -9 and TENSORD_BIND=0.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tensord
from tdutil import wait_until


def attaches(c):
    return c.stats()["requests_total"].get("attach", 0)


def figure(c, name):
    return c.stats()[name]


# 4 KiB lives in a slab window; 1 MiB has a memfd of its own.
SIZES = {"slab": 1024, "memfd": 256 << 10}


@pytest.mark.parametrize("where", SIZES)
def test_a_repeat_attach_asks_the_daemon_nothing(client, daemon, where):
    ref = np.arange(SIZES[where], dtype=np.float32)
    client.put("b/x", ref)
    with tensord.connect(daemon.socket) as r:
        with r.attach("b/x") as t:
            np.testing.assert_array_equal(np.from_dlpack(t), ref)
        # The first attach of a connection binds nothing (a one-shot client
        # pays for no page); the second asks for the page and binds.
        assert figure(client, "binding_pages_total") == 0
        r.attach("b/x").release()
        assert figure(client, "binding_pages_total") == 1
        before = attaches(client)
        bound = figure(client, "bindings_total")
        held = [r.attach("b/x") for _ in range(1000)]
        for t in held[::97]:
            np.testing.assert_array_equal(np.from_dlpack(t), ref)
            assert t.generation == held[0].generation
        for t in held:
            t.release()
        # No request reached the daemon, and no new binding was made.
        assert attaches(client) == before
        assert figure(client, "bindings_total") == bound >= 1


def test_unlink_is_exact_for_the_next_attach_in_another_process(client, child):
    """Each round: the child unlinks, then says so; the attach we start after
    that must fail, though we hold a binding of the name."""
    ch = child("""
        import sys, numpy as np, tensord
        c = tensord.connect()
        for line in sys.stdin:
            i = int(line)
            c.put("b/u", np.full(64, i, np.int32))
            print("put", flush=True)
            sys.stdin.readline()
            c.unlink("b/u")
            print("gone", flush=True)
        """)
    for i in range(200):
        ch.proc.stdin.write(f"{i}\n")
        ch.proc.stdin.flush()
        ch.expect("put")
        with client.attach("b/u") as t:
            assert np.from_dlpack(t)[0] == i
        with client.attach("b/u") as t:  # served from the binding
            assert np.from_dlpack(t)[0] == i
        ch.proc.stdin.write("go\n")
        ch.proc.stdin.flush()
        ch.expect("gone")
        with pytest.raises(FileNotFoundError, match="b/u"):
            client.attach("b/u").release()


def test_unlink_through_another_connection_of_this_process(daemon):
    with tensord.connect(daemon.socket) as a, tensord.connect(daemon.socket) as b:
        a.put("b/self", np.ones(16, np.float32))
        for _ in range(50):
            b.attach("b/self").release()
            a.unlink("b/self")
            with pytest.raises(FileNotFoundError):
                b.attach("b/self")
            a.put("b/self", np.ones(16, np.float32))


@pytest.mark.parametrize("where", SIZES)
def test_replace_is_exact_for_the_next_attach(client, daemon, where):
    n = SIZES[where]
    with tensord.connect(daemon.socket) as w:
        w.put("b/r", np.zeros(n, np.float32))
        old = client.attach("b/r")
        client.attach("b/r").release()  # bound, then served locally
        for i in range(1, 60):
            w.put("b/r", np.full(n, i, np.float32), replace=True)
            with client.attach("b/r") as t:
                a = np.from_dlpack(t)
                assert a[0] == a[-1] == i
                assert t.generation == i + 1
        # The first version still serves the lease taken before the replaces.
        assert np.from_dlpack(old).max() == 0
        old.release()


def test_a_racing_reader_never_sees_foreign_bytes(client, child):
    """A writer replaces the name, or unlinks it and puts it again, over and
    over with the same size (slab slots are reused: other names come and go
    in between), each version filled with its own number; a reader attaching
    all along sees only whole versions, each one the writer published, in
    order."""
    ch = child("""
        import sys, numpy as np, tensord
        c = tensord.connect()
        c.put("b/race", np.full(512, 0, np.int64))
        print("ready", flush=True)
        for i in range(1, 3000):
            c.put("b/other", np.full(512, -i, np.int64))  # takes freed slots
            c.unlink("b/other")
            if i % 2:
                c.put("b/race", np.full(512, i, np.int64), replace=True)
            else:
                c.unlink("b/race")
                c.put("b/race", np.full(512, i, np.int64))
        print("done", flush=True)
        sys.stdin.readline()
        """)
    ch.expect("ready")
    last, seen, misses = 0, 0, 0
    deadline = time.monotonic() + 120
    while ch.lines.empty() and time.monotonic() < deadline:
        try:
            t = client.attach("b/race")
        except FileNotFoundError:
            misses += 1
            continue
        with t:
            a = np.from_dlpack(t)
            v = int(a[0])
            assert (a == v).all(), "a torn or foreign tensor"
            assert v >= last, f"went back from version {last} to {v}"
            last, seen = v, seen + 1
            del a
    ch.expect("done")
    assert seen > 100 and last > 0
    ch.proc.stdin.write("\n")
    ch.proc.stdin.flush()


@pytest.mark.parametrize("where", SIZES)
def test_what_is_no_longer_named_is_let_go_without_the_client(daemon, where):
    """A client that attached once and then does nothing holds a binding; the
    unlink elsewhere frees the tensor anyway (the watcher thread lets go)."""
    with tensord.connect(daemon.socket) as w, tensord.connect(daemon.socket) as idle:
        w.put("b/idle", np.ones(SIZES[where], np.float32))
        idle.attach("b/idle").release()
        idle.attach("b/idle").release()  # the second binds
        assert figure(w, "leases") == 1  # the binding's lease
        w.unlink("b/idle")
        assert wait_until(lambda: figure(w, "tensors") == 0 and figure(w, "leases") == 0,
                          timeout=10), w.stats()
        assert figure(w, "bindings_cleared_total") >= 1


def test_a_local_lease_keeps_an_unlinked_tensor(client, daemon):
    with tensord.connect(daemon.socket) as w:
        w.put("b/keep", np.arange(100, dtype=np.float64))
        client.attach("b/keep").release()
        t = client.attach("b/keep")  # local
        w.unlink("b/keep")
        # The binding leaves the table (the watcher or, here at the latest, this
        # attach finds its slot cleared); the local lease alone keeps the tensor.
        with pytest.raises(tensord.NotFoundError):
            client.attach("b/keep")
        assert figure(w, "tensors") == 1
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(100, dtype=np.float64))
        t.release()
        assert wait_until(lambda: figure(w, "tensors") == 0, timeout=10), (figure(w, "leases"), figure(w, "tensors"), w.stats()["requests_total"])


def test_a_stray_write_never_shows_in_a_later_local_attach(client):
    for name, n in (("b/cow-slab", 1024), ("b/cow-memfd", 256 << 10)):
        ref = np.arange(n, dtype=np.float32)
        client.put(name, ref)
        client.attach(name).release()
        a = client.attach(name)
        x = np.from_dlpack(a)
        ctypes.memset(x.__array_interface__["data"][0], 0x7F, x.nbytes)
        with client.attach(name) as b:
            np.testing.assert_array_equal(np.from_dlpack(b), ref)
        a.release()
        with client.attach(name) as b:
            np.testing.assert_array_equal(np.from_dlpack(b), ref)


def test_mutable_tensors_are_shared_writable_through_local_leases(daemon):
    with tensord.connect(daemon.socket) as w, tensord.connect(daemon.socket) as r:
        t = w.create("b/mut", (256,), np.float32, mutable=True)
        np.from_dlpack(t)[:] = 1
        t.publish()
        w.attach("b/mut").release()
        r.attach("b/mut").release()
        for i in range(2, 20):
            with w.attach("b/mut") as wt:  # local, writable
                np.from_dlpack(wt)[:] = i
            with r.attach("b/mut") as rt:
                assert np.from_dlpack(rt).min() == i
        t.release()


def test_kill_9_with_bindings_leaks_nothing(client, child):
    client.put("b/k", np.ones(1 << 18, np.float32))
    ch = child("""
        import tensord
        c = tensord.connect()
        held = [c.attach("b/k") for _ in range(1000)]
        c.attach("b/other") if False else None
        print("held", flush=True)
        import time; time.sleep(600)
        """)
    ch.expect("held")
    # Two daemon leases behind 1000: the first attach's own (a connection's
    # first attach binds nothing), and the binding's behind the 999 others.
    assert figure(client, "leases") == 2
    os.kill(ch.proc.pid, signal.SIGKILL)
    ch.proc.wait()
    assert wait_until(lambda: figure(client, "leases") == 0, timeout=10)
    client.unlink("b/k")
    assert wait_until(lambda: figure(client, "tensors") == 0, timeout=10)


def test_fork_child_attaches_on_its_own_connection(client, daemon):
    client.put("b/f", np.arange(32, dtype=np.int32))
    with tensord.connect(daemon.socket) as c:
        c.attach("b/f").release()
        held = c.attach("b/f")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                with c.attach("b/f") as t:  # the child's own connection
                    ok = (np.from_dlpack(t) == np.arange(32)).all()
                ok = ok and (np.from_dlpack(held) == np.arange(32)).all()
                code = 0 if ok else 2
            finally:
                os.write(w, b"%d" % code)
                os._exit(code)
        os.close(w)
        assert os.read(r, 8) == b"0"
        os.waitpid(pid, 0)
        os.close(r)
        np.testing.assert_array_equal(np.from_dlpack(held), np.arange(32))
        held.release()
        client.unlink("b/f")
        with pytest.raises(FileNotFoundError):
            c.attach("b/f")


def test_tensord_bind_0_takes_round_trips(client, daemon):
    client.put("b/off", np.ones(8, np.float32))
    code = ("import tensord, sys; c = tensord.connect(sys.argv[1]); "
            "[c.attach('b/off').release() for _ in range(50)]")
    before = attaches(client)
    subprocess.run([sys.executable, "-c", code, daemon.socket], check=True, timeout=60,
                   env=dict(os.environ, TENSORD_BIND="0"))
    assert attaches(client) - before == 50
    before = attaches(client)
    subprocess.run([sys.executable, "-c", code, daemon.socket], check=True, timeout=60)
    # The first attach binds nothing, the second binds, the rest are local.
    assert attaches(client) - before == 2


def test_a_million_local_leases_on_one_connection(client):
    """Local leases cost the daemon nothing: one process holds a million of
    one tensor on one connection, with one daemon lease and a few mappings."""
    client.put("b/m", np.arange(16, dtype=np.float32))
    before = figure(client, "leases")
    held = [client.attach("b/m") for _ in range(1_000_000)]
    # The first attach's own lease, and the binding's behind all the others.
    assert figure(client, "leases") - before == 2
    np.testing.assert_array_equal(np.from_dlpack(held[-1]), np.arange(16, dtype=np.float32))
    for t in held:
        t.release()
