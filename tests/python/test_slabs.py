"""Small immutable tensors share slabs: names are not bounded by descriptors,
and a slab never lets a reader see or change what it could not attach."""
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import tensord
from tdutil import wait_until


def test_100k_names_with_few_descriptors_and_mappings(client, daemon):
    """100,000 named 4 KiB tensors: created, listed and attached (each checked)
    while the daemon holds fewer than 1,024 descriptors and this client, having
    attached every one of them, fewer than 1,024 descriptors and mappings."""
    n = 100_000
    base = np.arange(1024, dtype=np.float32)
    for i in range(n):
        client.put("many/%06d" % i, base + i)
    s = client.stats()
    assert s["tensors"] >= n
    assert s["open_fds"] < 1024, s["open_fds"]
    assert 1 <= s["host_slabs"] < 16, s["host_slabs"]
    assert s["host_slab_bytes"] >= n * 4096
    infos = client.list("many/")
    assert len(infos) == n and infos[12345].name == "many/012345"
    worst = 0
    for i in range(n):
        with client.attach("many/%06d" % i) as t:
            a = np.from_dlpack(t)
            assert a[0] == i and a[1023] == 1023 + i
        if i % 10_000 == 0:
            worst = max(worst, len(os.listdir("/proc/self/fd")),
                        sum(1 for _ in open("/proc/self/maps")))
    assert worst < 1024, worst
    assert client.stats()["open_fds"] < 1024
    del a  # the last array holds its lease
    for i in range(n):
        client.unlink("many/%06d" % i)

    def slabs():
        s = client.stats()
        return s["host_slabs"], s["host_slab_bytes"]
    # The leases of bound names end when this client's watcher sees them
    # unlinked, a moment after the unlink.
    assert wait_until(lambda: slabs() == (0, 0)), slabs()


def test_slot_is_zeroed_and_tensors_stay_apart(client):
    """Neighbours in a slab: each attach sees its own bytes, a freed slot's
    next tenant starts from what it was given, and a stray write stays private."""
    import torch
    client.put("a", np.full(100, 7, np.uint8))
    client.put("b", np.full(300, 9, np.uint8))
    with client.attach("a") as ta, client.attach("b") as tb:
        torch.from_dlpack(ta).fill_(1)  # torch ignores READ_ONLY: private copy
        assert np.from_dlpack(tb).tolist() == [9] * 300
    with client.attach("a") as ta:
        assert np.from_dlpack(ta).tolist() == [7] * 100
    client.unlink("a")
    client.put("c", np.zeros(100, np.uint8))
    with client.attach("c") as tc:
        assert np.from_dlpack(tc).tolist() == [0] * 100


NOBODY = r"""
import os, sys
import numpy as np, tensord   # imported as root: nobody cannot read root's site-packages
os.setgroups([]); os.setgid(65534); os.setuid(65534)
c = tensord.connect(sys.argv[1])
try:
    c.attach("priv")
    print("attached priv", flush=True)
except PermissionError:
    pass
t = c.attach("pub")
assert np.from_dlpack(t).tolist() == [0x22] * 64
marker = bytes([0x11]) * 64
for fd in os.listdir("/proc/self/fd"):
    path = "/proc/self/fd/" + fd
    try:
        link = os.readlink(path)
    except OSError:
        continue
    if "memfd:tensord" not in link:
        continue
    data = os.pread(int(fd), 64 << 20, 0)
    if marker in data:
        print("saw priv in", link, flush=True)
    for how in (os.O_RDWR, os.O_WRONLY):
        try:
            os.close(os.open(path, how))
            print("reopened for writing", link, flush=True)
        except PermissionError:
            pass
    try:
        os.pwrite(int(fd), b"x", 0)
        print("wrote", link, flush=True)
    except OSError:
        pass
print("done", flush=True)
"""


@pytest.mark.other_uid
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_other_uid_cannot_read_a_neighbour_or_write_the_slab(daemon_factory):
    sockdir = tempfile.mkdtemp(prefix="tensord-test-")
    os.chmod(sockdir, 0o755)
    d = daemon_factory("--mode", "0666", sub=sockdir)
    with tensord.connect(d.socket) as c:
        c.put("priv", np.full(64, 0x11, np.uint8))             # 0600
        c.put("pub", np.full(64, 0x22, np.uint8), mode=0o644)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(NOBODY), d.socket],
                           capture_output=True, text=True, timeout=60, env=env, cwd="/")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "done", r.stdout
        with c.attach("pub") as t:
            assert np.from_dlpack(t).tolist() == [0x22] * 64


def test_created_small_tensors_move_into_slabs(client, child):
    """Small immutable tensors made with create + publish (not put) also leave
    the daemon holding no descriptor of their own: publish copies them into
    their owner's slab. Another process reads every byte the creator wrote."""
    n = 5000
    before = client.stats()["open_fds"]
    for i in range(n):
        w = client.create("made/%04d" % i, (1024,), "float32")
        np.from_dlpack(w)[:] = np.arange(1024, dtype=np.float32) + i
        w.publish()
        w.release()
    s = client.stats()
    assert s["open_fds"] < before + 64, (before, s["open_fds"])
    assert s["host_slab_bytes"] >= n * 4096
    p = child("""
        import numpy as np, tensord
        c = tensord.connect()
        bad = [i for i in range(%d)
               if not np.array_equal(np.from_dlpack(c.attach("made/%%04d" %% i)),
                                     np.arange(1024, dtype=np.float32) + i)]
        print("bad", bad[:5], flush=True)
    """ % n)
    p.expect("bad []")
    # A mutable one stays in a memfd of its own, writable by its creator: this
    # uid's count of tensors with a descriptor grows by one (the daemon's own
    # descriptor count would also move as the child's connection closes).
    def own_fds():
        return {r["uid"]: r for r in client.stats()["uids"]}[os.geteuid()]["uid_fds"]

    fds = own_fds()
    with client.create("made/mutable", (1024,), "float32", mutable=True) as w:
        w.publish()
    assert own_fds() == fds + 1
