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


def _echo(sock):
    """The far end of kernel_floors(): answers each message, passing back any descriptor."""
    import array
    import socket as s
    while True:
        msg, anc, _, _ = sock.recvmsg(64, s.CMSG_SPACE(4))
        if not msg:
            return
        fds = [fd for lvl, typ, data in anc if lvl == s.SOL_SOCKET and typ == s.SCM_RIGHTS
               for fd in array.array("i", data[:len(data) - len(data) % 4])]
        if fds:
            sock.sendmsg([msg], [(s.SOL_SOCKET, s.SCM_RIGHTS, array.array("i", fds[:1]))])
            for fd in fds:
                os.close(fd)
        else:
            sock.send(msg)


def kernel_floors(n=2000):
    """What the kernel alone costs, measured here, in seconds (medians of 5
    runs of n): a round trip of 16 bytes over a Unix socket between two
    Python processes, the same carrying a descriptor both ways (SCM_RIGHTS),
    and mmap + first touch + munmap of 4 KiB of a memfd. An attach needs at
    least the first (or the second for a cold one) and the third."""
    import array
    import mmap
    import socket as s
    import statistics
    import time

    a, b = s.socketpair(s.AF_UNIX, s.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        try:
            _echo(b)
        finally:
            os._exit(0)
    b.close()
    fd = os.memfd_create("floor")
    os.ftruncate(fd, 4096)
    rtt, fdpass, maps = [], [], []
    try:
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                a.send(b"x" * 16)
                a.recv(64)
            rtt.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                a.sendmsg([b"x" * 16], [(s.SOL_SOCKET, s.SCM_RIGHTS, array.array("i", [fd]))])
                _, anc, _, _ = a.recvmsg(64, s.CMSG_SPACE(4))
                for lvl, typ, data in anc:
                    os.close(array.array("i", data[:4])[0])
            fdpass.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                m = mmap.mmap(fd, 4096)
                m[0]
                m.close()
            maps.append((time.perf_counter() - t0) / n)
    finally:
        a.close()
        os.waitpid(pid, 0)
        os.close(fd)
    return {"socket round trip": statistics.median(rtt),
            "descriptor round trip": statistics.median(fdpass),
            "mmap+touch+munmap 4 KiB": statistics.median(maps)}


def print_floors(prefix):
    """Prints kernel_floors() on one line, in microseconds."""
    f = kernel_floors()
    print(f"{prefix}: kernel floor here: " +
          ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in f.items()))


def connect_env(sock, **env):
    """A tensord client connected with env set in os.environ (read when a client
    connects, e.g. TENSORD_RECYCLE="0": fresh memory every version); the
    environment is given back as it was."""
    import tensord
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return tensord.connect(sock)
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
