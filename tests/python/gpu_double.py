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
