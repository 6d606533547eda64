"""Leases: who holds them, when they end, and that nothing leaks."""
import gc
import os
import threading
import time

import numpy as np
import pytest

from tdutil import fd_count, refcount, rss_bytes, wait_refcount

import tensord


def test_arrays_keep_the_lease_after_release(client):
    client.put("x", np.arange(6, dtype=np.int64))
    assert refcount(client, "x") == 0
    t = client.attach("x")
    assert refcount(client, "x") == 1
    a = np.from_dlpack(t)
    b = np.from_dlpack(t)
    t.release()
    assert refcount(client, "x") == 1, "a and b share the lease"
    del a
    assert refcount(client, "x") == 1
    assert b.tolist() == [0, 1, 2, 3, 4, 5]
    del b
    assert refcount(client, "x") == 0


def test_garbage_collected_tensor_releases(client):
    client.put("x", b"abc")
    t = client.attach("x")
    assert refcount(client, "x") == 1
    del t
    gc.collect()
    assert refcount(client, "x") == 0


def test_arrays_outlive_the_client(daemon):
    with tensord.connect(daemon.socket) as c:
        c.put("x", np.arange(4, dtype=np.float32))
        t = c.attach("x")
        a = np.from_dlpack(t)
    del t
    assert a.tolist() == [0, 1, 2, 3]


def test_many_cycles_leak_nothing(client, daemon):
    """100,000 attach/from_dlpack/release: refcount, fds and RSS come back."""
    client.put("cyc", np.arange(1024, dtype=np.float32))
    for _ in range(2000):  # warm up allocator caches before measuring
        with client.attach("cyc") as t:
            np.from_dlpack(t)
    gc.collect()
    fds, rss, dfds = fd_count(), rss_bytes(), daemon.fd_count()
    t0 = time.perf_counter()
    for i in range(100_000):
        t = client.attach("cyc")
        a = np.from_dlpack(t)
        t.release()
        del a
    dt = time.perf_counter() - t0
    gc.collect()
    print(f"\n100000 attach/from_dlpack/release cycles: {dt:.2f} s, "
          f"{100_000 / dt:,.0f}/s, RSS {rss >> 20} -> {rss_bytes() >> 20} MiB")
    assert refcount(client, "cyc") == 0
    assert fd_count() == fds
    assert daemon.fd_count() == dfds
    assert rss_bytes() - rss < 16 << 20


def test_eight_threads_attach_and_release(client):
    client.put("mt", np.ones(4096, np.float64))
    errors = []
    start = threading.Barrier(8)

    def work():
        try:
            start.wait()
            for _ in range(1000):
                t = client.attach("mt")
                a = np.from_dlpack(t)
                if a[4095] != 1.0:
                    raise AssertionError("bad data")
                t.release()
                del a
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert refcount(client, "mt") == 0


@pytest.mark.parametrize("how", ["return", "os._exit", "SIGKILL"])
def test_exiting_process_releases_its_leases(client, child, how):
    client.put("held", np.zeros(16))
    p = child("""
        import os, signal, sys
        import numpy as np, tensord
        c = tensord.connect()
        t = c.attach("held")
        u = c.attach("held")
        a = np.from_dlpack(t)
        cap = u.__dlpack__(max_version=(1, 0))
        print("holding", flush=True)
        sys.stdin.readline()
        how = %r
        if how == "os._exit":
            os._exit(0)
        if how == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
    """ % how)
    p.expect("holding")
    assert refcount(client, "held") == 2
    p.send()
    p.proc.wait(timeout=60)
    assert wait_refcount(client, "held", 0) == 0


def test_one_gib_attaches_as_fast_as_four_kib(client):
    """Attach cost must not grow with size; printed, not asserted (timing is noisy)."""
    with client.create("big", (1 << 30,), "uint8") as w:
        w.publish()
    client.put("small", np.zeros(4096, np.uint8))

    def per_attach(name, n=200):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                with client.attach(name) as t:
                    np.from_dlpack(t)
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    small, big = per_attach("small"), per_attach("big")
    print(f"\nattach + from_dlpack + release: 4 KiB {small * 1e6:.1f} us, "
          f"1 GiB {big * 1e6:.1f} us")
    with client.attach("big") as t:
        a = np.from_dlpack(t)
        assert a.nbytes == 1 << 30 and a[-1] == 0
    client.unlink("big")


def test_kill9_during_put_create_and_attach_leaks_nothing(client, daemon):
    """Clients killed at random points of put (inline and through the pool),
    create and attach: the daemon's tensors, leases, bytes and descriptors
    (less the pool's ready memfds) come back to where they were."""
    import random
    import signal
    import subprocess
    import sys

    client.put("shared/k", np.arange(1 << 18, dtype=np.float32))  # 1 MiB, from the pool
    loop = r"""
import os, numpy as np, tensord
c = tensord.connect()
small, big = np.ones(2048, np.float32), np.ones(3 << 18, np.float32)
i = 0
while True:
    i += 1
    c.put("victim/%d/s/%d" % (os.getpid(), i), small, lifetime="connection")
    c.put("victim/%d/b/%d" % (os.getpid(), i), big, lifetime="connection")
    w = c.create("victim/%d/c/%d" % (os.getpid(), i), (1 << 18,), "float32",
                 lifetime="connection")
    np.from_dlpack(w)[:] = 1
    t = c.attach("shared/k")
    np.from_dlpack(t).sum()
    if i % 3:
        t.release()
        w.publish()
"""
    time.sleep(0.3)
    base = client.stats()
    base_fds = daemon.fd_count()
    rng = random.Random(7)
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    for _ in range(12):
        p = subprocess.Popen([sys.executable, "-c", loop], env=env)
        time.sleep(0.25 + rng.random() * 0.5)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def settled():
        s = client.stats()
        return (s["tensors"], s["leases"], s["devices"][0]["device_used_bytes"]) == (
            base["tensors"], base["leases"], base["devices"][0]["device_used_bytes"])

    deadline = time.monotonic() + 20
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled(), (client.stats(), base)
    assert refcount(client, "shared/k") == 0
    deadline = time.monotonic() + 20
    while daemon.fd_count() != base_fds and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.fd_count() == base_fds
    assert client.stats()["host_pool_hits_total"] > 0, "the pool served some of the puts"
