"""What the Python GPU tests share about their driver: the double
(tests/gpudouble/, docs/gpu.md "The driver double") selected by
LD_LIBRARY_PATH in CI, or the system's driver on hardware
(TENSORD_GPU_DRIVER=system, as tests/gpu/run.sh sets it)."""
import hashlib
import os
import time

import pytest

from conftest import HERE, ROOT

BUILD = os.environ.get("TENSORD_BUILD") or os.path.join(ROOT, "build")
DOUBLE = os.path.join(BUILD, "gpudouble")
SYSTEM = os.environ.get("TENSORD_GPU_DRIVER") == "system"


# What the GPU tests' child clients share (testlib.Child's code starts with
# PRELUDE): a connection, the driver calls (cudrv), and 3 MiB of known bytes.
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


def require():
    """Skips the calling module, with the reason, where the double is not built."""
    if not SYSTEM and not os.path.exists(os.path.join(DOUBLE, "libcuda.so.1")):
        pytest.skip(f"the driver double is not built ({DOUBLE}: make all builds it)",
                    allow_module_level=True)


def env(report_dir):
    """The environment for daemons and child clients: this directory on
    PYTHONPATH (cudrv), and the double with its report in report_dir."""
    e = {"PYTHONPATH": os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    if not SYSTEM:
        e.update(LD_LIBRARY_PATH=DOUBLE, TD_GPU_DOUBLE_DIR=str(report_dir),
                 TD_GPU_DOUBLE_LEAKS="tensord")
    return e


def problems(report_dir, pid=None):
    """The double's report lines that fail a test: every violation, and the
    daemons' leaks at exit (only pid's when given)."""
    try:
        lines = (report_dir / "report").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [x for x in lines if " violation: " in x or
            (" leak at exit" in x and (pid is None or f"[{pid}]" in x))]


def end_children(children):
    """Kills the child clients still running."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


def wait_until(cond, timeout=30.0):
    """cond() true within timeout seconds (polled), or its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def unlink_all(gpu):
    """Every name gpu's daemon has, unlinked."""
    import tensord
    with tensord.connect(gpu.daemon.socket) as c:
        for n in [x.name for x in c.list()]:
            c.unlink(n)


# What the recycling tests (test_gpu_recycle.py, test_gpu_set_recycle.py) count
# of a process's driver calls, and the park that keeps a reader's import.
RECYCLE_FNS = ("cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap",
               "cuMemSetAccess")
PARK = {"TENSORD_GPU_PARK_MS": "60000"}


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def figures(gpu):
    """(stats, the cuda:0 row of its devices) of gpu's daemon (test_gpu_driver.Gpu)."""
    import tensord
    with tensord.connect(gpu.daemon.socket) as c:
        s = c.stats()
    dev = [d for d in s["devices"] if d["device"] == "cuda:0"][0]
    return s, dev


def ring(w, n):
    """Waits until child w (a writer) sees its daemon keep n free GPU ring buffers."""
    w.send(f"ring {n}")
    assert w.expect("ring ") == f"ring {n}"


class ManagedGpuDaemon:
    """A daemon over the driver double under a service manager that keeps its
    store (sdharness.ServiceManager), and the child clients of a test:
    .child(code) starts one (gpu_double.PRELUDE first, "ready" awaited),
    .stats() asks the daemon, .restart(sig) kills it and starts it again
    from its store. Used as a context manager: at the end every child
    ends, the manager closes, and neither systemd's rules nor the double's
    report may show a problem."""

    def __init__(self, tmp_path, **extra_env):
        from sdharness import ServiceManager
        self.tmp_path = tmp_path
        self.env = dict(env(tmp_path / "double"), TENSORD_CUDA_PATH="default", **extra_env)
        self.m = ServiceManager(tmp_path)
        self.children = []

    def __enter__(self):
        self.m.start(env=self.env)
        return self

    def child(self, code):
        import textwrap
        from testlib import Child
        c = Child(PRELUDE + textwrap.dedent(code), self.m.socket, self.env)
        self.children.append(c)
        c.expect("ready")
        return c

    def stats(self):
        import tensord
        with tensord.connect(self.m.socket) as c:
            return c.stats()

    def restart(self, sig):
        self.m.restart(sig=sig, env=self.env)

    def __exit__(self, *exc):
        try:
            end_children(self.children)
        finally:
            self.m.close()
        if exc[0] is None:
            assert not self.m.violations, self.m.violations
            bad = problems(self.tmp_path / "double")
            assert not bad, "\n".join(bad)
        return False
