"""Remote sets (docs/remote.md, "Sets"): attach_many of "@node-a/..." names,
by list or by prefix, through node-b. node-a resolves and leases the whole
set in one step (so all of one commit there), node-b pulls every member and
publishes the replicas in one commit of its own: the client gets every
member, bytes identical, all of the same commit, never a mix of versions
while node-a's writer commits new ones. A member not exported fails the
whole set naming it; node-a killed mid-pull leaves no replica on node-b."""
import errno
import re
import threading

import numpy as np
import pytest

from conftest import wait_until
from test_core import Client
from test_remote import (attach_many_when_ready, fake_peer_up, host_used, kill,
                         pull_in_thread, start_node_m, start_pair, stop_once_sending, tensord)

PEER = "@node-a/"

SET = {
    "model/set/small": np.arange(1000, dtype=np.float32),  # 4000 bytes: inline
    "model/set/mid": np.arange(3 << 10, dtype=np.int64).reshape(3, 1024),  # 24 KiB
    "model/set/big": np.random.default_rng(3).integers(0, 255, 17 << 20, np.uint8),  # 17 MiB
    "model/set/half": np.linspace(0, 1, 3000).astype(np.float16).reshape(30, 100),
}


def replica_names(cb):
    return sorted(r.name for r in cb.list("") if r.name.startswith("@"))


def replica_commits(cb, names):
    """The commits node-b's records of those replicas carry."""
    return {r.commit for r in cb.list("") if r.name in names}


def check_set(got, want_names):
    assert sorted(got) == sorted(PEER + n for n in want_names), sorted(got)
    commits = {t.commit for t in got.values()}
    assert len(commits) == 1 and 0 not in commits, commits
    for n in want_names:
        arr = np.from_dlpack(got[PEER + n])
        assert arr.dtype == SET[n].dtype and arr.shape == SET[n].shape, n
        np.testing.assert_array_equal(arr, SET[n])
        assert not arr.flags.writeable, n
    return commits.pop()


def release_all(got):
    for t in got.values():
        t.release()


def test_set_by_list_and_by_prefix_one_commit(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        commit_a = ca.put_many(SET, mode=0o644)
        assert {ca.stat(n).commit for n in SET} == {commit_a}
        ca.put("model/other", np.ones(4, np.float32), mode=0o644)  # not under the prefix

        got = attach_many_when_ready(cb, [PEER + n for n in SET])
        c1 = check_set(got, SET)
        # Every member shows node-a's commit of the set (issue 30 item 6),
        # as a listing of the replicas on node-b does.
        assert c1 == commit_a
        assert replica_commits(cb, got) == {c1}
        release_all(got)
        s = b.stats()
        assert s["remote_pulls_total"] == len(SET), s
        assert s["remote_pull_bytes_total"] == sum(v.nbytes for v in SET.values()), s

        got = cb.attach_many(PEER + "model/set/")
        c2 = check_set(got, SET)
        assert c2 == commit_a  # pulled again (a commit of its own on node-b): node-a's
        assert b.stats()["remote_pulls_total"] == 2 * len(SET)
        release_all(got)
        assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=5)

        # The C API: the set's commit is the one its replicas show (node-a's).
        c = Client(b.socket)
        line = c.ok("many %smodel/set/ 0 0" % PEER)
        c.close()
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        assert kv["n"] == str(len(SET)), line
        assert replica_commits(cb, got) == {int(kv["commit"])}, line

        # A duplicated name is one member; an empty prefix match is an empty set.
        got = cb.attach_many([PEER + "model/set/small", PEER + "model/set/small"])
        assert list(got) == [PEER + "model/set/small"]
        release_all(got)
        assert cb.attach_many(PEER + "model/none/") == {}


def test_refusals(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put_many(SET, mode=0o644)
        ca.put("secret/x", np.ones(4, np.float32), mode=0o644)  # not exported
        ca.put("model/private", np.ones(4, np.float32), mode=0o600)  # not readable by peers
        names = [PEER + n for n in SET]
        attach_many_when_ready(cb, names[:1])
        replicas0 = replica_names(cb)
        pulls0 = b.stats()["remote_pulls_total"]

        with pytest.raises(OSError) as ei:
            cb.attach_many(names + [PEER + "secret/x"])
        assert ei.value.errno == errno.ENOENT, ei.value
        assert "secret/x" in str(ei.value) and "node-a" in str(ei.value), ei.value

        with pytest.raises(OSError) as ei:
            cb.attach_many(names + [PEER + "model/gone"])
        assert ei.value.errno == errno.ENOENT and "model/gone" in str(ei.value), ei.value

        with pytest.raises(OSError) as ei:
            cb.attach_many(names + [PEER + "model/private"])
        assert ei.value.errno == errno.EACCES, ei.value
        assert "model/private" in str(ei.value) and "node-a" in str(ei.value), ei.value

        # Nothing of a refused set was pulled or published here.
        assert replica_names(cb) == replicas0
        assert b.stats()["remote_pulls_total"] == pulls0
        assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=5)

        # A prefix leaves out what node-b may not see, as a local one does.
        ca.put("model/set2/ok", np.ones(4, np.float32), mode=0o644)
        ca.put("model/set2/private", np.ones(4, np.float32), mode=0o600)
        got = cb.attach_many(PEER + "model/set2/")
        assert list(got) == [PEER + "model/set2/ok"]
        release_all(got)

        # One node per set; no `after` for another node's set yet.
        cb.put("local/y", np.ones(3))
        for bad in ([names[0], "local/y"], [names[0], "@node-c/model/x"]):
            with pytest.raises(OSError) as ei:
                cb.attach_many(bad)
            assert ei.value.errno == errno.EINVAL and "one node" in str(ei.value), ei.value
        with pytest.raises(OSError) as ei:
            cb.attach_many(names, after=1)
        assert ei.value.errno == errno.EOPNOTSUPP and "after" in str(ei.value), ei.value
        # A list too long for one set pull's frame: E2BIG, naming the way out.
        with pytest.raises(OSError) as ei:
            cb.attach_many([PEER + "model/" + "x" * 100 + str(i) for i in range(200)])
        assert ei.value.errno == errno.E2BIG and "prefix" in str(ei.value), ei.value
        with pytest.raises(OSError) as ei:
            cb.attach_many("@node-c/model/")
        assert ei.value.errno == errno.ENOENT and "node-c" in str(ei.value), ei.value


CHURN = {"churn/a": 256, "churn/b": 3000, "churn/c": 1 << 18}  # elements of int32


def test_set_from_one_commit_under_churn(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path, exports=("churn/",))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put_many({n: np.zeros(k, np.int32) for n, k in CHURN.items()}, mode=0o644)
        names = [PEER + n for n in CHURN]
        release_all(attach_many_when_ready(cb, names))
        stop = threading.Event()
        written = [0]
        errors = []

        def writer():
            try:
                with tensord.Client(a.socket) as cw:
                    v = 0
                    while not stop.is_set():
                        v += 1
                        cw.put_many({n: np.full(k, v, np.int32) for n, k in CHURN.items()},
                                    replace=True, mode=0o644)
                        written[0] = v
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        th = threading.Thread(target=writer)
        th.start()
        seen = set()
        try:
            i = 0
            # At least 30 pulls, and on until the writer's churn showed in them.
            while i < 30 or (len(seen) < 3 and i < 300):
                i += 1
                got = cb.attach_many(names if i % 2 else PEER + "churn/")
                versions = {n: np.unique(np.from_dlpack(t)) for n, t in got.items()}
                assert all(len(u) == 1 for u in versions.values()), versions
                vs = {int(u[0]) for u in versions.values()}
                assert len(vs) == 1, ("a mix of versions", versions)
                assert len({t.commit for t in got.values()}) == 1
                seen |= vs
                release_all(got)
        finally:
            stop.set()
            th.join(30)
        assert not errors, errors
        # The writer moved on during the pulls: more than one version was pulled.
        assert written[0] > 1 and len(seen) > 1, (written[0], seen)


def test_kill_a_mid_set_pull_no_replica_left(daemon_factory, tmp_path):
    a, b = start_pair(daemon_factory, tmp_path)
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        ca.put("model/warm", np.ones(4, np.float32), mode=0o644)
        release_all(attach_many_when_ready(cb, [PEER + "model/warm"]))
        big = {"model/k/small": np.ones(100, np.float32),
               "model/k/mid": np.ones(1 << 16, np.float32),
               "model/k/huge": np.ones(384 << 20, np.uint8),
               "model/k/huge2": np.ones(384 << 20, np.uint8)}  # sent one after the other
        ca.put_many(big, mode=0o644)
        used0 = host_used(b)
        replicas0 = replica_names(cb)
        th, out = pull_in_thread(cb, PEER + "model/k/", many=True)
        # node-a stopped once the set's bytes are on the way, then killed:
        # the set pull is always cut in the middle (it was a skip when the
        # pull won the race with the kill).
        stop_once_sending(ca, a, a, out, many=True)
        kill(a)
        th.join(30)
        assert not th.is_alive()
        assert "t" not in out, "a stopped node-a finished the set pull"
        e = out["e"]
        assert "node-a" in str(e) and "model/k/" in str(e), e
        assert e.errno in (errno.ECONNRESET, errno.ETIMEDOUT), e
        # No replica of any member, and their memory is back.
        assert not [n for n in replica_names(cb) if n.startswith(PEER + "model/k/")]
        assert replica_names(cb) in (replicas0, [])
        assert wait_until(lambda: host_used(b) <= used0, timeout=5), (host_used(b), used0)
        cb.put("local/x", np.ones(3))


def test_hostile_peer_set_frames(daemon_factory, tmp_path):
    """An authenticated peer speaking the set frames: as a puller it gets a
    refused set with nothing leased, or the set's reply and one PullReply
    per member whose leases its PullDones end; as a server that answers
    with a member the set did not ask for, it fails the client's set with
    EPROTO naming it, and nothing is published."""
    from test_peers import fbytes, fint, frame
    from test_remote import peer_frames, zigzag
    d, key, port = start_node_m(daemon_factory, tmp_path)
    with tensord.Client(d.socket) as c:
        commit = c.put_many({"model/s/big": np.arange(4096, dtype=np.float32),  # 16 KiB
                             "model/s/tiny": np.arange(16, dtype=np.int32)}, mode=0o644)
        c.put("other/w", np.ones(4, np.float32), mode=0o644)
        _, s = fake_peer_up(d, key, port)

        def send(field, body):
            s.sendall(frame(fbytes(3, fint(1, 1))) + frame(fbytes(field, body)))

        # A listed name not exported: the whole set refused, naming it; nothing leased.
        send(9, fint(1, 100) + fbytes(2, b"model/s/big") + fbytes(2, b"other/w"))
        r = peer_frames(s, 10)
        assert r[1] == 100 and r[2] == zigzag(-2) and b"other/w" in r[3], r
        assert d.stats()["remote_pull_leases"] == 0
        # A prefix: the reply (one commit, two members), then the members in name order.
        send(9, fint(1, 200) + fbytes(3, b"model/s/"))
        r = peer_frames(s, 10)
        assert r[1] == 200 and r.get(2, 0) == 0 and r[4] == commit and r[5] == 2, r
        m1 = peer_frames(s, 6)
        m2 = peer_frames(s, 6)
        assert (m1[1], m1[13]) == (201, b"model/s/big") and 12 not in m1, m1
        assert (m2[1], m2[13]) == (202, b"model/s/tiny"), m2
        assert m2[12] == np.arange(16, dtype=np.int32).tobytes()  # inline
        assert d.stats()["remote_pull_leases"] == 1  # the big one's, until its Go or Done
        send(8, fint(1, 201))
        assert wait_until(lambda: d.stats()["remote_pull_leases"] == 0, timeout=5)

        # As the server of a set: a garbage UCX address lets the client's set through.
        send(4, fbytes(1, b"\x01\x02garbage"))
        assert wait_until(lambda: "UCX endpoint" in d.read_log(), timeout=5)
        th, out = pull_in_thread(c, ["@node-z/a", "@node-z/b"], many=True)
        r = peer_frames(s, 9)                             # the daemon's SetPull
        sid = r[1]
        send(10, fint(1, sid) + fint(4, 7) + fint(5, 2))  # two members
        # The first member: inline, 16 bytes of int32; the second named "evil".
        desc = fint(7, 0) + fint(8, 32) + fint(9, 1) + fint(6, 16) + fint(10, 4) + fint(11, 1)
        send(6, fint(1, sid + 1) + desc + fbytes(12, bytes(16)) + fbytes(13, b"a"))
        send(6, fint(1, sid + 2) + desc + fbytes(12, bytes(16)) + fbytes(13, b"evil"))
        th.join(10)
        assert "e" in out, out
        assert out["e"].errno == errno.EPROTO and "node-z" in str(out["e"]), out
        assert "evil" in str(out["e"]), out
        assert replica_names(c) == []
        assert d.alive()
        s.close()
        c.put("local/after", np.ones(3))
