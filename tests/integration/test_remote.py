"""Remote attach of host tensors (docs/remote.md, "Remote attach: the data
flow"): two real daemons on 127.0.0.1, peered, UCX over TCP loopback. A
client of node-b attaches "@node-a/NAME" through node-b and gets a normal
read-only local tensor whose bytes match node-a's; a second attach pulls
nothing; names not exported, unknown peers and a dead node-a are refused
with errors that name the peer, the tensor and the reason; node-b killed
while node-a serves leaves node-a with no leases."""
import os
import signal
import sys
import time

import numpy as np
import pytest

from conftest import build_path, wait_until
from test_peers import free_port, peers, secret_file, state_is

# The integration suites run without PYTHONPATH: the Python module of this
# build, or of the plain build when this one has none (the sanitizer builds
# make only the daemon and the C programs; the client is then the plain one).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _d in (build_path("python"), os.path.join(ROOT, "build", "python")):
    if os.path.isdir(os.path.join(_d, "tensord")):
        sys.path.insert(0, _d)
        break
import tensord  # noqa: E402

UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def start_pair(daemon_factory, tmp_path, exports=("model/",), extra_a=(), extra_b=()):
    key = secret_file(tmp_path, "peer.key")
    pa, pb = free_port(), free_port()
    args_a = ["--node-name", "node-a", "--peer-listen", "127.0.0.1:%d" % pa,
              "--peer", "node-b=127.0.0.1:%d" % pb, "--peer-secret-file", key]
    for e in exports:
        args_a += ["--export", e]
    a = daemon_factory(*(args_a + list(extra_a)), env=UCX_ENV, sub="a")
    b = daemon_factory("--node-name", "node-b", "--peer-listen", "127.0.0.1:%d" % pb,
                       "--peer", "node-a=127.0.0.1:%d" % pa, "--peer-secret-file", key,
                       *extra_b, env=UCX_ENV, sub="b")
    pair_up(a, b)
    return a, b


def pair_up(a, b, timeout=10):
    """Waits until node-a (a) and node-b (b) call each other up; skips the
    test when tensord was built without UCX."""
    assert wait_until(lambda: state_is(a, "node-b", "up") and state_is(b, "node-a", "up"),
                      timeout=timeout), (peers(a), peers(b), a.read_log()[-2000:])
    if "built without UCX" in b.read_log():
        pytest.skip("tensord was built without UCX")


def when_ready(attach, what, timeout=10):
    """attach(what), retried while the peer has not sent its UCX worker
    address: the UCX addresses cross just after the peers come up."""
    end = time.monotonic() + timeout
    while True:
        try:
            return attach(what)
        except OSError as e:
            if "has not sent its UCX worker address" not in str(e) or \
                    time.monotonic() > end:
                raise
            time.sleep(0.05)


def attach_when_ready(cb, name, timeout=10):
    """The UCX addresses cross just after the peers come up: retry EHOSTUNREACH."""
    return when_ready(cb.attach, name, timeout)


def attach_many_when_ready(cb, what, timeout=10):
    """cb.attach_many(what), retried as attach_when_ready() does."""
    return when_ready(cb.attach_many, what, timeout)


def start_node_m(daemon_factory, tmp_path):
    """A daemon node-m listening for peers on 127.0.0.1 and exporting
    model/, for a FakePeer (test_peers.py) to speak to: (d, key, port)."""
    key = secret_file(tmp_path, "peer.key")
    port = free_port()
    d = daemon_factory("--node-name", "node-m", "--peer-listen", "127.0.0.1:%d" % port,
                       "--peer-secret-file", key, "--export", "model/", env=UCX_ENV, sub="m")
    return d, key, port


def fake_peer_up(d, key, port):
    """A FakePeer node-z dialled to node-m (d), once d calls it up: (me, s)."""
    from test_peers import FakePeer
    me = FakePeer("node-z", key)
    s = me.dial(port, "node-m")
    assert wait_until(lambda: state_is(d, "node-z", "up"), timeout=5)
    return me, s


def host_used(d):
    """Bytes the host device's tensors take on d."""
    dev = next(x for x in d.stats()["devices"] if x["device"] == "cpu")
    return dev[next(k for k in dev if "used" in k)]


def mapped_inode(addr):
    """The inode of the file mapped at addr in this process (a memfd's), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[4] if parts[4] != "0" else None
    return None


CASES = [
    ("model/small", np.arange(1024, dtype=np.float32)),               # 4 KiB
    ("model/mid", np.arange(1 << 20, dtype=np.uint8).reshape(1024, 1024)),   # 1 MiB
    ("model/big", np.random.default_rng(7).integers(0, 1 << 62, (8 << 20,), np.int64)),  # 64 MiB
    ("model/half", np.linspace(0, 1, 3000).astype(np.float16).reshape(30, 100)),
    ("model/c64", (np.arange(500) + 1j * np.arange(500)).astype(np.complex64)),
]


def test_remote_attach_bytes_identical_read_only_zero_copy(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        for name, arr in CASES:
            ca.put(name, arr, mode=0o644)
        first = attach_when_ready(cb, "@node-a/" + CASES[0][0])
        first.release()
        for name, arr in CASES:
            t = cb.attach("@node-a/" + name)
            pulls = b.stats()["remote_pulls_total"]
            got = np.from_dlpack(t)
            assert got.dtype == arr.dtype and got.shape == arr.shape, name
            np.testing.assert_array_equal(got, arr)
            assert not got.flags.writeable, name
            with pytest.raises(ValueError):
                got[...] = 0
            # A second attach of the live replica pulls nothing and maps the
            # same memory; another connection is served by the replica too,
            # without a pull request to node-a: node-a watches the name for
            # node-b, and node-b hears from it (one sync) before it serves
            # (docs/remote.md, "Freshness").
            t2 = cb.attach("@node-a/" + name)
            got2 = np.from_dlpack(t2)
            np.testing.assert_array_equal(got2, arr)
            assert mapped_inode(got.ctypes.data) == mapped_inode(got2.ctypes.data) is not None
            hits = b.stats()["remote_replica_hits_total"]
            asked = a.stats()["remote_pull_requests_total"]
            with tensord.Client(b.socket) as cb2:
                t3 = cb2.attach("@node-a/" + name)
                np.testing.assert_array_equal(np.from_dlpack(t3), arr)
                t3.release()
            s = b.stats()
            assert s["remote_pulls_total"] == pulls, (name, s)
            assert s["remote_replica_hits_total"] == hits + 1, (name, s)
            assert a.stats()["remote_pull_requests_total"] == asked, name
            del got, got2
            t.release()
            t2.release()
        s = b.stats()
        assert s["remote_pulls_total"] == len(CASES), s
        assert s["remote_pull_bytes_total"] == sum(arr.nbytes for _, arr in CASES)
        assert a.stats()["remote_served_total"] == len(CASES)
        # Per peer, as tensorctl peers shows it.
        total = sum(arr.nbytes for _, arr in CASES)
        pb = next(p for p in cb.peers() if p.name == "node-a")
        assert (pb.pulled, pb.pulled_bytes, pb.pull_errors) == (len(CASES), total, 0), pb
        assert pb.replicas == len(CASES) and pb.replica_bytes == total, pb
        # A list of "@node-a/" shows what node-a exports to node-b (issue 30
        # item 9); "@" alone this node's replicas; an unknown peer is ENOENT.
        assert {t.name for t in cb.list("@node-a/")} == {"@node-a/" + n for n, _ in CASES}
        assert {t.name for t in cb.list("@")} >= {"@node-a/" + n for n, _ in CASES}
        with pytest.raises(FileNotFoundError):
            cb.list("@node-z/")
        with tensord.Client(a.socket) as ca2:
            pa = next(p for p in ca2.peers() if p.name == "node-b")
        assert (pa.served, pa.served_bytes, pa.pulled) == (len(CASES), total, 0), pa
        # And as metrics, labelled by peer.
        sb, sa = b.stats(), a.stats()
        assert sb["peer_up"] == {"node-a": 1} and sa["peer_up"] == {"node-b": 1}
        assert sb["peer_pulled_bytes_total"]["node-a"] == total
        assert sb["peer_replica_bytes"]["node-a"] == total
        assert sa["peer_served_bytes_total"]["node-b"] == total
        assert sb["peer_pull_errors_total"]["node-a"] == 0
        with tensord.Client(b.socket) as cm:
            text = cm.metrics()
        assert 'tensord_peer_pulled_bytes_total{peer="node-a"} %d' % total in text
        # Node-a's pull leases all ended.
        assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=5)


def test_replaced_name_is_pulled_again(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/w", np.full(64, 1, np.int32), mode=0o644)
        with attach_when_ready(cb, "@node-a/model/w") as t:
            np.testing.assert_array_equal(np.from_dlpack(t), np.full(64, 1, np.int32))
            assert a.stats()["remote_watched_names"] == 1
            ca.put("model/w", np.full(64, 2, np.int32), mode=0o644, replace=True)
            # Node-a tells node-b, which drops its replica (and so every
            # binding of it); the next attach, from any connection, pulls
            # the new generation.
            assert wait_until(lambda: b.stats()["remote_replicas_changed_total"] == 1,
                              timeout=5)
            assert b.stats()["remote_replicas"] == 0
            assert a.stats()["remote_watched_names"] == 0
            for c in (cb, tensord.Client(b.socket)):
                with c.attach("@node-a/model/w") as t2:
                    np.testing.assert_array_equal(np.from_dlpack(t2),
                                                  np.full(64, 2, np.int32))
            # The first lease still sees the bytes it had.
            np.testing.assert_array_equal(np.from_dlpack(t), np.full(64, 1, np.int32))
        assert b.stats()["remote_pulls_total"] == 2
        # An unlink on node-a is told too.
        ca.unlink("model/w")
        assert wait_until(lambda: b.stats()["remote_replicas_changed_total"] == 2, timeout=5)
        with pytest.raises(FileNotFoundError):
            cb.attach("@node-a/model/w")


def test_replica_never_goes_back_under_replaces(daemon_factory, tmp_path):
    """A reader on node-b attaching in a loop while node-a replaces the name:
    whole versions only, never an older one after a newer, and the last one
    once node-a's word arrived; a replica serves after node-b heard from
    node-a (docs/remote.md, "Freshness")."""
    import threading
    a, b = start_pair(daemon_factory, tmp_path)
    n = 1 << 14
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/v", np.zeros(n, np.int64), mode=0o644)
        attach_when_ready(cb, "@node-a/model/v").release()
        done = threading.Event()

        def writer():
            with tensord.Client(a.socket) as cw:
                for v in range(1, 61):
                    cw.put("model/v", np.full(n, v, np.int64), mode=0o644, replace=True)
                    time.sleep(0.002)
            done.set()

        th = threading.Thread(target=writer)
        th.start()
        seen, last = [], -1
        while not done.is_set() or len(seen) < 20:
            with cb.attach("@node-a/model/v") as t:
                got = np.from_dlpack(t)
                v = int(got[0])
                assert (got == v).all(), "a torn version"
                assert v >= last, (v, last)
                last = v
                seen.append(v)
        th.join()
        assert wait_until(lambda: int(np.from_dlpack(cb.attach("@node-a/model/v"))[0]) == 60,
                          timeout=5)
        assert len(set(seen)) > 1, seen   # the reader saw versions change
        assert b.stats()["remote_pulls_total"] < len(seen) + 2


def test_both_nodes_serve_clients_while_a_big_pull_moves(daemon_factory, tmp_path):
    """Over TCP a large transfer keeps UCX busy for its whole length: the
    daemons progress it in slices (xport/ucx.c), so both keep answering
    their clients, and their heartbeats keep the peers up, meanwhile."""
    import threading
    a, b = start_pair(daemon_factory, tmp_path)
    big = np.arange(512 << 20, dtype=np.uint8)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()
        ca.put("model/big", big, mode=0o644)
        lost = a.stats()["peer_lost_total"], b.stats()["peer_lost_total"]
        out = {}

        def pull():
            with tensord.Client(b.socket) as c2, c2.attach("@node-a/model/big") as t:
                out["ok"] = np.array_equal(np.from_dlpack(t)[::4096], big[::4096])

        th = threading.Thread(target=pull)
        th.start()
        assert wait_until(lambda: a.stats()["remote_inflight_bytes"] > 0 or not th.is_alive(),
                          timeout=30)
        served = {"a": 0, "b": 0}
        with tensord.Client(a.socket) as pa, tensord.Client(b.socket) as pb:
            while th.is_alive():
                for k, c in (("a", pa), ("b", pb)):
                    c.stats()
                    if th.is_alive():
                        served[k] += 1
        th.join()
        assert out.get("ok"), out
        # Answered while the pull was on its way, on both nodes.
        assert served["a"] > 0 and served["b"] > 0, served
        assert (a.stats()["peer_lost_total"], b.stats()["peer_lost_total"]) == lost


def test_attach_waits_for_a_publish_on_the_peer(daemon_factory, tmp_path):
    """An attach of @node-a/NAME with a timeout waits for node-a to publish
    it, as a local attach waits: node-a says "not yet" and tells node-b of
    the publish (no polling); a name never published, or not exported,
    times out with the usual error; after= waits for a newer generation."""
    import threading
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()
        asked = a.stats()["remote_pull_requests_total"]
        out = {}

        def waiter():
            # One Attach with its whole timeout (the aio client's; the sync
            # client waits in 100 ms Attaches, to run signal handlers).
            import asyncio
            import tensord.aio

            async def w():
                c = await tensord.aio.connect(b.socket)
                try:
                    t = await c.attach("@node-a/model/later", timeout=20)
                    out["v"] = np.from_dlpack(t).copy()
                    t.release()
                finally:
                    await c.close()
            asyncio.run(w())

        th = threading.Thread(target=waiter)
        th.start()
        assert wait_until(lambda: b.stats()["remote_pulls"] == 1 and
                          a.stats()["remote_watched_names"] >= 1, timeout=10)
        time.sleep(0.3)  # node-a said "not yet" and node-b waits, asking nothing
        assert a.stats()["remote_pull_requests_total"] == asked + 1
        gen = ca.put("model/later", np.arange(64, dtype=np.int16), mode=0o644)
        th.join(20)
        np.testing.assert_array_equal(out["v"], np.arange(64, dtype=np.int16))
        # Asked twice: the first "not yet", then once told of the publish.
        assert a.stats()["remote_pull_requests_total"] == asked + 2
        assert wait_until(lambda: b.stats()["remote_pulls"] == 0, timeout=5)
        # A newer generation than the one held: waits for the replace.
        def newer():
            with tensord.Client(b.socket) as cw, cw.attach("@node-a/model/later", timeout=20,
                                                          after=gen) as t:
                out["g"] = t.generation
                out["n"] = np.from_dlpack(t).copy()

        th = threading.Thread(target=newer)
        th.start()
        # node-a was asked and said "not yet" before the replace: else this
        # tests an attach of what is there.
        assert wait_until(lambda: b.stats()["remote_pulls"] == 1 and
                          a.stats()["remote_pull_requests_total"] == asked + 3, timeout=10), \
            (a.stats()["remote_pull_requests_total"], asked)
        gen2 = ca.put("model/later", np.full(64, 7, np.int16), mode=0o644, replace=True)
        th.join(20)
        assert out["g"] == gen2 > gen and (out["n"] == 7).all(), out
        # Never published; not exported: both time out with the usual words.
        watched = a.stats()["remote_watched_names"]
        for name in ("@node-a/model/never", "@node-a/other/hidden"):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError) as e:
                cb.attach(name, timeout=0.3)
            assert time.monotonic() - t0 >= 0.25
            assert "node-a" in str(e.value) and "within the timeout" in str(e.value), e
        # The name not exported was never watched: node-b learns nothing of it.
        assert a.stats()["remote_watched_names"] == watched + 1
        assert wait_until(lambda: b.stats()["remote_pulls"] == 0, timeout=5)


def test_remote_wait_cancelled_by_asyncio(daemon_factory, tmp_path):
    """asyncio's cancellation of a waiting remote attach (its Cancel) ends
    it at once with nothing left on node-b."""
    import asyncio
    import tensord.aio
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()

    async def main():
        c = await tensord.aio.connect(b.socket)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.attach("@node-a/model/nothing", timeout=60), 0.3)
            # The connection still serves, and the wait is gone.
            t = await c.attach("@node-a/model/s")
            t.release()
        finally:
            await c.close()

    asyncio.run(main())
    assert wait_until(lambda: b.stats()["remote_pulls"] == 0, timeout=5)


def test_replica_freed_after_keep(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path, extra_b=("--replica-keep", "200"))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/k", np.ones(1 << 18, np.float32), mode=0o644)
        with attach_when_ready(cb, "@node-a/model/k"):
            time.sleep(0.6)
            assert b.stats()["remote_replicas"] == 1  # leased: kept
        assert wait_until(lambda: b.stats()["remote_replicas"] == 0, timeout=5)
        assert b.stats()["remote_replica_bytes"] == 0


def test_refusals_name_the_peer_the_tensor_and_the_reason(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/w", np.ones(4, np.float32), mode=0o644)
        ca.put("secret/w", np.ones(4, np.float32), mode=0o644)
        ca.put("model/private", np.ones(4, np.float32), mode=0o600)
        ca.put("model/mut", np.ones(4, np.float32), mutable=True, mode=0o644)
        attach_when_ready(cb, "@node-a/model/w").release()
        with pytest.raises(FileNotFoundError) as e:
            cb.attach("@node-a/secret/w")
        assert "secret/w" in str(e.value) and "node-a" in str(e.value)
        assert "not exported" in str(e.value)
        with pytest.raises(FileNotFoundError) as e:
            cb.attach("@node-a/model/none")
        assert "model/none" in str(e.value)
        with pytest.raises(PermissionError) as e:
            cb.attach("@node-a/model/private")
        assert "uid 65534" in str(e.value) and "model/private" in str(e.value)
        with pytest.raises(PermissionError) as e:
            cb.attach("@node-a/model/mut")
        assert "mutable" in str(e.value)
        with pytest.raises(FileNotFoundError) as e:
            cb.attach("@node-z/model/w")
        assert "no peer 'node-z'" in str(e.value) and "node-a" in str(e.value)
        # Local creates cannot take '@' names.
        with pytest.raises(OSError) as e:
            cb.put("@node-a/model/x", np.ones(2))
        assert e.value.errno == 22
        # Nor do stat and unlink: the error says which calls do.
        for call in (cb.stat, cb.unlink):
            with pytest.raises(OSError) as e:
                call("@node-a/model/w")
            assert e.value.errno == 22 and "only attach and attach_many" in str(e.value), e
        assert b.stats()["remote_pull_failures_total"] >= 4
        assert a.stats()["remote_pull_leases"] == 0


def test_export_to_other_peers_only(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path, exports=("model/=node-c", "open/"))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/w", np.ones(4, np.float32), mode=0o644)
        ca.put("open/w", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/open/w").release()
        with pytest.raises(FileNotFoundError):
            cb.attach("@node-a/model/w")


def test_kill_a_then_attach_clear_error(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/w", np.ones(1 << 20, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/w").release()
        kill(a)
        # Until node-b notices (EOF at once, or three heartbeats), an attach
        # fails with the connection lost or the peer down; never bytes.
        with pytest.raises(OSError) as e:
            cb.attach("@node-a/model/other")
        assert "node-a" in str(e.value)
        assert wait_until(lambda: state_is(b, "node-a", "down"), timeout=8)
        with pytest.raises(OSError) as e:
            cb.attach("@node-a/model/w")
        assert "peer node-a is not connected" in str(e.value)
        # Its replica went with the connection; nothing half-made is left.
        s = b.stats()
        assert s["remote_replicas"] == 0


def test_replica_share_of_one_peer(daemon_factory, tmp_path):
    """--peer-max-replica-bytes on node-b: replicas from node-a past it
    unlink node-a's unleased replicas first, oldest first; when the leased
    ones alone leave no room, the pull fails with EDQUOT naming the flag,
    the peer and the tensor, and nothing of it is left."""
    mib = 1 << 20
    a, b = start_pair(daemon_factory, tmp_path,
                      extra_b=("--peer-max-replica-bytes", "3Mi", "--replica-keep", "600000"))
    assert "at most 3145728 bytes of them per peer" in b.read_log()
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        for i in range(1, 5):
            ca.put("model/r%d" % i, np.full(mib, i, np.uint8), mode=0o644)
        ca.put("model/big", np.ones(3 * mib, np.uint8), mode=0o644)
        c1 = tensord.Client(b.socket)
        t1 = attach_when_ready(c1, "@node-a/model/r1")   # leased throughout

        def pull_and_let_go(name):
            # A connection of its own: closed, it holds no binding of the name either.
            with tensord.Client(b.socket) as c:
                c.attach(name).release()
        pull_and_let_go("@node-a/model/r2")               # the oldest unleased
        pull_and_let_go("@node-a/model/r3")
        s = b.stats()
        assert s["remote_replicas"] == 3 and s["remote_replica_bytes"] == 3 * mib, s
        # r4 does not fit: r2 goes for it, r3 stays.
        with tensord.Client(b.socket) as c, c.attach("@node-a/model/r4") as t4:
            assert np.from_dlpack(t4)[0] == 4
        s = b.stats()
        assert s["remote_replicas"] == 3 and s["remote_replica_bytes"] == 3 * mib, s
        pulls, hits = s["remote_pulls_total"], s["remote_replica_hits_total"]
        pull_and_let_go("@node-a/model/r3")               # still there: a hit
        s = b.stats()
        assert s["remote_replica_hits_total"] == hits + 1, s
        assert s["remote_pulls_total"] == pulls, s
        pull_and_let_go("@node-a/model/r2")               # gone: pulled again (r3 goes)
        assert b.stats()["remote_pulls_total"] == pulls + 1
        # 3 MiB with r1 leased: every unleased replica goes, and still no room.
        used = host_used(b)
        with pytest.raises(OSError) as e:
            cb.attach("@node-a/model/big")
        assert e.value.errno == 122, e.value  # EDQUOT
        msg = str(e.value)
        assert "--peer-max-replica-bytes" in msg and "node-a" in msg and "model/big" in msg, msg
        s = b.stats()
        assert s["remote_replicas"] == 1 and s["remote_replica_bytes"] == mib, s
        assert host_used(b) <= used
        assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=5)
        np.testing.assert_array_equal(np.from_dlpack(t1), np.full(mib, 1, np.uint8))
        t1.release()
        c1.close()  # and its binding of the name
        # With r1 let go, it fits (r1 unlinked for it).
        with tensord.Client(b.socket) as c, c.attach("@node-a/model/big") as t:
            assert np.from_dlpack(t)[-1] == 1
        s = b.stats()
        assert s["remote_replicas"] == 1 and s["remote_replica_bytes"] == 3 * mib, s


def pull_in_thread(cb, name, many=False):
    """cb.attach(name), or cb.attach_many(name) when many, on a thread:
    (thread, out), out["t"] or out["e"] once done."""
    import threading
    out = {}

    def pull():
        try:
            out["t"] = cb.attach_many(name) if many else cb.attach(name)
        except OSError as e:
            out["e"] = e

    th = threading.Thread(target=pull, daemon=True)
    th.start()
    return th, out


def stop_once_sending(ca, a, stopped, out, many=False):
    """SIGSTOPs the daemon stopped as soon as node-a (ca: a client of a)
    shows bytes in flight to node-b. From then on the transfer cannot end
    (a stopped sender sends nothing, a stopped receiver takes nothing) and
    the pull is in the middle, whatever the speeds: with one GET of a large
    tensor taking hundreds of milliseconds, a stats round trip cannot see
    it in flight after it ended. Fails if the pull ended before. A set's
    pull (many) holds a lease per member not sent yet: one or more."""
    seen = {}

    def sending():
        assert not out, "the pull ended before any byte was on the way: %r" % out
        seen.update(ca.stats())
        return seen.get("remote_inflight_bytes", 0) > 0
    assert wait_until(sending, timeout=15, interval=0.001), a.read_log()[-3000:]
    os.kill(stopped.pid, signal.SIGSTOP)
    if many:
        assert seen["remote_pull_leases"] >= 1, seen
    else:
        assert seen["remote_pull_leases"] == 1, seen
    assert "t" not in out


def kill(d):
    """SIGKILLs d and reaps it."""
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    d.proc = None  # reaped here


def test_kill_b_holding_a_leases_end(daemon_factory, tmp_path):
    """node-b killed in the middle of a pull, node-a's lease and its send
    in flight: everything of node-b's ends on node-a, its mapping of the
    tensor included (node-a's memory back where it was)."""
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()
        ca.put("model/big", np.ones(256 << 20, np.uint8), mode=0o644)
        rss0 = status_kib(a.pid, "VmRSS")
        served0 = a.stats()["remote_served_total"]
        th, out = pull_in_thread(cb, "@node-a/model/big")
        stop_once_sending(ca, a, b, out)
        assert ca.stat("model/big").refcount == 1  # node-b's pull lease
        kill(b)
        th.join(10)
        assert not th.is_alive() and "t" not in out
        assert wait_until(lambda: state_is(a, "node-b", "down"), timeout=8)
        # The send fails as node-b's sockets reset (its endpoint parked till then).
        assert wait_until(lambda: a.stats()["remote_inflight_bytes"] == 0, timeout=15), a.stats()
        s = a.stats()
        assert s["remote_pull_leases"] == 0 and s["remote_inflight_bytes"] == 0, s
        assert s["remote_served_total"] == served0, s
        # The tensor's own leases: none but what local clients hold.
        assert ca.stat("model/big").refcount == 0
        # Its read-only mapping for the send is gone (256 MiB of it was touched).
        assert wait_until(lambda: status_kib(a.pid, "VmRSS") < rss0 + (32 << 10), timeout=5), \
            (status_kib(a.pid, "VmRSS"), rss0)
        ca.put("local/after", np.ones(3))
        assert a.alive()


def test_kill_a_mid_pull_nothing_half_made(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()
        ca.put("model/huge", np.ones(1 << 30, np.uint8), mode=0o644)
        used0 = host_used(b)
        th, out = pull_in_thread(cb, "@node-a/model/huge")
        # node-a stopped once its bytes are on the way, then killed: the pull
        # is always cut in the middle.
        stop_once_sending(ca, a, a, out)
        kill(a)
        th.join(30)
        assert not th.is_alive()
        assert "t" not in out, "a stopped node-a finished the pull"
        e = out["e"]
        assert "node-a" in str(e) and "model/huge" in str(e), e
        assert e.errno in (104, 110), e  # ECONNRESET, or ETIMEDOUT
        s = b.stats()
        assert s["remote_replicas"] == 0 and s["remote_pull_failures_total"] >= 1, s
        assert wait_until(lambda: host_used(b) <= used0, timeout=5), (host_used(b), used0)
        # A new attach of it fails cleanly too, and node-b still serves.
        with pytest.raises(OSError):
            cb.attach("@node-a/model/huge")
        cb.put("local/x", np.ones(3))


def test_kill_a_mid_pull_then_its_restore_serves_the_pull_again(daemon_factory, tmp_path, holder):
    """node-a, which keeps its store in a holder (tensord --hold,
    docs/restart.md), killed in the middle of a pull and started again: the
    pull fails naming node-a, the restored node-a comes up with its peer
    again, and node-b's next attach pulls the same bytes, generation and
    commit; nothing of the cut pull stays leased on either node."""
    a, b = start_pair(daemon_factory, tmp_path, extra_a=("--holder", str(holder)))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        attach_when_ready(cb, "@node-a/model/s").release()
        want = np.random.default_rng(5).integers(0, 255, 256 << 20, np.uint8)
        ca.put("model/big", want, mode=0o644)
        info = ca.stat("model/big")
        th, out = pull_in_thread(cb, "@node-a/model/big")
        stop_once_sending(ca, a, a, out)
        kill(a)
        th.join(30)
        assert not th.is_alive() and "t" not in out, "a stopped node-a finished the pull"
        assert "node-a" in str(out["e"]) and "model/big" in str(out["e"]), out["e"]
        a.start()
        pair_up(a, b, timeout=20)
        s = a.stats()
        assert s["restart_restored_tensors"] == 2, s
        assert s["remote_pull_leases"] == 0 and s["remote_inflight_bytes"] == 0, s
        with tensord.Client(a.socket) as ca2:
            again = ca2.stat("model/big")
            assert (again.generation, again.commit) == (info.generation, info.commit)
            with attach_when_ready(cb, "@node-a/model/big", timeout=20) as t:
                assert (np.from_dlpack(t) == want).all()
                assert (t.generation, t.commit) == (info.generation, info.commit)
            # The pull's lease on node-a ended with it (the one reference
            # left is the restart's hold, restart.md 0.3); node-b keeps a
            # replica.
            assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=10)
            assert a.stats()["restart_held_tensors"] == 2
            assert ca2.stat("model/big").refcount == 1
            assert [h for h in ca2.leases() if h.name == "model/big"] == []
        assert b.stats()["remote_replicas"] == 1
        cb.put("local/x", np.ones(3))


def test_b_stops_receiving_mid_pull(daemon_factory, tmp_path):
    """node-b stopped (SIGSTOP) in the middle of a 1 GiB pull: node-a maps
    the tensor, copies none of it (its own memory bounded), serves its
    clients throughout, calls node-b down after three heartbeats and ends
    the pull's lease; the send stays in flight (its endpoint parked, not
    force-closed: docs/remote.md, "Failures") until node-b, continued,
    breaks it off; node-b comes back and pulls again."""
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/s", np.ones(4, np.float32), mode=0o644)
        ca.put("local/x", np.ones(4))
        attach_when_ready(cb, "@node-a/model/s").release()
        ca.put("model/huge", np.ones(1 << 30, np.uint8), mode=0o644)
        anon0 = status_kib(a.pid, "RssAnon")
        used0 = host_used(b)
        th, out = pull_in_thread(cb, "@node-a/model/huge")
        stop_once_sending(ca, a, b, out)
        try:
            served = serve_locally_until(ca, lambda: state_is(a, "node-b", "down"), timeout=15)
            assert served > 0
            s = ca.stats()
            assert s["remote_pull_leases"] == 0, s
            assert s["remote_inflight_bytes"] <= 1 << 30, s
            assert ca.stat("model/huge").refcount == 0
            grew = status_kib(a.pid, "RssAnon") - anon0
            assert grew < 64 << 10, "node-a's own memory grew by %d KiB" % grew
        finally:
            os.kill(b.pid, signal.SIGCONT)
        th.join(30)
        assert not th.is_alive() and "e" in out, out
        assert "node-a" in str(out["e"]) and "model/huge" in str(out["e"]), out["e"]
        assert wait_until(lambda: state_is(a, "node-b", "up") and state_is(b, "node-a", "up"),
                          timeout=15)
        assert wait_until(lambda: a.stats()["remote_inflight_bytes"] == 0, timeout=15), a.stats()
        # The half-made replica went with its pull.
        assert wait_until(lambda: host_used(b) <= used0, timeout=5), (host_used(b), used0)
        assert b.stats()["remote_replicas"] == 0
        with attach_when_ready(cb, "@node-a/model/huge") as t:
            got = np.from_dlpack(t)
            assert got.shape == (1 << 30,) and got[0] == 1 and got[-1] == 1
            del got
        assert a.alive() and b.alive()


def peer_frames(s, want, timeout=5):
    """Reads frames until one whose PeerFrame field is want; returns its fields."""
    from test_peers import fields, read_varint
    s.settimeout(timeout)
    while True:
        head = b""
        while len(head) < 8:
            chunk = s.recv(8 - len(head))
            assert chunk, "the daemon closed the connection"
            head += chunk
        n = int.from_bytes(head[:4], "little")
        body = b""
        while len(body) < n:
            chunk = s.recv(n - len(body))
            assert chunk
            body += chunk
        key, i = read_varint(body, 0)
        if key >> 3 == want:
            ln, i = read_varint(body, i)
            return fields(body[i:i + ln])


def drain_until_closed(s, timeout=5):
    """Reads (and drops) what the daemon sends until it closes the connection."""
    s.settimeout(timeout)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()


def zigzag(v):
    return (v << 1) ^ (v >> 31)


def test_hostile_peer_frames_daemon_survives(daemon_factory, tmp_path):
    """An authenticated peer that breaks the remote attach protocol: the
    daemon answers or closes that connection, holds nothing for it, and
    serves its clients throughout."""
    from test_peers import fbytes, fint, frame
    d, key, port = start_node_m(daemon_factory, tmp_path)
    with tensord.Client(d.socket) as c:
        # 16 KiB: past the inline size, so a pull holds a lease until its Go.
        gen = c.put("model/w", np.arange(4096, dtype=np.float32), mode=0o644)
        me, s = fake_peer_up(d, key, port)

        def send(field, body):
            # Each with a heartbeat: the daemon calls a silent peer down after 3 s.
            s.sendall(frame(fbytes(3, fint(1, 1))) + frame(fbytes(field, body)))

        send(5, fint(1, 1) + fbytes(2, b"model/w"))                      # Pull
        r = peer_frames(s, 6)
        assert r[1] == 1 and r.get(2, 0) == 0 and r[6] == 16384 and r[5] == gen, r
        assert 12 not in r  # no inline bytes
        assert d.stats()["remote_pull_leases"] == 1
        send(7, fint(1, 1))          # PullGo, but this peer never sent a UCX address
        assert wait_until(lambda: d.stats()["remote_pull_leases"] == 0, timeout=5)
        send(5, fint(1, 2) + fbytes(2, b"bad name!"))                    # an invalid name
        r = peer_frames(s, 6)
        assert r[1] == 2 and r[2] == zigzag(-22) and b"bad name" in r[3], r
        c.put("model/tiny", np.arange(16, dtype=np.int32), mode=0o644)
        send(5, fint(1, 30) + fbytes(2, b"model/tiny"))                 # inline
        r = peer_frames(s, 6)
        assert r[1] == 30 and r[12] == np.arange(16, dtype=np.int32).tobytes(), r
        assert d.stats()["remote_pull_leases"] == 0
        send(5, fint(1, 3) + fbytes(2, b"model/w") + fint(3, gen))      # current
        r = peer_frames(s, 6)
        assert r[1] == 3 and r[4] == 1 and d.stats()["remote_pull_leases"] == 0, r
        assert r.get(20) == 1, r  # watched: node-z is told of the next change
        assert d.stats()["remote_watched_names"] == 2  # model/w and model/tiny
        gen = c.put("model/w", np.arange(4096, dtype=np.float32), mode=0o644, replace=True)
        r = peer_frames(s, 20)                                          # PeerChanged
        from test_peers import read_varint
        assert r[1] == b"model/w" and read_varint(r[2], 0)[0] == gen, r  # packed
        assert d.stats()["remote_watched_names"] == 1  # told once
        send(21, fbytes(1, b"model/tiny") + fbytes(1, b"no/such"))   # Unwatch; one not watched
        assert wait_until(lambda: d.stats()["remote_watched_names"] == 0, timeout=5)
        send(20, fbytes(1, b"no/replica") + fint(2, 7))   # a change of no replica here
        send(5, fint(1, 4) + fbytes(2, b"other/w"))                     # not exported
        r = peer_frames(s, 6)
        assert r[2] == zigzag(-2) and b"not exported" in r[3], r
        send(6, fint(1, 99) + fint(6, 8))      # a PullReply for no pull: told to end it
        r = peer_frames(s, 8)
        assert r[1] == 99
        send(7, fint(1, 1234))
        send(8, fint(1, 555))
        # A client's attach through this peer: no UCX address from it yet.
        with pytest.raises(OSError) as e:
            c.attach("@node-z/x")
        assert e.value.errno == 113 and "node-z" in str(e.value)
        send(4, fbytes(1, b"\x01\x02garbage"))          # a UCX address that is not one
        send(8, fint(1, 556))
        # A pull then makes this node's endpoint to that address: refused by UCX, survived.
        send(5, fint(1, 10) + fbytes(2, b"model/w"))
        assert peer_frames(s, 6)[1] == 10
        send(7, fint(1, 10))
        assert wait_until(lambda: d.stats()["remote_pull_leases"] == 0, timeout=5)
        assert d.alive()
        th, out = pull_in_thread(c, "@node-z/x")
        r = peer_frames(s, 5)                          # the daemon's Pull
        assert r[2] == b"x"
        # Its id tags the bytes' UCX message, which anyone reaching the port
        # may send: 64 random bits, not a count (fails once in 2**32 runs).
        assert r[1] >= 1 << 32, r
        # A descriptor of 40 dimensions: refused, and the connection closed.
        send(6, fint(1, r[1]) + fint(7, 2) + fint(8, 32) + fint(9, 1) + fint(6, 4) +
             b"".join(fint(10, 1) for _ in range(40)) + b"".join(fint(11, 1) for _ in range(40)))
        th.join(10)
        assert "e" in out and out["e"].errno == 71 and "node-z" in str(out["e"]), out
        drain_until_closed(s)
        # A change list whose names and generations do not pair: the connection closed.
        s = me.dial(port, "node-m")
        assert wait_until(lambda: state_is(d, "node-z", "up"), timeout=5)
        s.sendall(frame(fbytes(20, fbytes(1, b"a") + fbytes(1, b"b") + fint(2, 1))))
        drain_until_closed(s)
        assert wait_until(lambda: "a change list of 2 names and 1 generations" in d.read_log(),
                          timeout=5)
        # A sync is answered at once with its seq; a sync reply to no sync
        # this node sent closes the connection (issue 30 item 7).
        s = me.dial(port, "node-m")
        assert wait_until(lambda: state_is(d, "node-z", "up"), timeout=5)
        syncs = d.stats()["remote_sync_requests_total"]
        s.sendall(frame(fbytes(3, fint(1, 1))) + frame(fbytes(22, fint(1, 77))))
        r = peer_frames(s, 23)
        assert r[1] == 77, r
        assert d.stats()["remote_sync_requests_total"] == syncs + 1
        s.sendall(frame(fbytes(23, fint(1, 5))))
        drain_until_closed(s)
        assert wait_until(lambda: "a sync reply 5 to no sync sent" in d.read_log(), timeout=5)
        # Listing (issue 30 item 9): node-m answers a list of what it exports
        # to node-z; a list answer for no list is ignored; one whose entry
        # fails node-m's checks fails the client's list (EPROTO) and closes
        # the connection.
        s = me.dial(port, "node-m")
        assert wait_until(lambda: state_is(d, "node-z", "up"), timeout=5)
        s.sendall(frame(fbytes(3, fint(1, 1))) + frame(fbytes(24, fint(1, 9) + fbytes(2, b"model/"))))
        r = peer_frames(s, 25)
        assert r[1] == 9 and r.get(2, 0) == 0, r
        s.sendall(frame(fbytes(25, fint(1, 12345))))
        out = {}

        def lister():
            try:
                with tensord.Client(d.socket) as cl:
                    out["v"] = cl.list("@node-z/m/")
            except OSError as e:
                out["e"] = e
        import threading
        th = threading.Thread(target=lister)
        th.start()
        r = peer_frames(s, 24)                       # node-m's question
        assert r[2] == b"m/", r
        s.sendall(frame(fbytes(25, fint(1, r[1]) + fbytes(4, fbytes(1, b"bad name!") +
                                                          fint(4, 1) + fint(5, 1) + fint(6, 8) +
                                                          fint(7, 1)))))
        th.join(10)
        assert "e" in out and out["e"].errno == 71 and "node-z" in str(out["e"]), out
        drain_until_closed(s)
        # Still serving.
        c.put("local/after", np.ones(3))
        with c.attach("model/w") as t:
            assert np.from_dlpack(t)[5] == 5
        assert d.alive()


def status_kib(pid, key):
    """A figure of /proc/PID/status in KiB (VmRSS, VmHWM, RssAnon)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def serve_locally_until(c, done, timeout):
    """Attach round trips on c until done(); returns how many succeeded."""
    n = 0
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, "timed out after %d local attaches" % n
        with c.attach("local/x") as t:
            assert np.from_dlpack(t)[2] == 1
        n += 1
        time.sleep(0.01)
    return n


def test_peer_that_stops_reading_memory_bounded(daemon_factory, tmp_path):
    """An authenticated peer that sends many Pulls of an inline tensor and
    never reads the replies: past 4 MiB queued the daemon stops reading its
    requests, and with nothing taken for 3 s it drops the peer, its memory
    far below what the peer asked for, its clients served throughout."""
    import threading
    from test_peers import fbytes, fint, frame
    d, key, port = start_node_m(daemon_factory, tmp_path)
    with tensord.Client(d.socket) as c:
        c.put("model/small", np.arange(2048, dtype=np.float32), mode=0o644)  # 8 KiB: inline
        c.put("local/x", np.ones(4))
        rss0 = status_kib(d.pid, "VmRSS")
        _, s = fake_peer_up(d, key, port)
        n = 65536  # small requests (1.6 MB of them) for 512 MiB of replies
        asked = n * 8192
        assert asked >= 512 << 20
        reqs = b"".join(frame(fbytes(5, fint(1, i + 1) + fbytes(2, b"model/small")))
                        for i in range(n))

        def flood():
            try:
                s.settimeout(None)
                s.sendall(reqs)  # blocks once the daemon stops reading: until it closes
            except OSError:
                pass

        th = threading.Thread(target=flood, daemon=True)
        th.start()
        served = serve_locally_until(c, lambda: state_is(d, "node-z", "down"), timeout=30)
        assert served > 0
        log = d.read_log()
        assert "peer node-z" in log and "its requests wait until it reads" in log, log[-2000:]
        assert "it stopped reading" in log, log[-2000:]
        grew = status_kib(d.pid, "VmHWM") - rss0
        # ThreadSanitizer's shadow memory triples what the daemon touches.
        limit = (48 << 10) * (3 if "tsan" in os.environ.get("TENSORD_BUILD", "") else 1)
        assert grew < limit, "the daemon grew by %d KiB; the peer asked %d MiB" % (
            grew, asked >> 20)
        assert d.stats()["remote_pull_leases"] == 0
        s.close()
        th.join(10)
        with c.attach("model/small") as t:
            assert np.from_dlpack(t)[7] == 7
        assert d.alive()


def test_replica_reports_the_origins_generation_and_commit(daemon_factory, tmp_path):
    """Issue 30 item 6: an '@' tensor shows node-a's generation and commit
    everywhere (the Python attrs, tensord_info through them, tensorctl ls and
    stat), and attach(after=t.generation) waits for the next version on
    node-a instead of returning the same one (node-b's own generation of the
    replica is smaller: node-a's name had versions before node-b's first)."""
    a, b = start_pair(daemon_factory, tmp_path)
    from test_peers import ctl
    import json
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        for v in range(4):   # node-a's generation of the name runs ahead of node-b's
            ver = ca.put("model/x", np.full(16, v, np.int32), mode=0o644, replace=True)
        t = attach_when_ready(cb, "@node-a/model/x")
        ta = ca.attach("model/x")
        ver = (ta.generation, ta.commit)
        assert ta.generation >= 4
        assert (t.generation, t.commit) == ver, (t.generation, t.commit, ver)
        ta.release()
        # tensorctl ls and stat on node-b show node-a's numbers too.
        rc, out, err = ctl(b, "ls", "@node-a/", "--json")
        assert rc == 0, err
        row = next(r for r in json.loads(out) if r["name"] == "@node-a/model/x")
        assert (row["generation"], row["commit"]) == ver, row
        rc, out, err = ctl(b, "stat", "@node-a/model/x", "--json")
        assert rc == 0, err
        st = json.loads(out)
        assert (st["generation"], st["commit"]) == ver, st
        # The next-version loop waits: nothing newer within the timeout.
        with pytest.raises(TimeoutError):
            cb.attach("@node-a/model/x", after=t.generation, timeout=0.3)
        ca.put("model/x", np.full(16, 9, np.int32), mode=0o644, replace=True)
        with ca.attach("model/x") as ta2:
            ver2 = (ta2.generation, ta2.commit)
        t2 = cb.attach("@node-a/model/x", after=t.generation, timeout=10)
        assert (t2.generation, t2.commit) == ver2 and t2.generation > t.generation
        assert (np.from_dlpack(t2) == 9).all()
        t.release()
        t2.release()


def test_remote_wait_that_times_out_is_one_question_not_failures(daemon_factory, tmp_path):
    """Issue 30 item 8: attach("@node-a/y", after=g, timeout=2) through the
    synchronous client (which waits in 100 ms Attaches) that times out raises
    ETIMEDOUT, counts no pull failure (remote_pull_failures_total, the peer's
    PULL-ERRORS), logs no "failed" line, and asks node-a once: the 100 ms
    slices join the one waiting pull node-a watches the name for. Asserted:
    node-a's remote_pull_requests_total moves by exactly 1 (the first slice's
    question) when no slice's gap passes the 1 s linger, at most 2 in any case."""
    import errno
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/y", np.ones(8, np.float32), mode=0o644)
        with attach_when_ready(cb, "@node-a/model/y") as t:
            g = t.generation
        fails = b.stats()["remote_pull_failures_total"]
        perrs = next(p for p in cb.peers() if p.name == "node-a").pull_errors
        asked = a.stats()["remote_pull_requests_total"]
        log0 = len(b.read_log())
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as ei:
            cb.attach("@node-a/model/y", after=g, timeout=2)
        assert time.monotonic() - t0 >= 1.9
        assert ei.value.errno == errno.ETIMEDOUT, ei.value
        assert "node-a" in str(ei.value) and "no generation newer than %d" % g in str(ei.value)
        assert b.stats()["remote_pull_failures_total"] == fails
        assert next(p for p in cb.peers() if p.name == "node-a").pull_errors == perrs
        assert "failed" not in b.read_log()[log0:], b.read_log()[log0:]
        n = a.stats()["remote_pull_requests_total"] - asked
        assert 1 <= n <= 2, n
        # The wait still works: a publish during the next one ends it, and
        # the lingering pull ends once nobody waits.
        gen2 = ca.put("model/y", np.full(8, 3, np.float32), mode=0o644, replace=True)
        with cb.attach("@node-a/model/y", after=g, timeout=10) as t2:
            assert t2.generation == gen2 and (np.from_dlpack(t2) == 3).all()
        assert wait_until(lambda: b.stats()["remote_pulls"] == 0, timeout=5)


def test_read_your_writes_and_monotonic_reads(daemon_factory, tmp_path):
    """Issue 30 item 7 (docs/remote.md, "Freshness"): an attach on node-b that
    begins after a put on node-a returned gets that version or a newer one,
    never the one before: 50 times on one connection and 50 on a fresh
    connection each time (before: 16 of 50 old on one connection, served by
    the replica or a binding before node-a's word arrived). A replica still
    serves without a pull: node-b hears from node-a first (one sync, no pull
    request). And a client reading from two connections while node-a
    replaces the name never sees a version older than one it saw."""
    import threading
    a, b = start_pair(daemon_factory, tmp_path)
    n = 1024
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/x", np.full(n, -1, np.int64), mode=0o644)
        attach_when_ready(cb, "@node-a/model/x").release()
        with cb.attach("@node-a/model/x"):   # held: the replica stays, watched
            old = []
            for i in range(100):
                ca.put("model/x", np.full(n, i, np.int64), mode=0o644, replace=True)
                if i % 2:
                    with tensord.Client(b.socket) as c2, c2.attach("@node-a/model/x") as t:
                        v = int(np.from_dlpack(t)[0])
                else:
                    with cb.attach("@node-a/model/x") as t:
                        v = int(np.from_dlpack(t)[0])
                if v != i:
                    old.append((i, v))
            assert old == [], old
            # No put since: the replica serves, after one sync and no pull.
            asked = a.stats()["remote_pull_requests_total"]
            syncs = a.stats()["remote_sync_requests_total"]
            hits = b.stats()["remote_replica_hits_total"]
            with tensord.Client(b.socket) as c2, c2.attach("@node-a/model/x") as t:
                assert int(np.from_dlpack(t)[0]) == 99
            assert a.stats()["remote_pull_requests_total"] == asked
            assert a.stats()["remote_sync_requests_total"] == syncs + 1
            assert b.stats()["remote_replica_hits_total"] == hits + 1

        done = threading.Event()
        read = {"last": -1}

        def writer():
            # Free running, but every tenth version waits until the reader
            # has seen it, so the reader meets several versions however slow
            # it is (under ThreadSanitizer it once saw only the last).
            with tensord.Client(a.socket) as cw:
                for v in range(100, 160):
                    cw.put("model/x", np.full(n, v, np.int64), mode=0o644, replace=True)
                    if v % 10 == 9:
                        wait_until(lambda: read["last"] >= v, timeout=60)
            done.set()

        th = threading.Thread(target=writer)
        th.start()
        with tensord.Client(b.socket) as cb2:
            last, seen, k = -1, set(), 0
            while not done.is_set() or k < 20:
                with (cb, cb2)[k % 2].attach("@node-a/model/x") as t:
                    got = np.from_dlpack(t)
                    v = int(got[0])
                    assert (got == v).all(), "a torn version"
                    assert v >= last, (v, last)
                    last = v
                    read["last"] = v
                    seen.add(v)
                k += 1
        th.join()
        assert {109, 119, 129, 139, 149, 159} <= seen, sorted(seen)


def test_tensorctl_of_remote_names_as_documented(daemon_factory, tmp_path):
    """Issue 30 item 9: what docs/remote.md "Naming" says of '@' names is what
    happens. tensorctl get (and stat, wait) of an '@' name attach it, pulling
    it when needed: get writes node-a's bytes. tensorctl ls @node-a/ lists
    what node-a exports to node-b (asked of node-a, as uid 65534 under its
    export rules), replicas here or not: a name node-b never attached is
    listed, one not exported or not readable by others is not, and the
    listing stays once the replicas went (--replica-keep); "ls @" lists this
    node's replicas. Python's stat of an '@' name and creates of one are
    refused with EINVAL, naming the rule."""
    import errno
    import json
    from test_peers import ctl
    a, b = start_pair(daemon_factory, tmp_path, extra_b=("--replica-keep", "200"))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        x = np.arange(100, dtype=np.float64).reshape(10, 10)
        ca.put("model/x", x, mode=0o644)
        ca.put("model/y", np.ones(3, np.int8), mode=0o644)
        attach_when_ready(cb, "@node-a/model/x").release()
        out = str(tmp_path / "x.npy")
        rc, _, err = ctl(b, "get", "@node-a/model/x", out)
        assert rc == 0, err
        np.testing.assert_array_equal(np.load(out), x)
        rc, so, err = ctl(b, "wait", "@node-a/model/y", "--timeout", "5", "--json")
        assert rc == 0, err
        ca.put("model/z", np.ones((2, 3), np.int16), mode=0o644)  # never attached on b
        ca.put("model/private", np.ones(3, np.int8), mode=0o600)  # not readable by peers
        ca.put("other/w", np.ones(3, np.int8), mode=0o644)        # not exported
        with ca.attach("model/z") as tz:
            zver = (tz.generation, tz.commit)

        def listed():
            rc, so, err = ctl(b, "ls", "@node-a/", "--json")
            assert rc == 0, err
            return {r["name"]: r for r in json.loads(so)}

        got = listed()
        assert set(got) == {"@node-a/model/x", "@node-a/model/y", "@node-a/model/z"}, got
        z = got["@node-a/model/z"]
        assert (z["generation"], z["commit"]) == zver and z["shape"] == [2, 3], z
        assert wait_until(lambda: b.stats()["remote_replicas"] == 0, timeout=5)
        assert set(listed()) == set(got)
        rc, so, err = ctl(b, "ls", "@", "--json")
        assert rc == 0 and json.loads(so) == [], (so, err)  # no replica left here
        # A peer's set as one checkpoint file, from one commit there (issue 34).
        rc, so, err = ctl(b, "get", "@node-a/model/", str(tmp_path / "set.npz"))
        assert rc == 0 and so.startswith("commit "), err
        with np.load(tmp_path / "set.npz") as zf:
            assert sorted(zf.files) == ["x", "y", "z"], zf.files
            np.testing.assert_array_equal(zf["x"], x)
        # Pages (node-a answers at most 256 names a question, and under a
        # frame): the client's list goes on after each page node-b gives.
        for i in range(300):
            ca.put("model/p/%03d" % i, np.ones(1, np.int8), mode=0o644)
        names = [t.name for t in cb.list("@node-a/model/p/")]
        assert names == ["@node-a/model/p/%03d" % i for i in range(300)], names[:3]
        for op in (lambda: cb.stat("@node-a/model/x"),
                   lambda: cb.put("@node-a/model/q", np.ones(2, np.int8))):
            with pytest.raises(OSError) as ei:
                op()
            assert ei.value.errno == errno.EINVAL, ei.value
            assert "only attach and attach_many" in str(ei.value), ei.value
