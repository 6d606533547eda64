"""Many leases, few mappings (issue 22).

Leases of one tensor in one client share its mapping while no stray write
has made a private copy of any of its pages (client/lib/import.c,
memfd_clean()); a write through one lease makes the mapping dirty, and the
next attach gets a mapping of its own. So a process holding many leases
of a few tensors holds a few mappings, far below vm.max_map_count
(65530), where it used to hold one per lease.
"""
import ctypes
import errno
import os
import subprocess
import sys

import numpy as np
import pytest


def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def poke(t, value):
    """A stray write: what a consumer that ignores the read-only flag does."""
    a = np.from_dlpack(t)
    ctypes.memset(a.__array_interface__["data"][0], value, a.nbytes)


# 1 KiB lives in a slab window; 1 MiB has a memfd of its own.
SIZES = {"slab": 256, "memfd": 256 << 10}


@pytest.mark.parametrize("where", SIZES)
def test_leases_of_one_tensor_share_one_mapping(client, where):
    ref = np.arange(SIZES[where], dtype=np.float32)
    client.put("many", ref)
    first = client.attach("many")
    before = mappings()
    held = [client.attach("many") for _ in range(20000)]
    # Without sharing this was 20000 more mappings.
    assert mappings() - before < 16
    for t in (held[0], held[-1]):
        np.testing.assert_array_equal(np.from_dlpack(t), ref)
    for t in held:
        t.release()
    first.release()


@pytest.mark.parametrize("where", SIZES)
def test_a_later_attach_never_sees_a_stray_write(client, daemon, where):
    ref = np.arange(SIZES[where], dtype=np.float32)
    client.put("cow", ref)
    a = client.attach("cow")
    b = client.attach("cow")  # clean: shares a's mapping
    poke(a, 0x7F)
    # The documented price of sharing: b, taken while the mapping was clean,
    # shows this process's own stray write ...
    assert np.from_dlpack(b).view(np.uint8).max() == 0x7F
    # ... but a later attach finds the mapping dirty and maps afresh,
    c = client.attach("cow")
    np.testing.assert_array_equal(np.from_dlpack(c), ref)
    # ... and another process never sees it.
    code = ("import numpy as np, tensord, sys; c = tensord.connect(sys.argv[1]); "
            "print(float(np.from_dlpack(c.attach('cow')).sum()))")
    out = subprocess.run([sys.executable, "-c", code, daemon.socket], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert float(out) == float(ref.sum())
    # The fresh mapping is clean: further leases share it, and see the published bytes.
    d = client.attach("cow")
    np.testing.assert_array_equal(np.from_dlpack(d), ref)
    for t in (a, b, c, d):
        t.release()
    with client.attach("cow") as e:
        np.testing.assert_array_equal(np.from_dlpack(e), ref)


def test_leases_past_one_connections_cap_over_several(daemon, monkeypatch):
    """The per-connection cap (262,144 leases) is a clear error; more
    connections hold more, and the mappings stay bounded by the tensors.
    Each attach here is a round trip (TENSORD_BIND=0): local leases served
    from a binding cost the daemon nothing and have no cap
    (test_bindings.py holds a million on one connection)."""
    import tensord

    monkeypatch.setenv("TENSORD_BIND", "0")
    cs = [tensord.connect(daemon.socket) for _ in range(2)]
    try:
        for i in range(8):
            cs[0].put(f"cap/{i}", np.full(64, i, np.float32))
        before = mappings()
        held = []
        with pytest.raises(OSError, match="too many leases"):
            while True:
                held.append(cs[0].attach(f"cap/{len(held) % 8}"))
        assert len(held) == 262144
        held += [cs[1].attach(f"cap/{i % 8}") for i in range(40000)]
        assert mappings() - before < 2 * 8 + 16
        assert np.from_dlpack(held[-1])[0] == (40000 - 1) % 8
        for t in held:
            t.release()
    finally:
        for c in cs:
            c.close()


MAP_LIMIT_CHILD = """
import errno, os, sys
import numpy as np, tensord
c = tensord.connect(sys.argv[1])
names = [f"lim/{i}" for i in range(int(sys.argv[2]))]
with open("/proc/self/maps") as f:
    base = sum(1 for _ in f)
# Room for about 200 mappings above what the process has, past the margin of 64.
os.environ["TENSORD_MAX_MAP_COUNT"] = str(base + 64 + 200)
held, err = [], None
try:
    for n in names:
        held.append(c.attach(n))
except tensord.Error as e:
    err = e
print("held", len(held), flush=True)
print("errno", err.errno if err else 0, flush=True)
print("msg", str(err).replace("\\n", " "), flush=True)
me = [x for x in c.clients() if x.pid == os.getpid()]
print("daemon-leases", me[0].leases, flush=True)
# Every lease still reads its tensor; the process makes threads and mappings.
ok = all(int(np.from_dlpack(t)[0]) == int(names.index(t.name)) for t in held)
import threading
th = threading.Thread(target=lambda: None)
th.start(); th.join()
print("ok", ok, flush=True)
for t in held[:50]:
    t.release()
t = c.attach(names[len(held)])
print("after-release", int(np.from_dlpack(t)[0]), flush=True)
"""


def test_mapping_limit_is_a_clear_error(client, daemon):
    """Issue 30: a process attaching many distinct tensors stopped near
    vm.max_map_count with glibc's "cannot allocate memory for thread-local
    data: ABORT". The library now refuses a mapping that would leave less
    than its margin below the limit, with EMFILE naming it, and releases
    the lease it got. TENSORD_MAX_MAP_COUNT lowers the limit for the test.
    The tensors are above the slab size (64 KiB), so each has a memfd and a
    mapping of its own: tensors in slabs share their slab's mapping (below)."""
    n = 400
    client.put_many({f"lim/{i}": np.full(10000, i, np.int64) for i in range(n)})
    before = {x.conn_id: x.leases for x in client.clients()}
    out = subprocess.run([sys.executable, "-c", MAP_LIMIT_CHILD, daemon.socket, str(n)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TENSORD_BIND": "0"})
    assert out.returncode == 0, out.stderr
    got = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    held = int(got["held"])
    assert 100 < held < n, out.stdout
    assert int(got["errno"]) == errno.EMFILE
    assert "vm.max_map_count" in got["msg"] and "memory mappings" in got["msg"], got["msg"]
    # The refused attach's lease was released: the daemon counts the ones held.
    assert int(got["daemon-leases"]) == held
    assert got["ok"] == "True"
    assert int(got["after-release"]) == held
    # The daemon serves on, and the child's leases ended with it.
    assert {x.conn_id: x.leases for x in client.clients()} == before
    with client.attach("lim/0") as t:
        assert int(np.from_dlpack(t)[0]) == 0
