#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_frame.c into tests/fuzz/corpus/.

Each file is a byte stream as a client (or, for rep_*, the daemon) would
send it: one or more frames `u32 len | u16 version | u16 flags | protobuf`,
little-endian. The protobuf is written by hand (field numbers from
proto/tensord.proto) so this needs no protobuf package. Rerun after a
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
