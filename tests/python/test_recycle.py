"""Recycled memory (docs/recycle.md, issue 32): a writer's new versions go
into the memory of its old ones once every lease on them ended. What must
hold however the versions and readers race: every attach sees one whole
version, never bytes of another; a reader holding a version keeps its
bytes; memory never crosses an access class; a forked child's inherited
view never changes; nobody can write a published version; kill -9 at any
point leaves whole versions and leaks nothing."""
import fcntl
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import tensord
from tdutil import wait_until

MiB = 1 << 20
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 0x8)
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)


def figures(c):
    s = c.stats()
    return {k: s[k] for k in ("host_ring_buffers", "host_ring_bytes", "host_ring_hits_total",
                              "host_ring_tainted_total")}


def test_replaced_versions_reuse_memory_and_read_whole(client):
    a = np.empty(MiB // 4, np.float32)   # 1 MiB: a memfd of its own, not a slab
    hits0 = figures(client)["host_ring_hits_total"]
    for g in range(1, 31):
        a.fill(g)
        assert client.put("w", a, replace=True) == g
        with client.attach("w") as t:
            x = np.from_dlpack(t)
            assert x[0] == g and x[-1] == g and (x == g).all()
    f = figures(client)
    # The first two versions take new memory; every later one a freed one.
    assert f["host_ring_hits_total"] - hits0 >= 25, f
    # The ring holds what the versions in flight need, not one per version.
    assert f["host_ring_buffers"] <= 2, f
    client.unlink("w")
    assert wait_until(lambda: figures(client)["host_ring_buffers"] <= 2)


@pytest.fixture
def client(daemon, monkeypatch):
    """This module's client makes no reserves: a reserve's memfd, made by its
    thread at any moment, would show among the descriptors tests look at."""
    monkeypatch.setenv("TENSORD_RESERVE", "0")
    c = tensord.connect(daemon.socket)
    yield c
    c.close()


def test_sealed_and_switched_off_paths_take_fresh_memory(client, daemon_factory, child):
    a = np.ones(MiB, np.uint8)
    hits0 = figures(client)["host_ring_hits_total"]
    for _ in range(5):
        client.put("s", a, replace=True, sealed=True)
    client.put_many({"m/a": a, "m/b": a}, sealed=True)
    for _ in range(4):
        client.put_many({"m/a": a, "m/b": a}, replace=True, sealed=True)
    assert figures(client)["host_ring_hits_total"] == hits0
    # A sealed version is F_SEAL_WRITE, as before recycling.
    before = memfds()
    with client.attach("s") as t:
        assert np.from_dlpack(t).sum() == MiB
        seals = [fcntl.fcntl(fd, F_GET_SEALS) for fd in memfds() - before]
        assert seals and all(s & F_SEAL_WRITE for s in seals), seals
    # TENSORD_RECYCLE=0 in a writer's environment.
    ch = child("""
        import numpy as np, tensord
        c = tensord.connect()
        a = np.ones(1 << 20, np.uint8)
        for _ in range(5):
            c.put("e", a, replace=True)
        print("done", flush=True)
        """, env={"TENSORD_RECYCLE": "0"})
    ch.expect("done")
    assert figures(client)["host_ring_hits_total"] == hits0
    # --recycle off on the daemon.
    d = daemon_factory("--recycle", "off")
    with tensord.connect(d.socket) as c:
        for _ in range(5):
            c.put("o", a, replace=True)
        assert figures(c)["host_ring_hits_total"] == 0
        before = memfds()
        with c.attach("o") as t:
            seals = [fcntl.fcntl(fd, F_GET_SEALS) for fd in memfds() - before]
            assert seals and all(s & F_SEAL_WRITE for s in seals), seals


def memfds():
    """This process's descriptors of the daemon's memfds, as a set."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if "memfd:tensord" in link:
            out.add(int(fd))
    return out


def test_recycled_versions_are_sealed_against_every_writer(client, daemon):
    """The daemon's memfd of a published recycled version refuses write(),
    a new writable mapping and a writable reopen's writes, also to its own
    uid (here: the test's, which owns the daemon), and so does a reader's
    descriptor."""
    import mmap
    a = np.full(MiB, 3, np.uint8)
    for _ in range(4):
        client.put("w", a, replace=True)
    assert figures(client)["host_ring_hits_total"] >= 1
    before = memfds()
    with client.attach("w") as t:
        fds = memfds() - before
        assert fds
        for fd in fds:
            assert fcntl.fcntl(fd, F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)
            with pytest.raises(OSError):
                os.pwrite(fd, b"x", 0)
            path = "/proc/self/fd/%d" % fd
            try:
                w = os.open(path, os.O_RDWR)
            except PermissionError:
                continue
            try:
                with pytest.raises(OSError):
                    os.pwrite(w, b"x", 0)
                with pytest.raises(OSError):
                    mmap.mmap(w, MiB, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(w)
        assert (np.from_dlpack(t) == 3).all()
    # The daemon's own descriptors, reopened by its uid.
    pid = daemon.proc.pid
    tried = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        path = "/proc/%d/fd/%s" % (pid, fd)
        try:
            if "memfd:tensord" not in os.readlink(path):
                continue
            w = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            seals = fcntl.fcntl(w, F_GET_SEALS)
            if not seals & F_SEAL_FUTURE_WRITE:
                continue  # a pool memfd or a reserve: no version in it
            tried += 1
            with pytest.raises(OSError):
                os.pwrite(w, b"x", 0)
            with pytest.raises(OSError):
                mmap.mmap(w, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(w)
    assert tried >= 1
    with client.attach("w") as t:
        assert (np.from_dlpack(t) == 3).all()


READER = r"""
import sys, numpy as np, tensord
c = tensord.connect()
names = ["set/%02d" % i for i in range(int(sys.argv[1]))]
last, seen, bad, single = 0, set(), 0, 0
while True:
    s = c.attach_many(names, after=last)
    vals = {}
    for n, t in s.items():
        x = np.from_dlpack(t)
        g, i = int(x[0]), int(x[1])
        if not (x[2:] == g).all() or i != int(n[-2:]):
            bad += 1
        vals[n] = g
    gens = set(vals.values())
    if len(gens) != 1:
        bad += 1
    g = gens.pop()
    last = max(t.commit for t in s.values())
    seen.add(g)
    # A single member, on its own, as a bound or round-trip attach.
    with c.attach(names[g % len(names)]) as t:
        x = np.from_dlpack(t)
        if not (x[2:] == x[0]).all() or int(x[0]) < g:
            bad += 1
        single += 1
    for t in s.values():
        t.release()
    if len(seen) == 1:
        print("ready", flush=True)
    if g < 0:
        break
print("seen %d bad %d single %d" % (len(seen), bad, single), flush=True)
"""


def test_readers_racing_recycled_sets_see_whole_versions(client, child):
    members, versions, size = 8, 150, 256 * 1024 // 4   # 256 KiB each: not slabs
    arrays = {"set/%02d" % i: np.empty(size, np.int32) for i in range(members)}
    hits0 = figures(client)["host_ring_hits_total"]

    def fill(g):
        for i, (n, a) in enumerate(sorted(arrays.items())):
            a.fill(g)
            a[1] = i
    fill(1)
    client.put_many(arrays, replace=True)
    readers = [child("import sys; sys.argv = ['r', '%d']\n" % members + READER)
               for _ in range(3)]
    for r in readers:
        r.expect("ready")
    for g in list(range(2, versions + 1)) + [-1]:   # -1: the readers' last
        fill(g)
        client.put_many(arrays, replace=True)
        if g % 10 == 0:
            time.sleep(0.01)   # let slow readers catch a few
    for r in readers:
        line = r.expect("seen", timeout=120)
        _, seen, _, bad, _, single = line.split()
        assert int(bad) == 0, line
        assert int(seen) > 1, line
    f = figures(client)
    # The set is one allocation (docs/recycle.md, section 5): one ring
    # buffer a version, recycled as a whole.
    assert f["host_ring_hits_total"] - hits0 > versions // 2, f
    # Bounded by what readers held at once, not by the versions made.
    assert f["host_ring_buffers"] <= 8, f


def test_a_reader_holding_a_version_keeps_it_and_blocks_only_it(client):
    a = np.empty(MiB // 4, np.int32)
    for g in range(1, 6):
        a.fill(g)
        client.put("w", a, replace=True)
    held = client.attach("w")
    x = np.from_dlpack(held)
    assert (x == 5).all()
    hits0 = figures(client)["host_ring_hits_total"]
    for g in range(6, 206):
        a.fill(g)
        client.put("w", a, replace=True)
        assert x[0] == 5 and x[-1] == 5
    assert (x == 5).all()
    f = figures(client)
    assert f["host_ring_hits_total"] - hits0 >= 190, f
    assert f["host_ring_buffers"] <= 2, f
    with client.attach("w") as t:
        assert (np.from_dlpack(t) == 205).all()
    del x
    held.release()


def test_a_stray_write_by_a_reader_stays_in_its_process(client):
    torch = pytest.importorskip("torch")
    a = np.empty(MiB // 4, np.int32)
    a.fill(1)
    client.put("w", a, replace=True)
    with client.attach("w") as t:
        torch.from_dlpack(t).fill_(99)   # torch ignores the read-only flag: private pages
    for g in range(2, 8):
        a.fill(g)
        client.put("w", a, replace=True)
        with client.attach("w") as t:
            assert (np.from_dlpack(t) == g).all()
    assert figures(client)["host_ring_hits_total"] >= 4


def test_a_forked_child_keeps_its_inherited_version(client, child):
    a = np.empty(MiB // 4, np.int32)
    a.fill(7)
    client.put("w", a, replace=True)
    ch = child("""
        import os, sys, time, numpy as np, tensord
        c = tensord.connect()
        t = c.attach("w")
        x = np.from_dlpack(t)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            ok = True
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                ok = ok and bool((x == 7).all())
                time.sleep(0.01)
            os.write(w, b"ok" if ok else b"changed")
            os._exit(0)
        os.close(w)
        del x
        t.release()            # the parent lets go: the child still reads
        c.close()
        print("released", flush=True)
        print(os.read(r, 16).decode(), flush=True)
        os.waitpid(pid, 0)
        """)
    ch.expect("released")
    tainted0 = figures(client)["host_ring_tainted_total"]
    for g in range(8, 40):
        a.fill(g)
        client.put("w", a, replace=True)
    assert ch.expect() == "ok"
    assert figures(client)["host_ring_tainted_total"] >= 1 or tainted0 >= 1


WRITER = r"""
import numpy as np, tensord
c = tensord.connect()
a = np.empty(4 << 18, np.int32)   # 4 MiB
g = 0
while True:
    g += 1
    a.fill(g)
    c.put("k", a, replace=True)
    c.put_many({"ks/a": a, "ks/b": a}, replace=True)
    if g == 3:
        print("going", flush=True)
"""


def test_kill9_of_a_writer_leaves_whole_versions_and_leaks_nothing(client, child):
    base = client.stats()
    rnd = random.Random(32)
    for _ in range(6):
        w = child(WRITER)
        w.expect("going")
        time.sleep(rnd.uniform(0.0, 0.15))
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        with client.attach("k") as t:
            x = np.from_dlpack(t)
            assert (x == x[0]).all() and x[0] >= 1
            del x   # an array holds its lease
        s = client.attach_many(["ks/a", "ks/b"])
        xa, xb = np.from_dlpack(s["ks/a"]), np.from_dlpack(s["ks/b"])
        assert (xa == xa[0]).all() and (xb == xa[0]).all()
        del xa, xb
        for t in s.values():
            t.release()
    for n in ("k", "ks/a", "ks/b"):
        client.unlink(n)

    def back():
        s = client.stats()
        return (s["host_ring_buffers"], s["host_ring_bytes"], s["host_arenas"],
                s["tensors"]) == (0, 0, 0, base["tensors"])
    assert wait_until(back), {k: v for k, v in client.stats().items()
                              if k in ("host_ring_buffers", "host_ring_bytes", "host_arenas",
                                       "tensors")}


NOBODY = r"""
import os, sys
import numpy as np, tensord   # imported as root: nobody cannot read root's site-packages
os.setgroups([]); os.setgid(65534); os.setuid(65534)
c = tensord.connect(sys.argv[1])
kept, inodes = [], set()
secret = bytes([0xEE]) * 4096
saw = 0
for line in sys.stdin:
    if line.startswith("end"):
        break
    try:
        with c.attach("w") as t:
            x = np.from_dlpack(t)
            assert (x == x[0]).all()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    link = os.readlink("/proc/self/fd/" + fd)
                except OSError:
                    continue
                ino = os.fstat(int(fd)).st_ino
                if "memfd:tensord" in link and ino not in inodes:
                    inodes.add(ino)
                    kept.append(os.dup(int(fd)))
            del x
    except PermissionError:
        pass
    for fd in kept:
        if secret in os.pread(fd, 8 << 20, 0):
            saw += 1
    print("round", flush=True)
print("saw %d kept %d" % (saw, len(kept)), flush=True)
"""


@pytest.mark.other_uid
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_memory_never_crosses_an_access_class(daemon_factory):
    """Versions go 0644, 0644, 0600: a reader of another uid keeps a
    descriptor of every 0644 version it attached and reads them all after
    every 0600 version: the 0600 bytes never show."""
    sockdir = tempfile.mkdtemp(prefix="tensord-test-")
    os.chmod(sockdir, 0o755)
    d = daemon_factory("--mode", "0666", sub=sockdir)
    r = subprocess.Popen([sys.executable, "-c", NOBODY, d.socket], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    with tensord.connect(d.socket) as c:
        a = np.empty(MiB, np.uint8)
        for g in range(1, 41):
            # Two readable versions, then a private one: alternating would
            # hand every buffer the same class by chance.
            if g % 3:
                a.fill(0x11)
                c.put("w", a, replace=True, mode=0o644)
            else:
                a.fill(0xEE)
                c.put("w", a, replace=True, mode=0o600)
            r.stdin.write("go\n")
            r.stdin.flush()
            assert r.stdout.readline().startswith("round")
        r.stdin.write("end\n")
        r.stdin.flush()
        line = r.stdout.readline()
        assert line.startswith("saw 0 "), line
        assert int(line.split()[3]) > 0, line
        assert figures(c)["host_ring_hits_total"] >= 20
    r.wait(timeout=10)


def test_create_fill_publish_recycled(client, child):
    """create(recycle=True): the view is a ring buffer the writer maps
    already; each version reads whole, and a held view outlives the idle
    time (its buffer is never given back under it)."""
    n = MiB // 4
    hits0 = figures(client)["host_ring_hits_total"]
    for g in range(1, 21):
        t = client.create("c", (n,), "int32", replace=True, recycle=True)
        np.from_dlpack(t)[:] = g   # torch-free fill through the writable view
        t.publish()
        t.release()
        with client.attach("c") as r:
            assert (np.from_dlpack(r) == g).all()
    assert figures(client)["host_ring_hits_total"] - hits0 >= 15
    ch = child("""
        import time, numpy as np, tensord
        c = tensord.connect()
        t = c.create("held", (1 << 18,), "int32", recycle=True)
        v = np.from_dlpack(t)
        v[:] = 5
        t.publish()
        time.sleep(0.5)            # ten idle times: the buffer is pinned
        # Still mapped (read-only since the publish): no fault.
        print("ok %d" % int(v.sum() == 5 * (1 << 18)), flush=True)
        del v
        t.release()
        time.sleep(0.5)
        print("released", flush=True)
        time.sleep(30)
        """, env={"TENSORD_RECYCLE_IDLE_MS": "50"})
    assert ch.expect("ok") == "ok 1"
    ch.expect("released")
    with client.attach("held") as r:
        assert (np.from_dlpack(r) == 5).all()


def test_create_view_is_revoked_at_publish(client, child):
    """A recycled create's view is the writer's ring buffer, shared; its
    publish revokes it (read-only), so a write through it afterwards faults
    instead of changing what others read (CONTRACT.md: an error or a
    private copy, never a change others see). A plain create's view turns
    private at publish: the write stays in the creator's copy."""
    import ctypes
    n = MiB // 4
    t = client.create("p", (n,), "int32")
    np.from_dlpack(t)[:] = 1
    t.publish()
    a = np.from_dlpack(t)
    ctypes.memset(a.__array_interface__["data"][0], 9, 4)
    with client.attach("p") as r:
        assert np.from_dlpack(r)[0] == 1
    del a
    t.release()
    w = child("""
        import ctypes, numpy as np, tensord
        c = tensord.connect()
        t = c.create("q", (1 << 18,), "int32", recycle=True)
        np.from_dlpack(t)[:] = 1
        t.publish()
        a = np.from_dlpack(t)
        print("published", flush=True)
        ctypes.memset(a.__array_interface__["data"][0], 9, 4)
        print("wrote", flush=True)
        """)
    w.expect("published")
    assert w.proc.wait(timeout=60) == -signal.SIGSEGV, w.stderr()
    with client.attach("q") as r:
        assert (np.from_dlpack(r) == 1).all()


def test_a_reader_maps_a_ring_buffer_once(client, child):
    """A reader keeps a ring buffer mapped across the versions it holds
    (docs/recycle.md, section 0): attaching a later version in a buffer it
    read before takes no new mapping and no page fault, where a fresh
    mapping per version would fault every 16 pages (1,024 pages here)."""
    a = np.empty(MiB, np.int32)   # 4 MiB
    a.fill(1)
    client.put("v", a, replace=True)
    r = child("""
        import resource, sys, numpy as np, tensord
        c = tensord.connect()
        flt = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        maps = lambda: sum(1 for _ in open("/proc/self/maps"))
        last, n, faults, grown = c.attach("v").generation, 0, 0, 0
        print("ready", flush=True)
        while True:
            with c.attach("v", after=last) as t:
                f0, m0 = flt(), maps()
                x = np.from_dlpack(t)
                g = int(x[0])
                ok = int(x[::1024].sum()) == g * 1024   # every page read
                del x
                last = t.generation
            if not ok:
                print("bad", flush=True)
            if g < 0:
                break
            n += 1
            if n > 10:    # past the buffers' first use
                faults += flt() - f0
                grown += maps() - m0
            print("got", flush=True)
        print("faults %d grown %d n %d" % (faults, grown, n), flush=True)
        """)
    r.expect("ready")
    for g in range(2, 60):
        a.fill(g)
        client.put("v", a, replace=True)
        r.expect("got")          # one version at a time: the reader holds each
    a.fill(-1)
    client.put("v", a, replace=True)
    line = r.expect("faults")
    _, faults, _, grown, _, n = line.split()
    assert int(n) >= 55, line
    # 48 versions read whole: a fresh mapping each would fault ~64 times each.
    assert int(faults) < 48 * 4, line
    # Reading maps nothing: a few mappings may still come and go meanwhile
    # on the client's other threads (the reserve thread, the flusher letting
    # an idle share go), as a loaded CI machine showed (grown 2).
    assert int(grown) <= 4, line


def test_protect_makes_the_writers_mapping_read_only_between_versions(child):
    """TENSORD_RECYCLE_PROTECT=1: between versions the writer's own shared
    mapping of its ring buffers is read-only (a stray write of its process
    faults), writable again for the next version; without it, it stays
    writable (docs/security.md, "Recycled memory")."""
    code = """
        import numpy as np, tensord
        c = tensord.connect()
        a = np.empty(1 << 20, np.int32)
        for g in range(1, 9):
            a.fill(g)
            c.put("w", a, replace=True)
            with c.attach("w") as t:
                assert (np.from_dlpack(t) == g).all()
        perms = set()
        for line in open("/proc/self/maps"):
            f = line.split()
            # Shared mappings of tensors' memfds: the ring buffers (the
            # binding page is one too, never a tensor's).
            if len(f) >= 6 and "tensord" in f[5] and "bindings" not in f[5] and \
                    f[1].endswith("s"):
                perms.add(f[1])
        hits = c.stats()["host_ring_hits_total"]
        print("perms", ",".join(sorted(perms)), hits, flush=True)
        """
    on = child(code, env={"TENSORD_RECYCLE_PROTECT": "1", "TENSORD_RESERVE": "0"})
    _, perms, hits = on.expect("perms").split()
    assert perms == "r--s" and int(hits) >= 5, (perms, hits)
    off = child(code, env={"TENSORD_RESERVE": "0"})
    _, perms, hits = off.expect("perms").split()
    assert perms == "rw-s" and int(hits) >= 5, (perms, hits)


def test_a_slow_loop_still_recycles(child):
    """A buffer unused for TENSORD_RECYCLE_IDLE_MS (here 50 ms) is given
    back, unless its size is put regularly: then it is kept four put
    intervals (at most a minute), so a loop whose steps are slower than the
    idle time (here 150 ms) still recycles."""
    w = child("""
        import time, numpy as np, tensord
        c = tensord.connect()
        a = np.empty(1 << 18, np.int32)
        for g in range(1, 13):
            a.fill(g)
            c.put("slow", a, replace=True)
            time.sleep(0.15)
        print("hits", c.stats()["host_ring_hits_total"], flush=True)
        """, env={"TENSORD_RECYCLE_IDLE_MS": "50", "TENSORD_RESERVE": "0"})
    hits = int(w.expect("hits").split()[1])
    assert hits >= 6, hits


# --- a set in one allocation (docs/recycle.md, section 5) ---------------------------

SET_READER = r"""
import os, sys, numpy as np, tensord
c = tensord.connect()
names = ["big/%03d" % i for i in range(int(sys.argv[1]))]

def maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)

def memfds():
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "memfd:" in os.readlink("/proc/self/fd/" + fd):
                out.add(os.fstat(int(fd)).st_ino)
        except OSError:
            pass
    return out

c.attach_many(names[:1]).clear()     # the library's own first mappings
before = maps()
s = c.attach_many(names)
grown = maps() - before
ok = all(int(np.from_dlpack(s[n])[0]) == i and int(np.from_dlpack(s[n])[-1]) == i
         for i, n in enumerate(names))
print("grown", grown, "ok", ok, flush=True)
one = c.attach(names[7])
print("single", int(np.from_dlpack(one)[5]), flush=True)
"""


def test_a_set_is_one_allocation_mapped_once(client, child):
    """put_many lays its members out in one ring buffer: the daemon counts
    one arena, and a reader of 300 members takes one mapping, not 300
    (the reader maps at most 64 ring buffers; a set past that was mapped
    anew every version)."""
    n = 300
    arrays = {"big/%03d" % i: np.full(32 * 1024 + 8 * i, i, np.int32) for i in range(n)}
    client.put_many(arrays)
    st = client.stats()
    assert st["host_arenas"] == 1, st["host_arenas"]
    total = sum(a.nbytes for a in arrays.values())
    assert total <= st["host_arena_bytes"] < total + n * 4096
    r = child("import sys; sys.argv = ['r', '%d']\n" % n + SET_READER)
    line = r.expect("grown")
    _, grown, _, ok = line.split()
    assert ok == "True", line
    assert int(grown) <= 4, line
    assert r.expect("single") == "single 7"
    for name in arrays:
        client.unlink(name)
    assert wait_until(lambda: client.stats()["host_arenas"] == 0)


def test_a_reader_keeping_one_member_keeps_its_set(client):
    """A member leased from version g keeps g's whole arena, so its bytes
    never change; later versions recycle other arenas, and g's goes back to
    the ring when the lease ends."""
    arrays = {"ks/%d" % i: np.empty(MiB // 4, np.int32) for i in range(4)}

    def put(g):
        for a in arrays.values():
            a.fill(g)
        client.put_many(arrays, replace=True)
    put(1)
    held = client.attach("ks/2")
    x = np.from_dlpack(held)
    for g in range(2, 12):
        put(g)
        assert (x == 1).all()
        with client.attach("ks/1") as t:
            assert (np.from_dlpack(t) == g).all()
    st = figures(client)
    assert client.stats()["host_arenas"] >= 2
    del x
    held.release()
    assert wait_until(lambda: figures(client)["host_ring_buffers"] > st["host_ring_buffers"])
    put(12)
    # Replacing one member alone: its version is its own; the set still reads.
    a = np.full(MiB // 4, 99, np.int32)
    client.put("ks/0", a, replace=True)
    with client.attach("ks/0") as t:
        assert (np.from_dlpack(t) == 99).all()
    s = client.attach_many(sorted(arrays))
    assert [int(np.from_dlpack(s[n])[0]) for n in sorted(arrays)] == [99, 12, 12, 12]
    s.clear()
    put(13)
    for n in arrays:
        client.unlink(n)
    assert wait_until(lambda: client.stats()["host_arenas"] == 0)


def test_a_forked_reader_of_a_member_taints_its_set(client, child):
    arrays = {"fs/%d" % i: np.full(MiB // 4, 5, np.int32) for i in range(3)}
    client.put_many(arrays, replace=True)
    tainted0 = figures(client)["host_ring_tainted_total"]
    ch = child("""
        import os, time, numpy as np, tensord
        c = tensord.connect()
        t = c.attach("fs/1")
        x = np.from_dlpack(t)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            time.sleep(1.0)
            os.write(w, b"ok" if (x == 5).all() else b"changed")
            os._exit(0)
        os.close(w)
        del x
        t.release()
        c.close()
        print("released", flush=True)
        print(os.read(r, 16).decode(), flush=True)
        os.waitpid(pid, 0)
        """)
    ch.expect("released")
    assert figures(client)["host_ring_tainted_total"] == tainted0 + 1
    for g in range(6, 30):
        for a in arrays.values():
            a.fill(g)
        client.put_many(arrays, replace=True)
    assert ch.expect() == "ok"
