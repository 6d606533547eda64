"""CUDA VMM tensors outlive the daemon (docs/restart.md; issue 33, "GPU"):
the export the daemon keeps of each VMM allocation goes into the
descriptor store, and a restarted daemon imports it again
(backend_ops.import_fd), so a tensor made on cuda:0 is served after a
kill -9 with the same bytes and generation, over the driver double here
(tests/gpudouble/) and on hardware by tests/gpu/run.sh. Legacy IPC memory
cannot survive (an IPC handle is no descriptor): it is counted as
unprotected and not restored."""
import hashlib
import signal
import textwrap

import pytest

import gpu_double
import tensord
from sdharness import ServiceManager
from testlib import Child

gpu_double.require()

DATA = bytes((i * 131 + 7) % 256 for i in range(3 << 20))
DIGEST = hashlib.sha256(DATA).hexdigest()[:16]
PRELUDE = """
import hashlib, os, sys
import tensord, cudrv
c = tensord.connect()
def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]
DATA = bytes((i * 131 + 7) % 256 for i in range(3 << 20))
"""


@pytest.fixture(params=["vmm", "ipc"])
def run(request, tmp_path):
    env = gpu_double.env(tmp_path / "double")
    env["TENSORD_CUDA_PATH"] = "ipc" if request.param == "ipc" else "default"
    m = ServiceManager(tmp_path)
    m.start(env=env)
    children = []

    def child(code):
        c = Child(PRELUDE + textwrap.dedent(code), m.socket, env)
        children.append(c)
        return c
    yield request.param, m, child, env
    gpu_double.end_children(children)
    m.close()
    assert not m.violations, m.violations
    bad = gpu_double.problems(tmp_path / "double")
    assert not bad, "\n".join(bad)


def test_a_cuda_tensor_survives_kill_9(run):
    path, m, child, env = run
    w = child("""
        t = c.create("g/a", (len(DATA),), "uint8", device="cuda:0")
        cudrv.write(t, DATA)
        t.publish()
        t.release()
        c.put("h/x", bytes(range(256)) * 16)
        print("published", c.stat("g/a").generation, c.stats()["restart_unprotected_tensors"],
              flush=True)
        sys.stdin.readline()
    """)
    line = w.expect("published").split()
    assert line[1] == "1"
    # Legacy IPC memory has no descriptor to keep: counted, not stored.
    assert line[2] == ("0" if path == "vmm" else "1")
    m.restart(sig=signal.SIGKILL, env=env)
    r = child("""
        names = sorted(i.name for i in c.list())
        print("names", *names, flush=True)
        if "g/a" in names:
            with c.attach("g/a") as t:
                print("digest", digest(cudrv.read(t)), t.device, c.stat("g/a").generation,
                      flush=True)
        print("restored", c.stats()["restart_restored_tensors"], flush=True)
    """)
    names = r.expect("names").split()[1:]
    if path == "vmm":
        assert names == ["g/a", "h/x"]
        assert r.expect("digest").split()[1:] == [DIGEST, "cuda:0", "1"]
        assert r.expect("restored") == "restored 2"
    else:
        assert names == ["h/x"]
        assert r.expect("restored") == "restored 1"
    w.send("")
