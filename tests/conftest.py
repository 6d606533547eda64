"""Shared pytest fixtures: a real tensord daemon per test.

The daemon is started with --ready-fd so a test waits for the ready byte
instead of retrying connect(). TENSORD_TEST_DAEMON=/path/to.sock makes the
fixture use an already running daemon instead (for gdb sessions).
"""
import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from testlib import wait_until  # noqa: F401 (the integration suite's `from conftest import`)

BUILD = os.environ.get("TENSORD_BUILD") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")


def build_path(*parts):
    return os.path.join(BUILD, *parts)


class Daemon:
    def __init__(self, tmp_path, args=(), env=None, binary="tensord"):
        self.binary = binary
        self.socket = str(tmp_path / "tensord.sock")
        self.log_path = str(tmp_path / "tensord.log")
        self.args = list(args)
        self.env = env
        self.proc = None

    def start(self):
        r, w = os.pipe()
        self.log = open(self.log_path, "wb")
        env = dict(os.environ)
        env.pop("TENSORD_SOCKET", None)
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(
            [build_path(self.binary), "--socket", self.socket, "--ready-fd", str(w),
             "--log-level", "debug"] + self.args,
            pass_fds=(w,), stdout=self.log, stderr=subprocess.STDOUT, env=env)
        os.close(w)
        with os.fdopen(r, "rb") as rf:
            byte = rf.read(1)
            # Until the daemon closed its end: a test that counts its
            # descriptors at once must not count this one.
            rf.read()
        if byte != b"R":
            self.proc.wait(timeout=10)
            raise RuntimeError("tensord did not start: " + self.read_log())
        return self

    @property
    def pid(self):
        return self.proc.pid

    def fd_count(self):
        """Descriptors the daemon holds, less the memfds its host memory pool
        keeps ready: those come and go as the pool refills, and stats counts
        them. Every other descriptor is a client, a tensor or a leak.

        The pool's worker refills while this counts, and the connection of
        the previous stats call may still be closing: a count is taken
        when the pool held still around it and it equals the one before."""
        prev = None
        for _ in range(100):
            before = self.stats().get("host_pool_fds", 0)
            time.sleep(0.01)        # the daemon closes that stats connection
            n = len(os.listdir(f"/proc/{self.pid}/fd"))
            after = self.stats().get("host_pool_fds", 0)
            if before == after:
                if n - after == prev:
                    return prev
                prev = n - after
        return prev

    def stats(self):
        """The daemon's stats as `tensorctl stats --json` prints them; {} when
        it is not answering (a test may be holding every client slot)."""
        r = subprocess.run([build_path("tensorctl"), "--socket", self.socket, "stats", "--json"],
                           capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def daemon_factory(tmp_path):
    started = []

    def make(*args, env=None, sub="d%d", binary="tensord"):
        d = Daemon(tmp_path / (sub % len(started)) if "%d" in sub else tmp_path / sub,
                   args, env, binary)
        os.makedirs(os.path.dirname(d.socket), exist_ok=True)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        rc = d.stop()
        if rc is None:  # the test reaped it itself
            continue
        log = d.read_log() if os.path.exists(d.log_path) else ""
        assert "ERROR: AddressSanitizer" not in log, log
        assert "runtime error:" not in log, log
        assert "WARNING: ThreadSanitizer" not in log, log
        assert rc == 0, f"tensord exited {rc}:\n{log[-4000:]}"


@contextlib.contextmanager
def holding(tmp_path, **env):
    """A holder (tensord --hold, docs/restart.md section 6) in tmp_path/hold,
    env added to its environment: daemons started with ("--holder",
    str(hold)) keep their store in it and restore from it when started
    again. Yields the directory; stops the holder after."""
    hold = tmp_path / "hold"
    with open(tmp_path / "holder.log", "ab") as log:
        proc = subprocess.Popen([build_path("tensord"), "--hold", str(hold)], stdout=log,
                                stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    try:
        assert wait_until(lambda: (hold / "take").exists(), timeout=10), "no holder"
        yield hold
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def holder(tmp_path):
    """holding(tmp_path), for the test."""
    with holding(tmp_path) as hold:
        yield hold


@pytest.fixture
def daemon(daemon_factory):
    ext = os.environ.get("TENSORD_TEST_DAEMON")
    if ext:
        class External:
            socket = ext
        yield External()
        return
    yield daemon_factory()
