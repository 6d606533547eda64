"""Peering (docs/remote.md, "Peering" and "Authentication"): two real daemons
on 127.0.0.1 with free ports. The same secret brings both up over one
connection; a different one is refused on both sides with the reason and
counted; raw sockets sending garbage, a Hello in this node's own name, a
frame cut short, a frame too long or a wrong proof are refused with a
log line naming the address and the reason while clients are still
served; kill -9 and SIGSTOP of one daemon show as down on the other within
seconds, and it comes back up; a secret file others may read stops the
start with the file and the reason."""
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

from conftest import build_path, wait_until

CTL = build_path("tensorctl")
TENSORD = build_path("tensord")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_file(tmp_path, name, mode=0o600, data=None):
    p = tmp_path / name
    p.write_bytes(data if data is not None else os.urandom(24).hex().encode() + b"\n")
    os.chmod(p, mode)
    return str(p)


def ctl(d, *args):
    r = subprocess.run([CTL, "--socket", d.socket] + list(args), capture_output=True,
                       text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


def peers(d):
    rc, out, err = ctl(d, "peers", "--json")
    assert rc == 0, err
    return {p["name"]: p for p in json.loads(out)}


def peer(d, name):
    return peers(d).get(name)


def state_is(d, name, state):
    p = peer(d, name)
    return p if p and p["state"] == state else None


def socket_inodes(pid):
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def tcp_sockets(pid, ports=None):
    """(state, inode) of the TCP sockets process pid holds (state 01:
    established, 0A: listening); with ports, only those with one end on one
    of them (UCX's own connections between the daemons use other ports)."""
    mine, out = socket_inodes(pid), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as f:
                for row in (line.split() for line in f.readlines()[1:]):
                    ends = {int(row[1].split(":")[1], 16), int(row[2].split(":")[1], 16)}
                    if row[9] in mine and (ports is None or ends & set(ports)):
                        out.append((row[3], row[9]))
    return out


def tcp_established(pid, ports=None):
    return sum(1 for st, _ in tcp_sockets(pid, ports) if st == "01")


def start_pair(daemon_factory, tmp_path, key_a, key_b):
    pa, pb = free_port(), free_port()
    a = daemon_factory("--node-name", "node-a", "--peer-listen", "127.0.0.1:%d" % pa,
                       "--peer", "node-b=127.0.0.1:%d" % pb, "--peer-secret-file", key_a,
                       sub="a")
    b = daemon_factory("--node-name", "node-b", "--peer-listen", "127.0.0.1:%d" % pb,
                       "--peer", "node-a=localhost:%d" % pa, "--peer-secret-file", key_b,
                       sub="b")
    return a, b, pa, pb


def test_same_secret_both_up_over_one_connection(daemon_factory, tmp_path):
    key = secret_file(tmp_path, "peer.key")
    a, b, pa, pb = start_pair(daemon_factory, tmp_path, key, key)
    pb_ = wait_until(lambda: state_is(a, "node-b", "up"), timeout=10)
    pa_ = wait_until(lambda: state_is(b, "node-a", "up"), timeout=10)
    assert pb_ and pa_, (peers(a), peers(b))
    for p in (pb_, pa_):
        assert p["configured"] and p["connects"] >= 1
        assert int(p["instance"], 16) != 0
    # One connection per pair: each daemon holds one established TCP
    # connection, dialled by one of them and accepted by the other.
    # (Connections on the peer ports only: the UCX endpoints each daemon
    # opens to the other's worker, for remote attach, are on ports of UCX's.)
    ports = (pa, pb)
    assert wait_until(lambda: tcp_established(a.pid, ports) == tcp_established(b.pid, ports) == 1,
                      timeout=5), (tcp_established(a.pid, ports), tcp_established(b.pid, ports))
    assert peer(a, "node-b")["dialled"] != peer(b, "node-a")["dialled"]
    # Heartbeats keep it up: past three heartbeat periods, the same connection.
    first = (peer(a, "node-b")["connects"], peer(b, "node-a")["connects"])
    time.sleep(3.5)
    pb_, pa_ = peer(a, "node-b"), peer(b, "node-a")
    assert pb_["state"] == pa_["state"] == "up"
    assert (pb_["connects"], pa_["connects"]) == first
    for p in (pb_, pa_):  # the handshake (~60 + ~95 + ~45 bytes) and 3 heartbeats each way
        assert p["bytes_in"] > 100 and p["bytes_out"] > 100, p
    for d in (a, b):
        s = d.stats()
        assert s["peers"] == 1 and s["peers_up"] == 1, s
        assert s["peer_auth_failures_total"] == 0 and s["peer_lost_total"] == 0, s
        assert s["peer_connects_total"] >= 1
    rc, out, _ = ctl(a, "peers")
    assert rc == 0 and out.split("\n")[0].split()[:3] == ["PEER", "STATE", "ADDRESS"]
    assert out.split("\n")[1].split()[:3] == ["node-b", "up", "127.0.0.1:%d" % pb]
    assert "peer node-b: up" in a.read_log() and "peer node-a: up" in b.read_log()


def test_wrong_secret_refused_on_both_sides(daemon_factory, tmp_path):
    a, b, pa, pb = start_pair(daemon_factory, tmp_path, secret_file(tmp_path, "a.key"),
                              secret_file(tmp_path, "b.key"))
    for d, other in ((a, "node-b"), (b, "node-a")):
        p = wait_until(lambda: state_is(d, other, "refused"), timeout=10)
        assert p, peers(d)
        assert p["error"].startswith("authentication failed: its proof is wrong"), p
        assert p["failures"] >= 1 and p["connects"] == 0 and p["instance"] == "0" * 16
    before = a.stats()["peer_auth_failures_total"]
    assert before >= 1
    # Redialled with back-off, refused again each time: the count grows.
    assert wait_until(lambda: a.stats()["peer_auth_failures_total"] > before, timeout=8)
    for d in (a, b):
        s = d.stats()
        assert s["peers_up"] == 0 and s["peer_connects_total"] == 0, s
        log = d.read_log()
        assert "refused: its proof is wrong" in log, log[-2000:]
    assert "peer connection to node-b at 127.0.0.1:%d: refused" % pb in a.read_log()


def test_secret_rotated_without_a_moment_apart(daemon_factory, tmp_path):
    """The secret file's second line is a secret a node accepts as well, and
    SIGHUP reads the file again: old -> old+new -> new+old -> new, one node
    at a time, each step's new handshakes (a restart of node-b) pass, and a
    node with the old secret alone is refused at the end."""
    old, new = os.urandom(24).hex(), os.urandom(24).hex()
    ka = secret_file(tmp_path, "a.key", data=(old + "\n").encode())
    kb = secret_file(tmp_path, "b.key", data=(old + "\n").encode())
    a, b, pa, pb = start_pair(daemon_factory, tmp_path, ka, kb)
    assert wait_until(lambda: state_is(a, "node-b", "up"), timeout=10)

    def step(path, d, *lines):
        with open(path, "w") as f:
            f.write("".join(x + "\n" for x in lines))
        os.kill(d.pid, signal.SIGHUP)
        want = "two secrets" if len(lines) == 2 else "one secret"
        assert wait_until(lambda: "read again: " + want in d.read_log().split("SIGHUP")[-1],
                          timeout=5), d.read_log()[-1500:]

    def rehandshake():
        first = peer(a, "node-b")["instance"]
        b.stop()
        b.start()
        p = wait_until(lambda: (peer(a, "node-b") or {}).get("instance") != first and
                       state_is(a, "node-b", "up"), timeout=15)
        assert p, peers(a)

    step(ka, a, old, new)      # both accept the new one first
    step(kb, b, old, new)
    rehandshake()
    step(ka, a, new, old)      # a proves with the new one; b still proves with the old
    rehandshake()
    step(kb, b, new, old)
    rehandshake()
    step(ka, a, new)           # the old one retired everywhere
    step(kb, b, new)
    rehandshake()
    assert a.stats()["peer_auth_failures_total"] == 0
    # A node that missed the rotation is refused.
    kc = secret_file(tmp_path, "c.key", data=(old + "\n").encode())
    c = daemon_factory("--node-name", "node-c", "--peer", "node-a=127.0.0.1:%d" % pa,
                       "--peer-secret-file", kc, sub="c")
    assert wait_until(lambda: state_is(c, "node-a", "refused"), timeout=10), peers(c)
    # A file SIGHUP cannot use leaves the secrets in use, and says why.
    with open(ka, "w") as f:
        f.write("short\n")
    os.kill(a.pid, signal.SIGHUP)
    assert wait_until(lambda: "the secrets in use stay" in a.read_log(), timeout=5)
    assert "fewer than 32" in a.read_log()
    rehandshake()


# --- raw sockets: what a stranger may send ---------------------------------------

def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def fbytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def fint(num, v):
    return varint(num << 3) + varint(v)


def frame(payload, version=1, length=None):
    return struct.pack("<IHH", len(payload) if length is None else length, version, 0) + payload


def hello(name, nonce=None, proof=None):
    body = fint(1, 1) + fbytes(2, name.encode()) + fint(3, 12345) + \
        fbytes(4, os.urandom(32) if nonce is None else nonce)
    if proof is not None:
        body += fbytes(5, proof)
    return fbytes(1, body)


def proof(p):
    return fbytes(2, fbytes(1, p))


def exchange(port, data, shut=False, want_reply=False):
    """Sends data to the listener; returns (what came back, whether it closed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    got = b""
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        if want_reply:
            return s
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return got, True
            got += chunk
    except socket.timeout:
        return got, False
    finally:
        if not want_reply:
            s.close()


CASES = [
    ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False,
     "a frame header of version"),
    ("own name", frame(hello("node-a")), False, "its Hello names this node itself"),
    ("bad name", frame(hello("no spaces please")), False, "node name is not 1-63 bytes"),
    ("short nonce", frame(hello("node-x", nonce=b"0123")), False, "nonce is not 32 bytes"),
    ("proof first", frame(proof(b"\0" * 32)), False, "a Proof when a Hello was due"),
    ("undecodable", frame(b"\xff\xff\xff\xff"), False, "does not decode"),
    ("over-long", frame(b"", length=1 << 20), False, "more than 16384"),
    ("truncated", frame(hello("node-x"))[:20], True, "in the middle of a frame"),
    ("dialler proof", frame(hello("node-x", proof=b"\1" * 32)), False,
     "the dialler's Hello carries a proof"),
]


def test_hostile_peer_input_refused_daemon_serves(daemon_factory, tmp_path):
    port = free_port()
    a = daemon_factory("--node-name", "node-a", "--peer-listen", "127.0.0.1:%d" % port,
                       "--peer-secret-file", secret_file(tmp_path, "peer.key"), sub="a")
    for i, (what, data, shut, reason) in enumerate(CASES):
        got, closed = exchange(port, data, shut=shut)
        assert closed and got == b"", (what, got)  # nothing is said to a stranger
        assert wait_until(lambda: a.stats().get("peer_auth_failures_total") == i + 1,
                          timeout=5), (what, a.stats())
        log = a.read_log()
        line = [x for x in log.splitlines() if reason in x]
        assert line and "peer connection from 127.0.0.1:" in line[-1], (what, log[-1500:])
    # A well-formed Hello gets the listener's Hello; a wrong proof then closes.
    s = exchange(port, frame(hello("node-x")), want_reply=True)
    try:
        head = s.recv(8)
        n, version, flags = struct.unpack("<IHH", head)
        assert version == 1 and flags == 0 and 32 + 32 < n < 4096
        body = b""
        while len(body) < n:
            body += s.recv(n - len(body))
        assert b"node-a" in body
        s.sendall(frame(proof(b"\0" * 32)))
        assert s.recv(100) == b""
    finally:
        s.close()
    assert wait_until(lambda: "refused: its proof is wrong" in a.read_log(), timeout=5)
    # No peer appears from any of it, and clients are served as before.
    assert peers(a) == {}
    assert a.alive()
    rc, out, err = ctl(a, "stats", "--json")
    assert rc == 0 and json.loads(out)["peers"] == 0
    assert a.stats()["peer_auth_failures_total"] == len(CASES) + 1


def test_kill_and_stop_reported_down_then_up_again(daemon_factory, tmp_path):
    key = secret_file(tmp_path, "peer.key")
    a, b, pa, pb = start_pair(daemon_factory, tmp_path, key, key)
    assert wait_until(lambda: state_is(a, "node-b", "up"), timeout=10), peers(a)
    first = peer(a, "node-b")["instance"]
    b.proc.kill()
    b.proc.wait()
    t0 = time.monotonic()
    p = wait_until(lambda: peer(a, "node-b")["state"] in ("down", "connecting"), timeout=5)
    assert p and time.monotonic() - t0 < 5, peers(a)
    assert wait_until(lambda: peer(a, "node-b")["error"].startswith("connection lost")
                      or "connection refused" in peer(a, "node-b")["error"], timeout=5)
    assert a.stats()["peers_up"] == 0 and a.stats()["peer_lost_total"] == 1
    b.start()  # the same node, a new instance
    p = wait_until(lambda: state_is(a, "node-b", "up"), timeout=15)
    assert p and p["instance"] != first, peers(a)
    assert wait_until(lambda: state_is(b, "node-a", "up"), timeout=10)
    assert "a new instance" in a.read_log()

    # No FIN: a stopped daemon stops its heartbeats and is called down.
    os.kill(b.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        p = wait_until(lambda: peer(a, "node-b")["state"] != "up", timeout=8, interval=0.1)
        assert p and time.monotonic() - t0 < 6
        assert "no heartbeat for 3000 ms" in peer(a, "node-b")["error"], peers(a)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    assert wait_until(lambda: state_is(a, "node-b", "up"), timeout=15), peers(a)
    assert wait_until(lambda: state_is(b, "node-a", "up"), timeout=15), peers(b)


def test_random_bytes_on_the_peer_port(daemon_factory, tmp_path):
    """Random byte strings, alone and after a valid frame header or a valid
    Hello: every connection is closed, the daemon lives and serves."""
    import random
    rng = random.Random(23)
    port = free_port()
    a = daemon_factory("--node-name", "node-a", "--peer-listen", "127.0.0.1:%d" % port,
                       "--peer-secret-file", secret_file(tmp_path, "peer.key"), sub="a")
    for i in range(150):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 7, 8, 9, 64, 700, 5000])))
        prefix = [b"", struct.pack("<IHH", len(junk), 1, 0), frame(hello("node-x"))][i % 3]
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(prefix + junk)
            s.shutdown(socket.SHUT_WR)
            assert closed(s, timeout=6), i
        except OSError:  # closed (and reset: unread bytes) before all was sent
            pass
        finally:
            s.close()
    assert a.alive() and peers(a) == {}
    s = a.stats()
    assert s["peer_auth_failures_total"] == 150 and s["peers_up"] == 0, s


@pytest.mark.other_uid
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to ask as another uid")
def test_peer_list_for_root_and_the_daemons_uid_only(daemon_factory, tmp_path):
    world = tempfile.mkdtemp(prefix="tensord-peers-")
    try:
        os.chmod(world, 0o755)
        shutil.copy(CTL, world)
        port = free_port()
        d = daemon_factory("--mode", "0666", "--node-name", "node-a", "--peer-listen",
                           "127.0.0.1:%d" % port, "--peer", "node-b=127.0.0.1:%d" % free_port(),
                           "--peer-secret-file", secret_file(tmp_path, "peer.key"),
                           sub=os.path.join(world, "d"))
        r = subprocess.run(["setpriv", "--reuid=4301", "--regid=4301", "--clear-groups",
                            os.path.join(world, "tensorctl"), "--socket", d.socket, "peers"],
                           capture_output=True, text=True, timeout=30, cwd="/")
        assert r.returncode == 1 and r.stdout == "", r
        assert "peers are shown to root and to the daemon's uid (0) only" in r.stderr, r.stderr
        assert list(peers(d)) == ["node-b"]  # root
    finally:
        shutil.rmtree(world, ignore_errors=True)


# --- an independent implementation of the handshake -------------------------------
#
# docs/remote.md and daemon/remote/peer_auth.h, written again from the text: a
# daemon that accepts these proofs and whose proofs these checks accept
# follows the documented transcript, not just its own code.

def read_varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def fields(b):
    """A protobuf message's fields: {number: value} (bytes or int)."""
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        if key & 7 == 0:
            out[key >> 3], i = read_varint(b, i)
        else:
            n, i = read_varint(b, i)
            out[key >> 3] = b[i:i + n]
            i += n
    return out


def recv_frame(s):
    head = b""
    while len(head) < 8:
        chunk = s.recv(8 - len(head))
        if not chunk:
            return None
        head += chunk
    n, version, flags = struct.unpack("<IHH", head)
    assert version == 1 and flags == 0 and n <= 4096
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        assert chunk
        body += chunk
    return fields(body)


def mac(secret, label, name_d, nonce_d, name_l, nonce_l):
    t = label + b"\0" + bytes([len(name_d)]) + name_d + bytes([len(name_l)]) + name_l + \
        nonce_d + nonce_l
    return hmac.new(secret, t, hashlib.sha256).digest()


LABEL_D, LABEL_L = b"tensord-peer-v1 dialler", b"tensord-peer-v1 listener"


class FakePeer:
    """A node that speaks the handshake from Python."""

    def __init__(self, name, key_path):
        self.name = name.encode()
        self.secret = open(key_path, "rb").read().rstrip(b" \t\r\n")

    def dial(self, port, daemon_name):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        nonce = os.urandom(32)
        s.sendall(frame(fbytes(1, fint(1, 1) + fbytes(2, self.name) + fint(3, 77) +
                               fbytes(4, nonce))))
        h = fields(recv_frame(s)[1])
        assert h[2] == daemon_name.encode() and len(h[4]) == 32
        # The listener's proof, checked here as docs/remote.md defines it.
        assert h[5] == mac(self.secret, LABEL_L, self.name, nonce, h[2], h[4])
        s.sendall(frame(proof(mac(self.secret, LABEL_D, self.name, nonce, h[2], h[4]))))
        return s

    def answer(self, s, daemon_name):
        """The listener's side, on a connection the daemon dialled."""
        h = fields(recv_frame(s)[1])
        assert h[2] == daemon_name.encode() and 5 not in h
        nonce = os.urandom(32)
        s.sendall(frame(fbytes(1, fint(1, 1) + fbytes(2, self.name) + fint(3, 77) +
                               fbytes(4, nonce) +
                               fbytes(5, mac(self.secret, LABEL_L, h[2], h[4], self.name,
                                             nonce)))))
        p = fields(recv_frame(s)[2])
        assert p[1] == mac(self.secret, LABEL_D, h[2], h[4], self.name, nonce)


def closed(s, timeout=5):
    s.settimeout(timeout)
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return True
            # heartbeats are fine; keep reading
    except socket.timeout:
        return False


def open_for(s, seconds):
    """Whether s stays open for that long (heartbeats may arrive)."""
    s.settimeout(0.2)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if s.recv(4096) == b"":
                return False
        except socket.timeout:
            pass
    return True


@pytest.mark.parametrize("fake", ["node-a", "node-z"])
def test_two_connections_one_pair_keeps_the_smaller_names(daemon_factory, tmp_path, fake):
    """The daemon node-m and a Python node each dial the other; both
    connections authenticate. The one dialled by the smaller name stays,
    the other is closed, and the peer stays up throughout."""
    key = secret_file(tmp_path, "peer.key")
    me = FakePeer(fake, key)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(10)
    port = free_port()
    d = daemon_factory("--node-name", "node-m", "--peer-listen", "127.0.0.1:%d" % port,
                       "--peer", "%s=127.0.0.1:%d" % (fake, lsock.getsockname()[1]),
                       "--peer-secret-file", key, sub="m")
    accepted, _ = lsock.accept()   # the daemon's dial, held before its handshake
    dialled = me.dial(port, "node-m")
    p = wait_until(lambda: state_is(d, fake, "up"), timeout=5)
    assert p and not p["dialled"] and p["connects"] == 1, peers(d)
    me.answer(accepted, "node-m")
    if fake < "node-m":
        # Dialled by node-a (this side): the daemon's own dial goes.
        assert closed(accepted), "the daemon kept its own dial"
        assert open_for(dialled, 1.0)
        assert wait_until(lambda: peer(d, fake)["connects"] == 1) and not peer(d, fake)["dialled"]
    else:
        # Dialled by node-m (the daemon): the one this side dialled goes.
        assert closed(dialled), "the daemon kept the connection node-z dialled"
        assert open_for(accepted, 1.0)
        assert wait_until(lambda: peer(d, fake)["connects"] == 2 and peer(d, fake)["dialled"])
    p = peer(d, fake)
    assert p["state"] == "up" and p["error"] == "" and p["instance"] == "%016x" % 77
    s = d.stats()
    assert s["peers_up"] == 1 and s["peer_lost_total"] == 0 and s["peer_auth_failures_total"] == 0
    for c in (accepted, dialled, lsock):
        c.close()
    assert wait_until(lambda: peer(d, fake)["state"] != "up", timeout=5)


# --- start-up --------------------------------------------------------------------

def start_fails(tmp_path, *args):
    sock = str(tmp_path / "s.sock")
    r = subprocess.run([TENSORD, "--socket", sock] + list(args), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0, r.stderr
    assert not os.path.exists(sock)  # refused before anything was made
    return r.stderr


def test_secret_file_refused_at_start(tmp_path):
    port = "127.0.0.1:%d" % free_port()
    key = secret_file(tmp_path, "peer.key", mode=0o644)
    err = start_fails(tmp_path, "--node-name", "n1", "--peer-listen", port,
                      "--peer-secret-file", key)
    assert key in err and "mode 0644" in err and "chmod 600" in err, err
    short = secret_file(tmp_path, "short.key", data=b"too short\n")
    err = start_fails(tmp_path, "--node-name", "n1", "--peer-listen", port,
                      "--peer-secret-file", short)
    assert short in err and "fewer than 32" in err, err
    missing = str(tmp_path / "none.key")
    err = start_fails(tmp_path, "--node-name", "n1", "--peer", "n2=127.0.0.1",
                      "--peer-secret-file", missing)
    assert missing in err and "No such file" in err, err
    err = start_fails(tmp_path, "--node-name", "n1", "--peer-listen", port)
    assert "--peer-secret-file" in err, err
    err = start_fails(tmp_path, "--node-name", "n1", "--peer", "n1=127.0.0.1",
                      "--peer-secret-file", short)
    assert "this node's own name" in err, err
    err = start_fails(tmp_path, "--node-name", "bad name", "--peer-listen", port)
    assert "--node-name 'bad name'" in err, err
    err = start_fails(tmp_path, "--peer", "n2=[::1", "--peer-secret-file", short)
    assert "--peer n2=[::1" in err and "not HOST[:PORT]" in err, err


def test_secret_file_alone_is_not_read(daemon_factory, tmp_path):
    d = daemon_factory("--peer-secret-file", str(tmp_path / "absent.key"))
    assert "--peer-secret-file %s: not read, ignoring: peering is off" % (tmp_path / "absent.key") \
        in d.read_log()
    assert tcp_sockets(d.pid) == [] and peers(d) == {}


def test_peering_off_changes_nothing(daemon):
    rc, out, err = ctl(daemon, "peers")
    assert rc == 0 and out.startswith("peering is off"), (out, err)
    rc, out, err = ctl(daemon, "peers", "--json")
    assert rc == 0 and json.loads(out) == []
    s = daemon.stats()
    assert s["peers"] == 0 and s["peers_up"] == 0
    # No TCP socket of the daemon's own.
    assert tcp_sockets(daemon.pid) == []
    assert "peering as node" not in daemon.read_log()
