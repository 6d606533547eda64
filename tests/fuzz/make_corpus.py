#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_frame.c into tests/fuzz/corpus/:
every Request kind, every PeerFrame kind and the replies.

Each file is a byte stream as a client (or, for rep_*, the daemon) would
send it: one or more frames `u32 len | u16 version | u16 flags | protobuf`,
little-endian. The protobuf is written by hand (field numbers from
proto/tensord.proto and proto/peer.proto) so this needs no protobuf package. Rerun after a
schema change and commit the result:

    python3 tests/fuzz/make_corpus.py
"""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def fv(field, value):
    return varint(field << 3) + varint(value)


def fb(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def ff64(field, value):
    """A fixed64 field."""
    return varint(field << 3 | 1) + struct.pack("<Q", value)


def zigzag(n):
    return (n << 1) ^ (n >> 31)


def packed(field, values):
    return fb(field, b"".join(varint(v) for v in values))


def frame(payload, version=1, flags=0, length=None):
    return struct.pack("<IHH", len(payload) if length is None else length, version, flags) + payload


def req(req_id, field, body):
    return fv(1, req_id) + fb(field, body)


DT_F32 = fv(1, 2) + fv(2, 32) + fv(3, 1)
CPU = fv(1, 1)


def create(name, shape, strides=(), dtype=DT_F32, flags=0):
    body = fb(1, name) + fb(2, dtype) + packed(3, shape) + (packed(4, strides) if strides else b"")
    return body + fb(5, CPU) + (fv(6, flags) if flags else b"")


HELLO = frame(req(1, 2, fv(1, 1) + fb(2, "libtensord 0.1")))
info = (fb(1, "model/w") + fb(2, DT_F32) + packed(3, [2, 3]) + packed(4, [3, 1]) + fb(5, CPU)
        + fv(6, 24) + fv(8, 2) + fv(9, 1) + fv(10, 1000) + fv(12, 0o600) + fv(15, 7))

SEEDS = {
    "hello": HELLO,
    "create": HELLO + frame(req(2, 3, create("model/w", [2, 3]))),
    "create_strided": frame(req(3, 3, create("x", [4, 5], [10, 1], flags=1))),
    "create_scalar": frame(req(4, 3, fb(1, "s") + fb(2, DT_F32))),
    "create_zero_dim": frame(req(5, 3, create("z", [0, 1 << 40, 7]))),
    "create_huge": frame(req(6, 3, create("h", [1 << 31, 1 << 32]))),
    "create_subbyte": frame(req(7, 3, create("b4", [3, 3], dtype=fv(1, 1) + fv(2, 4) + fv(3, 1)))),
    "publish": frame(req(8, 4, fb(1, "model/w"))),
    "attach": frame(req(9, 5, fb(1, "model/w") + fv(2, (1 << 64) - 1) + fv(3, 7))),
    "release": frame(fb(6, fv(1, 0x1234567890))),
    "unlink": frame(req(10, 7, fb(1, "model/w"))),
    "stat": frame(req(11, 8, fb(1, "model/w"))),
    "list": frame(req(12, 9, fb(1, "model/"))),
    "stats": frame(req(13, 10, b"")),
    "put": HELLO + frame(req(15, 11, fb(1, create("small/w", [2, 3])) + fb(2, b"\0" * 24))),
    "put_short": frame(req(16, 11, fb(1, create("small/x", [4])) + fb(2, b"ab"))),
    "attach_shares": frame(req(17, 5, fb(1, "small/w") + fv(2, 0) + packed(4, [1, 2, 3]))),
    "pipelined": HELLO + b"".join(frame(req(20 + i, 10, b"")) for i in range(4)),
    # Versions, transactions, sets, waits, watches, reserves, binding pages.
    "put_replace": frame(req(30, 11, fb(1, create("small/w", [2]) + fv(20, 1)) + fb(2, b"\0" * 8))),
    "attach_after_bind": frame(req(31, 5, fb(1, "small/w") + fv(2, 100) + fv(5, 3) + fv(6, 1))),
    "tx_begin_commit": HELLO + frame(req(32, 3, create("t/a", [4]) + fv(21, 7)))
    + frame(req(33, 4, fb(1, "t/a"))) + frame(req(34, 7, fb(1, "t/old") + fv(2, 7)))
    + frame(req(35, 12, fv(1, 7))),
    "tx_abort": frame(req(36, 3, create("t/b", [1]) + fv(21, 9))) + frame(req(37, 13, fv(1, 9))),
    "attach_many_names": frame(req(38, 14, fb(1, "s/a") + fb(1, "s/b") + fv(4, 0)
                                   + packed(5, [4, 5]))),
    "attach_many_prefix": frame(req(39, 14, fb(2, "s/") + fv(3, 12) + fv(4, (1 << 64) - 1))),
    "cancel": frame(req(40, 5, fb(1, "w/x") + fv(2, (1 << 64) - 1)))
    + frame(req(41, 15, fv(1, 40))),
    "watch_replay": frame(req(42, 16, fb(1, "p/") + fv(2, 3) + fv(3, 0xFFFFFFFF) + fv(4, 1))),
    "unwatch": frame(req(43, 16, fb(1, "") + fv(4, 1))) + frame(req(44, 17, fv(1, 43))),
    "reserve": frame(req(45, 23, fv(1, 1 << 20))),
    "create_reserve": frame(req(46, 3, create("r/a", [1 << 18]) + fv(22, 1))),
    "unreserve": frame(fb(24, fv(1, 1))),
    "bind_page": frame(req(47, 25, b"")),
    "lease_list": frame(req(48, 20, fb(1, "small/w") + fv(3, 5) + fv(4, 2000) + fv(5, 3))),
    "client_list": frame(req(49, 21, fv(1, 2) + fv(2, 10))),
    "metrics": frame(req(50, 22, b"")),
    "list_peers": frame(req(51, 26, b"")),
    "stats_figures": frame(req(52, 10, fv(1, 1))),
    "list_after": frame(req(53, 9, fb(1, "model/") + fb(2, "model/a") + fv(3, 3))),
    "readopt": frame(req(54, 27, fb(1, fb(1, "small/w") + fv(2, 1))
                         + fb(1, fb(1, "model/w") + fv(2, (1 << 64) - 1)) + fb(1, b""))),
    "resolve": frame(req(55, 28, ff64(1, 0x1234) + fv(2, 7) + ff64(3, 0x5678))),
    # Peer frames (proto/peer.proto: PeerFrame), as another daemon sends them.
    "peer_hello": frame(fb(1, fv(1, 1) + fb(2, "node-a") + fv(3, 0x1234) + fb(4, b"n" * 32)
                          + fb(5, b"p" * 32))),
    "peer_proof": frame(fb(2, fb(1, b"p" * 32))),
    "peer_heartbeat": frame(fb(3, fv(1, 9))),
    "peer_ucx": frame(fb(4, fb(1, b"\x01" * 40))),
    "peer_pull": frame(fb(5, fv(1, 77) + fb(2, "model/w") + fv(3, 2) + fv(4, 3) + fv(5, 1))),
    "peer_pull_reply": frame(fb(6, fv(1, 77) + fv(2, 0) + fv(5, 4) + fv(6, 8) + fv(7, 2) + fv(8, 32)
                                + fv(9, 1) + packed(10, [2]) + packed(11, [1]) + fb(12, b"\0" * 8)
                                + fb(13, "s/a") + fv(20, 1) + fv(22, 2) + fv(23, 0))),
    "peer_pull_error": frame(fb(6, fv(1, 78) + fv(2, zigzag(-2)) + fb(3, "no such tensor")
                                + fv(21, 1))),
    "peer_pull_go": frame(fb(7, fv(1, 77))),
    "peer_pull_done": frame(fb(8, fv(1, 77))),
    "peer_changed": frame(fb(20, fb(1, "model/w") + fb(1, "s/a") + packed(2, [5, 6]))),
    "peer_unwatch": frame(fb(21, fb(1, "model/w"))),
    "peer_set_pull": frame(fb(9, fv(1, 100) + fb(2, "s/a") + fb(2, "s/b") + fb(3, ""))),
    "peer_set_pull_reply": frame(fb(10, fv(1, 100) + fv(4, 12) + fv(5, 2))),
    "peer_sync": frame(fb(22, fv(1, 3))),
    "peer_sync_reply": frame(fb(23, fv(1, 3))),
    "peer_name_list": frame(fb(24, fv(1, 5) + fb(2, "model/") + fb(3, "model/a") + fv(4, 256))),
    "peer_name_list_reply": frame(fb(25, fv(1, 5) + fv(2, 0)
                                     + fb(4, fb(1, "model/b") + fv(2, 4) + fv(3, 9) + fv(4, 64)
                                          + fv(5, 2) + fv(6, 32) + fv(7, 1))
                                     + fv(5, 1) + fb(6, "model/b"))),
    # Replies of the newer kinds.
    "rep_published": frame(fv(1, 8) + fb(9, fv(1, 2) + fv(2, 17))),
    "rep_commit": frame(fv(1, 35) + fb(10, fv(1, 18) + fv(2, 1) + fv(3, 1))),
    "rep_attach_many": frame(fv(1, 38) + fb(11, fv(1, 18) + fb(2, fv(1, 5) + fb(2, info) + fv(3, 1)
                                                         + fv(10, 1)) + fv(3, 0)), flags=1),
    "rep_events": frame(fv(1, 42) + fb(12, fb(1, fv(1, 0) + fb(2, "p/a") + fv(3, 1) + fv(4, 2))
                                     + fb(1, fv(1, 2)))),
    "rep_reserve": frame(fv(1, 45) + fb(23, fv(1, 1) + fv(2, 1 << 20)), flags=1),
    "rep_bind_page": frame(fv(1, 47) + fb(25, fv(1, 512)), flags=1),
    # Edge cases for the parser and the decoders.
    "empty_frame": frame(b""),
    "unknown_field": frame(fv(1, 5) + fv(50, 1) + fb(51, b"abc")),
    "bad_name": frame(req(14, 8, fb(1, b"a\xff'\\b"))),
    "truncated": HELLO[:-3],
    "oversize_header": frame(b"", length=0xFFFFFFFF),
    "max_header": frame(b"", length=65536),
    "bad_version": frame(req(1, 10, b""), version=2),
    # Replies, for the Reply decoder.
    "rep_hello": frame(fv(1, 1) + fb(4, fv(1, 1) + fv(2, 4242) + fv(3, 65536))),
    "rep_error": frame(fv(1, 2) + fv(2, zigzag(-71)) + fb(3, "the first request must be hello")),
    "rep_lease": frame(fv(1, 2) + fb(5, fv(1, 99) + fb(2, info) + fv(3, 1) + fv(4, 4096) + fv(7, 1)),
                       flags=1),
    "rep_lease_slab": frame(fv(1, 3) + fb(5, fv(1, 98) + fb(2, info) + fv(3, 1) + fv(4, 24)
                                          + fv(6, 4096 + 256) + fv(9, 2))),
}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} files in {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
