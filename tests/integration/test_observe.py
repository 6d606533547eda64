"""Observability against a real daemon and real client processes: who holds
which lease (tensorctl leases, and what it stops showing after kill -9),
which clients are connected, who may see what, and the Prometheus metrics,
scraped over HTTP (TCP and a unix socket) and through `tensorctl stats
--prometheus`, parsed with prometheus_client's own parser."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import build_path, wait_until
from hostile import Raw, decode, f_bytes, f_varint, request
from test_core import Client, clients  # noqa: F401 (clients: a fixture)
from testlib import copies_for_all, open_dir

prom_parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus_client is not installed (deploy/setup.sh)")

CTL = build_path("tensorctl")


def ctl(sock, *args, preexec=None, ctl_path=CTL):
    r = subprocess.run([ctl_path, "--socket", sock] + list(args), capture_output=True,
                       text=True, timeout=30, preexec_fn=preexec)
    return r.returncode, r.stdout, r.stderr


def ctl_json(sock, *args, **kw):
    rc, out, err = ctl(sock, *args, "--json", **kw)
    assert rc == 0, err
    return json.loads(out)


def as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def publish(c, name, *extra):
    c.ok(f"create {name} uint8 64 " + " ".join(extra))
    c.ok(f"publish {name}")


# --- leases -----------------------------------------------------------------------------


def test_leases_show_a_real_client_and_forget_it_after_kill9(daemon, clients):
    owner = clients()
    publish(owner, "model/x")
    owner.ok("release model/x")
    holder = clients()
    holder.ok("attach model/x 0")
    holder.ok("attach model/x 0 again")  # a second lease on the same tensor

    # The owner's release goes out within 1 ms (deleters batch them).
    assert wait_until(lambda: len(ctl_json(daemon.socket, "leases", "model/x")) == 1,
                      timeout=5)
    rows = ctl_json(daemon.socket, "leases", "model/x")
    row = rows[0]
    assert row["pid"] == holder.p.pid
    assert row["uid"] == os.geteuid()
    assert row["comm"] == "tdclient"
    assert row["count"] == 2
    assert row["state"] == "published"
    # since is a wall-clock date within the last minute, and held agrees with it.
    assert abs(time.time() - row["since_ns"] / 1e9) < 60
    assert 0 <= row["held_ns"] < 60e9

    rc, out, err = ctl(daemon.socket, "leases", "model/x")
    assert rc == 0, err
    head, line = out.splitlines()
    assert head.split() == ["NAME", "STATE", "PID", "USER", "COMM", "LABEL", "LEASES", "SINCE",
                            "HELD"]
    cols = line.split()
    assert cols[0] == "model/x" and cols[2] == str(holder.p.pid) and cols[4] == "tdclient"
    assert cols[5] == "-" and row["label"] == ""  # it connected with no name
    assert cols[6] == "2"

    holder.kill9()
    assert wait_until(lambda: ctl_json(daemon.socket, "leases", "model/x") == [], timeout=5)
    rc, out, _ = ctl(daemon.socket, "leases", "model/x")
    assert rc == 0 and str(holder.p.pid) not in out


def test_leases_of_all_tensors_and_unlinked_ones_and_a_missing_name(daemon, clients):
    a = clients()
    publish(a, "t/one")
    publish(a, "t/two")
    a.ok("unlink t/two")  # still leased by its creator: listed as unlinked
    rows = ctl_json(daemon.socket, "leases")
    assert [(r["name"], r["state"], r["pid"]) for r in rows] == [
        ("t/one", "published", a.p.pid), ("t/two", "unlinked", a.p.pid)]
    rc, _, err = ctl(daemon.socket, "leases", "t/none")
    assert rc == 1 and "t/none" in err and "no such tensor" in err
    rc, _, err = ctl(daemon.socket, "leases", "bad name!")
    assert rc == 1 and "bad name!" in err


def test_clients_lists_connections_with_their_counts(daemon, clients):
    a = clients()
    publish(a, "c/x")
    b = clients()
    b.ok("attach c/x 0")
    rows = {r["pid"]: r for r in ctl_json(daemon.socket, "clients")}
    assert rows[a.p.pid]["tensors_created"] == 1 and rows[a.p.pid]["leases"] == 1
    assert rows[b.p.pid]["leases"] == 1 and rows[b.p.pid]["comm"] == "tdclient"
    assert rows[b.p.pid]["client"] == "libtensord"
    assert any(r["comm"] == "tensorctl" for r in rows.values()), "its own connection"
    rc, out, err = ctl(daemon.socket, "clients")
    assert rc == 0, err
    assert out.splitlines()[0].split()[:4] == ["CONN", "PID", "USER", "COMM"]
    assert str(b.p.pid) in out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
@pytest.mark.other_uid
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_leases_and_clients_respect_permissions(daemon_factory):
    d = daemon_factory("--mode", "0666", sub=open_dir())
    # Copies nobody can run: the checkout may be under a directory it cannot enter.
    bindir = open_dir()
    nobody_ctl, nobody_tdclient = copies_for_all(bindir, CTL,
                                                 build_path("tests", "helpers", "tdclient"))
    owner = Client(d.socket)
    other = Client(d.socket, preexec=as_nobody, exe=nobody_tdclient)
    try:
        publish(owner, "priv")               # 0600: nobody may not read it
        publish(owner, "pub", "mode=0644")
        other.ok("attach pub 0")

        def names(*args, preexec=None):
            return sorted((r["name"], r["pid"]) for r in
                          ctl_json(d.socket, "leases", *args, preexec=preexec,
                                   ctl_path=nobody_ctl))

        assert names() == sorted([("priv", owner.p.pid), ("pub", owner.p.pid),
                                  ("pub", other.p.pid)])
        assert names(preexec=as_nobody) == sorted([("pub", owner.p.pid),
                                                   ("pub", other.p.pid)])
        # A tensor nobody may not read is hidden from it, as from list and stat.
        rc, out, err = ctl(d.socket, "leases", "priv", preexec=as_nobody,
                           ctl_path=nobody_ctl)
        assert rc == 1 and "'priv': no such tensor" in err, (rc, out, err)

        uids = {r["uid"] for r in ctl_json(d.socket, "clients", ctl_path=nobody_ctl)}
        assert uids == {0, 65534}
        mine = ctl_json(d.socket, "clients", preexec=as_nobody, ctl_path=nobody_ctl)
        assert {r["uid"] for r in mine} == {65534}
        assert other.p.pid in {r["pid"] for r in mine}
        assert owner.p.pid not in {r["pid"] for r in mine}
    finally:
        other.close()
        owner.close()
        shutil.rmtree(bindir, ignore_errors=True)


# --- metrics ----------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text):
    """{(sample name, frozenset(labels)): value} as prometheus_client reads it."""
    out = {}
    for fam in prom_parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def test_metrics_move_when_tensors_are_created_and_attached(daemon_factory):
    port = free_port()
    # --metrics-per-uid: the endpoint shows the per-uid rows checked below.
    d = daemon_factory("--metrics", f"127.0.0.1:{port}", "--metrics-per-uid")
    before = parse(scrape(port))
    c = Client(d.socket)
    try:
        publish(c, "m/x")
        c.ok("attach m/x 0 again")
        c.err("attach m/none 0", "ENOENT")
        after = parse(scrape(port))
        cpu_pub = dict(device="cpu", backend="host", path="memfd", state="published")
        assert value(after, "tensord_device_tensors", **cpu_pub) == \
            value(before, "tensord_device_tensors", **cpu_pub) + 1
        for name, labels, delta in [
                ("tensord_requests_total", dict(request="attach"), 2),
                ("tensord_requests_total", dict(request="create"), 1),
                ("tensord_errors_total", dict(request="attach", code="ENOENT"), 1),
                ("tensord_attach_duration_seconds_count", {}, 1),
                ("tensord_attach_duration_seconds_bucket", dict(le="+Inf"), 1),
                ("tensord_leases", {}, 2),
                ("tensord_clients", {}, 1),
                ("tensord_uid_tensors", dict(uid=str(os.geteuid())), 1)]:
            assert value(after, name, **labels) == value(before, name, **labels) + delta, name
        assert value(after, "tensord_device_used_bytes", device="cpu", backend="host",
                     path="memfd") >= 64
        assert value(after, "tensord_uid_owned_bytes", uid=str(os.geteuid())) >= 64
        assert value(after, "tensord_attach_duration_seconds_sum") > 0

        # The same families, and the same state, through the socket.
        rc, out, err = ctl(d.socket, "stats", "--prometheus")
        assert rc == 0, err
        via_ctl = parse(out)
        assert {k[0] for k in via_ctl} == {k[0] for k in after}
        assert value(via_ctl, "tensord_device_tensors", **cpu_pub) == \
            value(after, "tensord_device_tensors", **cpu_pub)
        assert value(via_ctl, "tensord_leases") == value(after, "tensord_leases")
    finally:
        c.close()


def test_waiting_attach_is_counted_and_measured_from_its_wake(daemon_factory):
    port = free_port()
    d = daemon_factory("--metrics", f"127.0.0.1:{port}")
    waiter = Client(d.socket)
    maker = Client(d.socket)
    try:
        waiter.p.stdin.write("attach w/x 10000\n")
        waiter.p.stdin.flush()
        assert wait_until(lambda: value(parse(scrape(port)), "tensord_waiters") == 1)
        time.sleep(0.3)
        publish(maker, "w/x")
        assert waiter.p.stdout.readline().startswith("ok")
        s = parse(scrape(port))
        assert value(s, "tensord_attach_waits_total") == 1
        assert value(s, "tensord_attach_duration_seconds_count") == 1
        # The 0.3 s wait is not the daemon's time to serve it.
        assert value(s, "tensord_attach_duration_seconds_sum") < 0.25
    finally:
        maker.close()
        waiter.close()


def http_raw(connect, request, timeout=10):
    """Sends request bytes on a fresh connection; returns everything it answers."""
    s = connect()
    s.settimeout(timeout)
    try:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data
    finally:
        s.close()


def test_metrics_on_a_unix_socket(daemon_factory, tmp_path):
    path = str(tmp_path / "metrics.sock")
    d = daemon_factory("--metrics", "unix:" + path)

    def connect():
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        return s

    data = http_raw(connect, b"GET /metrics HTTP/1.0\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK"), head
    assert value(parse(body.decode()), "tensord_clients") == 0
    assert d.stop() == 0
    assert not os.path.exists(path), "the daemon removes its metrics socket"


def test_metrics_endpoint_answers_only_get_metrics_and_bounds_clients(daemon_factory):
    port = free_port()
    daemon_factory("--metrics", f"127.0.0.1:{port}")

    def connect():
        return socket.create_connection(("127.0.0.1", port))

    assert http_raw(connect, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 404")
    assert http_raw(connect, b"POST /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405")
    assert http_raw(connect, b"garbage\r\n\r\n").startswith(b"HTTP/1.0 400")
    assert http_raw(connect, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")
    big = b"GET /metrics HTTP/1.0\r\nX: " + b"a" * 8192 + b"\r\n\r\n"
    assert http_raw(connect, big).startswith(b"HTTP/1.0 431")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert e.value.code == 404

    # Idle connections of one peer (127.0.0.1) hold at most its share: each
    # past it closes the oldest, and a scrape still gets in and is answered.
    idle = [connect() for _ in range(16)]
    try:
        def closed(s):
            s.settimeout(5)
            try:
                return s.recv(100) == b""
            except OSError:  # a reset counts as closed too
                return True

        assert all(closed(s) for s in idle[:16 - 4]), "the oldest go first"
        assert http_raw(connect, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")
    finally:
        for s in idle:
            s.close()


def test_idle_metrics_connection_is_closed_after_its_deadline(daemon_factory):
    port = free_port()
    daemon_factory("--metrics", f"127.0.0.1:{port}")
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(20)
    t0 = time.monotonic()
    s.sendall(b"GET /metr")  # never finished
    assert s.recv(100) == b""
    assert time.monotonic() - t0 < 15
    s.close()


@pytest.mark.parametrize("addr", ["nonsense", "127.0.0.1:99999", "host.invalid:80",
                                  "unix:"])
def test_bad_metrics_address_is_refused_at_start(tmp_path, addr):
    r = subprocess.run([build_path("tensord"), "--socket", str(tmp_path / "s"),
                        "--metrics", addr], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "--metrics" in r.stderr and addr.split(":")[0] in r.stderr
    assert not os.path.exists(tmp_path / "s"), "the main socket is removed again"


def test_metrics_port_in_use_is_refused(daemon_factory, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([build_path("tensord"), "--socket", str(tmp_path / "s"),
                            "--metrics", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert str(port) in r.stderr and "address already in use" in r.stderr.lower()


# --- the wire, by hand ----------------------------------------------------------------

F_LEASE_LIST, F_CLIENT_LIST, F_METRICS = 20, 21, 22


def lease_page(raw, req_id, name=b"", after_conn=0, after_slot=0, limit=0, after_tensor=0):
    """One LeaseList page: (reply, [(tensor_id, conn_id, count)], more, cursor)."""
    body = (f_bytes(1, name) if name else b"") + f_varint(2, after_tensor) + \
        f_varint(3, after_conn) + f_varint(4, limit) + f_varint(5, after_slot)
    r = raw.call(request(req_id, F_LEASE_LIST, body))
    if r.status:
        return r, None, None, None
    b = r.body(F_LEASE_LIST) or {}
    holders = [decode(h) for h in b.get(1, [])]
    cursor = (b.get(3, [0])[0], b.get(4, [0])[0])
    return r, [(h[2][0], h[4][0], h[9][0]) for h in holders], bool(b.get(2, [0])[0]), cursor


def test_lease_list_pages_by_cursor_and_survives_odd_values(daemon, clients):
    a, b = clients(), clients()
    publish(a, "w/1")
    publish(a, "w/2")
    b.ok("attach w/1 0")
    b.ok("attach w/1 0 again")  # two leases of one connection: one entry, count 2
    raw = Raw(daemon.socket)
    raw.hello()
    r, whole, more, _ = lease_page(raw, 4)
    assert r.status == 0 and not more
    assert sorted(whole) == sorted(set(whole)) and len(whole) == 3, whole
    assert sum(n for _, _, n in whole) == 4
    # One entry a page, following the cursor: every entry once, then no more.
    seen, cursor, more = [], (0, 0), True
    while more:
        r, page, more, nxt = lease_page(raw, 5, after_conn=cursor[0], after_slot=cursor[1],
                                        limit=1)
        assert r.status == 0 and len(page) <= 1, r
        assert not more or nxt != cursor, "the cursor moves on"
        seen += page
        cursor = nxt
    assert sorted(seen) == sorted(whole)
    # Odd values are answered, not fatal: a cursor past the newest connection
    # starts from it, a slot past a connection's last goes on with the next.
    r, page, more, _ = lease_page(raw, 6, after_tensor=2**64 - 1, after_conn=2**64 - 1,
                                  limit=2**32 - 1)
    assert r.status == 0 and sorted(page) == sorted(whole) and not more
    b_conn = max(c for _, c, _ in whole)
    r, page, more, _ = lease_page(raw, 7, after_conn=b_conn, after_slot=2**32 - 1)
    assert r.status == 0 and not more
    assert sorted(page) == sorted(e for e in whole if e[1] != b_conn)
    r, _, _, _ = lease_page(raw, 8, name=b"x" * 300)
    assert r.status == -22 and "255" in r.message
    r, _, _, _ = lease_page(raw, 9, name=b"\xff\x00bad")
    assert r.status == -22
    assert raw.stats()
