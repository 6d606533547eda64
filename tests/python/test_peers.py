"""Client.peers(): the daemon's peers as tensord.PeerInfo records, the same
state `tensorctl peers --json` prints (tests/integration/test_peers.py
covers the peering itself)."""
import os
import socket

import tensord
from tdutil import wait_until


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_peers_off(client):
    assert client.peers() == []


def test_peers_of_two_daemons(daemon_factory, tmp_path):
    key = tmp_path / "peer.key"
    key.write_bytes(os.urandom(24).hex().encode())
    os.chmod(key, 0o600)
    pa, pb = free_port(), free_port()
    a = daemon_factory("--node-name", "py-a", "--peer-listen", "127.0.0.1:%d" % pa,
                       "--peer", "py-b=127.0.0.1:%d" % pb, "--peer-secret-file", str(key),
                       sub="a")
    daemon_factory("--node-name", "py-b", "--peer-listen", "127.0.0.1:%d" % pb,
                   "--peer", "py-a=127.0.0.1:%d" % pa, "--peer-secret-file", str(key), sub="b")
    with tensord.connect(a.socket) as c:
        assert wait_until(lambda: c.peers()[0].state == "up", timeout=10), c.peers()
        [p] = c.peers()
        assert isinstance(p, tensord.PeerInfo)
        assert (p.name, p.address, p.configured) == ("py-b", "127.0.0.1:%d" % pb, True)
        assert p.error == "" or "connection refused" in p.error  # the last error is kept
        assert p.instance > 0 and p.connects >= 1 and p.bytes_in > 0 and p.since > 0
        assert isinstance(p.dialled, bool)
