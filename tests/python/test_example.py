"""The example in docs/python.md runs as written."""
import os
import subprocess
import sys

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "client", "python", "examples", "two_process.py")


def test_two_process_example(daemon):
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    r = subprocess.run([sys.executable, EXAMPLE], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["reader: weights (3, 4) float32 sum 66.0 writable False",
                     "reader: counter 1", "reader: counter 2"]
    with tensord.connect(daemon.socket) as c:
        assert c.list("demo/") == []
