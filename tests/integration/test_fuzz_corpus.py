"""The libFuzzer target's seed corpus (tests/fuzz/corpus, written by
tests/fuzz/make_corpus.py) keeps up with the schemas: it holds a frame of
every Request kind and every PeerFrame kind that proto/tensord.proto and
proto/peer.proto define, and it is what make_corpus.py writes now. A new
request added to the schema without a seed fails here."""
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def oneof_fields(proto, message):
    """The field numbers of `message`'s oneof body in the .proto file."""
    text = open(os.path.join(ROOT, "proto", proto)).read()
    m = re.search(r"\nmessage " + message + r" \{(.*?)\n\}", text, re.S)
    assert m, f"no message {message} in proto/{proto}"
    body = re.search(r"oneof body \{(.*?)\}", m.group(1), re.S)
    assert body, f"no oneof body in {message}"
    return {int(n) for n in re.findall(r"=\s*(\d+);", body.group(1))}


def varint(b, o):
    n = shift = 0
    while True:
        if o >= len(b):
            raise ValueError("truncated varint")
        c = b[o]
        o += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, o


def top_fields(payload):
    """The top-level field numbers of one protobuf message, in order."""
    out, o = [], 0
    while o < len(payload):
        key, o = varint(payload, o)
        kind = key & 7
        if kind == 0:
            _, o = varint(payload, o)
        elif kind == 2:
            n, o = varint(payload, o)
            o += n
        elif kind == 1:
            o += 8
        elif kind == 5:
            o += 4
        else:
            raise ValueError(f"wire type {kind}")
        out.append(key >> 3)
    return out


def frames(data):
    o = 0
    while o + 8 <= len(data):
        n, _, _ = struct.unpack_from("<IHH", data, o)
        if o + 8 + n > len(data):
            return
        yield data[o + 8:o + 8 + n]
        o += 8 + n


def seen_fields(prefix_ok):
    seen = set()
    for name in sorted(os.listdir(CORPUS)):
        if not prefix_ok(name):
            continue
        with open(os.path.join(CORPUS, name), "rb") as f:
            for payload in frames(f.read()):
                try:
                    seen.update(top_fields(payload))
                except ValueError:
                    pass            # the deliberately broken seeds
    return seen


def test_corpus_holds_every_request_kind():
    want = oneof_fields("tensord.proto", "Request")
    seen = seen_fields(lambda n: not n.startswith(("peer_", "rep_")))
    assert want - seen == set(), f"Request fields without a seed: {sorted(want - seen)}"


def test_corpus_holds_every_peer_frame_kind():
    want = oneof_fields("peer.proto", "PeerFrame")
    seen = seen_fields(lambda n: n.startswith("peer_"))
    assert want - seen == set(), f"PeerFrame fields without a seed: {sorted(want - seen)}"


def test_corpus_is_what_make_corpus_writes(tmp_path):
    import shutil
    shutil.copytree(os.path.join(ROOT, "tests", "fuzz"), tmp_path / "fuzz")
    subprocess.run([sys.executable, str(tmp_path / "fuzz" / "make_corpus.py")], check=True,
                   capture_output=True)
    fresh = tmp_path / "fuzz" / "corpus"
    assert sorted(os.listdir(fresh)) == sorted(os.listdir(CORPUS)), \
        "tests/fuzz/corpus differs from make_corpus.py: rerun it and commit"
    for name in os.listdir(fresh):
        assert (fresh / name).read_bytes() == open(os.path.join(CORPUS, name), "rb").read(), name
