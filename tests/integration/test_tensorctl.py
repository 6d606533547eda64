"""tensorctl against a real daemon: every command, its table and JSON output,
exit codes 0/1/2, .npy round trips compared with numpy, and the .npy variants
that are refused with a message naming the file."""
import json
import os
import re
import subprocess
import time

import numpy as np
import pytest
from numpy.lib import format as npformat

from conftest import build_path, wait_until

CTL = build_path("tensorctl")


def ctl(daemon, *args, env=None, timeout=30, socket=True):
    """Runs tensorctl; returns (exit status, stdout, stderr)."""
    argv = [CTL] + (["--socket", daemon.socket] if socket else []) + list(args)
    e = dict(os.environ)
    e.pop("TENSORD_SOCKET", None)
    if env:
        e.update(env)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e)
    return r.returncode, r.stdout, r.stderr


def ok(daemon, *args, **kw):
    rc, out, err = ctl(daemon, *args, **kw)
    assert rc == 0, f"tensorctl {args}: exit {rc}: {err}"
    return out


def save(path, arr, version=None):
    with open(path, "wb") as f:
        npformat.write_array(f, arr, version=version, allow_pickle=True)
    return str(path)


DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
          np.int64, np.uint64, np.float16, np.float32, np.float64, np.complex64,
          np.complex128]


def sample(dtype, shape):
    rng = np.random.default_rng(42)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        a = rng.integers(0, 2, n).astype(np.bool_)
    elif np.issubdtype(dtype, np.complexfloating):
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    elif np.issubdtype(dtype, np.floating):
        a = rng.standard_normal(n).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return a.reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_put_get_round_trip(daemon, tmp_path, dtype):
    a = sample(dtype, (3, 5, 7))
    ok(daemon, "put", "rt/x", save(tmp_path / "in.npy", a))
    ok(daemon, "get", "rt/x", str(tmp_path / "out.npy"))
    b = np.load(tmp_path / "out.npy")
    assert b.dtype == a.dtype and b.shape == a.shape
    assert b.tobytes() == a.tobytes()
    # The file is exactly what numpy itself would write.
    assert (tmp_path / "out.npy").read_bytes() == (tmp_path / "in.npy").read_bytes()
    info = json.loads(ok(daemon, "stat", "rt/x", "--json"))
    assert info["dtype"] == np.dtype(dtype).name
    assert info["shape"] == [3, 5, 7] and info["strides"] == [35, 7, 1]
    assert info["nbytes"] == a.nbytes


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_format_versions(daemon, tmp_path, version):
    a = np.arange(24, dtype=np.int32).reshape(4, 6)
    ok(daemon, "put", "v", save(tmp_path / "in.npy", a, version))
    ok(daemon, "get", "v", str(tmp_path / "out.npy"))
    assert np.array_equal(np.load(tmp_path / "out.npy"), a)


def test_fortran_order(daemon, tmp_path):
    a = np.asfortranarray(np.arange(60, dtype=np.float64).reshape(3, 4, 5))
    ok(daemon, "put", "f", save(tmp_path / "f.npy", a))
    info = json.loads(ok(daemon, "stat", "f", "--json"))
    assert info["shape"] == [3, 4, 5]
    assert info["strides"] == [1, 3, 12]  # column-major, as the file was
    ok(daemon, "get", "f", str(tmp_path / "out.npy"))
    with open(tmp_path / "out.npy", "rb") as fh:
        assert npformat.read_magic(fh) == (1, 0)
        shape, fortran, dtype = npformat.read_array_header_1_0(fh)
    assert not fortran and shape == (3, 4, 5)  # written back in C order
    b = np.load(tmp_path / "out.npy")
    assert np.array_equal(a, b) and b.flags.c_contiguous


def test_zero_d_and_zero_size(daemon, tmp_path):
    ok(daemon, "put", "scalar", save(tmp_path / "s.npy", np.array(2.5, np.float32)))
    ok(daemon, "put", "empty", save(tmp_path / "e.npy", np.zeros((0, 3), np.int64)))
    ok(daemon, "put", "emptyf",
       save(tmp_path / "ef.npy", np.asfortranarray(np.zeros((2, 0, 3), np.float32))))
    for name, want in [("scalar", np.array(2.5, np.float32)),
                       ("empty", np.zeros((0, 3), np.int64)),
                       ("emptyf", np.zeros((2, 0, 3), np.float32))]:
        ok(daemon, "get", name, str(tmp_path / "out.npy"))
        b = np.load(tmp_path / "out.npy")
        assert b.shape == want.shape and b.dtype == want.dtype
        assert np.array_equal(b, want)
    info = json.loads(ok(daemon, "stat", "scalar", "--json"))
    assert info["shape"] == [] and info["strides"] == []
    stat = ok(daemon, "stat", "scalar")
    assert "shape:    ()" in stat


def test_get_to_stdout(daemon, tmp_path):
    a = np.arange(10, dtype=np.uint16)
    ok(daemon, "put", "s", save(tmp_path / "a.npy", a))
    r = subprocess.run([CTL, "--socket", daemon.socket, "get", "s", "-"],
                       capture_output=True, timeout=30)
    assert r.returncode == 0
    assert r.stdout == (tmp_path / "a.npy").read_bytes()


def test_large_round_trip(daemon, tmp_path):
    a = np.random.default_rng(1).standard_normal((1024, 2048)).astype(np.float32)
    ok(daemon, "put", "big", save(tmp_path / "big.npy", np.asfortranarray(a)))
    ok(daemon, "get", "big", str(tmp_path / "out.npy"))
    assert np.array_equal(np.load(tmp_path / "out.npy"), a)


def test_ls_table_and_json(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones((4, 8), np.float32))
    for name in ["model/inputs/0", "model/inputs/1", "other.x:y-z_w"]:
        ok(daemon, "put", name, f)
    out = ok(daemon, "ls")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "DTYPE", "SHAPE", "DEVICE", "BYTES", "STATE",
                                "GEN", "COMMIT", "REFS", "OWNER"]
    assert len(lines) == 4
    row = lines[1].split()
    assert row[:4] == ["model/inputs/0", "float32", "(4,8)", "cpu"]
    assert row[4:6] == ["128", "B"] and row[6] == "published"
    # Columns line up: every row starts its DTYPE cell at the same offset.
    col = lines[0].index("DTYPE")
    assert all(line[col - 2:col] == "  " and line[col] != " " for line in lines)

    listed = json.loads(ok(daemon, "ls", "model/", "--json"))
    assert [t["name"] for t in listed] == ["model/inputs/0", "model/inputs/1"]
    t = listed[0]
    for key in ["dtype", "shape", "strides", "device", "nbytes", "state", "refcount",
                "owner_uid", "mode", "mutable", "lifetime", "created_ns", "id",
                "generation", "commit"]:
        assert key in t
    assert t["owner_uid"] == os.getuid() and t["state"] == "published"
    # Options may come first, too.
    assert json.loads(ok(daemon, "--json", "ls", "other"))[0]["name"] == "other.x:y-z_w"
    assert json.loads(ok(daemon, "ls", "nothing/", "--json")) == []
    assert ok(daemon, "ls", "nothing/").splitlines()[0].startswith("NAME")


def test_stats(daemon, tmp_path):
    ok(daemon, "put", "a", save(tmp_path / "a.npy", np.ones(1000, np.float64)))
    st = json.loads(ok(daemon, "stats", "--json"))
    for key in ["tensors", "clients", "leases", "uptime_seconds", "daemon_pid", "devices"]:
        assert key in st
    assert st["tensors"] >= 1 and st["daemon_pid"] == daemon.pid
    cpu = [d for d in st["devices"] if d["device"] == "cpu"]
    assert cpu and cpu[0]["device_used_bytes"] >= 8000
    # The raw form: a line per figure, then the tables.
    out = ok(daemon, "stats", "--raw")
    assert any(line.split()[:2] == ["tensors", str(st["tensors"])] for line in out.splitlines())
    assert any(line.startswith("uptime_seconds ") for line in out.splitlines())
    assert any(line.split()[:1] == ["cpu"] for line in out.splitlines())
    # The summary, as docs/tensorctl.md shows it.
    lines = ok(daemon, "stats").splitlines()
    head = dict(l.split(":", 1) for l in lines[:lines.index("")])
    assert list(head) == ["tensors", "clients", "leases", "uptime", "pid", "fds", "pool", "slabs",
                          "restart"]
    # A daemon started here has no service manager's store (docs/restart.md).
    assert head["restart"].strip() == "no descriptor store: a restart loses every tensor"
    assert head["tensors"].strip() == str(st["tensors"])
    assert head["pid"].strip() == str(daemon.pid)
    assert re.fullmatch(r" +\d+d \d\dh \d\dm \d\ds", head["uptime"]), head["uptime"]
    assert re.fullmatch(r" +[\d.]+ [KMGT]?i?B ready in \d+ memfds of [\d.]+ [KMGT]?i?B; "
                        r"\d+ hits, \d+ misses", head["pool"]), head["pool"]
    dev = next(i for i, l in enumerate(lines) if l.startswith("DEVICE"))
    assert lines[dev].split() == ["DEVICE", "BACKEND", "PATH", "TENSORS", "USED", "CAPACITY",
                                  "USE", "GPU", "MEMORY"]
    cpu = lines[dev + 1].split()
    assert cpu[:4] == ["cpu", "host", "memfd", str(cpu0_tensors(st))], cpu
    assert cpu[-2].endswith("%") and cpu[-1] == "-", cpu
    uid = next(i for i, l in enumerate(lines) if l.startswith("UID"))
    assert lines[uid].split()[:3] == ["UID", "USER", "CLIENTS"]
    assert lines[uid + 1].split()[0] == str(os.geteuid())
    # --raw, --json and --prometheus are one each.
    rc, _, err = ctl(daemon, "stats", "--raw", "--json")
    assert rc == 2 and "exclude each other" in err


def cpu0_tensors(st):
    cpu = next(d for d in st["devices"] if d["device"] == "cpu")
    return sum(cpu["device_tensors"].values())


def test_stats_names_unlinked_tensors_still_leased(daemon, tmp_path):
    import sys
    sys.path.insert(0, build_path("python"))
    tensord = pytest.importorskip("tensord", reason="the Python module is not built "
                                  "(a sanitizer build); it holds the lease")
    ok(daemon, "put", "held", save(tmp_path / "a.npy", np.ones(1000, np.float64)))
    with tensord.connect(daemon.socket) as c, c.attach("held"):
        ok(daemon, "rm", "held")
        head = ok(daemon, "stats").splitlines()[0]
        assert head == "tensors:  1 (1 unlinked, still leased: tensorctl leases)", head
    assert wait_until(lambda: ok(daemon, "stats").splitlines()[0] == "tensors:  0")


def test_put_options(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(3, np.int8))
    ok(daemon, "put", "m", f, "--mutable", "--mode", "0640")
    info = json.loads(ok(daemon, "stat", "m", "--json"))
    assert info["mutable"] is True and info["mode"] == "0640"
    assert info["lifetime"] == "persistent"
    ok(daemon, "put", "--lifetime=connection", "c", f)
    # The connection was tensorctl's own, so the tensor went with it.
    rc, _, err = ctl(daemon, "stat", "c")
    assert rc == 1 and "'c'" in err


def test_exit_codes_and_usage(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(3, np.int8))
    assert ctl(daemon, "--help")[0] == 0 and "usage" in ctl(daemon, "--help")[1]
    assert ctl(daemon, "-h")[0] == 0
    assert ctl(daemon, "put", "--help")[0] == 0
    rc, out, _ = ctl(daemon, "--version")
    assert rc == 0 and out.startswith("tensorctl ")
    for args in [(), ("bogus",), ("stat",), ("get", "x"), ("rm",), ("rm", "--prefix"),
                 ("rm", "a", "--group", "prefix"), ("ls", "--group", "name"),
                 ("put", "x", f, "--json"), ("ls", "--frobnicate"), ("stats", "x"),
                 ("wait", "x", "--timeout", "soon"), ("wait", "x", "--timeout", "-1"),
                 ("wait", "x", "--timeout"), ("put", "x", f, "--mode", "999"),
                 ("put", "x", f, "--lifetime", "forever"), ("get", "a", "b", "--mutable")]:
        rc, out, err = ctl(daemon, *args)
        assert rc == 2, f"{args}: exit {rc}, {err}"
        assert err.startswith("tensorctl: ") and "usage: tensorctl" in err
    # Operation errors exit 1 with the reason on stderr.
    ok(daemon, "put", "dup", f)
    rc, _, err = ctl(daemon, "put", "dup", f)
    assert rc == 1 and "dup" in err
    rc, _, err = ctl(daemon, "put", "bad name!", f)
    assert rc == 1 and err.startswith("tensorctl: ")
    rc, _, err = ctl(daemon, "get", "missing", str(tmp_path / "o.npy"))
    assert rc == 1 and "missing" in err and not (tmp_path / "o.npy").exists()
    rc, _, err = ctl(daemon, "get", "dup", str(tmp_path / "no/such/dir/o.npy"))
    assert rc == 1 and "no/such/dir/o.npy" in err


def test_rm_then_stat(daemon, tmp_path):
    ok(daemon, "put", "gone", save(tmp_path / "a.npy", np.ones(3)))
    ok(daemon, "rm", "gone")
    rc, out, err = ctl(daemon, "stat", "gone")
    assert rc == 1 and out == ""
    assert "gone" in err and ("no such tensor" in err or "ENOENT" in err)
    rc, _, err = ctl(daemon, "rm", "gone")
    assert rc == 1 and "gone" in err


def test_wait_times_out(daemon):
    t0 = time.monotonic()
    rc, out, err = ctl(daemon, "wait", "never/there", "--timeout", "0.5")
    elapsed = time.monotonic() - t0
    assert rc == 124 and out == "", "a timeout has its own status, as timeout(1)"
    assert "never/there" in err and err.startswith("tensorctl: ")
    assert 0.4 <= elapsed < 10


@pytest.mark.parametrize("json_out", [False, True])
def test_wait_returns_on_publish(daemon, tmp_path, json_out):
    argv = [CTL, "--socket", daemon.socket, "wait", "late", "--timeout", "30"]
    if json_out:
        argv.append("--json")
    w = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The wait is the daemon's before the put: else this tests a wait for an existing one.
        assert wait_until(lambda: daemon.stats().get("waiters") == 1 or w.poll() is not None,
                          timeout=30), daemon.stats()
        assert w.poll() is None, "wait returned before the tensor existed"
        ok(daemon, "put", "late", save(tmp_path / "a.npy", np.arange(4, dtype=np.int32)))
        out, err = w.communicate(timeout=15)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert w.returncode == 0, err
    if json_out:
        info = json.loads(out)
        assert info["name"] == "late" and info["shape"] == [4]
    else:
        assert out == ""


def test_wait_for_existing(daemon, tmp_path):
    ok(daemon, "put", "here", save(tmp_path / "a.npy", np.ones(2)))
    t0 = time.monotonic()
    ok(daemon, "wait", "here")
    assert time.monotonic() - t0 < 5


def refused_files(tmp_path):
    files = {
        "big-endian": save(tmp_path / "be.npy", np.arange(3, dtype=">f4")),
        "pickled": save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object)),
        "string": save(tmp_path / "str.npy", np.array([b"abc", b"de"])),
        "unicode": save(tmp_path / "uni.npy", np.array(["abc"])),
        "structured": save(tmp_path / "rec.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])),
    }
    good = (tmp_path / "be.npy").read_bytes()
    ok_bytes = open(save(tmp_path / "ok.npy", np.arange(100, dtype=np.float32)), "rb").read()
    (tmp_path / "trunc.npy").write_bytes(ok_bytes[:-10])
    files["truncated"] = str(tmp_path / "trunc.npy")
    (tmp_path / "magic.npy").write_bytes(b"PK\x03\x04 not a numpy file at all")
    files["bad magic"] = str(tmp_path / "magic.npy")
    (tmp_path / "long.npy").write_bytes(b"\x93NUMPY\x02\x00" + (1 << 20).to_bytes(4, "little")
                                        + good[12:])
    files["too long"] = str(tmp_path / "long.npy")
    files["missing"] = str(tmp_path / "does-not-exist.npy")
    return files


def test_refused_npy_variants(daemon, tmp_path):
    for what, path in refused_files(tmp_path).items():
        rc, out, err = ctl(daemon, "put", "r", path)
        assert rc == 1, f"{what}: exit {rc}"
        assert path in err, f"{what}: {err}"
        assert err.count("\n") == 1, f"{what}: not one line: {err!r}"
    # Nothing was created by any of them.
    assert json.loads(ok(daemon, "ls", "--json")) == []


def test_socket_from_environment(daemon, tmp_path):
    f = save(tmp_path / "a.npy", np.ones(2))
    ok(daemon, "put", "envname", f, socket=False, env={"TENSORD_SOCKET": daemon.socket})
    ok(daemon, "stat", "envname")


def test_no_daemon(tmp_path):
    class Nobody:
        socket = str(tmp_path / "nobody.sock")

    rc, _, err = ctl(Nobody, "ls")
    assert rc == 1 and "nobody.sock" in err


def test_not_found_and_timeout_differ(daemon):
    """A script can tell "no such tensor" (1) from "timed out" (124)."""
    assert ctl(daemon, "stat", "absent")[0] == 1
    assert ctl(daemon, "wait", "absent", "--timeout", "0")[0] == 1, "0: do not wait"
    assert ctl(daemon, "wait", "absent", "--timeout", "0.05")[0] == 124


def test_json_errors_are_json_on_stderr(daemon, tmp_path):
    rc, out, err = ctl(daemon, "stat", "absent", "--json")
    assert rc == 1 and out == ""
    e = json.loads(err)
    assert e["error"] == "ENOENT" and e["errno"] == 2 and "'absent'" in e["message"], e
    assert err.count("\n") == 1
    rc, out, err = ctl(daemon, "wait", "late", "--timeout", "0.1", "--json")
    e = json.loads(err)
    assert rc == 124 and e["error"] == "ETIMEDOUT" and e["errno"] == 110 and "late" in e["message"]

    class Nobody:
        socket = str(tmp_path / "nobody.sock")

    rc, _, err = ctl(Nobody, "ls", "--json")
    e = json.loads(err)
    assert rc == 1 and e["error"] == "ECONNREFUSED" and Nobody.socket in e["message"]
    # Without --json the same failure is one line of text.
    rc, _, err = ctl(Nobody, "ls")
    assert err.startswith("tensorctl: ") and not err.startswith("{")


def test_socket_that_is_no_socket_says_so(daemon, tmp_path):
    class At:
        socket = str(tmp_path)

    rc, _, err = ctl(At, "ls")
    assert rc == 1
    assert f"{tmp_path} is a directory, not a socket" in err, err
    assert os.path.join(str(tmp_path), "tensord.sock") in err
    (tmp_path / "plain").write_text("x")
    At.socket = str(tmp_path / "plain")
    rc, _, err = ctl(At, "ls")
    assert rc == 1 and f"{At.socket} is not a socket but a regular file" in err, err
    rc, _, err = ctl(At, "ls", "--json")
    assert json.loads(err)["error"] == "ENOTSOCK"


def test_put_force_replaces(daemon, tmp_path):
    ok(daemon, "put", "f", save(tmp_path / "a.npy", np.ones(3, np.int8)))
    rc, _, err = ctl(daemon, "put", "f", save(tmp_path / "b.npy", np.arange(5, dtype=np.int16)))
    assert rc == 1 and "already exists" in err and "--force" in err
    ok(daemon, "put", "f", str(tmp_path / "b.npy"), "--force")
    ok(daemon, "get", "f", str(tmp_path / "out.npy"))
    got = np.load(tmp_path / "out.npy")
    assert got.dtype == np.int16 and got.tolist() == [0, 1, 2, 3, 4]
    ok(daemon, "put", "--force", "g", str(tmp_path / "b.npy"))   # nothing to replace
    assert ctl(daemon, "get", "f", "x.npy", "--force")[0] == 2, "only put takes --force"


# --- hostile text is escaped (issue 18, item 18) -----------------------------------------

# Names as a user could type them, and the escaped form tensorctl must print.
HOSTILE = {
    "csi": (b"\x1b[31mred", r'"\033[31mred"'),
    "newline": (b"a\nb", r'"a\nb"'),
    "invalid utf-8": (b"x\xff\xfe", r'"x\377\376"'),
    "c1 csi": (b"\xc2\x9b2J", r'"\302\2332J"'),
    "bidi override": ("\u202eevil".encode(), r'"\342\200\256evil"'),
    "title": (b"\x1b]0;pwned\x07", r'"\033]0;pwned\007"'),
}
# What a terminal acts on rather than shows (the newline ends lines).
UNSAFE = set(range(0x20)) - {0x0a} | set(range(0x7f, 0xa0)) | \
    {0x061c, 0x200e, 0x200f} | set(range(0x2028, 0x202f)) | set(range(0x2066, 0x206a))


def ctl_raw(daemon, *args, socket=None):
    """tensorctl with bytes arguments; (exit status, stdout bytes, stderr bytes)."""
    argv = [CTL.encode(), b"--socket", (socket or daemon.socket).encode()] + [
        a if isinstance(a, bytes) else str(a).encode() for a in args]
    e = dict(os.environ)
    e.pop("TENSORD_SOCKET", None)
    r = subprocess.run(argv, capture_output=True, timeout=30, env=e)
    return r.returncode, r.stdout, r.stderr


def terminal_safe(b, what=""):
    """b is UTF-8 with no character a terminal acts on but the newline; its text."""
    text = b.decode("utf-8")      # strict: a stray byte fails here
    bad = [hex(ord(ch)) for ch in text if ord(ch) in UNSAFE]
    assert not bad, f"{what}: raw {bad} in {b!r}"
    return text


@pytest.mark.parametrize("kind", HOSTILE, ids=list(HOSTILE))
def test_hostile_name_in_argv_is_escaped(daemon, tmp_path, kind):
    name, shown = HOSTILE[kind]
    f = save(tmp_path / "a.npy", np.ones(3, np.int8))
    for args in [("rm", name), ("stat", name), ("wait", name, "--timeout", "0"),
                 ("get", name, str(tmp_path / "o.npy")), ("put", name, f),
                 ("leases", name), ("put", "--force", name, f)]:
        rc, out, err = ctl_raw(daemon, *args)
        assert rc == 1 and out == b"", (args, rc, out, err)
        text = terminal_safe(err, args[0])
        assert text.count("\n") == 1 and text.startswith("tensorctl: "), text
        assert f"tensor {shown}: " in text, text
    # The JSON errors are JSON, with JSON's escapes; invalid UTF-8 becomes U+FFFD.
    want = name.decode("utf-8", errors="replace")
    for args in [("stat", name, "--json"), ("wait", name, "--timeout", "0", "--json"),
                 ("ls", name, "--json"), ("leases", name, "--json")]:
        rc, out, err = ctl_raw(daemon, *args)
        text = terminal_safe(err, args[0])
        if rc == 0:    # ls PREFIX: a prefix nothing has is an empty list
            assert json.loads(out) == [] and args[0] in ("ls", "leases"), (args, out)
            continue
        e = json.loads(text)
        assert text.count("\n") == 1 and f"tensor '{want}'" in e["message"], e
        assert e["error"] == "EINVAL"
    # A usage error names the argument escaped too.
    rc, _, err = ctl_raw(daemon, b"bogus" + name)
    assert rc == 2 and shown[1:-1] in terminal_safe(err)
    rc, _, err = ctl_raw(daemon, "ls", b"--" + name)
    assert rc == 2 and shown[1:-1] in terminal_safe(err)
    # Nothing was made, and an honest user is still served.
    assert json.loads(ok(daemon, "ls", "--json")) == []
    ok(daemon, "put", "honest", f)
    assert ok(daemon, "ls").splitlines()[1].split()[0] == "honest"


def test_hostile_file_names_and_headers_are_escaped(daemon, tmp_path):
    rc, _, err = ctl_raw(daemon, "put", "x", str(tmp_path).encode() + b"/\x1b[2Jmissing.npy")
    assert rc == 1 and r"\033[2Jmissing.npy" in terminal_safe(err), err
    # A .npy whose header holds an escape: the reason quotes the file's bytes, escaped.
    raw = bytearray((tmp_path / "ok.npy").read_bytes() if (tmp_path / "ok.npy").exists()
                    else open(save(tmp_path / "ok.npy", np.ones(4, np.float32)), "rb").read())
    i = raw.index(b"<f4")
    raw[i:i + 3] = b"\x1b[m"
    (tmp_path / "esc.npy").write_bytes(bytes(raw))
    rc, _, err = ctl_raw(daemon, "put", "x", str(tmp_path / "esc.npy"))
    assert rc == 1 and r"\033[m" in terminal_safe(err), err
    rc, _, err = ctl_raw(daemon, "--socket", b"/tmp/\x1b[31m/none", "ls")
    assert rc == 1 and r"\033[31m" in terminal_safe(err), err


def test_hostile_daemon_strings_are_escaped(daemon, tmp_path):
    """Whatever the daemon sends (names, process names, backends, messages,
    metrics) is shown escaped: a relay rewrites the daemon's replies with
    escapes and stray bytes in place of names it knows, byte for byte."""
    from relay import Relay
    comm = open("/proc/self/comm", "rb").read().strip()   # the relay is the daemon's client
    evil = b"\x1b[2J\x1b[H\xff"
    relay = Relay(daemon.socket, str(tmp_path / "relay.sock"), replace=[
        (b"evilname", evil), (b"host", b"\x1b[5m"), (b"memfd", "\u202eab".encode()),
        (comm, (b"\x1b]0;" + b"\x07" * 16)[:len(comm)])])
    try:
        ok(daemon, "put", "evilname", save(tmp_path / "a.npy", np.ones(4, np.float32)))
        seen = {}
        for args in [("ls",), ("ls", "--json"), ("stat", "evilname"),
                     ("stat", "evilname", "--json"), ("stats",), ("stats", "--json"),
                     ("stats", "--prometheus"), ("leases",), ("leases", "--json"),
                     ("clients",), ("clients", "--json"), ("stat", "evilname/none"),
                     ("stat", "evilname/none", "--json"), ("wait", "evilname", "--json")]:
            rc, out, err = ctl_raw(daemon, *args, socket=relay.path)
            seen[args] = (rc, terminal_safe(out, args), terminal_safe(err, args))
            if args[-1] == "--json":
                if rc == 0:
                    json.loads(seen[args][1])
                else:
                    json.loads(seen[args][2])
        assert not relay.errors, relay.errors
    finally:
        relay.close()
    # The escapes are there, so the rewrites did reach tensorctl.
    assert r'"\033[2J\033[H\377"' in seen[("ls",)][1]
    assert seen[("ls",)][1].splitlines()[1].startswith(r'"\033[2J\033[H\377"  ')
    assert json.loads(seen[("ls", "--json")][1])[0]["name"] == "\x1b[2J\x1b[H\ufffd"
    assert r'name:     "\033[2J\033[H\377"' in seen[("stat", "evilname")][1]
    assert r'"\033[5m"' in seen[("stats",)][1] and r'"\342\200\256ab"' in seen[("stats",)][1]
    assert r"\033[5m" in seen[("stats", "--prometheus")][1]
    assert r'"\033]0;' in seen[("clients",)][1]
    assert json.loads(seen[("clients", "--json")][1])[0]["comm"].startswith("\x1b]0;")
    rc, _, err = seen[("stat", "evilname/none")]
    assert rc == 1 and r"'\033[2J\033[H\377/none'" in err, err
    e = json.loads(seen[("stat", "evilname/none", "--json")][2])
    assert "'\x1b[2J\x1b[H\ufffd/none'" in e["message"], e
    assert json.loads(seen[("wait", "evilname", "--json")][1])["name"] == "\x1b[2J\x1b[H\ufffd"


# --- put reads only regular files, and reads them (issue 18, item 19) -----------------------

def test_put_refuses_what_is_not_a_regular_file(daemon, tmp_path):
    """A FIFO with no writer would block open() forever; a directory, a
    device or a socket is no .npy either. Each is refused, named for what
    it is, before anything is opened or created. (timeout: a hang guard.)"""
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    sock_path = str(tmp_path / "sock.npy")
    import socket as socketmod
    s = socketmod.socket(socketmod.AF_UNIX)
    s.bind(sock_path)
    try:
        for path, what in [(str(fifo), "a FIFO (named pipe)"), (str(tmp_path), "a directory"),
                           ("/dev/zero", "a character device"), (sock_path, "a socket")]:
            try:
                rc, out, err = ctl(daemon, "put", "x", path, timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"put of {what} hung")
            assert rc == 1 and out == "", (path, rc, err)
            assert err == f"tensorctl: {path}: is {what}, not a regular file\n", err
            # Also as the target of a symbolic link.
            link = tmp_path / "link.npy"
            link.unlink(missing_ok=True)
            link.symlink_to(path)
            rc, _, err = ctl(daemon, "put", "x", str(link), timeout=20)
            assert rc == 1 and f"is {what}" in err, err
    finally:
        s.close()
    assert json.loads(ok(daemon, "stats", "--json"))["tensors"] == 0
    assert json.loads(ok(daemon, "ls", "--json")) == []
    ok(daemon, "put", "x", save(tmp_path / "a.npy", np.arange(5, dtype=np.int16)))
    ok(daemon, "get", "x", str(tmp_path / "o.npy"))
    assert np.load(tmp_path / "o.npy").tolist() == [0, 1, 2, 3, 4]


def truncating_relay(daemon, tmp_path, path, keep):
    """A relay that cuts the file at path to keep bytes when the Create
    request passes it: after tensorctl checked the file's size against its
    header, before it reads the data. Deterministic, and no preload."""
    from hostile import F_CREATE
    from relay import Relay
    cut = []

    def on_request(fields):
        if F_CREATE in fields:
            os.truncate(path, keep)
            cut.append(True)

    relay = Relay(daemon.socket, str(tmp_path / "relay.sock"), on_request=on_request)
    relay.cut = cut
    return relay


def big_file(tmp_path):
    a = np.arange(1 << 20, dtype=np.float32)            # 4 MiB of data
    path = save(tmp_path / "big.npy", a)
    with open(path, "rb") as f:
        npformat.read_magic(f)
        npformat.read_array_header_1_0(f)
        offset = f.tell()
    return path, offset, a.nbytes


def test_put_of_a_file_truncated_mid_put(daemon, tmp_path):
    """Another process cuts the file after put checked its size: a clear
    error naming the file and how much was read, never SIGBUS, and no
    tensor left half made."""
    path, offset, nbytes = big_file(tmp_path)
    relay = truncating_relay(daemon, tmp_path, path, offset + 1000)
    try:
        rc, out, err = ctl(daemon, "put", "cut", path, socket=False,
                           env={"TENSORD_SOCKET": relay.path})
        assert relay.cut and not relay.errors, relay.errors
    finally:
        relay.close()
    assert rc == 1, f"exit {rc} (-7 is SIGBUS): {err}"
    assert err == f"tensorctl: {path}: file shrank while reading (1000 of {nbytes} bytes)\n"
    # The draft went with tensorctl's connection: no tensor, no bytes, no lease.
    assert wait_until(lambda: daemon.stats().get("tensors") == 0), daemon.stats()
    st = daemon.stats()
    assert st["leases"] == 0 and all(d["device_used_bytes"] == 0 for d in st["devices"]), st
    assert json.loads(ok(daemon, "ls", "--json")) == []
    # The name is free, and a whole file goes in.
    path, _, _ = big_file(tmp_path)
    ok(daemon, "put", "cut", path)
    ok(daemon, "get", "cut", str(tmp_path / "o.npy"))
    assert np.array_equal(np.load(tmp_path / "o.npy"), np.load(path))


def test_put_force_of_a_truncated_file_keeps_the_old_version(daemon, tmp_path):
    old = np.arange(7, dtype=np.int64)
    ok(daemon, "put", "kept", save(tmp_path / "old.npy", old))
    path, offset, nbytes = big_file(tmp_path)
    relay = truncating_relay(daemon, tmp_path, path, offset + 1000)
    try:
        rc, _, err = ctl(daemon, "put", "--force", "kept", path, socket=False,
                         env={"TENSORD_SOCKET": relay.path})
        assert relay.cut and not relay.errors, relay.errors
    finally:
        relay.close()
    assert rc == 1 and "file shrank while reading" in err, err
    # The failed replace left the old version in place, attachable.
    rc, _, err = ctl(daemon, "get", "kept", str(tmp_path / "o.npy"))
    assert rc == 0, err
    assert np.load(tmp_path / "o.npy").tolist() == old.tolist()
