"""Peers found by DNS (--peers-dns HOST[:PORT], docs/operating.md "Peers"):
two daemons on 127.0.0.1 that each name the other's port under "localhost"
find each other, learn each other's node name from the handshake and end
with one connection; a daemon whose DNS name answers with its own address
recognises itself and stops dialling it; a name that does not resolve
leaves the daemon serving clients, with the name and the reason in its log
(given in the config file, as every long option may be)."""
import re
import time

import numpy as np
import pytest

from conftest import wait_until
from test_peers import ctl, free_port, peers, secret_file, state_is, tcp_established
from test_remote import tensord


def test_two_daemons_find_each_other_by_dns(daemon_factory, tmp_path):
    key = secret_file(tmp_path, "peer.key")
    pa, pb = free_port(), free_port()
    a = daemon_factory("--node-name", "node-a", "--peer-listen", "127.0.0.1:%d" % pa,
                       "--peers-dns", "localhost:%d" % pb, "--peer-secret-file", key, sub="a")
    b = daemon_factory("--node-name", "node-b", "--peer-listen", "127.0.0.1:%d" % pb,
                       "--peers-dns", "localhost:%d" % pa, "--peer-secret-file", key, sub="b")
    up_b = wait_until(lambda: state_is(a, "node-b", "up"), timeout=15)
    up_a = wait_until(lambda: state_is(b, "node-a", "up"), timeout=15)
    assert up_a and up_b, (peers(a), peers(b), a.read_log()[-3000:], b.read_log()[-3000:])
    # Neither was named with --peer: each name came from the other's Hello.
    assert not up_a["configured"] and not up_b["configured"]
    assert int(up_a["instance"], 16) != 0
    # Both dial; one connection per pair is left (dialled by one, accepted
    # by the other), and nothing else is in the table.
    ports = (pa, pb)
    assert wait_until(lambda: tcp_established(a.pid, ports) == tcp_established(b.pid, ports) == 1,
                      timeout=10), (tcp_established(a.pid, ports), tcp_established(b.pid, ports))
    assert set(peers(a)) == {"node-b"} and set(peers(b)) == {"node-a"}
    assert peers(a)["node-b"]["dialled"] != peers(b)["node-a"]["dialled"]
    assert "--peers-dns localhost: 127.0.0.1:%d found" % pb in a.read_log()
    # The Python client sees the same.
    c = tensord.connect(b.socket)
    try:
        got = {p.name: p for p in c.peers()}
        assert set(got) == {"node-a"} and got["node-a"].state == "up", got
    finally:
        c.close()
    for d in (a, b):
        assert d.stats()["peer_auth_failures_total"] == 0


# Listening on 127.0.0.1, or on every address ([::], where the dial from
# 127.0.0.1 arrives as ::ffff:127.0.0.1 and must still be matched).
@pytest.mark.parametrize("listen", ["127.0.0.1:%d", ":%d"])
def test_own_address_in_the_answer_is_not_a_peer(daemon_factory, tmp_path, listen):
    key = secret_file(tmp_path, "peer.key")
    pa = free_port()
    a = daemon_factory("--node-name", "node-a", "--peer-listen", listen % pa,
                       "--peers-dns", "localhost:%d" % pa, "--peer-secret-file", key)
    line = "--peers-dns localhost: 127.0.0.1:%d is this daemon itself" % pa
    assert wait_until(lambda: line in a.read_log(), timeout=10), a.read_log()[-3000:]
    # Not dialled again: past several redial periods (1 s, then 2 s), still
    # one such line, no connection on its port, no peer, nothing refused.
    time.sleep(3.5)
    log = a.read_log()
    assert log.count(line) == 1, log[-3000:]
    assert tcp_established(a.pid, (pa,)) == 0
    assert peers(a) == {}
    s = a.stats()
    assert s["peers"] == 0 and s["peer_auth_failures_total"] == 0, s
    assert "names this node itself" not in log
    # tensorctl peers: no peer row, the name with its own address counted as SELF.
    rc, out, err = ctl(a, "peers")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows[0][0] == "PEER" and rows[1][0] == "PEERS-DNS", out
    name, addresses, self_, resolutions, failures, error = rows[2]
    assert name == "localhost:%d" % pa and int(addresses) >= 1 and self_ == "1", out
    assert int(resolutions) >= 1 and failures == "0" and error == "-", out


def test_unresolvable_name_logged_daemon_serves(daemon_factory, tmp_path):
    # Given in the config file, whose keys are the long options.
    key = secret_file(tmp_path, "peer.key")
    conf = tmp_path / "tensord.conf"
    conf.write_text("node-name = node-a\npeers-dns = no-such-host.invalid:7439\n"
                    "peer-secret-file = %s\n" % key)
    d = daemon_factory("--config", str(conf))
    assert wait_until(lambda: re.search(r"--peers-dns no-such-host\.invalid:7439: cannot resolve "
                                        r"no-such-host\.invalid: \S", d.read_log()),
                      timeout=30), d.read_log()[-3000:]
    assert d.alive()
    c = tensord.connect(d.socket)
    try:
        c.put("x", np.arange(16, dtype=np.int32))
        with c.attach("x") as t:
            assert np.array_equal(np.from_dlpack(t), np.arange(16, dtype=np.int32))
    finally:
        c.close()
    assert peers(d) == {}
    # tensorctl peers: no peer, and the name with its error under PEERS-DNS.
    rc, out, err = ctl(d, "peers")
    assert rc == 0, err
    head, row = [line for line in out.splitlines() if line.strip()][1:3]
    assert head.split()[:5] == ["PEERS-DNS", "ADDRESSES", "SELF", "RESOLUTIONS", "FAILURES"], out
    cells = row.split()
    assert cells[:3] == ["no-such-host.invalid:7439", "0", "0"], out
    assert int(cells[3]) >= 1 and cells[4] == cells[3], out
    assert "cannot resolve no-such-host.invalid: " in row, out
