"""Hostile clients against a real tensord: hundreds of idle connections,
floods without reading, stalls mid-frame, the client limit, and parked
requests woken by a publish. After each the daemon serves a well-behaved
client and its descriptors return to their baseline (hostile.py)."""
import errno
import os
import resource
import struct
import time

import pytest

from conftest import wait_until
from hostile import hd  # noqa: F401 (the fixture)
from hostile import (
    f_varint, f_bytes, request, hello_req, stats_req, frame, Reply, Raw, rss_kib,
    serve_check, settle_fds, healthy, create_req, reply_with_fds, MAX_REQUEST, F_ATTACH,
    F_LIST, IO_TIMEOUT,
)


def test_hundreds_of_idle_connections(hd):
    n = 500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 200
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    # The daemon inherited the limit it was started with.
    with open(f"/proc/{hd.pid}/limits") as f:
        lim = next(int(l.split()[3]) for l in f if l.startswith("Max open files"))
    if lim < n + 50:
        pytest.skip(f"daemon RLIMIT_NOFILE {lim}")
    conns = []
    try:
        for i in range(n):
            c = Raw(hd.socket)
            if i % 2:
                c.send(frame(hello_req(1)))   # half said hello, never read the reply
            conns.append(c)
        assert wait_until(lambda: hd.fd_count() >= hd.baseline + n, timeout=10), \
            (hd.fd_count(), hd.baseline)
        sb = serve_check(hd)
        assert sb[2][0] == n + 1, sb          # StatsReply.clients
        for c in conns[:5]:                   # the idle ones still work too
            if conns.index(c) % 2:
                assert c.reply().status == 0
            else:
                c.hello()
            c.stats()
    finally:
        for c in conns:
            c.close()
    healthy(hd, hd.baseline)
    assert serve_check(hd)[2][0] == 1


def test_flood_without_reading(hd):
    before = rss_kib(hd.pid)
    c = Raw(hd.socket)
    c.hello()
    c.sock.setblocking(False)
    chunk = b"".join(frame(stats_req(1000 + i)) for i in range(2000))  # ~28 KiB
    sent = 0
    stuck_since = None
    end = time.monotonic() + 8
    while time.monotonic() < end and sent < 16 << 20:
        try:
            n = c.sock.send(chunk)
            sent += n
            stuck_since = None
            if n < len(chunk):
                # Finish this chunk later: keep the stream frame-aligned.
                rest = chunk[n:]
                while rest and time.monotonic() < end:
                    try:
                        k = c.sock.send(rest)
                        rest = rest[k:]
                        sent += k
                    except BlockingIOError:
                        time.sleep(0.005)
                if rest:
                    break
        except BlockingIOError:
            if stuck_since is None:
                stuck_since = time.monotonic()
            elif time.monotonic() - stuck_since > 1.0:
                break   # the daemon stopped reading us: backpressure works
            time.sleep(0.01)
    peak = rss_kib(hd.pid)
    print(f"flood: sent {sent} bytes of stats requests; VmRSS {before} -> {peak} KiB")
    assert sent > 100 * 1024, sent
    assert peak - before < 64 * 1024, (before, peak)
    # Others are served while the flooder sits there.
    t0 = time.monotonic()
    sb = serve_check(hd)
    assert time.monotonic() - t0 < 2.0
    assert sb[2][0] == 2, sb
    # The flooder's replies are all there, in order, once it reads.
    c.sock.setblocking(True)
    c.sock.settimeout(IO_TIMEOUT)
    for i in range(200):
        r = c.reply()
        assert r.status == 0 and r.id == 1000 + i % 2000, r
    c.close()
    healthy(hd, hd.baseline)
    assert serve_check(hd)[2][0] == 1
    after = rss_kib(hd.pid)
    print(f"flood: VmRSS after close {after} KiB")
    assert after - before < 64 * 1024


def test_stall_mid_frame(hd):
    a = Raw(hd.socket)
    a.hello()
    req = frame(stats_req(42))
    a.send(req[:5])                 # half a header
    b = Raw(hd.socket)
    t0 = time.monotonic()
    b.hello()
    b.stats()
    a.send(req[5:9])                # header done, payload begun
    b.stats(8)
    assert time.monotonic() - t0 < 1.0
    time.sleep(0.2)
    a.send(req[9:])                 # the stalled client finishes its frame
    r = a.reply()
    assert r.status == 0 and r.id == 42, r
    # One byte at a time works too.
    for byte in frame(stats_req(43)):
        a.send(bytes([byte]))
        time.sleep(0.001)
    assert a.reply().id == 43
    # A half frame left hanging forever does not hold the others back.
    a.send(frame(b"", length=1000) + b"z" * 500)
    for i in range(20):
        b.stats(300 + i)
    a.close()
    b.close()
    healthy(hd, hd.baseline)


def test_max_clients(daemon_factory):
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs its own daemon")
    d = daemon_factory("--max-clients", "4", "--max-clients-per-uid", "4")
    serve_check(d)
    time.sleep(0.05)
    baseline = d.fd_count()
    four = [Raw(d.socket) for _ in range(4)]
    for c in four:
        c.hello()
    fifth = Raw(d.socket)          # connect() succeeds: the kernel queued it
    # It is told why (an id-0 error naming the limit), then closed; never served.
    r = fifth.reply()
    assert r.id == 0 and r.status == -errno.EAGAIN and "--max-clients" in r.message, r
    fifth.expect_closed()
    fifth.close()
    for i, c in enumerate(four):
        sb = c.stats(50 + i)
        assert sb[2][0] == 4, sb
    # A slot freed is a slot reused.
    four.pop().close()
    settle_fds(d, baseline + 3)
    c = Raw(d.socket)
    c.hello()
    c.stats()
    four.append(c)
    for c in four:
        c.close()
    settle_fds(d, baseline)
    serve_check(d)
    settle_fds(d, baseline)
    assert d.alive()


def test_parked_frames_survive_a_waking_publish(hd):
    """A client whose requests are parked by backpressure must not be closed
    with "input buffer full" when a publish elsewhere answers its waiting
    attach: that reply lowers the queue and re-arms reading before the parked
    frames are processed (conn.c conn_read, its "cannot happen" branch)."""
    s = Raw(hd.socket)
    s.hello()
    for i in range(1000):  # 1000 named tensors: each List reply is ~60 KiB
        s.send(frame(create_req(1, f"p/{i:05d}", [1])))
        assert reply_with_fds(s).status == 0
        assert s.call(request(2, 4, f_bytes(1, f"p/{i:05d}"))).status == 0
    a = Raw(hd.socket)
    a.hello()
    head = stats_req(5)  # one maximal frame grows the input buffer to its cap
    assert a.call(head + f_bytes(99, b"x" * (MAX_REQUEST - len(head) - 5))).status == 0
    a.send(frame(request(6, F_ATTACH, f_bytes(1, "w") + f_varint(2, (1 << 64) - 1))))
    a.sock.setblocking(False)
    lst = frame(request(7, F_LIST, f_bytes(1, "p/"))) * 64
    stuck, end = None, time.monotonic() + 10
    while time.monotonic() < end:
        try:
            a.sock.send(lst)
            stuck = None
        except BlockingIOError:
            stuck = stuck or time.monotonic()
            if time.monotonic() - stuck > 0.5:
                break
            time.sleep(0.01)
    a.sock.settimeout(IO_TIMEOUT)
    a.reply()  # ~60 KiB: room for a direct send, too little for EPOLLOUT
    s.send(frame(create_req(3, "w", [1])))
    assert reply_with_fds(s).status == 0
    assert s.call(request(4, 4, f_bytes(1, "w"))).status == 0
    time.sleep(0.2)
    buf = bytearray()
    seen_lease, after = False, 0
    while after < 20:
        while len(buf) < 8 or len(buf) < 8 + struct.unpack_from("<I", buf)[0]:
            chunk = a.sock.recv(1 << 20)
            assert chunk, "daemon closed the waiting client"
            buf += chunk
        ln, _, fl = struct.unpack_from("<IHH", buf)
        r = Reply(fl, bytes(buf[8:8 + ln]))
        del buf[:8 + ln]
        assert r.status == 0, r
        seen_lease = seen_lease or r.id == 6
        after += seen_lease and r.id == 7
    a.close()
    s.close()
    assert hd.alive()
    serve_check(hd)
