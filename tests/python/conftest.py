"""Fixtures for the Python client tests.

The `daemon` fixture (tests/conftest.py) starts a real tensord. Here:
`client` connects to it; `child` runs a Python snippet in another process
that talks to the test over stdin/stdout lines; `tdtest` is a small C
consumer compiled for this session (tests/python/tdtest_helper.c).
"""
import importlib.util
import os
import queue
import subprocess
import sys
import sysconfig
import textwrap
import threading

import pytest

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture
def client(daemon):
    c = tensord.connect(daemon.socket)
    yield c
    c.close()


class Child:
    """A Python process running `code` with TENSORD_SOCKET set to the daemon.

    The snippet and the test talk in lines: the child prints, the test
    expect()s; the test send()s, the child reads sys.stdin.
    """

    def __init__(self, code, socket, env=None):
        full_env = dict(os.environ, TENSORD_SOCKET=socket)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink(line.rstrip("\n"))
        sink(None)

    def expect(self, prefix="", timeout=120):
        """Returns the child's next line, which must start with prefix."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"child said nothing for {timeout}s; stderr: {self.stderr()}")
        assert line is not None, f"child exited early (rc {self.proc.wait()}): {self.stderr()}"
        assert line.startswith(prefix), f"expected {prefix!r}, got {line!r}; {self.stderr()}"
        return line

    def send(self, line=""):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self):
        return "\n".join(x for x in self.err if x is not None)

    def finish(self, timeout=120):
        """Closes the child's stdin and checks that it exits with 0."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, f"child exited {rc}: {self.stderr()}"


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
