"""The GPU suite's timeouts and cleanup, without a GPU (issue 21, defect 1):
tests/gpu/selftest.sh links tests/gpu/gpu_suite.c against a stub
libcuda.so.1 and runs its --selftest modes against this build's daemon: a
deliberately failed CHECK with a holder child and leases alive, a hung
child ended by its alarm, exit() mid-test, kill -9 of the orchestrator.
Each must end within its bound, through a pipe, with none of the processes
it started left. Needs the CUDA toolkit's headers (cuda.h) and nm.
"""
import os
import shutil
import subprocess

import pytest

from conftest import build_path

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))


def cuda_home():
    for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if d and os.path.isfile(os.path.join(d, "include", "cuda.h")):
            return d
    return None


@pytest.mark.skipif(
    os.environ.get("TENSORD_SANITIZED") == "1",
    reason="links the suite with its own plain flags; the plain run checks it")
def test_gpu_suite_cleans_up_after_failures():
    home = cuda_home()
    if not home or not shutil.which("nm"):
        pytest.skip("needs the CUDA toolkit's cuda.h (CUDA_HOME) and nm")
    build = build_path()
    if not os.path.exists(os.path.join(build, "libtensord.a")):
        pytest.skip(f"no libtensord.a in {build}")
    p = subprocess.run(["bash", os.path.join(TOP, "tests/gpu/selftest.sh"), build],
                       cwd=TOP, env={**os.environ, "CUDA_HOME": home},
                       capture_output=True, text=True, timeout=240)
    print(p.stderr[-4000:])
    assert p.returncode == 0, p.stderr[-4000:]
    for mode in ("check", "hang", "exit", "orphan"):
        assert f"gpu-selftest: PASS {mode}" in p.stderr
