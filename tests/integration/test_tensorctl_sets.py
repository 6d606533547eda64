"""tensorctl and versions (issue 20): `watch` prints the events under a
prefix while other clients put, replace and unlink; `ls`/`stat` show
generation and commit; `put PREFIX FILE.npz|FILE.safetensors` publishes
every array of a checkpoint in one commit, and a bad checkpoint exits 1
with a reason and leaves nothing behind."""
import json
import os
import signal
import struct
import subprocess
import queue
import sys
import threading
import time
import zipfile

import numpy as np
import pytest

from conftest import build_path
from test_tensorctl import ctl, ok, save

CTL = build_path("tensorctl")
# The Python module of this build, to attach what tensorctl put; a
# sanitizer build (make test-asan) has none, and `tensorctl get` stands in.
sys.path.insert(0, build_path("python"))
try:
    import tensord
except ImportError:
    tensord = None


def attached_bytes(daemon, name, tmp_path):
    if tensord is None:
        out = tmp_path / "attached.npy"
        ok(daemon, "get", name, str(out))
        return np.load(out).tobytes()
    c = tensord.connect(daemon.socket)
    try:
        t = c.attach(name, timeout=0)
        return bytes(memoryview(t))
    finally:
        c.close()


def listing(daemon, prefix=""):
    return json.loads(ok(daemon, "ls", prefix, "--json"))


class Watcher:
    """tensorctl watch in the background, its lines read as they come; live
    (its Watch answered) when the constructor returns."""

    def __init__(self, daemon, *args, env=None):
        self.p = subprocess.Popen([CTL, "--socket", daemon.socket, "watch", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **(env or {})))
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 10
        while watches(daemon) < 1:
            assert time.monotonic() < deadline and self.p.poll() is None, "watch not live"
            time.sleep(0.01)

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout=10):
        line = self.lines.get(timeout=timeout)
        assert line is not None, "tensorctl watch ended"
        return line

    def stop(self, sig=signal.SIGINT):
        self.p.send_signal(sig)
        rc = self.p.wait(timeout=10)
        self.reader.join(timeout=10)
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return rc, [r for r in rest if r is not None], self.p.stderr.read()


def watches(daemon):
    st = json.loads(ok(daemon, "stats", "--json"))
    return sum(u.get("uid_watches", 0) for u in st.get("uids", []))


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_watch_prints_events_in_order(daemon, tmp_path, as_json):
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    ok(daemon, "put", "m/before", f)     # committed before the watch: not printed
    w = Watcher(daemon, "m/", *(["--json"] if as_json else []))
    try:
        ok(daemon, "put", "m/sync", f)
        first = w.line()
        ok(daemon, "put", "m/x", f)
        ok(daemon, "put", "elsewhere", f)                 # not under the prefix
        ok(daemon, "put", "m/x", f, "--force")
        ok(daemon, "rm", "m/x")
        got = [first] + [w.line() for _ in range(3)]
    finally:
        rc, rest, err = w.stop(signal.SIGINT)
    assert rc == 0, err
    assert rest == [] and err == ""
    info = {t["name"]: t for t in listing(daemon)}
    if as_json:
        ev = [json.loads(line) for line in got]
        assert [set(e) for e in ev] == [{"kind", "name", "generation", "commit"}] * 4
        assert [(e["kind"], e["name"], e["generation"]) for e in ev] == [
            ("published", "m/sync", 1), ("published", "m/x", 1), ("published", "m/x", 2),
            ("unlinked", "m/x", 2)]
        commits = [e["commit"] for e in ev]
        assert commits == sorted(commits) and len(set(commits)) == 4
        assert ev[0]["commit"] == info["m/sync"]["commit"]
    else:
        assert got[0] == f"published m/sync gen 1 commit {info['m/sync']['commit']}"
        assert [line.split()[:4] for line in got[1:]] == [
            ["published", "m/x", "gen", "1"], ["published", "m/x", "gen", "2"],
            ["unlinked", "m/x", "gen", "2"]]


def test_watch_after_replays_and_sigterm_ends_it(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    ok(daemon, "put", "r/a", f)
    since = listing(daemon, "r/")[0]["commit"]
    ok(daemon, "put", "r/b", f)
    ok(daemon, "rm", "r/a")
    w = Watcher(daemon, "r/", "--after", str(since), "--json")
    try:
        ev = [json.loads(w.line()) for _ in range(2)]
    finally:
        rc, _, err = w.stop(signal.SIGTERM)
    assert rc == 0, err
    assert [(e["kind"], e["name"]) for e in ev] == [("published", "r/b"), ("unlinked", "r/a")]


def test_watch_after_0_replays_every_name(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    ok(daemon, "put", "z/a", f)
    ok(daemon, "put", "z/b", f)
    w = Watcher(daemon, "z/", "--after", "0", "--json")
    try:
        ev = [json.loads(w.line()) for _ in range(2)]
    finally:
        rc, _, err = w.stop(signal.SIGTERM)
    assert rc == 0, err
    assert [(e["kind"], e["name"]) for e in ev] == [("published", "z/a"), ("published", "z/b")]


def test_watch_lagged_with_a_tiny_queue(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    for i in range(5):
        ok(daemon, "put", f"l/{i}", f)
    w = Watcher(daemon, "l/", "--after", "1", "--queue", "2")
    try:
        assert w.line() == "lagged"
    finally:
        rc, _, err = w.stop()
    assert rc == 0, err


def test_watch_ends_with_status_1_when_the_daemon_goes(daemon):
    """No daemon back within TENSORD_RECONNECT_MS: status 1, saying why."""
    w = Watcher(daemon, "x/", env={"TENSORD_RECONNECT_MS": "300"})
    daemon.stop()
    rc = w.p.wait(timeout=10)
    err = w.p.stderr.read()
    assert rc == 1 and err.startswith("tensorctl: ") and "watch of 'x/'" in err, err


def test_watch_goes_on_across_a_restart(daemon, tmp_path):
    """A daemon that restarted (kill -9, then a new one after a while): the
    watch connects anew and prints on; one that started empty is announced
    ('restarted'), then what it has."""
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    w = Watcher(daemon, "x/")
    try:
        ok(daemon, "put", "x/before", f)
        assert w.line().startswith("published x/before gen 1"), "before"
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        daemon.log.close()
        time.sleep(0.3)     # the watch finds no daemon for a while
        daemon.start()
        ok(daemon, "put", "x/after", f)
        line = w.line()
        if line == "restarted":
            line = w.line()
        assert line.startswith("published x/after gen 1"), line
    finally:
        rc, rest, err = w.stop()
    assert rc == 0 and not rest, (rc, rest, err)


def test_watch_errors(daemon):
    rc, _, err = ctl(daemon, "watch", "bad prefix!")
    assert rc == 1 and err.startswith("tensorctl: ") and "prefix" in err
    rc, _, err = ctl(daemon, "watch", "x", "--after", "soon")
    assert rc == 2 and "--after" in err
    rc, _, err = ctl(daemon, "watch", "x", "--queue", "0")
    assert rc == 2 and "--queue" in err


def test_ls_and_stat_show_generation_and_commit(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(4, np.float32))
    ok(daemon, "put", "g", f)
    one = json.loads(ok(daemon, "stat", "g", "--json"))
    ok(daemon, "put", "other", f)
    ok(daemon, "put", "g", f, "--force")
    two = json.loads(ok(daemon, "stat", "g", "--json"))
    assert one["generation"] == 1 and two["generation"] == 2
    assert two["commit"] > one["commit"] > 0
    stat = ok(daemon, "stat", "g")
    assert "gen:      2\n" in stat and f"commit:   {two['commit']}\n" in stat
    lines = ok(daemon, "ls", "g").splitlines()
    head = lines[0].split()
    row = lines[1].split()
    # BYTES is two words ("16 B"): the row has one more.
    assert row[head.index("GEN") + 1] == "2"
    assert row[head.index("COMMIT") + 1] == str(two["commit"])


# --- checkpoints ---------------------------------------------------------------------

def arrays():
    rng = np.random.default_rng(7)
    return {"layer0/weight": rng.standard_normal((8, 4)).astype(np.float32),
            "layer0/bias": np.arange(4, dtype=np.int64),
            "scale": np.array(1.5, np.float64),
            "mask": np.array([True, False, True]),
            "empty": np.zeros((0, 3), np.uint16)}


def check_set(daemon, tmp_path, prefix, want, extra=()):
    listed = {t["name"]: t for t in listing(daemon, prefix)}
    assert sorted(listed) == sorted([prefix + k for k in want] + [prefix + k for k in extra])
    commits = {t["commit"] for t in listed.values()}
    assert len(commits) == 1 and commits.pop() > 0, listed
    for k, a in want.items():
        t = listed[prefix + k]
        assert t["shape"] == list(a.shape) and t["dtype"] == a.dtype.name
        assert attached_bytes(daemon, prefix + k, tmp_path) == np.ascontiguousarray(a).tobytes()
    return listed


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_put_npz_is_one_commit(daemon, tmp_path, compressed):
    want = arrays()
    path = tmp_path / "ckpt.npz"
    (np.savez_compressed if compressed else np.savez)(path, **want)
    out = json.loads(ok(daemon, "put", "ck/", str(path), "--json"))
    assert out["tensors"] == sorted("ck/" + k for k in want)
    listed = check_set(daemon, tmp_path, "ck/", want)
    assert out["commit"] == listed["ck/scale"]["commit"]


def test_put_npz_fortran_and_text_output(daemon, tmp_path):
    a = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    np.savez(tmp_path / "f.npz", a=a)
    out = ok(daemon, "put", "f/", str(tmp_path / "f.npz"))
    commit = listing(daemon, "f/")[0]["commit"]
    assert out == f"commit {commit}: 1 tensor\n"
    info = json.loads(ok(daemon, "stat", "f/a", "--json"))
    assert info["strides"] == [1, 2, 6]
    ok(daemon, "get", "f/a", str(tmp_path / "out.npy"))
    assert np.array_equal(np.load(tmp_path / "out.npy"), a)
    # Exported as a set, the strided tensor is written row-major too (issue 34).
    ok(daemon, "get", "f/", str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as z:
        assert z.files == ["a"] and np.array_equal(z["a"], a)
    ok(daemon, "get", "f/", str(tmp_path / "out.safetensors"))
    raw = (tmp_path / "out.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    assert n % 8 == 0 and h["a"] == {"dtype": "F32", "shape": [2, 3, 4],
                                     "data_offsets": [0, 96]}
    assert raw[8 + n:] == np.ascontiguousarray(a).tobytes()


def safetensors_bytes(entries, meta=None, pad=0):
    """A .safetensors file by hand: 8-byte little-endian header length, the JSON
    header, then the data. entries: name -> (dtype, shape, bytes)."""
    header, data = {}, b""
    for name, (dt, shape, raw) in entries.items():
        header[name] = {"dtype": dt, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + data


ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
             "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}


def test_put_safetensors_is_one_commit(daemon, tmp_path):
    rng = np.random.default_rng(3)
    # An empty array first: it shares offset 0 with the next one.
    want = {"a.empty": np.zeros((0, 3), np.float32)}
    entries = {"a.empty": ("F32", (0, 3), b"")}
    for code, dt in ST_DTYPES.items():
        a = (rng.integers(0, 2, (3, 5)) if dt == np.bool_
             else rng.integers(0, 100, (3, 5))).astype(dt)
        want[f"t.{code.lower()}"] = a
        entries[f"t.{code.lower()}"] = (code, a.shape, a.tobytes())
    bf16 = bytes(range(16))  # 8 bfloat16 values, compared as bytes
    entries["t.bf16"] = ("BF16", (2, 4), bf16)
    path = tmp_path / "m.safetensors"
    path.write_bytes(safetensors_bytes(entries, meta={"format": "pt"}, pad=5))
    out = json.loads(ok(daemon, "put", "st/", str(path), "--json"))
    assert out["tensors"] == sorted("st/" + k for k in entries)
    listed = check_set(daemon, tmp_path, "st/", want, extra=["t.bf16"])
    assert listed["st/t.bf16"]["dtype"] == "bfloat16"
    assert listed["st/t.bf16"]["shape"] == [2, 4]
    # bfloat16 has no buffer format: its bytes through torch, where there is torch.
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and tensord is not None:
        c = tensord.connect(daemon.socket)
        try:
            t = torch.from_dlpack(c.attach("st/t.bf16", timeout=0))
            assert t.dtype == torch.bfloat16
            assert t.contiguous().view(torch.uint8).numpy().tobytes() == bf16
        finally:
            c.close()
    assert out["commit"] == listed["st/t.f32"]["commit"]


def test_put_force_replaces_the_set_in_one_commit(daemon, tmp_path):
    one = {"a": np.ones(3, np.float32), "b": np.zeros(2, np.int32)}
    two = {"a": np.full(3, 2, np.float32), "b": np.full(2, 7, np.int32)}
    np.savez(tmp_path / "one.npz", **one)
    np.savez(tmp_path / "two.npz", **two)
    ok(daemon, "put", "s/", str(tmp_path / "one.npz"))
    first = check_set(daemon, tmp_path, "s/", one)
    rc, _, err = ctl(daemon, "put", "s/", str(tmp_path / "two.npz"))
    assert rc == 1 and "already exists" in err and "--force" in err
    check_set(daemon, tmp_path, "s/", one)                # untouched
    out = json.loads(ok(daemon, "put", "s/", str(tmp_path / "two.npz"), "--force", "--json"))
    second = check_set(daemon, tmp_path, "s/", two)
    assert out["commit"] == second["s/a"]["commit"] > first["s/a"]["commit"]
    assert all(t["generation"] == 2 for t in second.values())


def test_put_checkpoint_options(daemon, tmp_path):
    np.savez(tmp_path / "o.npz", x=np.ones(2, np.int8))
    ok(daemon, "put", "o/", str(tmp_path / "o.npz"), "--mutable", "--mode", "0640")
    info = json.loads(ok(daemon, "stat", "o/x", "--json"))
    assert info["mutable"] is True and info["mode"] == "0640"


def corrupt_safetensors():
    good = {"x": ("F32", (2,), np.ones(2, np.float32).tobytes()),
            "y": ("I8", (3,), bytes(3))}
    g = safetensors_bytes(good)
    hlen = struct.unpack("<Q", g[:8])[0]

    def with_header(h, data=b"\0" * 11):
        h = json.dumps(h).encode()
        return struct.pack("<Q", len(h)) + h + data

    return {
        "header too long": (struct.pack("<Q", 1 << 40) + g[8:], "too long"),
        "header past the end": (struct.pack("<Q", hlen + 100) + g[8:], "truncated"),
        "not json": (struct.pack("<Q", 5) + b"{abc}", "malformed header"),
        "bad dtype": (with_header({"x": {"dtype": "F7_E3M3", "shape": [2],
                                         "data_offsets": [0, 2]}}, b"\0\0"),
                      "array 'x': unsupported dtype 'F7_E3M3'"),
        # Issue 34: a file cut short says so, with how much is missing.
        "offsets past the data": (with_header({"x": {"dtype": "F32", "shape": [2],
                                                     "data_offsets": [0, 8]},
                                               "y": {"dtype": "I8", "shape": [3],
                                                     "data_offsets": [8, 11]}}, b"\0" * 9),
                                  "truncated: expected 11 data bytes after the header, "
                                  "the file has 9"),
        "odd F4": (with_header({"x": {"dtype": "F4", "shape": [3],
                                      "data_offsets": [0, 2]}}, b"\0\0"),
                   "array 'x': 3 values of 4 bits are not a whole number of bytes"),
        "size not shape": (with_header({"x": {"dtype": "F32", "shape": [3],
                                              "data_offsets": [0, 8]},
                                        "y": {"dtype": "I8", "shape": [3],
                                              "data_offsets": [8, 11]}}),
                           "need"),
        "overlapping": (with_header({"x": {"dtype": "F32", "shape": [2],
                                           "data_offsets": [0, 8]},
                                     "y": {"dtype": "I8", "shape": [3],
                                           "data_offsets": [6, 9]}}),
                        "tile"),
        "bad name": (with_header({"x y": {"dtype": "I8", "shape": [11],
                                          "data_offsets": [0, 11]}}),
                     "cannot be in a tensor name"),
        "negative shape": (with_header({"x": {"dtype": "I8", "shape": [-1],
                                              "data_offsets": [0, 11]}}),
                           "negative"),
        # Issue 30: no arrays at all (qsort of NULL under UBSan before).
        "metadata only": (with_header({"__metadata__": {"format": "pt"}}, b""),
                          "holds no arrays"),
        "empty header": (with_header({}, b""), "holds no arrays"),
    }


@pytest.mark.parametrize("case", list(corrupt_safetensors()))
def test_corrupt_safetensors_leaves_nothing(daemon, tmp_path, case):
    raw, why = corrupt_safetensors()[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    rc, out, err = ctl(daemon, "put", "bad/", str(path))
    assert rc == 1 and out == ""
    assert err.startswith(f"tensorctl: {path}: ") and why in err, err
    assert listing(daemon) == []


def test_bad_npz_leaves_nothing(daemon, tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, a=np.ones(4, np.float32), b=np.ones(1000, np.float64))
    cases = {}
    # Not a zip at all.
    (tmp_path / "notzip.npz").write_bytes(b"hello, not a zip file")
    cases["notzip.npz"] = "not a readable .npz"
    # A member that is not a .npy.
    with zipfile.ZipFile(tmp_path / "txt.npz", "w") as z:
        z.writestr("a.npy", open(save(tmp_path / "a.npy", np.ones(2)), "rb").read())
        z.writestr("readme.txt", "hi")
    cases["txt.npz"] = "not a .npy array"
    # A member whose .npy data is short.
    raw = open(save(tmp_path / "b.npy", np.ones(100)), "rb").read()
    with zipfile.ZipFile(tmp_path / "short.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ok.npy", open(tmp_path / "a.npy", "rb").read())
        z.writestr("short.npy", raw[:-8])
    cases["short.npz"] = "truncated"
    # A big-endian member, refused as put refuses it.
    with zipfile.ZipFile(tmp_path / "be.npz", "w") as z:
        z.writestr("ok.npy", open(tmp_path / "a.npy", "rb").read())
        z.writestr("be.npy", open(save(tmp_path / "be.npy", np.ones(3, ">f4")), "rb").read())
    cases["be.npz"] = "big-endian"
    # A bad name for a tensor.
    with zipfile.ZipFile(tmp_path / "name.npz", "w") as z:
        z.writestr("bad name.npy", open(tmp_path / "a.npy", "rb").read())
    cases["name.npz"] = "cannot be in a tensor name"
    # A corrupted deflate stream (a byte flipped inside the compressed data).
    np.savez_compressed(tmp_path / "crc.npz", a=np.arange(100000, dtype=np.int64))
    b = bytearray((tmp_path / "crc.npz").read_bytes())
    b[len(b) // 2] ^= 0xff
    (tmp_path / "crc.npz").write_bytes(bytes(b))
    cases["crc.npz"] = "member 'a'"
    for name, why in cases.items():
        rc, out, err = ctl(daemon, "put", "bad/", str(tmp_path / name))
        assert rc == 1 and out == "", (name, err)
        assert err.startswith("tensorctl: ") and why in err, (name, err)
        assert listing(daemon) == [], name
    # A name over 255 bytes after the prefix.
    rc, _, err = ctl(daemon, "put", "p" * 254 + "/", str(good))
    assert rc == 1 and "over 255 bytes" in err
    assert listing(daemon) == []


def test_put_checkpoint_usage(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(2))
    rc, _, err = ctl(daemon, "put", "x", f, "--json")
    assert rc == 2 and "--json" in err
    np.savez(tmp_path / "empty.npz")
    rc, _, err = ctl(daemon, "put", "e/", str(tmp_path / "empty.npz"))
    assert rc == 1 and "no arrays" in err
    # With --json a failure is a JSON object on stderr, as for the other commands.
    rc, out, err = ctl(daemon, "put", "e/", str(tmp_path / "missing.safetensors"), "--json")
    assert rc == 1 and out == ""
    assert json.loads(err)["error"] == "ENOENT" and "missing.safetensors" in err
    (tmp_path / "t.safetensors").write_bytes(b"\x05" + b"\0" * 7 + b"{abc}")
    rc, out, err = ctl(daemon, "put", "e/", str(tmp_path / "t.safetensors"), "--json")
    assert rc == 1 and json.loads(err)["error"] == "EINVAL"


# --- rm of several names or prefixes: one transaction (issue 34) -------------


def names(daemon, prefix=""):
    return [t["name"] for t in listing(daemon, prefix)]


def put_many(daemon, tmp_path, prefix, keys):
    """keys under prefix in one commit (put PREFIX FILE.npz)."""
    f = tmp_path / "many.npz"
    np.savez(f, **{k: np.full(4, i, np.float32) for i, k in enumerate(keys)})
    ok(daemon, "put", prefix, str(f))


def test_rm_many_names_is_one_commit(daemon, tmp_path):
    put_many(daemon, tmp_path, "s/", ["a", "b", "c"])
    ok(daemon, "put", "keep", save(tmp_path / "k.npy", np.ones(3)))
    w = Watcher(daemon, "s/")
    r = json.loads(ok(daemon, "rm", "s/a", "s/b", "s/c", "--json"))
    assert r["removed"] == 3 and r["commit"] > 0
    lines = [w.line() for _ in range(3)]
    rc, rest, _ = w.stop()
    assert rc == 0 and rest == []
    assert sorted(l.split()[1] for l in lines) == ["s/a", "s/b", "s/c"]
    assert {l.split()[0] for l in lines} == {"unlinked"}
    assert {l.split()[-1] for l in lines} == {str(r["commit"])}, lines
    assert names(daemon) == ["keep"]


def test_rm_is_all_or_nothing(daemon, tmp_path):
    put_many(daemon, tmp_path, "s/", ["a", "b"])
    rc, out, err = ctl(daemon, "rm", "s/a", "s/missing", "s/b")
    assert rc == 1 and out == ""
    assert "'s/missing'" in err and "nothing was removed" in err, err
    assert err.count("\n") == 1, err
    assert names(daemon) == ["s/a", "s/b"]
    rc, _, err = ctl(daemon, "rm", "s/a", "bad name!")
    assert rc == 1 and "bad name!" in err and "nothing was removed" in err, err
    assert names(daemon) == ["s/a", "s/b"]
    # A name given twice (or under two prefixes) is removed once.
    r = json.loads(ok(daemon, "rm", "s/a", "s/a", "--json"))
    assert r["removed"] == 1 and names(daemon) == ["s/b"]
    r = json.loads(ok(daemon, "rm", "--prefix", "s/", "s/b", "--json"))
    assert r["removed"] == 1 and names(daemon) == []


def test_rm_prefix(daemon, tmp_path):
    many = [f"{i:04d}" for i in range(1024)]
    put_many(daemon, tmp_path, "ck/", many)
    put_many(daemon, tmp_path, "ck2/", ["x"])
    ok(daemon, "put", "other", save(tmp_path / "o.npy", np.ones(3)))
    assert len(names(daemon, "ck/")) == 1024
    r = json.loads(ok(daemon, "rm", "--prefix", "ck/", "--json"))
    assert r["removed"] == 1024
    assert names(daemon) == ["ck2/x", "other"]
    # A prefix nothing is under is an error that names it; so the whole rm is.
    rc, _, err = ctl(daemon, "rm", "--prefix", "other", "ck/")
    assert rc == 1 and "'ck/'" in err and "nothing was removed" in err, err
    assert names(daemon) == ["ck2/x", "other"]
    ok(daemon, "rm", "--prefix", "ck2/", "oth")
    assert names(daemon) == []


# --- client labels, leases/ls/watch --group (issue 34) -----------------------

needs_module = pytest.mark.skipif(tensord is None, reason="the Python module is not built "
                                  "(a sanitizer build): the holders are Python clients")


def test_client_label_from_the_environment(daemon):
    out = ok(daemon, "clients", "--json", env={"TENSORD_CLIENT_NAME": "ctl-7"})
    mine = [c for c in json.loads(out) if c["comm"] == "tensorctl"]
    assert [c["label"] for c in mine] == ["ctl-7"], out
    table = ok(daemon, "clients", env={"TENSORD_CLIENT_NAME": "ctl-7"}).splitlines()
    assert table[0].split()[:6] == ["CONN", "PID", "USER", "COMM", "LABEL", "CLIENT"]
    assert any(l.split()[3:5] == ["tensorctl", "ctl-7"] for l in table[1:]), table
    # Without it, no label: "-".
    out = json.loads(ok(daemon, "clients", "--json"))
    assert [c["label"] for c in out if c["comm"] == "tensorctl"] == [""]
    # A bad one fails before anything is sent, naming the variable and why.
    for bad in ["two words", "x" * 64, "t\x1bab"]:
        rc, out, err = ctl(daemon, "ls", env={"TENSORD_CLIENT_NAME": bad})
        assert rc == 1 and out == "", err
        assert "$TENSORD_CLIENT_NAME" in err and "printable ASCII" in err, err


def test_client_label_from_c(daemon):
    """The C library's tensord_connect_named(), through ctypes."""
    import ctypes
    if not os.path.exists(build_path("libtensord.so")):
        pytest.skip("the sanitizer build makes no libtensord.so for ctypes to load (an ASan "
                    "library cannot load into this Python); the plain run tests it")
    lib = ctypes.CDLL(build_path("libtensord.so"))
    lib.tensord_connect_named.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.POINTER(ctypes.c_void_p)]
    lib.tensord_close.argtypes = [ctypes.c_void_p]
    lib.tensord_last_error.restype = ctypes.c_char_p
    c = ctypes.c_void_p()
    assert lib.tensord_connect_named(daemon.socket.encode(), b"from-c", ctypes.byref(c)) == 0
    try:
        labels = [x["label"] for x in json.loads(ok(daemon, "clients", "--json"))]
        assert "from-c" in labels, labels
    finally:
        lib.tensord_close(c)
    rc = lib.tensord_connect_named(daemon.socket.encode(), b"bad label", ctypes.byref(c))
    assert rc == -22, rc
    msg = lib.tensord_last_error().decode()
    assert "client name 'bad label'" in msg and "printable ASCII" in msg, msg


@needs_module
def test_client_label_from_python(daemon):
    with tensord.connect(daemon.socket, name="rollout-1") as c:
        me = [x for x in c.clients() if x.label == "rollout-1"]
        assert len(me) == 1 and me[0].pid == os.getpid()
    with pytest.raises(tensord.Error) as e:
        tensord.connect(daemon.socket, name="no spaces please")
    assert e.value.errno == 22 and "client name" in str(e.value)
    with pytest.raises(TypeError):
        tensord.connect(daemon.socket, name=7)
    with pytest.raises(TypeError):
        tensord.connect(daemon.socket, "positional-name")


@needs_module
def test_leases_group_three_rollouts(daemon, tmp_path):
    """3 rollouts x 32 tensors: 96 rows by name, 3 by prefix or commit."""
    put_many(daemon, tmp_path, "w/", [f"{i:02d}" for i in range(32)])
    commit = listing(daemon, "w/")[0]["commit"]
    clients = [tensord.connect(daemon.socket, name=f"rollout-{i}") for i in range(3)]
    try:
        held = [c.attach_many([f"w/{i:02d}" for i in range(32)], timeout=0) for c in clients]
        rows = json.loads(ok(daemon, "leases", "--json"))
        assert len(rows) == 96
        assert {r["label"] for r in rows} == {"rollout-0", "rollout-1", "rollout-2"}
        assert {r["bytes"] for r in rows} == {16} and {r["commit"] for r in rows} == {commit}
        table = ok(daemon, "leases").splitlines()
        assert table[0].split()[4:6] == ["COMM", "LABEL"] and len(table) == 97
        for by in ["prefix", "commit"]:
            g = json.loads(ok(daemon, "leases", "--group", by, "--json"))
            assert len(g) == 3, g
            assert sorted(x["label"] for x in g) == ["rollout-0", "rollout-1", "rollout-2"]
            for x in g:
                assert (x["prefix"], x["commit"], x["tensors"], x["bytes"], x["leases"],
                        x["state"], x["pid"]) == ("w/", commit, 32, 512, 32, "published",
                                                  os.getpid()), x
            table = ok(daemon, "leases", "--group", by).splitlines()
            assert len(table) == 4, table
            head = table[0].split()
            assert head[:4] == (["PREFIX", "COMMIT"] if by == "prefix" else
                                ["COMMIT", "PREFIX"]) + ["TENSORS", "BYTES"], head
            for line in table[1:]:
                cells = line.split()
                key = ["w/", str(commit)] if by == "prefix" else [str(commit), "w/"]
                assert cells[:5] == key + ["32", "512", "B"], line
                assert cells[9].startswith("rollout-"), line
        del held
    finally:
        for c in clients:
            c.close()


def test_ls_group(daemon, tmp_path):
    put_many(daemon, tmp_path, "a/", ["x", "y"])
    put_many(daemon, tmp_path, "b/c/", ["1", "2", "3"])
    ok(daemon, "put", "b/c/4", save(tmp_path / "k.npy", np.ones(2, np.float32)))
    ok(daemon, "put", "top", save(tmp_path / "k.npy", np.ones(2, np.float32)))
    c_a, c_b, c_b4, c_top = (listing(daemon, n)[0]["commit"] for n in ["a/x", "b/c/1", "b/c/4",
                                                                      "top"])
    g = json.loads(ok(daemon, "ls", "--group", "prefix", "--json"))
    assert [(x["prefix"], x["tensors"], x["bytes"], x["commit"]) for x in g] == [
        ("", 1, 8, c_top), ("a/", 2, 32, c_a), ("b/c/", 4, 56, c_b4)], g
    assert g[2]["commit_min"] == c_b
    table = ok(daemon, "ls", "--group", "prefix").splitlines()
    assert table[0].split() == ["PREFIX", "TENSORS", "BYTES", "COMMIT"]
    assert table[3].split() == ["b/c/", "4", "56", "B", f"{c_b}-{c_b4}"]
    g = json.loads(ok(daemon, "ls", "--group", "commit", "--json"))
    assert [(x["commit"], x["prefix"], x["tensors"]) for x in g] == [
        (c_a, "a/", 2), (c_b, "b/c/", 3), (c_b4, "b/c/", 1), (c_top, "", 1)], g
    g = json.loads(ok(daemon, "ls", "b/", "--group", "commit", "--json"))
    assert [x["commit"] for x in g] == [c_b, c_b4]


def test_watch_group_commit_and_prefix(daemon, tmp_path):
    w = Watcher(daemon, "--group", "commit")
    put_many(daemon, tmp_path, "ck/", [f"{i:02d}" for i in range(32)])
    commit = listing(daemon, "ck/")[0]["commit"]
    assert w.line() == f"published commit {commit} names 32 prefix ck/"
    ok(daemon, "rm", "--prefix", "ck/")
    line = w.line().split()
    assert line[0] == "unlinked" and line[3:] == ["names", "32", "prefix", "ck/"], line
    rc, rest, _ = w.stop()
    assert rc == 0 and rest == []
    # By prefix: one line per prefix of a commit; --json.
    w = Watcher(daemon, "--group", "prefix", "--json")
    f = tmp_path / "two.npz"
    np.savez(f, **{"p/0": np.ones(2), "p/1": np.ones(2), "q/0": np.ones(2)})
    ok(daemon, "put", "m/", str(f))
    commit = listing(daemon, "m/")[0]["commit"]
    got = sorted([json.loads(w.line()), json.loads(w.line())], key=lambda e: e["prefix"])
    assert got == [{"kind": "published", "commit": commit, "names": 2, "prefix": "m/p/"},
                   {"kind": "published", "commit": commit, "names": 1, "prefix": "m/q/"}], got
    rc, rest, _ = w.stop()
    assert rc == 0 and rest == []
# --- issue 34: files of the real packages, export, fp8, the prefix rule, progress ------

def test_put_and_get_files_of_the_safetensors_package(daemon, tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")
    want = arrays()
    st_numpy.save_file(want, str(tmp_path / "in.safetensors"))
    out = json.loads(ok(daemon, "put", "pk/", str(tmp_path / "in.safetensors"), "--json"))
    check_set(daemon, tmp_path, "pk/", want)
    # get PREFIX FILE: the set from one commit, read back by the package and by numpy.
    line = ok(daemon, "get", "pk/", str(tmp_path / "out.safetensors"))
    assert line == f"commit {out['commit']}: {len(want)} tensors\n"
    back = st_numpy.load_file(str(tmp_path / "out.safetensors"))
    assert sorted(back) == sorted(want)
    for k, a in want.items():
        assert back[k].dtype == a.dtype and np.array_equal(back[k], a), k
    ok(daemon, "get", "pk/", str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as z:
        assert sorted(z.files) == sorted(want)
        for k, a in want.items():
            assert z[k].dtype == a.dtype and np.array_equal(z[k], a), k
    # An npz tensorctl wrote goes back in as it came out.
    ok(daemon, "put", "again/", str(tmp_path / "out.npz"))
    check_set(daemon, tmp_path, "again/", want)


def test_float8_checkpoint_through_tensorctl(daemon, tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch for its float8 tensors")
    st_torch = pytest.importorskip("safetensors.torch", reason="needs the safetensors package")
    want = {"w": torch.randn(16, 8).to(torch.float8_e4m3fn),
            "g": torch.randn(8).to(torch.float8_e5m2),
            "s": torch.rand(4).to(torch.float8_e8m0fnu)}
    st_torch.save_file(want, str(tmp_path / "fp8.safetensors"))
    ok(daemon, "put", "f8/", str(tmp_path / "fp8.safetensors"))
    dtypes = {t["name"]: t["dtype"] for t in listing(daemon, "f8/")}
    assert dtypes == {"f8/w": "float8_e4m3fn", "f8/g": "float8_e5m2", "f8/s": "float8_e8m0fnu"}
    table = ok(daemon, "ls", "f8/")
    assert "float8_e4m3fn" in table and "dtype(" not in table
    if tensord is not None:   # float8 has no buffer format: through torch's from_dlpack
        c = tensord.connect(daemon.socket)
        try:
            for k, v in want.items():
                t = torch.from_dlpack(c.attach("f8/" + k, timeout=0))
                assert t.dtype == v.dtype and torch.equal(t.view(torch.uint8),
                                                          v.view(torch.uint8)), k
        finally:
            c.close()
    ok(daemon, "get", "f8/", str(tmp_path / "out.safetensors"))
    back = st_torch.load_file(str(tmp_path / "out.safetensors"))
    for k, v in want.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k].view(torch.uint8),
                                                        v.view(torch.uint8)), k
    # numpy has no float8: an .npz is refused, naming the tensor, and nothing is written.
    rc, _, err = ctl(daemon, "get", "f8/", str(tmp_path / "out.npz"))
    assert rc == 1 and "f8/g" in err and "no .npy equivalent" in err, err
    assert not (tmp_path / "out.npz").exists()


def test_a_prefix_without_a_separator_is_refused(daemon, tmp_path):
    np.savez(tmp_path / "c.npz", weight=np.ones(2, np.float32))
    rc, out, err = ctl(daemon, "put", "ck/x", str(tmp_path / "c.npz"))
    assert rc == 1 and out == ""
    assert "prefix 'ck/x' does not end in a separator" in err and "'ck/xNAME'" in err, err
    assert "write 'ck/x/'" in err
    assert listing(daemon) == []
    for prefix in ["ck/x/", "ck/x.", "ck/x_", ""]:
        ok(daemon, "put", prefix, str(tmp_path / "c.npz"))
    assert sorted(t["name"] for t in listing(daemon)) == \
        ["ck/x.weight", "ck/x/weight", "ck/x_weight", "weight"]
    rc, _, err = ctl(daemon, "get", "ck/x", str(tmp_path / "o.npz"))
    assert rc == 1 and "does not end in a separator" in err
    rc, _, err = ctl(daemon, "get", "none/", str(tmp_path / "o.npz"))
    assert rc == 1 and "no tensors under 'none/'" in err
    assert not (tmp_path / "o.npz").exists()


def test_truncated_package_file_says_truncated(daemon, tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")
    st_numpy.save_file({"a": np.ones(8192, np.float32), "b": np.ones(100, np.int16)},
                       str(tmp_path / "full.safetensors"))
    raw = (tmp_path / "full.safetensors").read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:-1000])
    rc, out, err = ctl(daemon, "put", "t/", str(path))
    assert rc == 1 and out == ""
    assert err == (f"tensorctl: {path}: truncated: expected 32968 data bytes after the header, "
                   f"the file has 31968\n"), err
    assert listing(daemon) == []


def test_progress_on_a_terminal(daemon, tmp_path):
    """A long import redraws 'FILE: N MiB of M MiB (P%)' on stderr when it is a
    terminal (here a pty); through a pipe, as everywhere above, it says nothing."""
    import os
    import pty
    st_numpy = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")
    path = tmp_path / "big.safetensors"
    st_numpy.save_file({f"w{i}": np.ones(6 << 20, np.float32) for i in range(4)}, str(path))
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([CTL, "--socket", daemon.socket, "put", "big/", str(path)],
                             stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        slave = -1
        out, _ = p.communicate(timeout=120)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert p.returncode == 0, seen
    assert out.startswith("commit ")
    text = seen.decode()
    assert f"tensorctl: {path}: 96.0 MiB of 96.0 MiB (100%)" in text, text
    assert text.rstrip("\r\n").count("\n") == 0, "one line, redrawn in place"
    rc, _, err = ctl(daemon, "put", "--force", "big/", str(path))
    assert rc == 0 and err == ""


def test_narrow_float_dtypes_round_trip_by_hand(daemon, tmp_path):
    """Every safetensors dtype name of the narrow floats, in a file made by
    hand (the package writes no F6), in and back out with the same header."""
    entries = {"e4m3": ("F8_E4M3", (2, 3), bytes(range(6))),
               "e5m2": ("F8_E5M2", (3,), b"\x01\x02\x03"),
               "e4m3fnuz": ("F8_E4M3FNUZ", (2,), b"\x04\x05"),
               "e5m2fnuz": ("F8_E5M2FNUZ", (2,), b"\x06\x07"),
               "e8m0": ("F8_E8M0", (1,), b"\x7f"),
               "f6a": ("F6_E2M3", (4,), b"\x11\x22\x33"),       # 4 x 6 bits = 3 bytes
               "f6b": ("F6_E3M2", (2, 4), b"\x44" * 6),
               "f4even": ("F4", (2, 4), b"\x12\x34\x56\x78"),   # two values a byte
               "f4odd": ("F4", (2, 3), b"\x9a\xbc\xde")}        # odd: packed, lanes 1
    (tmp_path / "n.safetensors").write_bytes(safetensors_bytes(entries))
    ok(daemon, "put", "n/", str(tmp_path / "n.safetensors"))
    got = {t["name"][2:]: (t["dtype"], t["shape"]) for t in listing(daemon, "n/")}
    assert got == {"e4m3": ("float8_e4m3fn", [2, 3]), "e5m2": ("float8_e5m2", [3]),
                   "e4m3fnuz": ("float8_e4m3fnuz", [2]), "e5m2fnuz": ("float8_e5m2fnuz", [2]),
                   "e8m0": ("float8_e8m0fnu", [1]), "f6a": ("float6_e2m3fn", [4]),
                   "f6b": ("float6_e3m2fn", [2, 4]), "f4even": ("float4_e2m1fn_x2", [2, 2]),
                   "f4odd": ("float4_e2m1fn", [2, 3])}
    ok(daemon, "get", "n/", str(tmp_path / "out.safetensors"))
    raw = (tmp_path / "out.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    for k, (dt, shape, b) in entries.items():
        assert h[k]["dtype"] == dt and h[k]["shape"] == list(shape), (k, h[k])
        lo, hi = h[k]["data_offsets"]
        assert data[lo:hi] == b, k
