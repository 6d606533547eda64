"""The reserve (docs/design.md, "The reserve"): host memory the library keeps
mapped ahead of a process's large creates, owned and charged by the daemon.

Behaviour only, never timings: a put and a create + fill + publish that go
through a reserve show exactly their bytes, never an earlier tensor's; a
reserve is charged while it is held and given back (idle, close, kill -9);
a forked child never holds its parent's reserve, and its puts work; what
was published from a reserve is sealed.

Recycled memory (docs/recycle.md) serves a writer's puts from its ring once
two buffers of the size are mapped, and turns a reserve a put consumes into
a ring buffer; these tests are of the reserve alone, so their clients put
with TENSORD_RECYCLE=0 (test_recycle.py has the reserve and the ring together).
"""
import ctypes
import fcntl
import mmap
import os
import signal

import numpy as np
import pytest

from tdutil import wait_until

import tensord

MiB = 1 << 20


@pytest.fixture(autouse=True)
def reserves_alone(monkeypatch):
    """Clients this module makes (and their children) recycle nothing."""
    monkeypatch.setenv("TENSORD_RECYCLE", "0")
N = 4 * MiB  # bytes of each tensor: a size class of its own (4 MiB)
F_GET_SEALS = 1034
F_SEAL_SHRINK = 0x0002
F_SEAL_WRITE = 0x0008


def figures(client):
    s = client.stats()
    return {
        "reserves": s["host_reserves"],
        "reserve_bytes": s["host_reserve_bytes"],
        "used": s["devices"][0]["device_used_bytes"],
        "uid_bytes": sum(u["uid_bytes"] for u in s["uids"]),
        "uid_fds": sum(u["uid_fds"] for u in s["uids"]),
    }


def creates(client):
    return client.stats()["host_reserve_creates_total"]


def ready(client, n=1):
    """Waits until n reserves are ready (the library makes them off the caller's thread)."""
    assert wait_until(lambda: client.stats()["host_reserves"] >= n, 20), client.stats()


def warm(client, nbytes=N):
    """Two creates of a size within the idle time make it one the library
    keeps ready; waits until it is."""
    for i in range(2):
        client.put("warm/%d" % i, np.zeros(nbytes, np.uint8))
        client.unlink("warm/%d" % i)
    ready(client)


def read(daemon, name):
    with tensord.connect(daemon.socket) as other, other.attach(name) as t:
        return np.from_dlpack(t).copy()


def test_put_and_create_through_a_reserve_show_only_their_bytes(client, daemon):
    warm(client)
    rng = np.random.default_rng(7)
    a = rng.integers(1, 256, N, dtype=np.uint8)
    before = creates(client)
    client.put("a", a)
    assert creates(client) == before + 1, "the put went through the reserve"
    assert np.array_equal(read(daemon, "a"), a)
    client.unlink("a")

    # The next one of the same size: a strided source, other bytes.
    ready(client)
    wide = rng.integers(1, 256, (N // 1024, 2048), dtype=np.uint8)
    b = wide[:, ::2]
    assert not b.flags.c_contiguous
    client.put("b", b)
    assert creates(client) == before + 2
    assert np.array_equal(read(daemon, "b"), b)
    client.unlink("b")

    # A create that fills only its first bytes: the rest is zero, never
    # what a or b held.
    ready(client)
    w = client.create("c", (N,), "uint8")
    x = np.from_dlpack(w)
    x[:1000] = 5
    del x
    w.publish()
    w.release()
    assert creates(client) == before + 3
    got = read(daemon, "c")
    assert (got[:1000] == 5).all()
    assert not got[1000:].any(), "a fresh tensor shows zeroes where it was not written"


def test_reserve_is_charged_while_held_and_given_back(client, daemon):
    base = figures(client)
    fds = daemon.fd_count()
    c = tensord.connect(daemon.socket)
    c.put("p/0", np.ones(N, np.uint8))
    c.unlink("p/0")
    assert figures(client)["reserves"] == 0, "one create of a size reserves nothing"
    c.put("p/1", np.ones(N, np.uint8))
    c.unlink("p/1")
    # Two of a size this small (a put right after a put finds one).
    ready(client, 2)
    held = figures(client)
    assert held["reserves"] == 2
    assert held["reserve_bytes"] == 2 * N
    # Charged as memory of the uid's: the host's bytes, the uid's bytes and
    # descriptors, and a descriptor of the daemon's each (beside c's socket).
    assert held["used"] == base["used"] + 2 * N
    assert held["uid_bytes"] == base["uid_bytes"] + 2 * N
    assert held["uid_fds"] == base["uid_fds"] + 2
    assert wait_until(lambda: daemon.fd_count() == fds + 3, 20)
    c.close()
    assert wait_until(lambda: figures(client) == base, 20), (figures(client), base)
    assert wait_until(lambda: daemon.fd_count() == fds, 20)


def test_idle_reserve_goes_back_without_a_close(client, daemon):
    base = figures(client)
    warm(client)
    # Nobody creates that size any more: given back after its idle time.
    assert wait_until(lambda: figures(client) == base, 20), (figures(client), base)


def test_kill9_of_a_client_holding_a_reserve_leaves_nothing(child, client, daemon):
    base = figures(client)
    fds = daemon.fd_count()
    p = child(f"""
        import numpy as np, sys, tensord
        c = tensord.connect()
        for i in range(3):
            c.put("k/%d" % i, np.ones({N}, np.uint8))
            c.unlink("k/%d" % i)
        print("put", flush=True)
        sys.stdin.readline()
    """)
    p.expect("put")
    ready(client)
    assert figures(client)["reserve_bytes"] >= N
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait()
    assert wait_until(lambda: figures(client) == base, 20), (figures(client), base)
    assert wait_until(lambda: daemon.fd_count() == fds, 20)


def test_forked_child_puts_and_never_holds_the_parents_reserve(child, client, daemon):
    """The parent has a reserve mapped when it forks. The child has no
    mapping and no descriptor of it, and its put goes over a connection of
    its own; while the child lives, the parent puts from its reserve and
    publishes (a child holding a writable shared mapping of it would make
    that publish fail with EBUSY)."""
    p = child(f"""
        import os, time
        import numpy as np, tensord
        N = {N}
        c = tensord.connect()
        for i in range(3):
            c.put("f/%d" % i, np.zeros(N, np.uint8))
            c.unlink("f/%d" % i)
        while c.stats()["host_reserves"] < 1:
            time.sleep(0.01)

        def reserve_maps():
            with open("/proc/self/maps") as f:
                return [l for l in f if "tensord:pool" in l]

        def reserve_fds():
            out = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if "tensord:pool" in os.readlink("/proc/self/fd/" + fd):
                        out.append(fd)
                except OSError:
                    pass
            return out

        # The daemon counts the reserve as it answers; the client's own
        # thread maps it a moment later.
        end = time.monotonic() + 10
        while not (reserve_maps() and reserve_fds()) and time.monotonic() < end:
            time.sleep(0.01)
        assert reserve_maps() and reserve_fds(), "the parent maps its reserve"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            maps, fds = reserve_maps(), reserve_fds()
            os.read(r, 1)                   # the parent published from its reserve
            c.put("child", np.full(N, 3, np.uint8))
            os._exit(0 if not maps and not fds else 1)
        created = c.stats()["host_reserve_creates_total"]
        c.put("parent", np.full(N, 2, np.uint8))
        assert c.stats()["host_reserve_creates_total"] == created + 1
        os.write(w, b"x")
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0, "the child held the parent's reserve"
        with c.attach("child") as t:
            assert (np.from_dlpack(t) == 3).all()
        with c.attach("parent") as t:
            assert (np.from_dlpack(t) == 2).all()
        print("ok", flush=True)
    """)
    p.expect("ok")
    p.finish()


def sealed(tensor_fd_label="tensord:pool"):
    """The seals of this process's descriptors of pool memfds."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if tensor_fd_label in os.readlink("/proc/self/fd/" + fd):
                out.append(fcntl.fcntl(int(fd), F_GET_SEALS))
        except OSError:
            pass
    return out


def test_published_from_a_reserve_is_immutable(client, daemon):
    warm(client)
    before = creates(client)
    w = client.create("m", (N,), "uint8")
    x = np.from_dlpack(w)
    x[:] = 1
    w.publish()
    assert creates(client) == before + 1
    # The creator's view, made before the publish, writes privately now.
    x[0] = 99
    with tensord.connect(daemon.socket) as other, other.attach("m") as t:
        y = np.from_dlpack(t)
        assert y[0] == 1 and not y.flags.writeable
        assert (y == 1).all()
    del x
    w.release()
    # A put's tensor: sealed against writes, whoever holds its descriptor.
    ready(client)
    client.put("n", np.full(N, 4, np.uint8))
    assert creates(client) == before + 2
    with tensord.connect(daemon.socket) as other, other.attach("n") as t:
        # Tensors' memfds are sealed against shrinking; a reserve's only
        # against growing (this process's next one may be among them).
        seals = [s for s in sealed() if s & F_SEAL_SHRINK]
        assert seals and all(s & F_SEAL_WRITE for s in seals), seals
        assert (np.from_dlpack(t) == 4).all()


def test_a_put_from_a_source_that_faults_still_fails_cleanly(client):
    """The copy into a reserve is a memcpy(), which would crash on a page
    that cannot be read; put checks the source first and lets pwrite()
    answer EFAULT instead."""
    size = 8 * MiB
    warm(client, size)
    buf = mmap.mmap(-1, size)
    src = np.frombuffer(buf, np.uint8)
    src[:] = 4
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    addr = src.ctypes.data
    assert libc.mprotect(addr + size // 2, 65536, 0) == 0, ctypes.get_errno()
    before = creates(client)
    try:
        with pytest.raises(ValueError) as e:
            client.put("bad", src)
        assert "Bad address" in str(e.value), e.value
    finally:
        libc.mprotect(addr + size // 2, 65536, mmap.PROT_READ | mmap.PROT_WRITE)
    assert creates(client) == before + 1, "the failed put had taken the reserve"
    with pytest.raises(FileNotFoundError):
        client.stat("bad")
    ready(client)
    client.put("good", src)
    assert (read_self(client, "good") == 4).all()


def read_self(client, name):
    with client.attach(name) as t:
        return np.from_dlpack(t).copy()


def test_reserve_off_makes_none(child, client, daemon):
    p = child(f"""
        import numpy as np, tensord, time
        c = tensord.connect()
        for i in range(4):
            c.put("o/%d" % i, np.ones({N}, np.uint8))
        time.sleep(0.3)
        print("reserves", c.stats()["host_reserves"], flush=True)
    """, env={"TENSORD_RESERVE": "0"})
    assert p.expect("reserves") == "reserves 0"
    p.finish()


def test_on_one_cpu_reserves_are_still_made_by_a_batch_thread(child):
    """Confined to one CPU, the reserve's thread runs SCHED_BATCH (it never
    preempts the caller on waking) and still makes reserves that puts use;
    given two CPUs again, it goes back to SCHED_OTHER."""
    p = child(f"""
        import os, numpy as np, tensord, time

        def policies():
            out = {{}}
            for tid in os.listdir("/proc/self/task"):
                try:
                    out[int(tid)] = os.sched_getscheduler(int(tid))
                except OSError:
                    pass
            return out

        def wait_reserve(c, n):
            end = time.monotonic() + 20
            while c.stats()["host_reserves"] < n and time.monotonic() < end:
                time.sleep(0.01)
            return c.stats()["host_reserves"] >= n

        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:1])  # this thread, and the ones it starts
        c = tensord.connect()
        for i in range(2):
            c.put("b/%d" % i, np.ones({N}, np.uint8))
        print("ready", wait_reserve(c, 1), flush=True)
        before = c.stats()["host_reserve_creates_total"]
        c.put("b/x", np.ones({N}, np.uint8))
        print("used", c.stats()["host_reserve_creates_total"] - before, flush=True)
        print("batch", sum(p == os.SCHED_BATCH for p in policies().values()), flush=True)
        if len(cpus) < 2:
            print("other", 0, flush=True)
        else:
            for tid in policies():
                os.sched_setaffinity(tid, cpus)
            # A put takes a reserve; making the next one reads the CPUs again.
            c.put("b/y", np.ones({N}, np.uint8))
            wait_reserve(c, 1)
            c.put("b/z", np.ones({N}, np.uint8))
            wait_reserve(c, 1)
            print("other", sum(p == os.SCHED_BATCH for p in policies().values()), flush=True)
        c.close()
    """)
    assert p.expect("ready") == "ready True"
    assert p.expect("used") == "used 1"
    assert p.expect("batch") == "batch 1"
    assert p.expect("other") == "other 0"
    p.finish()
