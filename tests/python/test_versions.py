"""Versions, atomic sets, waits for the next version and watches (issue 20;
docs/design.md, "Versions, sets and watches"), through the Python client
against a real daemon."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tensord
from tdutil import wait_until


def full(n, v, dtype=np.int64):
    return np.full(n, v, dtype)


def value(t):
    a = np.from_dlpack(t)
    assert (a == a.flat[0]).all(), "a tensor with mixed contents"
    return int(a.flat[0])


# --- generations and commits -------------------------------------------------------------

def test_generations_and_commits_grow_across_replace_unlink_recreate(client):
    g1 = client.put("v/a", full(4, 1))
    c1 = client.stat("v/a").commit
    assert g1 == 1 and c1 >= 1
    g2 = client.put("v/a", full(4, 2), replace=True)
    assert g2 == 2 and client.stat("v/a").commit > c1
    other = client.put("v/b", full(4, 0))
    assert other == 1
    client.unlink("v/a")
    g3 = client.put("v/a", full(4, 3))
    assert g3 == 3, "a name's generation is never reused, also after unlink"
    infos = {i.name: i for i in client.list("v/")}
    assert infos["v/a"].generation == 3 and infos["v/b"].generation == 1
    assert infos["v/a"].commit > infos["v/b"].commit
    with client.attach("v/a") as t:
        assert (t.generation, t.commit) == (3, infos["v/a"].commit)
        assert value(t) == 3
    # create + publish: publish() returns the generation.
    t = client.create("v/a", (4,), "int64", replace=True)
    np.from_dlpack(t)[:] = 4
    assert t.generation == 0
    assert t.publish() == 4 and t.generation == 4
    t.release()


# --- transactions -------------------------------------------------------------------------

def test_a_transaction_commits_everything_in_one_step(client, daemon):
    client.put("tx/old", full(8, 0))
    client.put("tx/gone", full(8, 0))
    with tensord.connect(daemon.socket) as reader:
        with client.transaction() as tx:
            tx.put("tx/old", full(8, 1), replace=True)
            t = tx.create("tx/new", (8,), "int64")
            np.from_dlpack(t)[:] = 1
            t.release()
            tx.unlink("tx/gone")
            # Nothing of it is visible yet.
            with reader.attach("tx/old") as o:
                assert value(o) == 0
            with pytest.raises(tensord.NotFoundError):
                reader.attach("tx/new")
            assert reader.stat("tx/gone").state == "published"
        commit = tx.commit_id
        assert commit and commit > 0
        infos = {i.name: i for i in reader.list("tx/")}
        assert set(infos) == {"tx/old", "tx/new"}
        assert infos["tx/old"].commit == infos["tx/new"].commit == commit
        assert infos["tx/old"].generation == 2 and infos["tx/new"].generation == 1
        s = reader.attach_many("tx/")
        assert {n: value(t) for n, t in s.items()} == {"tx/old": 1, "tx/new": 1}
        for t in s.values():
            t.release()


def test_abort_and_exceptions_leave_no_trace(client):
    client.put("ab/x", full(4, 7))
    base = client.stats()["tensors"]
    tx = client.transaction()
    tx.put("ab/x", full(4, 8), replace=True)
    tx.put("ab/y", full(1 << 16, 8))  # 512 KiB: create + write, not inline
    tx.abort()
    with pytest.raises(ValueError):
        tx.commit()
    with pytest.raises(RuntimeError):
        with client.transaction() as tx:
            tx.put("ab/x", full(4, 9), replace=True)
            raise RuntimeError("the block fails")
    with client.attach("ab/x") as t:
        assert value(t) == 7 and t.generation == 1
    with pytest.raises(tensord.NotFoundError):
        client.stat("ab/y")
    assert client.stats()["tensors"] == base


def test_a_member_that_cannot_be_published_fails_the_commit(client):
    """A staged unlink of a name that went by the commit: the commit fails
    naming it, and nothing of the transaction shows."""
    client.put("fm/keep", full(4, 1))
    client.put("fm/victim", full(4, 1))
    tx = client.transaction()
    tx.put("fm/keep", full(4, 2), replace=True)
    tx.unlink("fm/victim")
    client.unlink("fm/victim")
    with pytest.raises(tensord.NotFoundError, match="fm/victim"):
        tx.commit()
    with client.attach("fm/keep") as t:
        assert value(t) == 1


def test_put_many_is_one_commit(client):
    arrays = {f"pm/{i:03d}": full(64 if i % 2 else 1 << 15, i) for i in range(300)}
    commit = client.put_many(arrays)
    infos = client.list("pm/")
    assert len(infos) == 300 and {i.commit for i in infos} == {commit}
    s = client.attach_many(list(arrays))
    assert {n: value(t) for n, t in s.items()} == {n: int(a[0]) for n, a in arrays.items()}
    for t in s.values():
        t.release()
    # Replacing them all: one more commit, every generation 2.
    commit2 = client.put_many({n: a + 1 for n, a in arrays.items()}, replace=True)
    assert commit2 > commit
    assert {i.generation for i in client.list("pm/")} == {2}


def test_puts_of_up_to_64_kib_travel_inline_into_slabs(client):
    """A put of up to 64 KiB (a slab slot) is one Put request whose bytes the
    daemon writes into a slab: compact and strided sources, alone and in
    put_many."""
    st = client.stats()
    before, inline = st["host_slab_bytes"], st["inline_puts_total"]
    big = np.arange(16384, dtype=np.float32)  # exactly 64 KiB
    strided = np.arange(32768, dtype=np.float32)[::2]  # 64 KiB, gathered
    client.put("in/one", big)
    client.put_many({"in/many": big + 1, "in/strided": strided})
    st = client.stats()
    assert st["inline_puts_total"] - inline == 3
    assert st["host_slab_bytes"] - before == 3 * 65536
    for name, want in (("in/one", big), ("in/many", big + 1), ("in/strided", strided)):
        with client.attach(name) as t:
            assert np.array_equal(np.from_dlpack(t), want), name
    # One byte more: a memfd of its own, not a slab slot.
    client.put("in/over", np.zeros(65537, np.uint8))
    st = client.stats()
    assert st["inline_puts_total"] - inline == 3
    assert st["host_slab_bytes"] - before == 3 * 65536


def test_put_many_never_deadlocks_on_a_daemon_that_stops_reading(daemon_factory):
    """A daemon stops reading a client holding unread descriptors; put_many
    keeps few enough bytes unanswered that its sends never wait on it.
    Large members (a create, whose reply has a descriptor) mixed with 64 KiB
    ones (inline requests): this hung before flow control. In a child, so a
    hang fails the test instead of stopping the suite."""
    d = daemon_factory("--max-fds-in-flight-per-conn", "2")
    code = textwrap.dedent("""
        import sys, numpy as np, tensord
        c = tensord.connect(sys.argv[1])
        arrays = {}
        for i in range(120):
            n = 16384 if i % 2 else 65536  # 64 KiB inline, 256 KiB created
            arrays[f"fc/{i:03d}"] = np.full(n, i, np.float32)
        for step in range(3):
            commit = c.put_many(arrays, replace=True)
        s = c.attach_many("fc/")
        assert len(s) == 120 and {t.commit for t in s.values()} == {commit}
        assert all(int(np.from_dlpack(t)[0]) == int(n[3:]) for n, t in s.items())
        print("ok", commit)
    """)
    r = subprocess.run([sys.executable, "-c", code, d.socket], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr


def test_a_request_too_large_is_refused_and_the_client_goes_on(client):
    """attach_many of names that do not fit in one request (128 KiB) fails
    naming the size, sends nothing, and leaves the connection working."""
    names = [f"big/{i:05d}/" + "x" * 200 for i in range(1000)]
    with pytest.raises(tensord.Error, match="larger than tensord takes"):
        client.attach_many(names)
    assert client.put("big/after", full(2, 7)) == 1
    with client.attach("big/after") as t:
        assert value(t) == 7


# --- waiting for newer ---------------------------------------------------------------------

def test_attach_after_a_generation(client, daemon):
    gen = client.put("w/x", full(4, 1))
    with client.attach("w/x", after=0) as t:  # anything published: at once
        assert t.generation == gen
    with pytest.raises(tensord.TimedOutError):
        client.attach("w/x", after=gen, timeout=0)
    with pytest.raises(tensord.TimedOutError):
        client.attach("w/x", after=gen, timeout=0.2)

    got = {}

    def waiter():
        with tensord.connect(daemon.socket) as c:
            with c.attach("w/x", after=gen, timeout=30) as t:
                got["v"] = (t.generation, value(t))

    th = threading.Thread(target=waiter)
    th.start()
    assert wait_until(lambda: client.stats()["waiters"] == 1), client.stats()
    client.put("w/other", full(4, 5))  # another name's commit does not wake it
    # A wake is sent with the commit, before the put's reply: the waiter is still there.
    assert client.stats()["waiters"] == 1
    assert "v" not in got
    client.put("w/x", full(4, 2), replace=True)
    th.join(30)
    assert got["v"] == (gen + 1, 2)
    assert client.stats()["waiters"] == 0


def test_attach_many_after_a_commit(client, daemon):
    c1 = client.put_many({"am/a": full(4, 1), "am/b": full(4, 1)})
    s = client.attach_many(["am/a", "am/b"])
    assert {t.commit for t in s.values()} == {c1}
    for t in s.values():
        t.release()
    with pytest.raises(tensord.NotFoundError, match="am/missing"):
        client.attach_many(["am/a", "am/missing"])
    with pytest.raises(tensord.TimedOutError):
        client.attach_many("am/", after=c1, timeout=0)
    got = {}

    def waiter():
        with tensord.connect(daemon.socket) as c:
            s = c.attach_many("am/", after=c1, timeout=30)
            got["v"] = {n: (t.commit, value(t)) for n, t in s.items()}
            for t in s.values():
                t.release()

    th = threading.Thread(target=waiter)
    th.start()
    assert wait_until(lambda: client.stats()["waiters"] == 1), client.stats()
    client.put("other/x", full(4, 9))  # outside the prefix: no wake
    assert client.stats()["waiters"] == 1
    assert "v" not in got
    c2 = client.put_many({"am/a": full(4, 2), "am/b": full(4, 2)}, replace=True)
    th.join(30)
    assert got["v"] == {"am/a": (c2, 2), "am/b": (c2, 2)}
    # An unlink under the prefix is a newer commit too.
    client.unlink("am/b")
    s = client.attach_many("am/", after=c2, timeout=0)
    assert list(s) == ["am/a"]
    for t in s.values():
        t.release()


def test_waits_count_against_the_per_connection_limit(daemon_factory):
    d = daemon_factory("--max-waiters-per-conn", "4")
    with tensord.connect(d.socket) as c:
        threads, errors = [], []

        def wait(i):
            try:
                c.attach(f"nobody/{i}", timeout=3)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        for i in range(6):
            threads.append(threading.Thread(target=wait, args=(i,)))
            threads[-1].start()
        for t in threads:
            t.join()
        assert any(isinstance(e, tensord.Error) and e.errno == 11 for e in errors), errors
        assert any(isinstance(e, tensord.TimedOutError) for e in errors), errors


# --- a reader never sees a mixed set ----------------------------------------------------------

READER = textwrap.dedent("""
    import sys, numpy as np, tensord
    c = tensord.connect()
    names = [f"mix/{i}" for i in range(8)]
    n, last = int(sys.argv[1]), 0
    print("ready", flush=True)
    for i in range(n):
        s = c.attach_many(names)
        vals = {int(np.from_dlpack(t).flat[0]) for t in s.values()}
        commits = {t.commit for t in s.values()}
        assert len(s) == 8, ("a missing member", list(s))
        assert len(vals) == 1, ("a mixed set", vals, commits)
        v = vals.pop()
        assert v >= last, (v, last)
        last = v
        for t in s.values():
            t.release()
    print("done", last, flush=True)
""")


def test_attach_many_never_sees_a_mixed_set(client, daemon):
    names = [f"mix/{i}" for i in range(8)]
    client.put_many({n: full(1 << 14, 0) for n in names})
    r = subprocess.Popen([sys.executable, "-c", READER, "10000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, TENSORD_SOCKET=daemon.socket))
    assert r.stdout.readline().strip() == "ready", r.stderr.read()
    v = 0
    while r.poll() is None:
        v += 1
        # Half of the versions by put_many, half by a hand-made transaction.
        if v % 2:
            client.put_many({n: full(1 << 14, v) for n in names}, replace=True)
        else:
            with client.transaction() as tx:
                for n in names:
                    tx.put(n, full(1 << 14, v), replace=True)
    out, err = r.communicate(timeout=60)
    assert r.returncode == 0, err
    assert out.startswith("done"), out
    assert v > 10, "the writer committed while the reader read"


# --- kill -9 of a writer mid-transaction ---------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, numpy as np, tensord
    c = tensord.connect()
    stage = sys.argv[1]
    tx = c.transaction()
    tx.put("k/a", np.full(1 << 16, 2, np.int64), replace=True)
    if stage == "staged-two":
        t = tx.create("k/b", (1 << 16,), "int64", replace=True)
        np.from_dlpack(t)[:] = 2
    if stage == "unlink-staged":
        tx.unlink("k/b")
    print("staged", flush=True)
    import time
    time.sleep(60)
""")


@pytest.mark.parametrize("stage", ["staged-one", "staged-two", "unlink-staged"])
def test_kill9_mid_transaction_leaves_the_old_set(client, daemon, stage):
    client.put_many({"k/a": full(1 << 16, 1), "k/b": full(1 << 16, 1)})
    before = client.stats()
    p = subprocess.Popen([sys.executable, "-c", WRITER, stage], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, TENSORD_SOCKET=daemon.socket))
    assert p.stdout.readline().strip() == "staged"
    p.send_signal(signal.SIGKILL)
    p.wait()
    s = client.attach_many(["k/a", "k/b"])
    assert {n: (value(t), t.generation) for n, t in s.items()} == {"k/a": (1, 1),
                                                                  "k/b": (1, 1)}
    for t in s.values():
        t.release()

    def settled():
        now = client.stats()
        return (now["tensors"], now["devices"][0]["device_used_bytes"]) == \
            (before["tensors"], before["devices"][0]["device_used_bytes"])
    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled(), (client.stats(), before)


# --- watches ----------------------------------------------------------------------------------

def test_watch_reports_each_commit_in_order(client, daemon):
    with tensord.connect(daemon.socket) as wc:
        with wc.watch("wt/") as w:
            g = client.put("wt/a", full(4, 1))
            client.put("elsewhere", full(4, 1))
            commit = client.put_many({"wt/a": full(4, 2), "wt/b": full(4, 2)}, replace=True)
            client.unlink("wt/b")
            evs = [w.next(timeout=10) for _ in range(4)]
            assert [(e.kind, e.name, e.generation) for e in evs] == [
                ("published", "wt/a", g), ("published", "wt/a", g + 1),
                ("published", "wt/b", 1), ("unlinked", "wt/b", 1)]
            assert evs[1].commit == evs[2].commit == commit < evs[3].commit
            assert w.poll() is None


def test_watch_after_replays_the_state(client, daemon):
    c0 = client.put_many({"rp/a": full(4, 1), "rp/b": full(4, 1)})
    c1 = client.put("rp/a", full(4, 2), replace=True) and client.stat("rp/a").commit
    client.unlink("rp/b")
    with client.watch("rp/", after=c0) as w:
        evs = [w.next(timeout=10) for _ in range(2)]
    assert [(e.kind, e.name) for e in evs] == [("published", "rp/a"), ("unlinked", "rp/b")]
    assert evs[0].commit == c1


def test_a_watch_that_does_not_read_lags_with_bounded_memory(client, daemon):
    with tensord.connect(daemon.socket) as wc:
        w = wc.watch("lag/", queue=16)
        for i in range(400):
            client.put(f"lag/{i % 4}", full(4, i), replace=i >= 4)
        evs = []
        while (e := w.next(timeout=5)) is not None:
            evs.append(e)
            if e.kind != "lagged" and e.name == "lag/3" and e.generation == 100:
                break
        assert evs[0].kind == "lagged", evs[:3]
        # Coalesced: the newest per name, each name's in order; far fewer
        # events than the 400 commits.
        last = {}
        for e in evs:
            if e.kind == "lagged":
                continue
            assert e.generation > last.get(e.name, 0), (e, last)
            last[e.name] = e.generation
        assert last["lag/3"] == 100 and len(evs) < 200, len(evs)
        w.close()


def test_watches_count_against_the_uid_limit(daemon_factory):
    d = daemon_factory("--max-watches-per-uid", "2")
    with tensord.connect(d.socket) as c:
        a, b = c.watch("x/"), c.watch("y/")
        with pytest.raises(tensord.Error, match="max-watches-per-uid"):
            c.watch("z/")
        a.close()
        c.watch("z/").close()
        b.close()
