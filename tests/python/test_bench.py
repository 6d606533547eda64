"""bench/py_attach.py and bench/py_put.py run and print their figures."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")


def test_py_attach_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_attach.py"), "--socket",
                        daemon.socket, "--seconds", "0.2", "--procs", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3
    assert re.match(r"py_attach: 1 client: +[\d,]+ attach\+from_dlpack\+release/s", lines[0])
    assert re.match(r"py_attach: tensord [\d.]+ us, SharedMemory\(name\)\+view\+close [\d.]+ us "
                    r".*: [\d.]+x shm$", lines[1])
    assert re.match(r"py_attach: 2 clients: +[\d,]+ attach\+from_dlpack\+release/s", lines[2])


def test_py_put_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_put.py"), "--socket",
                        daemon.socket, "--sizes", "4K,2M", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for size in ("4 KiB", "2 MiB"):
        block = out[out.index("put %s" % size):]
        for name in ("memcpy", "shm", "tensord"):
            assert re.search(r"^  %-8s +[\d.]+ us +[\d.]+ GB/s +[\d.]+x memcpy$" % name, block,
                             re.M), out


def test_py_names_bench_runs():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_names.py"), "--names", "2000",
                        "--samples", "400", "--rounds", "2"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    assert re.match(r"py_names: 10 names: +attach p50 +[\d.]+ us +p99 +[\d.]+ us$", lines[0])
    assert re.match(r"py_names: p99 ratio [\d.]+ \(any of 2000 names / 10 names\).*"
                    r"daemon: \d+ descriptors, \d+ slabs, RSS \d+ MiB$", lines[2])


def test_py_gpu_async_bench_runs():
    """The fake-driver daemon's bench prints both rows and the ratios (the
    figures themselves are not asserted)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_gpu_async.py"), "--rounds", "2",
                        "--alloc-ms", "100"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  idle baseline: +median +[\d.]+ us, slowest +[\d.]+ us$", r.stdout,
                     re.M), r.stdout
    assert re.search(r"^  during the alloc: median +[\d.]+ us, slowest +[\d.]+ us "
                     r"\([\d.]+x / [\d.]+x the baseline\)$", r.stdout, re.M), r.stdout
