"""What both pytest suites (tests/integration, tests/python) share, kept
once: waiting on an observable state (wait_until), a Python child process
the test talks to in lines (Child), and copies of the build's programs that
another uid can run (open_dir, copies_for_all).

tests/conftest.py (the integration suite imports it as `conftest`) and
tests/python/tdutil.py re-export these; pytest puts tests/ on sys.path for
both suites, as it loads tests/conftest.py.
"""
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time


def wait_until(pred, timeout=10.0, interval=0.01):
    """Polls pred until it is true or timeout seconds passed; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(interval)


class Child:
    """A Python process running prelude + code; the test and it talk in lines:
    the child prints, the test expect()s; the test send()s, the child reads
    sys.stdin.

    env is added to this process's environment, with TENSORD_SOCKET=socket
    when socket is given."""

    def __init__(self, code, socket=None, env=None, prelude=""):
        full_env = dict(os.environ)
        if socket is not None:
            full_env["TENSORD_SOCKET"] = socket
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(code)], stdin=subprocess.PIPE,
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

    @property
    def pid(self):
        return self.proc.pid

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

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def open_dir(prefix="tensord-test-"):
    """A new directory every uid may enter (0755), for tests that switch uid;
    the caller removes it."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o755)
    return d


def copies_for_all(into, *paths):
    """Copies of the programs at paths in the directory into, 0755, for
    processes of another uid: the checkout may lie under a 0700 directory (a
    clone in /root), where they cannot reach build/. Returns their paths, in
    the order given."""
    out = []
    for src in paths:
        exe = os.path.join(into, os.path.basename(src))
        shutil.copy(src, exe)
        os.chmod(exe, 0o755)
        out.append(exe)
    return out
