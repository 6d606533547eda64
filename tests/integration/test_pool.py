"""The host memory pool against a real daemon: --pool bounds it, 0 turns it
off, a create of a size clients use is served from it, and stats count it."""
import os
import subprocess

import numpy as np

from conftest import build_path, wait_until

CTL = build_path("tensorctl")
MiB = 1 << 20


def put(d, tmp_path, name, nbytes):
    path = str(tmp_path / (name.replace("/", "_") + ".npy"))
    np.save(path, np.ones(nbytes, np.uint8))
    r = subprocess.run([CTL, "--socket", d.socket, "put", name, path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def pool(d):
    s = d.stats()
    return s["host_pool_fds"], s["host_pool_bytes"], s["host_pool_budget_bytes"], \
        s["host_pool_hits_total"], s["host_pool_misses_total"]


def test_pool_serves_repeated_sizes_within_its_budget(daemon_factory, tmp_path):
    d = daemon_factory("--pool", "10Mi")
    assert pool(d) == (0, 0, 10 * MiB, 0, 0)
    put(d, tmp_path, "p/0", 4 * MiB)  # the first of a size: a miss, and now wanted
    assert wait_until(lambda: pool(d)[0] == 2)
    fds, nbytes, budget, hits, misses = pool(d)
    assert (nbytes, hits, misses) == (8 * MiB, 0, 1)
    put(d, tmp_path, "p/1", 4 * MiB)
    assert pool(d)[3] == 1, "the second put of that size came from the pool"
    # 8 MiB does not fit beside what is ready: wanted, but never held.
    put(d, tmp_path, "p/2", 8 * MiB)
    assert wait_until(lambda: pool(d)[1] == 8 * MiB)
    assert pool(d)[1] <= budget
    # The tensors are whole and right, wherever their memory came from.
    out = tmp_path / "back.npy"
    for name, n in (("p/0", 4 * MiB), ("p/1", 4 * MiB), ("p/2", 8 * MiB)):
        r = subprocess.run([CTL, "--socket", d.socket, "get", name, str(out)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        a = np.load(out)
        assert a.size == n and int(a.sum()) == n


def test_pool_zero_keeps_nothing_and_still_frees(daemon_factory, tmp_path):
    d = daemon_factory("--pool", "0")
    base = d.fd_count()
    for i in range(3):
        put(d, tmp_path, "z/%d" % i, 2 * MiB)
    fds, nbytes, budget, hits, misses = pool(d)
    assert (fds, nbytes, budget, hits, misses) == (0, 0, 0, 0, 3)
    r = subprocess.run([CTL, "--socket", d.socket, "rm", "z/0"], capture_output=True)
    assert r.returncode == 0
    # Three tensors, one removed: two descriptors more than before.
    assert wait_until(lambda: d.fd_count() == base + 2)


def test_pool_option_is_checked(tmp_path):
    r = subprocess.run([build_path("tensord"), "--socket", str(tmp_path / "s"), "--pool", "lots"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "--pool lots" in r.stderr and "not a size" in r.stderr
    assert not os.path.exists(tmp_path / "s")
