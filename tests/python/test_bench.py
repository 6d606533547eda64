"""bench/py_attach.py runs and prints its two figures."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "py_attach.py")


def test_py_attach_bench_runs(daemon):
    r = subprocess.run([sys.executable, BENCH, "--socket", daemon.socket, "--seconds", "0.2",
                        "--procs", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert re.match(r"py_attach: 1 client: +[\d,]+ attach\+from_dlpack\+release/s", lines[0])
    assert re.match(r"py_attach: 2 clients: +[\d,]+ attach\+from_dlpack\+release/s", lines[1])
