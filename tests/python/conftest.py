"""Fixtures for the Python client tests.

The `daemon` fixture (tests/conftest.py) starts a real tensord. Here:
`client` connects to it; `child` runs a Python snippet in another process
that talks to the test over stdin/stdout lines (testlib.Child); `tdtest` is a small C
consumer compiled for this session (tests/python/tdtest_helper.c).
"""
import importlib.util
import os
import subprocess
import sysconfig

import pytest

import tensord
from testlib import Child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture
def client(daemon):
    c = tensord.connect(daemon.socket)
    yield c
    c.close()


@pytest.fixture
def child(daemon):
    started = []

    def make(code, env=None):
        c = Child(code, daemon.socket, env)
        started.append(c)
        return c

    yield make
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


@pytest.fixture(scope="session")
def tdtest(tmp_path_factory):
    """Compiles tdtest_helper.c with the system compiler and imports it."""
    out = tmp_path_factory.mktemp("tdtest")
    so = out / ("_tdtest" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-std=c11", "-O1", "-g", "-Wall", "-Werror", "-shared", "-fPIC",
         "-I" + sysconfig.get_paths()["include"], "-I" + os.path.join(ROOT, "include"),
         os.path.join(HERE, "tdtest_helper.c"), "-o", str(so), "-lpthread"],
        check=True)
    spec = importlib.util.spec_from_file_location("_tdtest", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
