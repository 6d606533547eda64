"""Two daemons in two network namespaces joined by a veth pair the test
makes (docs/remote.md, "Tests"): the peers come up across the veth, host
tensors of several sizes (64 MiB among them) attach remotely byte for byte,
a daemon with another secret is refused across it, and the link set down
in one namespace (no FIN: the packets just stop) makes each side call the
other down within its heartbeat bound, the pull in flight or the next
attach failing with an error that names the peer, nothing left behind.

Each daemon runs under `ip netns exec`; its Unix socket is a file, so the
test's clients in the root namespace reach both. Needs root and `ip`
(iproute2, deploy/setup.sh); skipped with the reason otherwise."""
import errno
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import build_path, wait_until
from test_peers import peers, secret_file, state_is
from test_remote import attach_when_ready, host_used, pair_up, pull_in_thread, tensord

PORT = 7439
LOST = (errno.EHOSTUNREACH, errno.ECONNRESET, errno.ETIMEDOUT)


def ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r


class Net:
    """Namespaces NS_A and NS_B, veth DEV_A (10.231.N.1/24) in the one and
    DEV_B (10.231.N.2/24) in the other."""

    def __init__(self):
        tag = "%d" % (os.getpid() % 100000)
        self.ns = {"a": "tdnet-a-" + tag, "b": "tdnet-b-" + tag}
        self.dev = {"a": "tdva" + tag, "b": "tdvb" + tag}
        net = 10 + os.getpid() % 240
        self.addr = {"a": "10.231.%d.1" % net, "b": "10.231.%d.2" % net}
        self.made = []

    def make(self):
        for side in "ab":
            ip("netns", "add", self.ns[side])
            self.made.append(self.ns[side])
        ip("link", "add", self.dev["a"], "netns", self.ns["a"], "type", "veth",
           "peer", "name", self.dev["b"], "netns", self.ns["b"])
        for side in "ab":
            ip("-n", self.ns[side], "addr", "add", self.addr[side] + "/24", "dev", self.dev[side])
            ip("-n", self.ns[side], "link", "set", "lo", "up")
            ip("-n", self.ns[side], "link", "set", self.dev[side], "up")
        # The kernel marks a veth running (carrier, IFF_RUNNING) a moment
        # after both ends are up; UCX lists only running devices, so a
        # daemon started before that would have no interface for UCX_NET_DEVICES.
        for side in "ab":
            if not wait_until(lambda: " state UP " in ip("-n", self.ns[side], "-o", "link", "show",
                                                         "dev", self.dev[side]).stdout,
                              timeout=10, interval=0.05):
                raise RuntimeError("%s in %s did not come up: %s" % (
                    self.dev[side], self.ns[side],
                    ip("-n", self.ns[side], "-o", "link", "show").stdout.strip()))

    def remove(self):
        for ns in self.made:  # the veth pair goes with its namespaces
            ip("netns", "del", ns, check=False)
        self.made = []

    def wrapper(self, tmp_path, side):
        """A tensord that runs in side's namespace (ip netns exec execs it:
        same pid, the ready pipe inherited)."""
        path = tmp_path / ("tensord-in-%s" % side)
        path.write_text('#!/bin/sh\nexec ip netns exec %s %s "$@"\n' % (
            self.ns[side], build_path("tensord")))
        path.chmod(0o755)
        return str(path)

    def env(self, side):
        return {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": self.dev[side],
                "UCX_WARN_UNUSED_ENV_VARS": "n"}


@pytest.fixture
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (this runs as uid %d)" % os.geteuid())
    if not shutil.which("ip"):
        pytest.skip("no ip command (iproute2; deploy/setup.sh installs it)")
    n = Net()
    try:
        n.make()
    except RuntimeError as e:
        n.remove()
        pytest.skip("cannot make the namespaces and veth pair: %s" % e)
    try:
        yield n
    finally:
        n.remove()


def start(daemon_factory, tmp_path, net, side, name, key, *args):
    other = "b" if side == "a" else "a"
    return daemon_factory("--node-name", name, "--peer-listen", "%s:%d" % (net.addr[side], PORT),
                          "--peer", "node-%s=%s:%d" % (other, net.addr[other], PORT),
                          "--peer-secret-file", key, *args, env=net.env(side), sub=side,
                          binary=net.wrapper(tmp_path, side))


CASES = [
    ("model/small", np.arange(1024, dtype=np.float32)),                              # 4 KiB
    ("model/mid", np.arange(1 << 20, dtype=np.uint8).reshape(1024, 1024)),           # 1 MiB
    ("model/big", np.random.default_rng(3).integers(0, 1 << 62, (8 << 20,), np.int64)),  # 64 MiB
    ("model/half", np.linspace(0, 1, 3000).astype(np.float16).reshape(30, 100)),
]


# net first: its teardown (the namespaces deleted) runs after the daemons stopped.
def test_two_namespaces_attach_refuse_and_link_loss(net, daemon_factory, tmp_path):
    key = secret_file(tmp_path, "peer.key")
    a = start(daemon_factory, tmp_path, net, "a", "node-a", key, "--export", "model/")
    b = start(daemon_factory, tmp_path, net, "b", "node-b", key)
    pair_up(a, b, timeout=15)
    assert peers(b)["node-a"]["address"] == "%s:%d" % (net.addr["a"], PORT)

    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        # Remote attach across the veth, bytes identical.
        for name, arr in CASES:
            ca.put(name, arr, mode=0o644)
        attach_when_ready(cb, "@node-a/" + CASES[0][0]).release()
        for name, arr in CASES:
            t = cb.attach("@node-a/" + name)
            got = np.from_dlpack(t)
            assert got.dtype == arr.dtype and got.shape == arr.shape, name
            assert got.tobytes() == arr.tobytes(), name
            del got
            t.release()
        assert b.stats()["remote_pull_bytes_total"] == sum(arr.nbytes for _, arr in CASES)

        # Another secret is refused across it, on both sides.
        bad = secret_file(tmp_path, "other.key")
        failures = a.stats()["peer_auth_failures_total"]
        c = daemon_factory("--node-name", "node-c", "--peer",
                           "node-a=%s:%d" % (net.addr["a"], PORT), "--peer-secret-file", bad,
                           env=net.env("b"), sub="c", binary=net.wrapper(tmp_path, "b"))
        refused = wait_until(lambda: state_is(c, "node-a", "refused"), timeout=15)
        assert refused and "proof is wrong" in refused["error"], peers(c)
        assert wait_until(lambda: a.stats()["peer_auth_failures_total"] > failures, timeout=5)
        assert "node-c" not in peers(a)
        c.stop()

        # The link down in a's namespace, a pull under way.
        ca.put("model/huge", np.ones(256 << 20, np.uint8), mode=0o644)
        ca.put("model/later", np.ones(4, np.float32), mode=0o644)
        used0 = host_used(b)
        th, out = pull_in_thread(cb, "@node-a/model/huge")
        assert wait_until(lambda: a.stats().get("remote_inflight_bytes", 0) > 0 or
                          "e" in out or "t" in out, timeout=10, interval=0.001)
        ip("-n", net.ns["a"], "link", "set", net.dev["a"], "down")
        th.join(60)
        assert not th.is_alive()
        errors = [out["e"]] if "e" in out else []
        if "t" in out:  # it was done before the link went: the next attach fails instead
            out["t"].release()
            try:
                cb.attach("@node-a/model/later")
            except OSError as e:
                errors.append(e)
        (e,) = errors
        assert "node-a" in str(e) and e.errno in LOST, (e, e.errno)

        # Each side calls the other down (heartbeats, no FIN), with the reason.
        down_a = wait_until(lambda: state_is(b, "node-a", "down"), timeout=15)
        down_b = wait_until(lambda: state_is(a, "node-b", "down"), timeout=15)
        assert down_a and down_b, (peers(a), peers(b))
        assert "connection lost" in down_a["error"], down_a
        with pytest.raises(OSError) as ei:
            cb.attach("@node-a/model/small-other")
        assert ei.value.errno in LOST and "node-a" in str(ei.value), ei.value

        # Nothing left behind: no half-made replica and its bytes back on b;
        # no pull lease or bytes in flight on a; both still serve.
        assert wait_until(lambda: host_used(b) <= used0, timeout=10), (host_used(b), used0)
        s = b.stats()
        assert s["remote_replicas"] == 0, s
        assert wait_until(lambda: a.stats()["remote_pull_leases"] == 0, timeout=10), a.stats()
        # A send stuck on the dead link ends when its parked endpoint is closed (10 s).
        assert wait_until(lambda: a.stats()["remote_inflight_bytes"] == 0, timeout=25), a.stats()
        assert ca.stat("model/huge").refcount == 0
        cb.put("local/x", np.ones(3))
        ca.put("local/y", np.ones(3))
