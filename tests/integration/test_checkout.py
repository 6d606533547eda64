"""A checkout under a 0700 directory (a clone in /root): the tests that act
as another uid still pass, since what that uid runs is copied where it can
reach it. The checkout's tests and the built programs are copied into a
0700 directory and the other-uid tests run there."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import build_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_other_uid_tests_pass_in_a_checkout_under_0700(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    home = tempfile.mkdtemp(prefix="tensord-home-")   # mkdtemp makes it 0700
    try:
        assert os.stat(home).st_mode & 0o077 == 0
        co = os.path.join(home, "tensord")
        shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(co, "tests"),
                        ignore=shutil.ignore_patterns("__pycache__", "debs"))
        shutil.copy(os.path.join(ROOT, "pytest.ini"), co)
        for f in ("tensord", "tensorctl", "tests/helpers/tdclient"):
            os.makedirs(os.path.dirname(os.path.join(co, "build", f)), exist_ok=True)
            shutil.copy2(build_path(f), os.path.join(co, "build", f))
        env = dict(os.environ, TENSORD_BUILD=os.path.join(co, "build"))
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            "tests/integration/test_core.py", "-k", "other_uid"],
                           cwd=co, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"(\d+) passed", r.stdout)
        assert m and int(m.group(1)) >= 2, r.stdout
        assert "skipped" not in r.stdout and "failed" not in r.stdout, r.stdout
    finally:
        shutil.rmtree(home)
