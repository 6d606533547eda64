"""Inspection must not stall the loop on one user's state (issue 18, items
10 to 13): LeaseList over a quarter of a million leases, metrics scrapes
over tens of thousands of tensors, idle connections on the metrics
endpoint, and what the metrics tell one uid about another.

Each test acts as real uids against a real daemon (test_fairness.py's
FairDaemon: a copy of tensord on a 0666 socket; a raw client becomes uid N
by connecting with that effective uid, which is what SO_PEERCRED records).
Stalls are shown gone by counted work, never by wall-clock time: the daemon
counts the entries each inspection request visits
(tensord_inspect_visits_total), and the tests bound that count per request
where the old code visited everything, and check that an honest client was
served and got the right answer.
"""
import json
import os
import socket
import struct
import threading
import time

import pytest

from conftest import build_path, wait_until
from hostile import (
    Raw, create_body, decode, frame, request, f_bytes, f_varint, reply_with_fds, F_ATTACH,
    F_CREATE,
)
from test_fairness import as_uid, fair, raw_as, tensor_body  # noqa: F401 (fair: a fixture)

prom_parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus_client is not installed (deploy/setup.sh)")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")

NOBODY, HONEST = 65534, 1001
F_PUBLISH, F_UNLINK, F_STATS = 4, 7, 10
F_LEASE_LIST, F_METRICS = 20, 22
S_TENSORS, S_UIDS = 1, 40
U_UID, U_TENSORS, U_BYTES = 1, 3, 4
# daemon/inspect.h and daemon/metrics_http.h
INSPECT_SCAN_MAX, INSPECT_PAGE_MAX = 65536, 1024
HTTP_CONNS_PER_PEER = 4


# --- the wire --------------------------------------------------------------------------

def pipeline(raw, payload, n, chunk=8192):
    """Sends the request payload n times without waiting, reads the n replies
    (another thread, so neither side blocks on a full socket) and returns how
    many were errors. The payload's id must be 1..127 (one byte)."""
    one = frame(payload)
    res = {"errors": 0, "exc": None}
    raw.sock.settimeout(120)

    def reader():
        try:
            buf, got = bytearray(), 0
            while got < n:
                data = raw.sock.recv(1 << 20)
                if not data:
                    raise EOFError(f"closed after {got} of {n} replies")
                buf += data
                off = 0
                while len(buf) - off >= 8:
                    length = struct.unpack_from("<I", buf, off)[0]
                    if len(buf) - off < 8 + length:
                        break
                    # Reply: field 1 (id, one byte) then field 2 (status) if not 0.
                    res["errors"] += length > 2 and buf[off + 10] == 0x10
                    off += 8 + length
                    got += 1
                del buf[:off]
        except Exception as e:  # noqa: BLE001 (handed to the main thread)
            res["exc"] = e

    t = threading.Thread(target=reader)
    t.start()
    for i in range(0, n, chunk):
        raw.sock.sendall(one * min(chunk, n - i))
    t.join()
    if res["exc"]:
        raise res["exc"]
    raw.sock.settimeout(30)
    return res["errors"]


def make(c, name, n=0, mode=0o644, publish=True):
    c.send(frame(request(11, F_CREATE, tensor_body(name, [n], mode))))
    r = reply_with_fds(c)
    assert r.status == 0, r
    if publish:
        r = c.call(request(12, F_PUBLISH, f_bytes(1, name)))
        assert r.status == 0, r


def metrics(c, req_id=30):
    """The Metrics text as c's uid gets it, parsed: {(name, labels): value}."""
    r = c.call(request(req_id, F_METRICS, b""))
    assert r.status == 0, r
    return parse(r.body(F_METRICS)[1][0].decode())


def parse(text):
    out = {}
    for fam in prom_parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


CPU = dict(device="cpu", backend="host", path="memfd")
CUDA0 = dict(device="cuda:0", backend="cuda", path="cuda-vmm")


def owners(samples, name="tensord_uid_tensors"):
    """{uid: value} of a per-uid family, for the uids where it is not 0."""
    return {int(dict(k[1])["uid"]): v for k, v in samples.items() if k[0] == name and v}


def visits(c, what):
    return value(metrics(c, 31), "tensord_inspect_visits_total", request=what)


def stats_uids(c):
    r = c.call(request(32, F_STATS, b""))
    assert r.status == 0, r
    sb = r.body(8)
    rows = [decode(u) for u in sb.get(S_UIDS, [])]
    return {row.get(U_UID, [0])[0]: row for row in rows}, sb


def lease_list_req(req_id, name=b"", after_conn=0, after_slot=0, limit=0):
    body = (f_bytes(1, name) if name else b"") + f_varint(3, after_conn) + \
        f_varint(4, limit) + f_varint(5, after_slot)
    return request(req_id, F_LEASE_LIST, body)


def lease_page(reply):
    """A LeaseList reply: ([(tensor_id, conn_id, count)], more, (next_conn, next_slot))."""
    assert reply.status == 0, reply
    b = reply.body(F_LEASE_LIST) or {}
    holders = [decode(h) for h in b.get(1, [])]
    return ([(h[2][0], h[4][0], h[9][0]) for h in holders], bool(b.get(2, [0])[0]),
            (b.get(3, [0])[0], b.get(4, [0])[0]))


# --- item 10: LeaseList ------------------------------------------------------------------

def test_lease_list_of_half_a_million_leases_visits_a_bounded_share_per_page(fair):
    """uid 65534 holds 2^18 leases (the most a connection may) on each of two
    connections and sends 20 pipelined LeaseList requests: each page visits
    at most INSPECT_SCAN_MAX slots (the old code visited and sorted all
    524,288 every time), the pages of one walk list every lease exactly
    once, and uid 1001 is served meanwhile."""
    d = fair()
    owner = raw_as(NOBODY, d.socket)
    make(owner, b"nb/t")                   # empty: an attach passes no descriptor
    holders = [raw_as(NOBODY, d.socket) for _ in range(2)]
    per_conn = 1 << 18
    for h in holders:
        assert pipeline(h, request(1, F_ATTACH, f_bytes(1, b"nb/t")), per_conn) == 0
    root = raw_as(0, d.socket)
    _, sb = stats_uids(root)
    total = sb[3][0]                       # StatsReply.leases
    assert total == 2 * per_conn + 1       # and the creator's own

    honest = raw_as(HONEST, d.socket)
    make(honest, b"h/x")
    asker = raw_as(NOBODY, d.socket)
    before = visits(root, "lease_list")
    asker.send(b"".join(frame(lease_list_req(40 + i)) for i in range(20)))
    # Served while the 20 wait in the loop's queue.
    r = honest.call(request(2, F_ATTACH, f_bytes(1, b"h/x")))
    assert r.status == 0, r
    pages = [lease_page(asker.reply()) for _ in range(20)]
    spent = visits(root, "lease_list") - before
    conns = 6  # owner, two holders, root, honest, asker
    assert spent <= 20 * (INSPECT_SCAN_MAX + 2 * conns), spent
    for entries, more, _ in pages:
        assert more and len(entries) <= INSPECT_PAGE_MAX
        assert sum(n for _, _, n in entries) <= INSPECT_SCAN_MAX

    # One walk by the cursor: every lease once, in pages of bounded work.
    seen, cursor, more, n_pages = {}, (0, 0), True, 0
    while more:
        before = visits(root, "lease_list")
        entries, more, nxt = lease_page(asker.call(lease_list_req(60, b"nb/t", *cursor)))
        assert visits(root, "lease_list") - before <= INSPECT_SCAN_MAX + 2 * conns
        assert not more or nxt != cursor
        for tensor, conn, n in entries:
            seen[(tensor, conn)] = seen.get((tensor, conn), 0) + n
        cursor, n_pages = nxt, n_pages + 1
    assert sorted(seen.values()) == [1, per_conn, per_conn], seen
    assert n_pages >= total // INSPECT_SCAN_MAX

    # The library puts the pages together: one row per connection, as before.
    rows = fair.tools.run_as(NOBODY, ["tensorctl", "--socket", d.socket, "leases", "--json",
                                   "nb/t"])
    assert rows.returncode == 0, rows.stderr
    counts = sorted(r["count"] for r in json.loads(rows.stdout))
    assert counts == [1, per_conn, per_conn]
    for c in holders + [owner, root, honest, asker]:
        c.close()


# --- item 11: metrics cost series, not tensors --------------------------------------------

def test_metrics_scrape_walks_series_not_tensors(fair):
    """uid 65534 owns 65,536 tensors and asks for the metrics 20 times at
    once, and 12 HTTP scrapers come at once: each scrape visits the same few
    rows it visited with none (the old code walked and sorted every tensor
    per scrape), the figures count the tensors exactly, and uid 1001's
    attach is served meanwhile."""
    port = free_port()
    d = fair("--metrics", f"127.0.0.1:{port}")
    root = raw_as(0, d.socket)
    nobody = raw_as(NOBODY, d.socket)
    honest = raw_as(HONEST, d.socket)
    make(honest, b"h/x")
    make(nobody, b"nb/seed")               # its owner row exists before and after
    metrics(root)
    a = visits(root, "metrics")
    b = visits(root, "metrics")
    per_scrape_few = b - a                 # one scrape, counted by itself
    assert 0 < per_scrape_few < 64

    n = 1 << 16
    blob = b"".join(frame(request(1, F_CREATE, tensor_body(b"nb/%d" % i, [0], 0o600)))
                    for i in range(n))
    nobody.sock.settimeout(120)
    t = threading.Thread(target=nobody.sock.sendall, args=(blob,))
    t.start()
    got = errors = 0
    while got < n:
        r = reply_with_fds(nobody)
        errors += r.status != 0
        got += 1
    t.join()
    assert errors == 0

    s = metrics(root)
    assert value(s, "tensord_device_tensors", **CPU, state="created") == n
    assert owners(s)[NOBODY] == n + 1 and owners(s)[HONEST] == 1
    a = visits(root, "metrics")
    b = visits(root, "metrics")
    assert b - a == per_scrape_few, "a scrape visits as much with 65,536 tensors as with 2"

    before = visits(root, "metrics")
    nobody.send(b"".join(frame(request(40 + i, F_METRICS, b"")) for i in range(20)))
    r = honest.call(request(2, F_ATTACH, f_bytes(1, b"h/x")))
    assert r.status == 0, r
    for _ in range(20):
        r = nobody.reply()
        assert r.status == 0 and b"tensord_device_tensors" in r.body(F_METRICS)[1][0]
    spent = visits(root, "metrics") - before
    assert spent == 21 * per_scrape_few, spent  # the 20, and root's own scrape

    def scrape_until_served():
        # Twelve at once from one address are more than its 4 slots: a
        # newcomer may take the slot of an unanswered one (item 12), which
        # then tries again. Only answered scrapes render, and count.
        for _ in range(50):
            try:
                texts.append(scrape(port))
                return
            except (AssertionError, OSError):
                time.sleep(0.01)

    before = visits(root, "metrics")
    texts = []
    scrapers = [threading.Thread(target=scrape_until_served) for _ in range(12)]
    for t in scrapers:
        t.start()
    r = honest.call(request(3, F_ATTACH, f_bytes(1, b"h/x")))
    assert r.status == 0, r
    for t in scrapers:
        t.join()
    assert len(texts) == 12 and all("tensord_device_tensors{" in t for t in texts)
    assert visits(root, "metrics") - before == 13 * per_scrape_few
    for c in (root, nobody, honest):
        c.close()


def test_metrics_figures_are_those_of_the_state(fair):
    """The figures kept as tensors change are the state's: tensors by state,
    bytes and tensors by owner (equal to stats' per-uid rows, which are
    counted apart), through create, publish, unlink with a lease left,
    replace, drafts and connection-lifetime tensors dropped at close, and
    closes that free what only they held, across three uids."""
    d = fair()
    root = raw_as(0, d.socket)
    honest = raw_as(HONEST, d.socket)
    nobody = raw_as(NOBODY, d.socket)
    make(honest, b"h/pub", 1000)                      # 4,000 bytes: into a slab
    make(honest, b"h/big", 1 << 16)                   # 256 KiB: a memfd of its own
    make(honest, b"h/draft", 10, publish=False)
    r = root.call(request(5, F_ATTACH, f_bytes(1, b"h/big")))
    assert r.status == 0, r
    r = honest.call(request(6, F_UNLINK, f_bytes(1, b"h/big")))
    assert r.status == 0, r                           # leases keep it: unlinked
    make(nobody, b"nb/pub", 5)
    make(nobody, b"nb/rep", 7)
    # Replaced: the new one is a draft until its publish; the old one stays
    # named and published (docs/design.md, "Replace").
    nobody.send(frame(request(11, F_CREATE, tensor_body(b"nb/rep", [9]) + f_varint(20, 1))))
    assert reply_with_fds(nobody).status == 0
    gone = raw_as(NOBODY, d.socket)
    gone.send(frame(request(11, F_CREATE, tensor_body(b"nb/conn", [3], flags=2))))
    assert reply_with_fds(gone).status == 0           # connection lifetime
    make(gone, b"nb/draft", 3, publish=False)
    waiter = raw_as(HONEST, d.socket)
    waiter.send(frame(request(7, F_ATTACH, f_bytes(1, b"w/none") + f_varint(2, 60000))))

    root_holds_big = True

    def check(created, published, unlinked):
        s = metrics(root)
        uids, sb = stats_uids(root)
        got = tuple(value(s, "tensord_device_tensors", **CPU, state=st)
                    for st in ("created", "published", "unlinked"))
        assert got == (created, published, unlinked)
        assert sum(got) == sb.get(S_TENSORS, [0])[0]
        # The owner rows count every tensor a uid owns; the share (stats'
        # bytes) leaves out h/big once it is unlinked and only root's lease
        # keeps it: then it counts against root's pinned bytes
        # (docs/security.md, "What a reader can pin").
        pinned = {HONEST: 1 << 18} if root_holds_big else {}
        for uid, row in uids.items():
            assert owners(s).get(uid, 0) == row.get(U_TENSORS, [0])[0], (uid, row)
            assert owners(s, "tensord_uid_owned_bytes").get(uid, 0) == \
                row.get(U_BYTES, [0])[0] + pinned.get(uid, 0), (uid, row)
        assert sum(owners(s, "tensord_uid_owned_bytes").values()) == \
            value(s, "tensord_device_used_bytes", **CPU)
        return s

    def settled(created, published, unlinked):
        return wait_until(lambda: tuple(
            value(metrics(root), "tensord_device_tensors", **CPU, state=st)
            for st in ("created", "published", "unlinked")) == (created, published, unlinked),
            timeout=10)

    assert wait_until(lambda: value(metrics(root), "tensord_waiters") == 1, timeout=10)
    s = check(4, 3, 1)
    assert owners(s) == {HONEST: 3, NOBODY: 5}
    # Footprints: a 4,000-byte slab slot of 4,096, 256 KiB, a 40-byte memfd's page.
    assert owners(s, "tensord_uid_owned_bytes")[HONEST] == 4096 + (1 << 18) + 4096
    waiter.close()
    assert wait_until(lambda: value(metrics(root), "tensord_waiters") == 0, timeout=10)
    gone.close()            # its draft and its connection-lifetime tensor go
    assert settled(2, 3, 1)
    check(2, 3, 1)
    nobody.close()          # the unpublished new version goes; the old one stays
    assert settled(1, 3, 1)
    check(1, 3, 1)
    honest.close()          # h/draft; h/big lives on in root's lease
    assert settled(0, 3, 1)
    check(0, 3, 1)
    root.close()            # h/big's last lease
    root_holds_big = False
    root = raw_as(0, d.socket)
    assert settled(0, 3, 0)
    s = check(0, 3, 0)
    assert owners(s) == {HONEST: 1, NOBODY: 2}
    root.close()




def test_metrics_figures_follow_a_gpu_create_to_its_rounded_size(daemon_factory):
    """A GPU create is counted when it is linked, at the size it asked for,
    while the worker allocates; then at its rounded size, as the device's
    bytes are (the old walk summed the same sizes). The fake CUDA driver
    rounds to its granularity and takes 300 ms per allocation."""
    if not os.path.exists(build_path("tests/helpers/tensord-fakegpu")):
        pytest.fail("build/tests/helpers/tensord-fakegpu is missing: run make all")
    d = daemon_factory(env={"TENSORD_FAKE_ALLOC_MS": "300"},
                       binary="tests/helpers/tensord-fakegpu")
    c = Raw(d.socket)
    c.hello()
    uid = os.geteuid()

    def figures():
        s = metrics(c)
        return (value(s, "tensord_device_tensors", **CUDA0, state="created"),
                owners(s, "tensord_uid_owned_bytes").get(uid, 0),
                value(s, "tensord_device_used_bytes", **CUDA0))

    c.send(frame(request(11, F_CREATE, create_body(b"g/x", [1000], device=(2, 0)))))
    assert figures() == (1, 4000, 4000), "in flight: counted at the size asked for"
    r = reply_with_fds(c)
    assert r.status == 0, r
    n, owner_bytes, used = figures()
    assert n == 1 and used > 4000 and owner_bytes == used, "rounded, both alike"
    r = c.call(request(12, F_UNLINK, f_bytes(1, b"g/x")))
    assert r.status == 0, r
    c.close()
    c = Raw(d.socket)
    c.hello()
    assert wait_until(lambda: figures() == (0, 0, 0), timeout=10)
    c.close()


# --- item 12: idle connections on the metrics endpoint --------------------------------------

GET = b"GET /metrics HTTP/1.0\r\n\r\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(connect, request=GET):
    """Everything the endpoint answers to request on a fresh connection."""
    s = connect()
    s.settimeout(10)
    try:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data
    finally:
        s.close()


def closed_now(s):
    """Whether the daemon has closed s (what it sent has arrived: loopback)."""
    try:
        return s.recv(100, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_cannot_keep_a_scraper_off_the_metrics_endpoint(fair):
    """uid 65534 opens 16 connections to the endpoint and sends nothing (they
    used to take every slot for 5 s). Over a unix socket it keeps 4 (its
    share: each past it closes its own oldest) and root's scrapes are served
    beside them; over TCP, from four addresses, it fills all 16 and a scrape
    takes the slot of the oldest unfinished one."""
    path = os.path.join(fair.tools.sock_dir, "metrics.sock")
    d = fair("--metrics", "unix:" + path)       # the socket's mode: 0666, like the daemon's

    def unix():
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        return s

    idle = []
    for _ in range(16):
        with as_uid(NOBODY):
            idle.append(unix())
    http(unix, b"GET /nothing HTTP/1.0\r\n\r\n")  # a round trip: every accept is done
    share = HTTP_CONNS_PER_PEER
    assert [closed_now(s) for s in idle] == [True] * (16 - share) + [False] * share
    for _ in range(5):
        assert http(unix).startswith(b"HTTP/1.0 200 OK")
    assert not any(closed_now(s) for s in idle[-share:]), "root's scrapes used their own share"
    # It keeps opening more: each costs only its own oldest.
    for _ in range(8):
        with as_uid(NOBODY):
            idle.append(unix())
        assert http(unix).startswith(b"HTTP/1.0 200 OK")
    for s in idle:
        s.close()
    d.stop()

    port = free_port()
    fair("--metrics", f"127.0.0.1:{port}")
    idle = []
    for i in range(16):  # 4 each from 127.0.0.2 .. 127.0.0.5: four peers, all slots
        with as_uid(NOBODY):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 4}", 0))
            s.connect(("127.0.0.1", port))
        idle.append(s)

    def tcp():
        return socket.create_connection(("127.0.0.1", port))

    assert http(tcp).startswith(b"HTTP/1.0 200 OK")  # in the oldest idle one's slot
    assert [closed_now(s) for s in idle] == [True] + [False] * 15
    with as_uid(NOBODY):                             # all 16 taken again
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
    idle.append(s)
    assert http(tcp).startswith(b"HTTP/1.0 200 OK")  # in the next oldest's
    assert [closed_now(s) for s in idle] == [True] * 2 + [False] * 15
    for s in idle:
        s.close()


# --- item 13: who sees whose usage -------------------------------------------------------------

def scrape(port):
    data = http(lambda: socket.create_connection(("127.0.0.1", port)))
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK"), head
    return body.decode()


def test_metrics_show_another_uids_usage_only_as_stats_does(fair):
    """uid 1001 owns three tensors, uid 65534 one. Over the socket each sees
    its own row of tensord_uid_* (root every row), exactly the uids its
    stats show; the HTTP endpoint, which has no peer to ask, shows totals
    only, unless started with --metrics-per-uid."""
    port = free_port()
    d = fair("--metrics", f"127.0.0.1:{port}")
    honest = raw_as(HONEST, d.socket)
    nobody = raw_as(NOBODY, d.socket)
    root = raw_as(0, d.socket)
    for name, n in ((b"h/a", 1000), (b"h/b", 1 << 16), (b"h/c", 0)):
        make(honest, name, n, mode=0o600)
    make(nobody, b"nb/a", 3)

    r = nobody.call(request(30, F_METRICS, b""))
    assert r.status == 0
    text = r.body(F_METRICS)[1][0].decode()
    assert f'uid="{HONEST}"' not in text, "1001's usage is not 65534's to see"
    s = parse(text)
    assert owners(s) == {NOBODY: 1}
    assert owners(s, "tensord_uid_owned_bytes") == {NOBODY: 256}      # a slab slot
    assert set(stats_uids(nobody)[0]) == {NOBODY}, "the same rule as stats"
    # The totals are everyone's to see, as in stats.
    assert value(s, "tensord_device_tensors", **CPU, state="published") == 4

    s = metrics(honest)
    assert owners(s) == {HONEST: 3}
    assert owners(s, "tensord_uid_owned_bytes") == {HONEST: 4096 + (1 << 18)}
    s = metrics(root)
    assert owners(s) == {HONEST: 3, NOBODY: 1}

    http_text = scrape(port)
    assert "tensord_uid_" not in http_text and f'uid="{HONEST}"' not in http_text
    s = parse(http_text)
    assert value(s, "tensord_device_tensors", **CPU, state="published") == 4
    assert value(s, "tensord_device_used_bytes", **CPU) == \
        4096 + (1 << 18) + 256
    for c in (honest, nobody, root):
        c.close()

    port = free_port()
    d = fair("--metrics", f"127.0.0.1:{port}", "--metrics-per-uid")
    honest = raw_as(HONEST, d.socket)
    nobody = raw_as(NOBODY, d.socket)
    make(honest, b"h/a", 1000)
    make(nobody, b"nb/a", 3)
    s = parse(scrape(port))
    assert owners(s) == {HONEST: 1, NOBODY: 1}
    assert owners(s, "tensord_uid_owned_bytes") == {HONEST: 4096, NOBODY: 256}
    honest.close()
    nobody.close()
