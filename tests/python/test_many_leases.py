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
    The tensors are above the slab size (64 KiB) and sealed, so each has a
    memfd and a mapping of its own: tensors in slabs share their slab's
    mapping (below), and a recycled put_many's members their set's one
    (test_recycle.py)."""
    n = 400
    client.put_many({f"lim/{i}": np.full(10000, i, np.int64) for i in range(n)}, sealed=True)
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


CAP = 262144  # leases per connection


def test_a_million_distinct_leases(daemon, monkeypatch):
    """Issue 32 (docs/recycle.md, section 6): leases of many *distinct*
    small tensors took a mapping each (a window of its slab) and stopped
    near vm.max_map_count. A slab is now mapped once per client, whole, and
    a lease points into it: a million distinct 8-byte tensors (four slabs
    of 256-byte slots) over the four connections the per-connection cap
    needs take a handful of mappings. About 25 s and 2.5 GiB here."""
    import tensord

    monkeypatch.setenv("TENSORD_BIND", "0")  # every lease in the daemon's ledger
    n = 1_000_000
    w = tensord.connect(daemon.socket)
    cs = [tensord.connect(daemon.socket) for _ in range((n + CAP - 1) // CAP)]
    held = []
    try:
        names = [f"distinct/{i}" for i in range(n)]
        for k in range(0, n, 10_000):
            w.put_many({names[i]: np.full(1, i, np.int64) for i in range(k, min(n, k + 10_000))},
                       lifetime="connection")
        before = mappings()
        held = [cs[i // CAP].attach(names[i]) for i in range(n)]
        # One window per lease was a million mappings (the process aborted).
        assert mappings() - before < 1024, mappings() - before
        for i in list(range(0, n, 4999)) + [n - 1]:
            assert int(np.from_dlpack(held[i])[0]) == i
    finally:
        for t in held:
            t.release()
        for c in cs + [w]:
            c.close()


def addr(t):
    return np.from_dlpack(t).__array_interface__["data"][0]


def test_a_stray_write_stays_in_its_tensor(daemon, monkeypatch):
    """Leases of tensors in one slab point into one mapping of it. A stray
    write into one of them copies its page privately; that copy no longer
    follows the slab, so no neighbour on the page shows the write, and a
    tensor put later into the written slot (or any slot of that page) is
    read from the slab, exactly, in this process and in others. Once no
    lease of this process uses the page, the copy is dropped. (A binding
    keeps its lease, and the page in use, a while after the last local
    lease: TENSORD_BIND=0 makes every lease the daemon's.)"""
    import tensord

    monkeypatch.setenv("TENSORD_BIND", "0")
    client = tensord.connect(daemon.socket)
    client.put_many({f"nb/{i}": np.full(1, 1000 + i, np.int64) for i in range(8)})
    held = [client.attach(f"nb/{i}") for i in range(8)]
    # Neighbours 8 bytes apart in 256-byte slots: the same page of one mapping.
    pages = {addr(t) // 4096 for t in held}
    assert len(pages) <= 2, [hex(addr(t)) for t in held]
    poke(held[3], 0x7F)
    assert np.from_dlpack(held[3]).view(np.uint8).tolist() == [0x7F] * 8
    for i in (2, 4):
        assert int(np.from_dlpack(held[i])[0]) == 1000 + i
    # A later lease of a neighbour on the written page reads the slab itself.
    again = client.attach("nb/4")
    assert int(np.from_dlpack(again)[0]) == 1004
    # ... and leaves the writer's private copy alone while a lease uses it.
    assert np.from_dlpack(held[3]).view(np.uint8).tolist() == [0x7F] * 8
    # The written slot is freed, zeroed, and given to new tensors.
    held[3].release()
    client.unlink("nb/3")
    client.put_many({f"nb/new/{i}": np.full(1, 2000 + i, np.int64) for i in range(8)})
    for i in range(8):
        with client.attach(f"nb/new/{i}") as t:
            assert int(np.from_dlpack(t)[0]) == 2000 + i, i
    # The written copy stays this lease's, whatever became of the slot.
    code = ("import numpy as np, tensord, sys; c = tensord.connect(sys.argv[1]); "
            "print(' '.join(str(int(np.from_dlpack(c.attach(n))[0])) for n in sys.argv[2:]))")
    names = [f"nb/{i}" for i in (0, 2, 4, 7)] + [f"nb/new/{i}" for i in range(8)]
    out = subprocess.run([sys.executable, "-c", code, daemon.socket] + names,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == [str(x) for x in [1000, 1002, 1004, 1007] + list(range(2000, 2008))]
    for t in held[:3] + held[4:] + [again]:
        t.release()
    # No lease of this process uses the written page now: its private copy is
    # dropped, and the next leases point into the slab's mapping again.
    for name, want in (("nb/0", 1000), ("nb/new/0", 2000), ("nb/new/7", 2007)):
        with client.attach(name) as t:
            assert addr(t) // 4096 in pages and int(np.from_dlpack(t)[0]) == want, name
    for i in range(8):
        client.unlink(f"nb/new/{i}")
        if i != 3:
            client.unlink(f"nb/{i}")
    client.close()


FORK_SLAB = """
import os, sys
import numpy as np, tensord
c = tensord.connect(sys.argv[1])
n = 3000
c.put_many({f"fk/{i}": np.full(1, i, np.int64) for i in range(n)}, lifetime="connection")
held = [c.attach(f"fk/{i}") for i in range(n)]
with open("/proc/self/maps") as f:
    before = sum(1 for _ in f)
pid = os.fork()
if pid == 0:
    # The child's cache lets the slab's descriptor go; its inherited
    # leases keep the slab's mapping, and a new attach maps it anew.
    ok = all(int(np.from_dlpack(t)[0]) == i for i, t in enumerate(held))
    with c.attach("fk/7") as t:
        ok = ok and int(np.from_dlpack(t)[0]) == 7
    for t in held:
        t.release()
    os._exit(0 if ok else 1)
_, st = os.waitpid(pid, 0)
ok = all(int(np.from_dlpack(t)[0]) == i for i, t in enumerate(held))
with open("/proc/self/maps") as f:
    grew = sum(1 for _ in f) - before
print("child", os.waitstatus_to_exitcode(st), "parent", ok, "grew", grew, flush=True)
for t in held:
    t.release()
with c.attach("fk/9") as t:
    print("again", int(np.from_dlpack(t)[0]), flush=True)
"""


def test_forked_child_keeps_the_slab_mapping(daemon):
    """A child inherits the slab's whole mapping with the leases pointing
    into it: they read on after the child's cache let the slab go, and
    neither process unmaps anything under the other."""
    out = subprocess.run([sys.executable, "-c", FORK_SLAB, daemon.socket],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TENSORD_BIND": "0"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("child 0 parent True grew "), lines
    assert int(lines[0].split()[-1]) < 16
    assert lines[1] == "again 9"
