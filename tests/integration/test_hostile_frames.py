"""Hostile input against a real tensord: random bytes, oversized and
truncated frames, garbage protobuf, unknown requests, wrong versions,
requests before hello, descriptors sent to the daemon or counted in a
frame's header, and shapes built to overflow. After each the daemon serves a well-behaved client and its
descriptors return to their baseline (hostile.py)."""
import errno
import os
import random
import socket
import time

import pytest

from hostile import hd  # noqa: F401 (the fixture)
from hostile import (
    f_varint, f_bytes, F_UNLINK, request, hello_req, stats_req, frame, Raw, rss_kib,
    settle_fds, healthy, create_req, create_body, put_req, MAX_REQUEST, F_ATTACH, F_STAT, F_LIST,
    fd_flags,
)


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
        (14, f_varint(1, 14) + f_bytes(19, b"")),         # a body field no request has
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


@pytest.mark.parametrize("after_hello", [False, True])
@pytest.mark.parametrize("flags,fds", [
    (fd_flags(1), 0),          # counts one, none attached
    (fd_flags(1), 1),          # counts one, one attached
    (fd_flags(3), 3),          # counts three, three attached
    (fd_flags(256), 0),        # the most a header can count
    (0x0100, 0),               # more beyond the first, with no first
], ids=["one-none", "one-one", "three-three", "256", "extra-only"])
def test_frames_counting_fds(hd, tmp_path, after_hello, flags, fds):
    """A request whose header counts descriptors is refused from the header
    (tensord accepts none), whatever came with it; each one that came is
    closed."""
    path = tmp_path / "some_file"
    path.write_bytes(b"x")
    files = [open(path, "rb") for _ in range(fds)]
    try:
        c = Raw(hd.socket)
        if after_hello:
            c.hello()
        data = frame(stats_req(2), flags=flags)
        if fds:
            socket.send_fds(c.sock, [data], [f.fileno() for f in files])
        else:
            c.send(data)
        r = c.expect_error_and_close(-errno.EPROTO)
        assert "descriptors" in r.message, r
        c.close()
    finally:
        for f in files:
            f.close()
    healthy(hd, hd.baseline)


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


@pytest.mark.parametrize("create,data,status", [
    (create_body("put/short", [16], code=1, bits=8), b"x" * 15, -errno.EINVAL),
    (create_body("put/long", [16], code=1, bits=8), b"x" * 17, -errno.EINVAL),
    (None, b"x" * 16, -errno.EINVAL),
    (create_body("put/strided", [4, 4], [8, 1], code=1, bits=8), b"x" * 16, -errno.EINVAL),
    (create_body("put/cuda", [16], code=1, bits=8, device=(2, 0)), b"x" * 16, -errno.EINVAL),
    (create_body("put/bad name", [16], code=1, bits=8), b"x" * 16, -errno.EINVAL),
    (create_body("put/huge", [1 << 40], code=1, bits=8), b"x" * 16, -errno.ENOSPC),
    (create_body("put/ok", [16], code=1, bits=8), b"x" * 16, 0),
    (create_body("put/mutable", [16], code=1, bits=8, flags=1), b"x" * 16, 0),
], ids=["short", "long", "no-create", "strided", "cuda", "bad-name", "huge", "ok", "mutable"])
def test_hostile_put(hd, create, data, status):
    """Put with inline bytes: every malformed one is refused with a status and
    leaves nothing behind; a good one is stored and can be removed again."""
    c = Raw(hd.socket)
    c.hello()
    r = c.call(put_req(31, create, data))
    assert r.id == 31 and r.status == status, r
    if status == 0:
        name = "put/ok" if b"put/ok" in create else "put/mutable"
        assert c.call(request(32, F_UNLINK, f_bytes(1, name))).status == 0
    assert c.stats().get(1, [0])[0] == 0, "no tensor was left behind"
    c.close()
    assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, hd.baseline)


@pytest.mark.parametrize("name", [b"a b", b"tab\there", b"\x1b[31m", b"x" * 64, b"caf\xc3\xa9"],
                         ids=["space", "tab", "escape", "64-bytes", "utf8"])
def test_hello_bad_client_name(hd, name):
    """A Hello naming the connection (field 3) with a label that is not 1 to
    63 bytes of printable ASCII without spaces fails with EINVAL and a
    reason, and the connection ends; a good one is kept (issue 34)."""
    c = Raw(hd.socket)
    c.send(frame(request(4, 2, f_varint(1, 1) + f_bytes(2, "t") + f_bytes(3, name))))
    r = c.expect_error_and_close(-errno.EINVAL)
    assert r.id == 4 and "client name" in r.message, r
    c.close()
    c = Raw(hd.socket)
    r = c.call(request(4, 2, f_varint(1, 1) + f_bytes(2, "t") + f_bytes(3, "x" * 63)))
    assert r.status == 0, r
    c.close()
    healthy(hd, hd.baseline)
