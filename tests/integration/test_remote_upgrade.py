"""A node's --peer-listen socket across its restarts and upgrades (issue 33;
docs/restart.md section 6): the daemon keeps its listening socket for peers
in the descriptor store, as it keeps the clients' one, so the next daemon
(restored after a kill, or taking over in a drained upgrade while the old
one still runs) listens on the same socket: the port never closes, peers
dialling meanwhile wait in its backlog, and the new daemon does not meet
its predecessor's bind. A stored socket the next daemon does not listen on
(no --peer-listen any more, or another address) leaves the store."""
import pathlib
import socket

import numpy as np
import pytest

from conftest import Daemon, holding, wait_until
from test_remote import attach_when_ready, kill, pair_up, start_pair, state_is, tensord


def successor(d, name):
    """A second daemon of d's directory and arguments, logging to name.log:
    under a holder it takes d's store (and drains d) as it starts."""
    n = Daemon(pathlib.Path(d.socket).parent, d.args, d.env)
    n.log_path = str(pathlib.Path(d.socket).parent / (name + ".log"))
    return n


def bindable(port):
    """Whether no socket listens at 127.0.0.1:port (a bind succeeds;
    SO_REUSEADDR as the daemon's: the peer links' ends in TIME_WAIT do
    not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def peer_port(d):
    return int(d.args[d.args.index("--peer-listen") + 1].rsplit(":", 1)[1])


def test_a_drained_upgrade_keeps_the_peer_port_and_its_peers(daemon_factory, tmp_path, holder):
    """node-a upgraded behind a holder: the new daemon listens on the old
    one's peer socket (before, it could not bind the port the drained one
    held and exited, leaving the old one drained); the old one exits once
    the new one serves; node-b calls the new node-a up again and pulls both
    what node-a published before and what it publishes after."""
    a, b = start_pair(daemon_factory, tmp_path, extra_a=("--holder", str(holder)))
    with tensord.Client(a.socket) as ca, tensord.Client(b.socket) as cb:
        before = np.arange(1000, dtype=np.int32)
        ca.put("model/before", before, mode=0o644)
        with attach_when_ready(cb, "@node-a/model/before") as t:
            assert (np.from_dlpack(t) == before).all()
    a2 = successor(a, "new")
    try:
        a2.start()  # returns once the new daemon serves
        assert a.proc.wait(timeout=30) == 0, a.read_log()[-3000:]
        assert "(its predecessor's socket)" in a2.read_log(), a2.read_log()[-3000:]
        assert "peering: draining" in a.read_log(), a.read_log()[-3000:]
        assert not bindable(peer_port(a))
        pair_up(a2, b, timeout=30)
        with tensord.Client(a2.socket) as ca, tensord.Client(b.socket) as cb:
            assert ca.stats()["daemon_pid"] == a2.pid
            after = np.arange(2000, dtype=np.int64) * 3
            ca.put("model/after", after, mode=0o644)
            with attach_when_ready(cb, "@node-a/model/after", timeout=20) as t:
                assert (np.from_dlpack(t) == after).all()
            with cb.attach("@node-a/model/before") as t:
                assert (np.from_dlpack(t) == before).all()
    finally:
        assert a2.stop() == 0, a2.read_log()[-3000:]


def test_a_restarted_node_listens_on_its_stored_peer_socket(daemon_factory, tmp_path, holder):
    """node-a killed behind a holder: the port stays bound (the store holds
    the socket) and the restored node-a listens on it; node-b comes up with
    it again and pulls."""
    a, b = start_pair(daemon_factory, tmp_path, extra_a=("--holder", str(holder)))
    with tensord.Client(a.socket) as ca:
        ca.put("model/x", np.ones(8, np.float32), mode=0o644)
    kill(a)
    assert not bindable(peer_port(a))  # in the store meanwhile
    a.start()
    assert "(its predecessor's socket)" in a.read_log()
    pair_up(a, b, timeout=20)
    with tensord.Client(b.socket) as cb:
        with attach_when_ready(cb, "@node-a/model/x", timeout=20) as t:
            assert (np.from_dlpack(t) == 1).all()


@pytest.mark.parametrize("change", ["none", "other-port"])
def test_a_stored_peer_socket_not_listened_on_leaves_the_store(daemon_factory, tmp_path,
                                                              holder, change):
    """Restarted without --peer-listen, or with another port: the stored
    socket is closed and removed from the store (the old port is free
    again), said in the log; the daemon starts and serves."""
    a, b = start_pair(daemon_factory, tmp_path, extra_a=("--holder", str(holder)))
    old = peer_port(a)
    with tensord.Client(a.socket) as ca:
        ca.put("model/x", np.ones(8, np.float32), mode=0o644)
    a.stop()
    assert not bindable(old)
    i = a.args.index("--peer-listen")
    if change == "none":
        del a.args[i:i + 2]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.args[i + 1] = "127.0.0.1:%d" % s.getsockname()[1]
    a.start()
    log = a.read_log()
    assert "a stored listening socket for peers" in log and "removing it from the store" in log
    assert wait_until(lambda: bindable(old), timeout=10)
    with tensord.Client(a.socket) as ca:
        assert ca.stat("model/x").generation == 1
    a.stop()
    a.start()  # the socket of the new port came back from the store
    assert "(its predecessor's socket)" in a.read_log() or change == "none"


def test_a_drained_node_left_to_its_manager_lets_its_peers_go(daemon_factory, tmp_path):
    """A holder that leaves the drained node-a to its manager (a DaemonSet's
    rolling update, $TENSORD_HOLD_STOP_DRAINED=0): once the new node-a
    serves, the old one, still running, closes its peer link, so node-b
    links to the new one and pulls what it publishes; before, node-b kept
    its link to the old, frozen daemon until that one was stopped."""
    with holding(tmp_path, TENSORD_HOLD_STOP_DRAINED="0") as hold:
        a, b = start_pair(daemon_factory, tmp_path, extra_a=("--holder", str(hold)))
        with tensord.Client(a.socket) as ca:
            ca.put("model/before", np.ones(10, np.float32), mode=0o644)
        a2 = successor(a, "new")
        try:
            a2.start()
            assert wait_until(lambda: "letting 0 clients and 1 peer links go" in a.read_log(),
                              timeout=30), a.read_log()[-3000:]
            assert a.alive()
            pair_up(a2, b, timeout=30)
            p = state_is(b, "node-a", "up")
            assert p and p["instance"] != 0
            with tensord.Client(a2.socket) as ca, tensord.Client(b.socket) as cb:
                after = np.arange(64, dtype=np.int16)
                ca.put("model/after", after, mode=0o644)
                with attach_when_ready(cb, "@node-a/model/after", timeout=20) as t:
                    assert (np.from_dlpack(t) == after).all()
        finally:
            assert a2.stop() == 0, a2.read_log()[-3000:]
            # The holder stops the left one with it (its manager would start it again).
            assert a.proc.wait(timeout=30) == 0, a.read_log()[-3000:]
