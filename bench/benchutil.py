"""What the Python benchmarks share: a private daemon to measure against."""
import contextlib
import os
import subprocess
import sys
import tempfile


def start_daemon(tmp, extra=()):
    """Starts tensord from $TENSORD_BUILD (default: build/) on a socket in tmp and
    waits for its ready byte. Returns (process, socket path)."""
    build = os.environ.get("TENSORD_BUILD") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")
    sock = os.path.join(tmp, "tensord.sock")
    r, w = os.pipe()
    proc = subprocess.Popen([os.path.join(build, "tensord"), "--socket", sock,
                             "--ready-fd", str(w), "--log-level", "warn"] + list(extra),
                            pass_fds=(w,), stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        if rf.read(1) != b"R":
            sys.exit("tensord did not start")
    return proc, sock


@contextlib.contextmanager
def daemon_socket(socket=None, extra=()):
    """The socket to measure against: socket when given, else that of a
    private daemon started for the block and stopped after it."""
    if socket:
        yield socket
        return
    with tempfile.TemporaryDirectory() as tmp:
        proc, sock = start_daemon(tmp, extra)
        try:
            yield sock
        finally:
            proc.terminate()
            proc.wait()
