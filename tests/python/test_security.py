"""What a client of another uid can do with the descriptors it is handed."""
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))

NOBODY = r"""
import errno, os, sys
import numpy as np, tensord   # imported as root: nobody cannot read root's site-packages
os.setgroups([]); os.setgid(65534); os.setuid(65534)
c = tensord.connect(sys.argv[1])
t = c.attach("mut")
assert t.readonly, "nobody may only read mut"
before = int(np.from_dlpack(t)[0])
refused = 0
for fd in os.listdir("/proc/self/fd"):
    link = os.readlink("/proc/self/fd/" + fd) if os.path.exists("/proc/self/fd/" + fd) else ""
    if "memfd:tensord" not in link:
        continue
    try:
        w = os.open("/proc/self/fd/" + fd, os.O_RDWR)
    except PermissionError:
        refused += 1
        continue
    os.pwrite(w, b"\x63", 0)
    print("upgraded", link, flush=True)
print("before", before, "refused", refused, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_reader_of_another_uid_cannot_upgrade_its_descriptor(daemon_factory):
    sockdir = tempfile.mkdtemp(prefix="tensord-test-")
    os.chmod(sockdir, 0o755)
    d = daemon_factory("--mode", "0666", sub=sockdir)
    with tensord.connect(d.socket) as c:
        with c.create("mut", (16,), "uint8", mutable=True, mode=0o644) as w:
            np.from_dlpack(w)[:] = 5
            w.publish()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(NOBODY), d.socket],
                           capture_output=True, text=True, timeout=60, env=env, cwd="/")
        assert r.returncode == 0, r.stderr
        assert "upgraded" not in r.stdout, r.stdout
        assert "before 5 refused 1" in r.stdout, r.stdout
        with c.attach("mut") as t:
            assert np.from_dlpack(t).tolist() == [5] * 16
