"""Replace never loses the old version (docs/design.md, "Replace"; issue 18,
items 4, 5 and 19's --force): the old version stays named and attachable
until the new one is published, and every failure before the publish (a
refused request, a client killed between create and publish, tensorctl
killed mid-copy) leaves it as it was. The Python client's cases are in
tests/python/test_replace.py."""
import json
import signal
import subprocess

import numpy as np

from conftest import build_path, wait_until
from hostile import Raw, create_body, f_varint, put_req
from test_core import Client

CTL = build_path("tensorctl")


def ctl(d, *args):
    r = subprocess.run([CTL, "--socket", d.socket, *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def stats(d):
    return json.loads(ctl(d, "stats", "--json"))


def test_create_replace_killed_before_publish(daemon):
    """A replacing client killed with SIGKILL between create and publish:
    the old version serves on, whole, and the draft leaves nothing."""
    owner = Client(daemon.socket)
    owner.ok("create r uint8 4096")
    owner.ok("fill r 7")
    owner.ok("publish r")
    owner.ok("release r")
    base = stats(daemon)
    repl = Client(daemon.socket)
    repl.ok("create r uint8 1048576 replace")
    repl.ok("fill r 9")
    # The draft exists and is charged, and the name is still the old one's.
    assert stats(daemon)["tensors"] == base["tensors"] + 1
    reader = Client(daemon.socket)
    reader.ok("attach r 0 mid")
    assert reader.ok("read mid 4095") == "7"
    repl.kill9()
    assert wait_until(lambda: stats(daemon)["tensors"] == base["tensors"]), stats(daemon)
    reader.ok("attach r 0 after")
    assert reader.ok("read after 0") == "7" and reader.ok("read after 4095") == "7"
    assert reader.kv("stat r")["nbytes"] == "4096"
    assert stats(daemon)["devices"][0]["device_used_bytes"] == base["devices"][0]["device_used_bytes"] + 0
    reader.close()
    owner.close()


def test_put_replace_with_a_wrong_byte_count(daemon):
    """A Put(replace) whose bytes do not match its shape is refused, and the
    old version is untouched (it used to be unlinked before the check)."""
    owner = Client(daemon.socket)
    owner.ok("create w uint8 16")
    owner.ok("fill w 5")
    owner.ok("publish w")
    owner.ok("release w")
    raw = Raw(daemon.socket)
    try:
        raw.hello()
        body = create_body("w", [32], code=1, bits=8) + f_varint(20, 1)   # replace
        rep = raw.call(put_req(9, body, b"\x01" * 31))
        assert rep.status == -22, rep                                   # EINVAL
        assert "31 bytes sent for a tensor of 32" in rep.message, rep.message
        # The right count replaces it.
        rep = raw.call(put_req(10, body, b"\x01" * 32))
        assert rep.status == 0, rep
    finally:
        raw.close()
    owner.ok("attach w 0 x")
    assert owner.ok("read x 31") == "1"
    owner.close()


def test_tensorctl_put_force_killed_mid_copy(daemon, tmp_path):
    """tensorctl put --force of a 256 MiB file, killed with SIGKILL once its
    draft exists: the name is never missing and holds the old version."""
    small, big = tmp_path / "small.npy", tmp_path / "big.npy"
    np.save(small, np.full(1 << 16, 1, np.uint8))
    np.save(big, np.full(256 << 20, 2, np.uint8))
    ctl(daemon, "put", "big", str(small))
    base = stats(daemon)["tensors"]
    reader = Client(daemon.socket)
    killed_mid_copy = False
    for _ in range(5):
        p = subprocess.Popen([CTL, "--socket", daemon.socket, "put", "--force", "big",
                              str(big)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill it once the daemon holds its draft (before its publish).
        wait_until(lambda: stats(daemon)["tensors"] > base or p.poll() is not None,
                   timeout=60, interval=0.001)
        p.send_signal(signal.SIGKILL)
        p.wait()
        reader.ok("attach big 0 v")
        nbytes = int(reader.kv("stat big")["nbytes"])
        first, last = reader.ok("read v 0"), reader.ok(f"read v {nbytes - 1}")
        reader.ok("release v")
        if p.returncode == -signal.SIGKILL and nbytes == 1 << 16:
            assert first == last == "1"
            killed_mid_copy = True
            break
        # It finished before the kill: the new version, whole. Again over the old one.
        assert (nbytes, first, last) == (256 << 20, "2", "2")
        ctl(daemon, "put", "--force", "big", str(small))
    assert killed_mid_copy, "tensorctl always finished before it could be killed"
    assert wait_until(lambda: stats(daemon)["tensors"] == base), stats(daemon)
    reader.close()
