"""A checkout under a 0700 directory (a clone in /root, the usual container
checkout) with the tests run as root: every test that acts as another uid
still passes, since what that uid runs is a copy it can reach, never a file
of the checkout.

The checkout's tests and what was built are copied into a 0700 directory
and every test marked `other_uid` (pytest.ini) runs there, the integration
and the Python suites each in a pytest of their own: none may fail, and
none may skip but for a reason this machine gives them anywhere (no
unshare, no prometheus_client, ...)."""
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

from conftest import build_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")
# The Python module: this build's, else the plain build's (an ASan build has none).
PYDIR = next((d for d in (build_path("python"), os.path.join(ROOT, "build", "python"))
              if os.path.isdir(os.path.join(d, "tensord"))), None)

# How a test becomes another uid.
OTHER_UID = re.compile(r"setpriv|os\.set(e|res)?uid|os\.set(e|res)?gid")

# Skips that say something about this machine, not about the checkout: the
# same test skips for the same reason from any checkout.
MACHINE_SKIPS = re.compile(
    r"cannot mount a private /run here|needs unshare|needs setpriv|"
    r"prometheus_client is not installed")


def marked_other_uid(path):
    """Whether the test module at path marks any test (or itself) other_uid."""
    tree = ast.parse(open(path).read(), path)
    return any(isinstance(n, ast.Attribute) and n.attr == "other_uid"
               for n in ast.walk(tree))


def test_every_module_that_switches_uid_marks_its_tests():
    """A new test that acts as another uid without the mark would escape the
    run below: each module that switches uid must mark its tests."""
    unmarked = []
    for sub in ("integration", "python"):
        for name in sorted(os.listdir(os.path.join(TESTS, sub))):
            path = os.path.join(TESTS, sub, name)
            if (name.startswith("test_") and name.endswith(".py") and name != "test_checkout.py"
                    and OTHER_UID.search(open(path).read()) and not marked_other_uid(path)):
                unmarked.append(f"{sub}/{name}")
    assert not unmarked, f"switch uid but mark no test other_uid: {unmarked}"


def copy_checkout(home):
    """tests/, pytest.ini, the pages the doc tests read, and what the
    other-uid tests run from build/ (the Python module from PYDIR)."""
    co = os.path.join(home, "tensord")
    shutil.copytree(TESTS, os.path.join(co, "tests"),
                    ignore=shutil.ignore_patterns("__pycache__", "debs"))
    shutil.copy(os.path.join(ROOT, "pytest.ini"), co)
    # The doc tests read the pages they check when they are collected.
    shutil.copy(os.path.join(ROOT, "README.md"), co)
    shutil.copytree(os.path.join(ROOT, "docs"), os.path.join(co, "docs"))
    build = os.path.join(co, "build")
    os.makedirs(os.path.join(build, "tests"))
    for f in ("tensord", "tensorctl"):
        shutil.copy2(build_path(f), os.path.join(build, f))
    shutil.copytree(build_path("tests", "helpers"), os.path.join(build, "tests", "helpers"))
    shutil.copytree(PYDIR, os.path.join(build, "python"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return co


def run_marked(co, suite):
    """pytest -m other_uid over tests/<suite> in the copy: its output and
    its results, [(test id, outcome, skip reason)]."""
    env = dict(os.environ, TENSORD_BUILD=os.path.join(co, "build"),
               PYTHONPATH=os.path.join(co, "build", "python"))
    env.pop("TENSORD_TEST_DAEMON", None)
    xml = os.path.join(co, f"{suite}.xml")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "-m", "other_uid", f"--junitxml={xml}", f"tests/{suite}"],
                       cwd=co, env=env, capture_output=True, text=True, timeout=540)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    results = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, reason = child.tag, child.get("message", "")
        # A module skipped whole while collecting (importorskip) counts
        # only when it holds other-uid tests.
        if not case.get("classname") and outcome == "skipped" and not marked_other_uid(
                os.path.join(co, *case.get("name").split(".")) + ".py"):
            continue
        results.append((tid, outcome, reason))
    return out, results


def test_other_uid_tests_pass_in_a_checkout_under_0700():
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    if PYDIR is None:
        pytest.skip("the tensord Python module is not built (make all): "
                    "the Python suite's other-uid tests need it")
    home = tempfile.mkdtemp(prefix="tensord-home-")   # mkdtemp makes it 0700
    try:
        assert os.stat(home).st_mode & 0o077 == 0
        co = copy_checkout(home)
        for suite in ("integration", "python"):
            out, results = run_marked(co, suite)
            bad = [r for r in results if r[1] in ("failure", "error")]
            assert not bad, f"{suite}: {bad}\n{out}"
            skipped = [r for r in results if r[1] == "skipped"
                       and not MACHINE_SKIPS.search(r[2])]
            assert not skipped, f"{suite}: skipped in a 0700 checkout: {skipped}\n{out}"
            assert any(r[1] == "passed" for r in results), out
    finally:
        shutil.rmtree(home)
