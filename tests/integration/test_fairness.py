"""Fair shares between local users (issue 10, items 3, 4, 5, 6, 7 and 12).

Each test acts as two or three real uids against a real daemon and shows
the attacker refused or limited AND an honest second user still served
within a bound. The tests run as root and skip (with the reason) otherwise.

How a test becomes another uid: the kernel records a Unix socket's peer
credentials (SO_PEERCRED) when connect() runs, from the caller's effective
uid and gid, and the daemon trusts nothing else. So a raw client is
connected inside `as_uid()`, which switches the effective uid/gid of this
process around connect() only (root switches back); everything the socket
does afterwards counts as that uid's. Processes that must *be* another uid
(a non-root daemon for item 7, tdclient for item 4) are started with
setpriv --reuid/--regid/--clear-groups from copies of the binaries in a
0755 temporary directory, since the checkout may sit under a 0700 one.

Bounds are on descriptors, bytes and counted work (StatsReply.cleanup_steps),
never tight wall-clock times; "within N s" bounds are liveness checks.
"""
import contextlib
import errno
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import build_path, wait_until
from testlib import copies_for_all, open_dir
from hostile import (
    Raw, Reply, frame, request, f_bytes, f_varint, hello_req, create_body, put_req,
    reply_with_fds, decode, rss_kib, F_CREATE, F_ATTACH, F_STAT, F_LIST, F_STATS, F_PUT, F_UNLINK,
    IO_TIMEOUT,
)

pytestmark = [pytest.mark.other_uid,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")]

ATTACKER, HONEST, DAEMON_UID = 50001, 50002, 50003
F_PUBLISH = 4
R_LEASE, R_INFO, R_LIST, R_STATS = 5, 6, 7, 8
# StatsReply fields of fair shares, and UidUsage's.
S_UIDS, S_CLEANUP_STEPS, S_FD_WAITS = 40, 41, 42
U_UID, U_CLIENTS, U_TENSORS, U_BYTES, U_WAITERS, U_FDS_IN_FLIGHT, U_FDS = 1, 2, 3, 4, 5, 6, 7


# --- acting as other uids -------------------------------------------------------

@contextlib.contextmanager
def as_uid(uid):
    """Effective uid/gid switched to uid for the block (root only)."""
    os.setegid(uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def raw_as(uid, path, hello=True):
    with as_uid(uid):
        c = Raw(path)
    if hello:
        c.hello()
    return c


class Tools:
    """Copies of tensord, tensorctl and tdclient that every uid may run."""

    def __init__(self):
        self.dir = open_dir(prefix="tensord-fair-")
        copies_for_all(self.dir, build_path("tensord"), build_path("tensorctl"),
                       build_path("tests", "helpers", "tdclient"))
        self.sock_dir = os.path.join(self.dir, "run")
        os.mkdir(self.sock_dir)
        os.chmod(self.sock_dir, 0o777 | 0o1000)  # sticky, like /tmp

    def path(self, name):
        return os.path.join(self.dir, name)

    def run_as(self, uid, argv, **kw):
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                               self.path(argv[0])] + list(argv[1:]),
                              capture_output=True, text=True, timeout=120, cwd="/", **kw)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class FairDaemon:
    """A tensord on a socket every uid may reach, optionally as another uid
    and with a smaller descriptor limit."""

    def __init__(self, tools, args=(), uid=None, nofile=None, env=None):
        self.socket = os.path.join(tools.sock_dir, "tensord-%d.sock" % id(self))
        self.log_path = os.path.join(tools.dir, "tensord-%d.log" % id(self))
        r, w = os.pipe()
        cmd = [tools.path("tensord"), "--socket", self.socket, "--ready-fd", str(w),
               "--mode", "0666", "--log-level", "info"] + list(args)
        if uid is not None:
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] + cmd

        def limits():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.log = open(self.log_path, "wb")
        env = dict(os.environ, **(env or {}))
        env.pop("TENSORD_SOCKET", None)
        self.proc = subprocess.Popen(cmd, pass_fds=(w,), stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=limits, cwd="/",
                                     env=env)
        os.close(w)
        with os.fdopen(r, "rb") as rf:
            byte = rf.read(1)
            rf.read()  # until the daemon closed its end (fd counts)
        if byte != b"R":
            self.proc.wait(timeout=10)
            raise RuntimeError("tensord did not start: " + self.read_log())

    @property
    def pid(self):
        return self.proc.pid

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        log = self.read_log()
        assert "ERROR: AddressSanitizer" not in log, log[-4000:]
        assert "runtime error:" not in log, log[-4000:]
        assert self.proc.returncode == 0, f"tensord exited {self.proc.returncode}:\n{log[-4000:]}"


@pytest.fixture
def fair():
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs daemons this test starts (uids, limits, fd accounting)")
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run as other uids")
    tools = Tools()
    started = []

    def make(*args, uid=None, nofile=None, env=None):
        d = FairDaemon(tools, args, uid, nofile, env)
        started.append(d)
        return d

    make.tools = tools
    yield make
    for d in started:
        d.stop()
    tools.cleanup()


# --- requests and replies ------------------------------------------------------------

def tensor_body(name, shape, mode=0o644, flags=0):
    return create_body(name, shape, flags=flags) + f_varint(7, mode)


def attach_req(req_id, name, timeout_ms=0):
    body = f_bytes(1, name)
    if timeout_ms:
        body += f_varint(2, timeout_ms)
    return request(req_id, F_ATTACH, body)


def make_tensor(c, name, n_floats, mode=0o644):
    """Creates and publishes a host tensor: with a descriptor of its own when
    larger than a slab slot (64 KiB), else it moves into a slab at publish."""
    c.send(frame(request(11, F_CREATE, tensor_body(name, [n_floats], mode))))
    r = reply_with_fds(c)
    assert r.status == 0, r
    r = c.call(request(12, F_PUBLISH, f_bytes(1, name)))
    assert r.status == 0, r


def put_many(c, names, mode=0o644, batch=2000):
    """Zero-byte tensors, one put each, pipelined in batches."""
    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        c.send(b"".join(frame(put_req(100 + j, tensor_body(n, [0], mode), b""))
                        for j, n in enumerate(chunk)))
        for _ in chunk:
            r = c.reply()
            assert r.status == 0, r


def stats(c, req_id=77):
    r = c.call(request(req_id, F_STATS, b""))
    assert r.status == 0, r
    return r.body(R_STATS)


def steps(c):
    """StatsReply.cleanup_steps: waiters and tensors visited by wakes and closes."""
    return stats(c).get(S_CLEANUP_STEPS, [0])[0]


def uid_rows(sb):
    return {row[U_UID][0] if U_UID in row else 0: row
            for row in (decode(b) for b in sb.get(S_UIDS, []))}


def usage(sb, uid, field):
    return uid_rows(sb).get(uid, {}).get(field, [0])[0]


def list_names(c, prefix="", after="", limit=0, req_id=9):
    body = f_bytes(1, prefix) if prefix else b""
    if after:
        body += f_bytes(2, after)
    if limit:
        body += f_varint(3, limit)
    r = c.call(request(req_id, F_LIST, body))
    assert r.status == 0, r
    lb = r.body(R_LIST) or {}
    names = [decode(t)[1][0].decode() for t in lb.get(1, [])]
    return names, bool(lb.get(2, [0])[0])


def honest_round_trip(d, uid, name, timeout=5.0):
    """uid connects, attaches name (a descriptor comes) and gets stats, within timeout s."""
    t0 = time.monotonic()
    c = raw_as(uid, d.socket)
    c.sock.settimeout(timeout)
    c.send(frame(attach_req(5, name)))
    r = reply_with_fds(c)
    assert r.status == 0 and r.id == 5, r
    sb = stats(c)
    c.close()
    assert time.monotonic() - t0 < timeout
    return sb


def flood(c, payload, seconds=5.0, stuck_for=0.5):
    """Sends copies of payload without reading until the daemon stops
    taking them (back-pressure) or seconds pass. Returns frames sent."""
    c.sock.setblocking(False)
    sent_bytes, stuck = 0, None
    end = time.monotonic() + seconds
    view = b""
    while time.monotonic() < end:
        if not view:
            view = payload
        try:
            n = c.sock.send(view)
            view = view[n:]
            sent_bytes += n
            stuck = None
        except BlockingIOError:
            stuck = stuck or time.monotonic()
            if time.monotonic() - stuck > stuck_for:
                break
            time.sleep(0.005)
    c.sock.settimeout(5.0)
    return sent_bytes


# --- item 3: descriptors of unread replies; tensors per uid -----------------------------

def test_item3_unread_attach_replies_hold_no_daemon_descriptors(fair):
    d = fair()
    owner = raw_as(0, d.socket)
    make_tensor(owner, "pub", 16384)
    time.sleep(0.1)
    base = d.fds()
    # The attacker asks for 50,000 attaches, each a descriptor, and reads none.
    a = raw_as(ATTACKER, d.socket)
    one = frame(attach_req(1, "pub"))
    sent = flood(a, one * 50_000, seconds=8)
    assert sent >= 64 * len(one), sent
    held = d.fds()
    print(f"item 3: attacker sent {sent // len(one)} attaches; daemon fds {base} -> {held}")
    # Its connection costs one descriptor; its queued replies none.
    assert held <= base + 4, (base, held)
    # Another uid is served, with a descriptor, within a bound.
    sb = honest_round_trip(d, HONEST, "pub")
    assert usage(sb, ATTACKER, U_FDS_IN_FLIGHT) <= 64, uid_rows(sb)
    assert sb.get(S_FD_WAITS, [0])[0] > 0
    # What the attacker got so far is well formed, and the rest follows as it reads.
    a.sock.setblocking(True)
    for i in range(200):
        r = reply_with_fds(a)
        assert r.status == 0 and r.id == 1, r
    a.close()
    owner.close()
    assert wait_until(lambda: d.fds() <= base, timeout=10), (d.fds(), base)


def test_item3_tensors_per_uid_never_emfile(fair):
    # 1024 descriptors: 64 kept for root, 480 tensors with descriptors per uid.
    d = fair(nofile=1024)
    a = raw_as(ATTACKER, d.socket)
    b = raw_as(ATTACKER + 10, d.socket)
    refusals = {}
    for who, c in (("a", a), ("b", b)):
        for i in range(2000):
            # 128 KiB: larger than a slab slot, so each keeps a descriptor.
            c.send(frame(request(1, F_CREATE, tensor_body(f"{who}/{i}", [32768]))))
            r = reply_with_fds(c)
            if r.status:
                refusals[who] = (i, r)
                break
            assert c.call(request(2, F_PUBLISH, f_bytes(1, f"{who}/{i}"))).status == 0
    print("item 3: refusals", {k: (i, r.status, r.message) for k, (i, r) in refusals.items()})
    i, r = refusals["a"]
    assert r.status == -errno.EDQUOT and "--max-fds-per-uid" in r.message, r
    assert i == (1024 - 64) // 2
    # The second attacker runs into the reserve (or its own share) first:
    # never EMFILE, and the message names the limit.
    i, r = refusals["b"]
    assert r.status in (-errno.ENOSPC, -errno.EDQUOT), r
    assert "RLIMIT_NOFILE" in r.message or "--max-fds-per-uid" in r.message, r
    # Root still gets a tensor (from the reserve) and a connection.
    make_tensor(raw_as(0, d.socket), "root/t", 32768)
    # Disconnecting does not free persistent tensors, but the shares hold.
    a.close()
    b.close()
    sb = stats(raw_as(0, d.socket))
    assert usage(sb, ATTACKER, U_FDS) == (1024 - 64) // 2
    assert usage(sb, ATTACKER, U_CLIENTS) == 0


# --- item 4: connections per uid -----------------------------------------------------------

def test_item4_connections_per_uid(fair):
    d = fair("--max-clients", "64", "--max-clients-per-uid", "8")
    mine = [raw_as(ATTACKER, d.socket) for _ in range(8)]
    ninth = raw_as(ATTACKER, d.socket, hello=False)
    r = ninth.reply()
    assert r.id == 0 and r.status == -errno.EDQUOT, r
    assert "--max-clients-per-uid 8" in r.message and f"uid {ATTACKER}" in r.message, r
    ninth.expect_closed()
    # The library says so from tensord_connect.
    p = fair.tools.run_as(ATTACKER, ["tdclient"], input=f"connect {d.socket}\n")
    assert p.stdout.startswith("err EDQUOT") and "--max-clients-per-uid" in p.stdout, p
    # Another uid connects and is served while the attacker holds its 8.
    t0 = time.monotonic()
    h = raw_as(HONEST, d.socket)
    sb = h.stats()
    assert time.monotonic() - t0 < 5
    assert sb[2][0] == 9  # StatsReply.clients
    # A slot given back is a slot the attacker may use again.
    mine.pop().close()
    root = raw_as(0, d.socket)
    assert wait_until(lambda: usage(root.stats(), ATTACKER, U_CLIENTS) == 7, timeout=5)
    mine.append(raw_as(ATTACKER, d.socket))
    for c in mine:
        c.close()


# --- item 5: paged, bounded List -------------------------------------------------------------

def test_item5_list_paged_and_bounded(fair):
    # Under ASan freed memory waits in a quarantine (256 MiB by default)
    # before it can be reused: keep it small so that RSS means something.
    asan = bool(os.environ.get("TENSORD_SANITIZED"))
    opts = os.environ.get("ASAN_OPTIONS", "")
    d = fair(env={"ASAN_OPTIONS": opts + ":quarantine_size_mb=8"} if asan else None)
    n = 100_000
    owner = raw_as(HONEST, d.socket)
    names = ["many/%06d" % i for i in range(n)]
    put_many(owner, names)
    # A page is bounded whatever the limit asked for, and says there is more.
    page, more = list_names(owner, "many/", limit=1 << 30)
    assert len(page) == 1024 and more and page[0] == "many/000000"
    time.sleep(0.2)
    before = rss_kib(d.pid)
    # 20 clients of another uid ask for lists and never read the replies.
    spammers = [raw_as(ATTACKER, d.socket) for _ in range(20)]
    lst = frame(request(9, F_LIST, f_bytes(1, "many/"))) * 200
    for s in spammers:
        flood(s, lst, seconds=3, stuck_for=0.3)
    time.sleep(0.5)
    peak = rss_kib(d.pid)
    print(f"item 5: VmRSS {before} -> {peak} KiB with 20 clients not reading their lists")
    # Each holds at most about 4 MiB of replies (then we stop reading it);
    # ASan's redzones and quarantine take about as much again.
    assert peak - before < 20 * 6 * 1024 * (2 if asan else 1), (before, peak)
    # The honest user lists all 100,000 through the library, in order.
    t0 = time.monotonic()
    p = fair.tools.run_as(HONEST, ["tensorctl", "--socket", d.socket, "ls", "many/"])
    assert p.returncode == 0, p.stderr
    got = [line.split()[0] for line in p.stdout.splitlines()[1:] if line.strip()]
    assert got == names, (len(got), got[:3], got[-3:])
    print(f"item 5: tensorctl ls of {n} names took {time.monotonic() - t0:.1f} s")
    assert time.monotonic() - t0 < 60
    # Paging by hand: complete and without repeats.
    seen, after, more = [], "", True
    while more:
        page, more = list_names(owner, "many/", after=after, limit=5000)
        seen += page
        after = page[-1] if page else after
    assert seen == names
    for s in spammers:
        s.close()
    assert d.proc.poll() is None


# --- item 6: clean-up linear in what a connection held ---------------------------------------

def test_item6_waiters_cleanup_is_linear(fair):
    conns, per = 100, 2000
    d = fair("--max-waiters-per-conn", str(per), "--max-waiters-per-uid", str(conns * per),
             "--max-clients-per-uid", "200")
    root = raw_as(0, d.socket)
    attackers = [raw_as(ATTACKER, d.socket) for _ in range(conns)]
    for k, c in enumerate(attackers):
        c.send(b"".join(frame(attach_req(1000 + i, f"w/{k}/{i}", timeout_ms=-1))
                        for i in range(per)))
    assert wait_until(lambda: usage(stats(root), ATTACKER, U_WAITERS) == conns * per,
                      timeout=60), uid_rows(stats(root))
    # A publish wakes only that name's waiters: one visit for one waiter,
    # none for a name nobody waits for.
    h = raw_as(HONEST, d.socket)
    before = steps(root)
    make_tensor(h, "nobody-waits", 4)
    assert steps(root) - before == 0
    before = steps(root)
    make_tensor(h, "w/0/0", 4, mode=0o644)
    r = reply_with_fds(attackers[0])
    assert r.id == 1000 and r.status == 0, r
    assert steps(root) - before == 1
    # Closing every attacker connection visits each of its waiters once.
    before = steps(root)
    t0 = time.monotonic()
    for c in attackers:
        c.close()
    # A generous liveness bound: the counted work below is the real check.
    assert wait_until(lambda: usage(stats(root), ATTACKER, U_CLIENTS) == 0, timeout=10)
    took = time.monotonic() - t0
    visited = steps(root) - before
    print(f"item 6: {conns * per} waiters dropped in {took:.2f} s, {visited} visits")
    assert conns * per - 1 <= visited <= conns * per + 2 * conns, visited
    assert usage(stats(root), ATTACKER, U_WAITERS) == 0
    honest_round_trip(d, HONEST, "nobody-waits")


def test_waiters_per_uid_are_bounded_across_connections(fair):
    """--max-waiters-per-uid counts a uid's waiters over all its connections:
    one uid cannot park unbounded attaches by opening more connections.
    Past it EAGAIN names the flag; another uid still waits, and a closed
    connection gives its share back."""
    d = fair("--max-waiters-per-conn", "10", "--max-waiters-per-uid", "25")
    root = raw_as(0, d.socket)
    conns = [raw_as(ATTACKER, d.socket) for _ in range(3)]
    refused = []
    for k, c in enumerate(conns):
        c.send(b"".join(frame(attach_req(100 + i, f"pu/{k}/{i}", timeout_ms=-1))
                        for i in range(10)))
    assert wait_until(lambda: usage(stats(root), ATTACKER, U_WAITERS) == 25, timeout=10)
    # The refusals were answered at once, the waiters' replies wait for a publish.
    for c in conns:
        c.sock.settimeout(1.0)
        try:
            while True:
                refused.append(c.reply())
        except (socket.timeout, TimeoutError):
            pass
        c.sock.settimeout(IO_TIMEOUT)
    assert len(refused) == 5, refused
    assert all(r.status == -11 and "--max-waiters-per-uid 25" in r.message
               and "'pu/" in r.message for r in refused), refused
    assert usage(stats(root), ATTACKER, U_WAITERS) == 25
    # Another uid is not held back by it.
    h = raw_as(HONEST, d.socket)
    h.send(frame(attach_req(7, "pu/honest", timeout_ms=-1)))
    assert wait_until(lambda: usage(stats(root), HONEST, U_WAITERS) == 1, timeout=10)
    # Closing a connection gives its ten back: the uid may wait again.
    conns[0].close()
    assert wait_until(lambda: usage(stats(root), ATTACKER, U_WAITERS) == 15, timeout=10)
    c = raw_as(ATTACKER, d.socket)
    c.send(frame(attach_req(9, "pu/again", timeout_ms=-1)))
    assert wait_until(lambda: usage(stats(root), ATTACKER, U_WAITERS) == 16, timeout=10)
    for x in conns[1:] + [c, h]:
        x.close()
    assert d.proc.poll() is None


def test_item6_close_walks_only_its_own_tensors(fair):
    d = fair()
    root = raw_as(0, d.socket)
    big = raw_as(ATTACKER, d.socket)
    put_many(big, ["z/%06d" % i for i in range(50_000)])
    before = steps(root)
    for i in range(20):
        c = raw_as(HONEST, d.socket)
        c.send(frame(request(1, F_CREATE, tensor_body(f"h/{i}", [4], flags=2))))
        assert reply_with_fds(c).status == 0
        c.close()
    assert wait_until(lambda: usage(stats(root), HONEST, U_CLIENTS) == 0, timeout=10)
    visited = steps(root) - before
    # Each close: its one tensor and its lease slots (16), not 50,000 names.
    print(f"item 6: 20 closes with 50,000 names in the registry: {visited} visits")
    assert visited <= 20 * 20, visited
    honest_round_trip(d, 0, "z/000007")


# --- item 7: descriptors in flight for a daemon that is not root -----------------------------

def nonroot_daemon_under_attack(fair, n_attackers, *args):
    """A daemon of its own uid with 256 descriptors (so the kernel lets it
    have at most 256 in flight, SCM_RIGHTS, over all its clients), a tensor
    "pub", and n_attackers connections of ATTACKER that ask for it
    thousands of times and never read."""
    d = fair(*args, uid=DAEMON_UID, nofile=256)
    owner = raw_as(0, d.socket)
    make_tensor(owner, "pub", 1024)
    attackers = [raw_as(ATTACKER, d.socket) for _ in range(n_attackers)]
    one = frame(attach_req(1, "pub"))
    for a in attackers:
        flood(a, one * 2000, seconds=1.5, stuck_for=0.2)
    return d, owner, attackers


def test_item7_nonroot_daemon_keeps_serving_when_one_client_never_reads(fair):
    d, owner, attackers = nonroot_daemon_under_attack(fair, 8)
    sb = stats(owner)
    print("item 7: attacker usage", uid_rows(sb).get(ATTACKER))
    # Its uid's share of descriptors in flight is well below the kernel's limit...
    assert 0 < usage(sb, ATTACKER, U_FDS_IN_FLIGHT) <= 256 // 4
    # ...so a victim is served at once, descriptor and all.
    honest_round_trip(d, HONEST, "pub")
    for a in attackers:
        a.close()


def test_item7_half_closed_connections_keep_their_share(fair):
    """An attacker that asks for a few descriptors on a connection, never
    reads them and half-closes it (the daemon sees EOF and closes its end),
    then does it again, would pile up descriptors in flight that nobody
    counts. They stay counted, with the connection, until read or closed."""
    d, owner, attackers = nonroot_daemon_under_attack(fair, 0)
    twenty = frame(attach_req(1, "pub")) * 20
    for _ in range(20):
        a = raw_as(ATTACKER, d.socket)
        a.send(twenty)
        time.sleep(0.05)
        a.sock.shutdown(socket.SHUT_WR)
        attackers.append(a)
    time.sleep(0.3)
    sb = stats(owner)
    print("item 7: half-closing attacker", uid_rows(sb).get(ATTACKER))
    # 20 x 20 would pass the kernel's 256; the uid's share stops at 64.
    assert 0 < usage(sb, ATTACKER, U_FDS_IN_FLIGHT) <= 256 // 4
    assert usage(sb, ATTACKER, U_CLIENTS) >= 2  # closed ones with descriptors unread
    honest_round_trip(d, HONEST, "pub")
    # Once the attacker closes its sockets, its share comes back.
    for a in attackers:
        a.close()
    assert wait_until(lambda: usage(stats(owner), ATTACKER, U_CLIENTS) == 0, timeout=5)
    assert usage(stats(owner), ATTACKER, U_FDS_IN_FLIGHT) == 0


def test_item7_etoomanyrefs_keeps_the_reply_queued(fair):
    # Lift every share of the attacker so that the kernel's per-user limit
    # is what stops the daemon: the victim's reply must wait, not be lost,
    # and its connection must stay open.
    d, owner, attackers = nonroot_daemon_under_attack(
        fair, 6, "--quota-exempt-uid", str(ATTACKER), "--max-fds-in-flight-per-conn", "100000")
    victim = raw_as(HONEST, d.socket)
    victim.send(frame(attach_req(5, "pub")))
    # The attackers' unread replies fill the kernel's per-user limit (the
    # daemon's RLIMIT_NOFILE, 256): waited for, not slept on and skipped.
    assert wait_until(lambda: usage(stats(owner), ATTACKER, U_FDS_IN_FLIGHT) >= 250,
                      timeout=30), uid_rows(stats(owner))
    sb = stats(owner)
    in_flight = usage(sb, ATTACKER, U_FDS_IN_FLIGHT)
    print(f"item 7: attacker holds {in_flight} descriptors in flight, fd_waits "
          f"{sb.get(S_FD_WAITS, [0])[0]}")
    # Held back, not lost: nothing has come yet, and the connection is open.
    victim.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        victim.sock.recv(1, socket.MSG_PEEK)
    victim.sock.setblocking(True)
    # The attacker lets go; the victim's reply arrives on the same connection.
    for a in attackers:
        a.close()
    victim.sock.settimeout(10)
    r = reply_with_fds(victim)
    assert r.status == 0 and r.id == 5, r
    assert victim.stats().get(S_FD_WAITS, [0])[0] > 0
    victim.close()


# --- item 12: metadata of private tensors ------------------------------------------------------

def stat_status(c, name):
    return c.call(request(3, F_STAT, f_bytes(1, name))).status


@pytest.mark.parametrize("show_all", [False, True])
def test_item12_list_and_stat_only_what_you_may_read(fair, show_all):
    d = fair(*(["--show-all-metadata"] if show_all else []))
    owner = raw_as(ATTACKER, d.socket)
    make_tensor(owner, "secret/weights", 4, mode=0o600)
    make_tensor(owner, "open/weights", 4, mode=0o644)
    other = raw_as(HONEST, d.socket)
    names, _ = list_names(other)
    if show_all:
        assert names == ["open/weights", "secret/weights"]
        assert stat_status(other, "secret/weights") == 0
    else:
        assert names == ["open/weights"]
        assert stat_status(other, "secret/weights") == -errno.ENOENT
    assert stat_status(other, "open/weights") == 0
    # The owner and root see both.
    assert list_names(owner)[0] == ["open/weights", "secret/weights"]
    assert list_names(raw_as(0, d.socket))[0] == ["open/weights", "secret/weights"]
    # And the other uid may still do what its mode allows.
    other.send(frame(attach_req(4, "open/weights")))
    assert reply_with_fds(other).status == 0


# --- per-uid usage in stats ---------------------------------------------------------------------

def test_stats_per_uid_visible_to_root_and_owner(fair):
    d = fair()
    a = raw_as(ATTACKER, d.socket)
    make_tensor(a, "a/x", 256)
    h = raw_as(HONEST, d.socket)
    rows = uid_rows(stats(raw_as(0, d.socket)))
    assert rows[ATTACKER][U_CLIENTS][0] == 1 and rows[ATTACKER][U_TENSORS][0] == 1
    assert rows[ATTACKER][U_BYTES][0] == 1024 and rows[HONEST][U_CLIENTS][0] == 1
    assert set(uid_rows(stats(h))) == {HONEST}
    assert set(uid_rows(stats(a))) == {ATTACKER}
    p = fair.tools.run_as(ATTACKER, ["tensorctl", "--socket", d.socket, "stats"])
    assert p.returncode == 0, p.stderr
    # The table of uids: a row per uid, its uid first.
    firsts = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    assert str(ATTACKER) in firsts and str(HONEST) not in firsts, p.stdout


# --- watches see only what their uid may read (issue 20) ---------------------------------------

F_WATCH, R_EVENTS = 16, 12


def watch_events(c, want, timeout=10):
    """The events of c's watch (request id 50) until want of them came: (kind, name) pairs."""
    got, end = [], time.monotonic() + timeout
    c.sock.settimeout(timeout)
    while len(got) < want and time.monotonic() < end:
        r = c.reply()
        if r.id != 50:
            continue
        body = r.body(R_EVENTS) or {}
        for ev in body.get(1, []):
            e = decode(ev)
            got.append((e.get(1, [0])[0], e.get(2, [b""])[0].decode()))
    return got


def test_watch_events_follow_what_the_uid_may_read(fair):
    """A watcher of another uid hears of tensors whose mode lets it read
    them, and of nothing else: names, generations and commits of tensors
    it may not read never reach it. Watches count against its uid's share."""
    d = fair("--max-watches-per-uid", "2")
    owner = raw_as(HONEST, d.socket)
    spy = raw_as(ATTACKER, d.socket)
    r = spy.call(request(50, F_WATCH, f_bytes(1, b"w/")))
    assert r.status == 0, r
    make_tensor(owner, "w/secret", 4, mode=0o600)
    make_tensor(owner, "w/open", 4, mode=0o644)
    owner_watch = raw_as(HONEST, d.socket)
    # Watch.replay (4) from commit 0: the current state of every name.
    assert owner_watch.call(request(50, F_WATCH, f_bytes(1, b"w/") + f_varint(4, 1))).status == 0
    # The owner's watch sees both; the spy only the open one.
    assert sorted(watch_events(owner_watch, 2)) == [(0, "w/open"), (0, "w/secret")]
    assert watch_events(spy, 1) == [(0, "w/open")]
    owner.call(request(13, F_UNLINK, f_bytes(1, b"w/secret")))
    owner.call(request(14, F_UNLINK, f_bytes(1, b"w/open")))
    assert watch_events(spy, 1) == [(1, "w/open")], "the secret's unlink is not the spy's to see"
    # The uid's share of watches: two, then EAGAIN naming the flag.
    assert spy.call(request(51, F_WATCH, f_bytes(1, b"x/"))).status == 0
    r = spy.call(request(52, F_WATCH, f_bytes(1, b"y/")))
    assert r.status == -errno.EAGAIN and "--max-watches-per-uid" in r.message, r
    for c in (owner, spy, owner_watch):
        c.close()
