"""What the hostile-client tests share (test_hostile_frames.py,
test_hostile_clients.py): a raw client, frames built by hand, and the
checks that a daemon survived (CONTRACT.md section 6).

Every case talks to the daemon over a raw AF_UNIX socket with frames built
by hand, so nothing in libtensord can smooth over what the daemon sees. After
each case the daemon must still serve a well-behaved client (hello + stats
round trip) and its open descriptors must return to their baseline. The
fixture then checks that it exits 0 on SIGTERM and logged no sanitizer
report.

Only the few protobuf fields the tests need are encoded here, by hand: a
varint/length-delimited writer and a generic reader. No protobuf package.
"""
import os
import socket
import struct
import time

import pytest

from conftest import wait_until

VERSION = 1
MAX_REQUEST = 128 * 1024

# Request body field numbers (proto/tensord.proto).
F_HELLO, F_CREATE, F_ATTACH, F_RELEASE, F_UNLINK, F_STAT, F_LIST, F_STATS, F_PUT = \
    2, 3, 5, 6, 7, 8, 9, 10, 11
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


def fd_flags(n_fds):
    """Frame flags that count n_fds descriptors (proto/frame.h): bit 0 for
    some, bits 8-15 for how many beyond the first."""
    return 1 | (n_fds - 1) << 8 if n_fds else 0


def n_fds_of(flags):
    """The descriptor count of frame flags; None when they hold none validly."""
    if flags & 1:
        return 1 + (flags >> 8)
    return None if flags >> 8 else 0


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


def create_body(name, shape, strides=(), code=2, bits=32, lanes=1, device=None, flags=0):
    """A Create message: the body of a create request, and the description in a put."""
    packed = lambda vals: b"".join(varint(v) for v in vals)
    body = f_bytes(1, name) + f_bytes(2, f_varint(1, code) + f_varint(2, bits) + f_varint(3, lanes))
    body += f_bytes(3, packed(shape))
    if strides:
        body += f_bytes(4, packed(strides))
    if device:
        body += f_bytes(5, f_varint(1, device[0]) + f_varint(2, device[1]))
    if flags:
        body += f_varint(6, flags)
    return body


def create_req(req_id, name, shape, strides=(), code=2, bits=32, lanes=1):
    return request(req_id, F_CREATE, create_body(name, shape, strides, code, bits, lanes))


def put_req(req_id, create, data):
    """A Put: the Create message (or None) and the tensor's bytes inline."""
    return request(req_id, F_PUT, (f_bytes(1, create) if create is not None else b"")
                   + f_bytes(2, data))


def reply_with_fds(c, keep=None):
    """Reads one reply, closing any descriptor that came with it (or, with
    keep a list, appending it there for the caller to close)."""
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
    if keep is not None:
        keep += fds
    else:
        for fd in fds:
            os.close(fd)
    return Reply(struct.unpack_from("<HH", buf, 4)[1], bytes(buf[8:]))
