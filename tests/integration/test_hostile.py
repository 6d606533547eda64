"""Hostile clients against a real tensord (CONTRACT.md section 6).

Every case talks to the daemon over a raw AF_UNIX socket with frames built
by hand, so nothing in libtensord can smooth over what the daemon sees. After
each case the daemon must still serve a well-behaved client (hello + stats
round trip) and its open descriptors must return to their baseline. The
fixture then checks that it exits 0 on SIGTERM and logged no sanitizer
report.

Only the few protobuf fields the tests need are encoded here, by hand: a
varint/length-delimited writer and a generic reader. No protobuf package.
"""
import errno
import os
import random
import resource
import socket
import struct
import time

import pytest

from conftest import wait_until

VERSION = 1
MAX_REQUEST = 65536

# Request body field numbers (proto/tensord.proto).
F_HELLO, F_CREATE, F_ATTACH, F_RELEASE, F_STAT, F_LIST, F_STATS = 2, 3, 5, 6, 8, 9, 10
# Reply body field numbers.
R_HELLO, R_STATS = 4, 8

IO_TIMEOUT = 5.0


# --- a tiny protobuf encoder/decoder ------------------------------------------

def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, value):
    return varint(field << 3 | 0) + varint(value)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def request(req_id, body_field=None, body=b""):
    out = f_varint(1, req_id) if req_id else b""
    if body_field is not None:
        out += f_bytes(body_field, body)
    return out


def hello_req(req_id=1, version=VERSION):
    return request(req_id, F_HELLO, f_varint(1, version) + f_bytes(2, "test_hostile"))


def stats_req(req_id):
    return request(req_id, F_STATS, b"")


def frame(payload, version=VERSION, flags=0, length=None):
    if length is None:
        length = len(payload)
    return struct.pack("<IHH", length, version, flags) + payload


def read_varint(buf, i):
    shift = n = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def decode(buf):
    """field number -> list of values (int for varints, bytes otherwise)."""
    fields = {}
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v = bytes(buf[i:i + n])
            if len(v) != n:
                raise ValueError("truncated field")
            i += n
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
        fields.setdefault(field, []).append(v)
    return fields


class Reply:
    def __init__(self, flags, payload):
        self.flags = flags
        self.fields = decode(payload)
        self.id = self.fields.get(1, [0])[0]
        z = self.fields.get(2, [0])[0]
        self.status = (z >> 1) ^ -(z & 1)  # sint32 is zigzag encoded
        self.message = self.fields.get(3, [b""])[0].decode(errors="replace")

    def body(self, field):
        v = self.fields.get(field)
        return decode(v[0]) if v else None

    def __repr__(self):
        return f"Reply(id={self.id}, status={self.status}, message={self.message!r})"


# --- a raw client ---------------------------------------------------------------

class Raw:
    def __init__(self, path, timeout=IO_TIMEOUT):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def send(self, data):
        self.sock.sendall(data)

    def send_quiet(self, data):
        """Sends what the daemon takes; it may close on us half way."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def reply(self):
        length, version, flags = struct.unpack("<IHH", self.recv_exact(8))
        assert version == VERSION, version
        assert length <= 256 << 20, length
        return Reply(flags, self.recv_exact(length))

    def call(self, payload):
        self.send(frame(payload))
        return self.reply()

    def hello(self):
        r = self.call(hello_req(1))
        assert r.status == 0 and r.id == 1, r
        hb = r.body(R_HELLO)
        assert hb and hb[1][0] == VERSION and hb[3][0] == MAX_REQUEST, hb
        return r

    def stats(self, req_id=7):
        r = self.call(stats_req(req_id))
        assert r.status == 0 and r.id == req_id, r
        sb = r.body(R_STATS)
        assert sb is not None, r
        return sb

    def expect_closed(self):
        """Reads (and drops) until the daemon closes; fails if it never does."""
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except socket.timeout:
            pytest.fail("daemon did not close the connection")

    def expect_error_and_close(self, status):
        try:
            r = self.reply()
        except (ConnectionResetError, EOFError) as e:
            pytest.fail(f"connection closed without a reply: {e}")
        assert r.status == status, (r, status)
        assert r.message, r
        self.expect_closed()
        return r

    def close(self):
        self.sock.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def serve_check(d):
    """A well-behaved client gets a hello and a stats reply."""
    c = Raw(d.socket)
    try:
        c.hello()
        return c.stats()
    finally:
        c.close()


def settle_fds(d, baseline, timeout=10.0):
    n = wait_until(lambda: d.fd_count() == baseline, timeout=timeout)
    assert n, f"daemon holds {d.fd_count()} fds, baseline {baseline}:\n{d.read_log()[-3000:]}"


def healthy(d, baseline):
    assert d.alive(), d.read_log()[-3000:]
    settle_fds(d, baseline)
    serve_check(d)
    settle_fds(d, baseline)
    assert d.alive()


@pytest.fixture
def hd(daemon_factory):
    """A fresh daemon and its steady-state fd count."""
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs a daemon this test starts (fd and RSS accounting)")
    d = daemon_factory()
    serve_check(d)
    time.sleep(0.05)
    d.baseline = d.fd_count()
    return d


# --- the cases ----------------------------------------------------------------------

@pytest.mark.parametrize("after_hello", [False, True])
def test_random_bytes(hd, after_hello):
    lengths = (1, 7, 8, 9, 100, 4095, 65544, 200000)
    for seed in range(6):
        rnd = random.Random(seed)
        for n in lengths:
            data = rnd.randbytes(n)
            c = Raw(hd.socket)
            if after_hello:
                c.hello()
            c.send_quiet(data)
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            c.expect_closed()
            c.close()
        # Random protobuf inside valid framing: exercises the decoder and
        # the dispatcher rather than the frame parser.
        c = Raw(hd.socket)
        if after_hello:
            c.hello()
        for _ in range(50):
            c.send_quiet(frame(rnd.randbytes(rnd.randrange(0, 300))))
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        c.expect_closed()
        c.close()
        assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, hd.baseline)


@pytest.mark.parametrize("after_hello", [False, True])
def test_frame_announcing_4gib(hd, after_hello):
    before = rss_kib(hd.pid)
    c = Raw(hd.socket)
    if after_hello:
        c.hello()
    # The header alone, then a little of the "payload": the daemon must
    # decide from the header and never try to buffer 4 GiB.
    c.send(frame(b"", length=0xFFFFFFFF))
    c.send_quiet(b"\0" * 65536)
    r = c.expect_error_and_close(-errno.EMSGSIZE)
    assert r.id == 0
    c.close()
    after = rss_kib(hd.pid)
    print(f"4 GiB frame: VmRSS {before} KiB -> {after} KiB")
    assert after - before < 8 * 1024, (before, after)
    # Just over the limit is refused the same way; exactly at it is not.
    c = Raw(hd.socket)
    c.hello()
    c.send(frame(b"", length=MAX_REQUEST + 1))
    c.expect_error_and_close(-errno.EMSGSIZE)
    c.close()
    c = Raw(hd.socket)
    c.hello()
    # A frame of exactly MAX_REQUEST bytes: a stats request padded with an
    # unknown field, which the decoder skips.
    head = stats_req(5)
    body = head + f_bytes(99, b"x" * (MAX_REQUEST - len(head) - 5))
    assert len(body) == MAX_REQUEST
    r = c.call(body)
    assert r.status == 0 and r.id == 5, r
    c.stats()
    c.close()
    healthy(hd, hd.baseline)


def test_truncated_frames(hd):
    stats = frame(stats_req(3))
    cases = [
        b"\x05\x00",                                 # half a header
        frame(b"", length=100),                      # header only
        frame(b"\x08\x01" * 10, length=40),          # half a payload
        stats[: len(stats) - 1],                     # all but one byte
        frame(b"", length=MAX_REQUEST) + b"x" * 30000,  # half a maximal frame
    ]
    for after_hello in (False, True):
        for data in cases:
            c = Raw(hd.socket)
            if after_hello:
                c.hello()
            c.send(data)
            time.sleep(0.01)
            c.close()
    # Same, but the client keeps its end open after shutting down writes.
    for data in cases:
        c = Raw(hd.socket)
        c.hello()
        c.send(data)
        c.sock.shutdown(socket.SHUT_WR)
        c.expect_closed()
        c.close()
    healthy(hd, hd.baseline)


def test_garbage_protobuf_keeps_connection(hd):
    c = Raw(hd.socket)
    c.hello()
    garbage = [
        b"\x80",                       # unterminated varint key
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # varint too long
        b"\x12\x10\x08",               # hello: length 16, 1 byte present
        b"\x0a\x03abc",                # id (uint64) sent as a string
        b"\x12\x05\x08\x01",           # submessage overruns the frame
        b"\x52\x02\x0f\x0f",           # stats with a wire type 7 field inside
        b"\x07",                       # wire type 7 at top level
        b"\x1a\x04\x0a\x02\xff\xfe",   # create; field 1 (name) - accepted or rejected
    ]
    for i, g in enumerate(garbage):
        r = c.call(g)
        if i == len(garbage) - 1:
            assert r.status < 0, r      # invalid UTF-8 name: EBADMSG or EINVAL
        else:
            assert r.status == -errno.EBADMSG, (g, r)
            assert r.id == 0
        # The framing was intact: the same connection goes on.
        c.stats(100 + i)
    c.close()
    healthy(hd, hd.baseline)


def test_unknown_request_types(hd):
    c = Raw(hd.socket)
    c.hello()
    cases = [
        (11, f_varint(1, 11) + f_varint(50, 1)),          # unknown field 50 only
        (12, f_varint(1, 12) + f_bytes(50, b"hello")),    # unknown, length-delimited
        (13, f_varint(1, 13)),                            # oneof not set
        (0, b""),                                         # empty request
        (14, f_varint(1, 14) + f_bytes(15, b"")),         # body field past the oneof
    ]
    for req_id, payload in cases:
        r = c.call(payload)
        assert r.status < 0, (payload, r)
        assert r.status == -errno.EBADMSG, (payload, r)
        assert r.id == req_id, (payload, r)
        c.stats(200 + req_id)
    c.close()
    healthy(hd, hd.baseline)


@pytest.mark.parametrize("version", [0, 2, 0x100, 0xFFFF])
def test_wrong_frame_version(hd, version):
    for after_hello in (False, True):
        c = Raw(hd.socket)
        if after_hello:
            c.hello()
        c.send(frame(stats_req(9), version=version))
        c.expect_error_and_close(-errno.EPROTO)
        c.close()
    healthy(hd, hd.baseline)


@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_hello_wrong_version(hd, version):
    c = Raw(hd.socket)
    c.send(frame(hello_req(4, version=version)))
    r = c.expect_error_and_close(-errno.EPROTO)
    assert r.id == 4
    c.close()
    # A second hello with a bad version on a live connection closes it too.
    c = Raw(hd.socket)
    c.hello()
    c.send(frame(hello_req(5, version=version)))
    c.expect_error_and_close(-errno.EPROTO)
    c.close()
    healthy(hd, hd.baseline)


@pytest.mark.parametrize("body", [
    stats_req(3),
    request(3, F_STAT, f_bytes(1, "x")),
    request(3, F_LIST, b""),
    request(3, F_ATTACH, f_bytes(1, "x")),
    request(3),
], ids=["stats", "stat", "list", "attach", "empty"])
def test_request_before_hello(hd, body):
    c = Raw(hd.socket)
    # A pipelined hello after the bad request must not be served.
    c.send(frame(body) + frame(hello_req(4)))
    r = c.expect_error_and_close(-errno.EPROTO)
    assert r.id in (0, 3)
    c.close()
    healthy(hd, hd.baseline)


def test_unexpected_fds(hd, tmp_path):
    path = tmp_path / "some_file"
    path.write_bytes(b"x" * 100)
    files = [open(path, "rb") for _ in range(20)]
    fds = [f.fileno() for f in files]
    r, w = os.pipe()
    try:
        cases = [
            (False, b"\0", fds[:1]),                      # one fd, one junk byte
            (False, frame(hello_req(1)), fds[:1]),        # one fd with a valid hello
            (False, frame(hello_req(1)), fds[:3]),        # three fds with a valid hello
            (True, frame(stats_req(2)), fds[:1]),         # after hello, with a stats
            (True, frame(stats_req(2)), [r, w]),          # a pipe: both ends
            (True, frame(stats_req(2)), fds[:20]),        # more than the daemon's cmsg room
            (True, b"\x01", [c for c in fds[:2]]),        # mid-frame junk with fds
        ]
        for after_hello, data, send in cases:
            c = Raw(hd.socket)
            if after_hello:
                c.hello()
            socket.send_fds(c.sock, [data], send)
            try:
                rep = c.reply()
                assert rep.status == -errno.EPROTO, rep
            except (EOFError, ConnectionResetError):
                pass
            c.expect_closed()
            c.close()
            settle_fds(hd, hd.baseline)
        # fds on a later message of an otherwise good connection
        c = Raw(hd.socket)
        c.hello()
        c.stats()
        socket.send_fds(c.sock, [frame(stats_req(8))], fds[:3])
        try:
            rep = c.reply()
            assert rep.status == -errno.EPROTO, rep
        except (EOFError, ConnectionResetError):
            pass
        c.expect_closed()
        c.close()
    finally:
        for f in files:
            f.close()
        os.close(r)
        os.close(w)
    # The daemon closed every descriptor it was handed.
    healthy(hd, hd.baseline)


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
    d = daemon_factory("--max-clients", "4")
    serve_check(d)
    time.sleep(0.05)
    baseline = d.fd_count()
    four = [Raw(d.socket) for _ in range(4)]
    for c in four:
        c.hello()
    fifth = Raw(d.socket)          # connect() succeeds: the kernel queued it
    try:
        fifth.send(frame(hello_req(1)))
        fifth.reply()
        pytest.fail("a fifth client was served")
    except (EOFError, ConnectionResetError, BrokenPipeError):
        pass
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


def create_req(req_id, name, shape, strides=(), code=2, bits=32, lanes=1):
    packed = lambda vals: b"".join(varint(v) for v in vals)
    body = f_bytes(1, name) + f_bytes(2, f_varint(1, code) + f_varint(2, bits) + f_varint(3, lanes))
    body += f_bytes(3, packed(shape))
    if strides:
        body += f_bytes(4, packed(strides))
    return request(req_id, F_CREATE, body)


@pytest.mark.parametrize("shape,strides,dtype", [
    ([1 << 31, 1 << 32], (), (2, 32, 1)),          # numel 2^63: int64 stride product overflows
    ([0, 1 << 62, 1 << 62], (), (2, 32, 1)),       # zero elements, strides unrepresentable
    ([1 << 62, 1 << 62], (), (2, 32, 1)),          # numel overflows 64 bits
    ([(1 << 64) - 1], (), (2, 32, 1)),             # extent -1
    ([1 << 63], (), (2, 32, 1)),                   # extent INT64_MIN
    ([3, 3], [(1 << 63) - 1, 1], (2, 32, 1)),      # stride sum overflows
    ([3, 3], [(1 << 64) - 1, 1], (2, 32, 1)),      # negative stride
    ([2] * 33, (), (2, 32, 1)),                    # too many dimensions
    ([2, 2], [1], (2, 32, 1)),                     # strides/shape count mismatch
    ([2], (), (2, 0, 1)),                          # zero bits
    ([2], (), (2, 1 << 20, 1)),                    # bits out of range
    ([2], (), (2, 255, 65535)),                    # odd sizes: accepted or refused
], ids=["numel2^63", "zero-huge", "numel-ovf", "neg-extent", "min-extent", "stride-ovf",
        "neg-stride", "33-dims", "stride-count", "zero-bits", "big-bits", "odd-dtype"])
def test_hostile_create_layout(hd, shape, strides, dtype):
    c = Raw(hd.socket)
    c.hello()
    r = c.call(create_req(21, f"hostile/{len(shape)}", shape, strides, *dtype))
    assert r.id == 21, r
    if dtype != (2, 255, 65535):
        assert r.status in (-errno.EINVAL, -errno.EFBIG), r
    c.stats()
    c.close()
    assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, hd.baseline)


def reply_with_fds(c):
    """Reads one reply, closing any descriptor that came with it."""
    fds, buf, need = [], bytearray(), 8
    while len(buf) < need:
        data, anc, _, _ = c.sock.recvmsg(need - len(buf), socket.CMSG_SPACE(4 * 4))
        for level, kind, d in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(d) // 4}i", d[: len(d) - len(d) % 4])
        if not data:
            raise EOFError
        buf += data
        if len(buf) == 8 and need == 8:
            need += struct.unpack_from("<I", buf)[0]
    for fd in fds:
        os.close(fd)
    return Reply(struct.unpack_from("<HH", buf, 4)[1], bytes(buf[8:]))


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
