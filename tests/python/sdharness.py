"""A service manager for tests (docs/restart.md, section 8): what systemd
does for tensord's restart survival, played in the test's process.

It binds a NOTIFY_SOCKET datagram socket, keeps every descriptor the daemon
stores (FDSTORE=1 with FDNAME=), honours FDSTOREREMOVE=1, and starts the
daemon again with what it keeps passed through LISTEN_FDS, LISTEN_PID and
LISTEN_FDNAMES, as systemd does with FileDescriptorStorePreserve=yes. It
checks systemd's rules on every message: names of at most 255 bytes
without ':', no open file stored twice, never more than the store's limit.
"""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

BUILD = os.environ.get("TENSORD_BUILD") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build")


def build_path(*parts):
    return os.path.join(BUILD, *parts)


# Run in the daemon's child process: puts the passed descriptors at 3, 4,
# ... (their order in argv), sets LISTEN_PID to itself, and execs tensord.
LAUNCHER = r"""
import fcntl, os, sys
listen, n = int(sys.argv[1]), int(sys.argv[2])
fds = [int(x) for x in sys.argv[3:3 + n]]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + n) for fd in fds]
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i, inheritable=True)
    os.close(fd)
env = dict(os.environ)
if listen:
    env["LISTEN_PID"] = str(os.getpid())
    env["LISTEN_FDS"] = str(listen)
os.execve(sys.argv[3 + n], sys.argv[3 + n:], env)
"""


class ServiceManager:
    def __init__(self, tmp_path, max_fds=4096, args=(), binary="tensord", socket_unit=False):
        self.dir = tmp_path
        self.socket = str(tmp_path / "tensord.sock")
        self.notify_path = str(tmp_path / "notify.sock")
        self.log_path = str(tmp_path / "tensord.log")
        self.max_fds = max_fds
        self.args = list(args)
        self.binary = binary
        self.store = {}          # name -> [fd, ...] (dups of what the daemon sent)
        self.violations = []     # systemd's rules the daemon broke
        self.most = 0            # the most descriptors stored at once
        self.ready = threading.Event()
        self.synced = self.sync_sent = 0
        self.lock = threading.Lock()
        self.proc = None
        self.log = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.notify_path)
        self.sock.settimeout(0.2)
        self.stopping = False
        # A socket unit's listening socket, kept across restarts as systemd
        # keeps it: passed as "tensord.socket" among the stored ones.
        self.listener = None
        if socket_unit:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(self.socket)
            self.listener.listen(128)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    # --- the notify socket ---------------------------------------------------
    def _serve(self):
        while not self.stopping:
            try:
                msg, fds, _, _ = socket.recv_fds(self.sock, 65536, 16)
            except socket.timeout:
                continue
            except OSError:
                return
            self._handle(msg.decode(errors="replace"), fds)

    def _handle(self, text, fds):
        kv = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
        with self.lock:
            if "X-SYNC" in kv:
                self.synced = int(kv["X-SYNC"])
                return
            if kv.get("READY") == "1":
                self.ready.set()
            if kv.get("FDSTORE") == "1":
                name = kv.get("FDNAME", "stored")
                if len(name) > 255 or ":" in name or not name:
                    self.violations.append(f"bad name {name!r}")
                if kv.get("FDPOLL") != "0":
                    self.violations.append(f"{name}: stored without FDPOLL=0")
                for fd in fds:
                    ident = self._identity(fd)
                    for other, ofds in self.store.items():
                        if any(self._identity(o) == ident for o in ofds):
                            self.violations.append(f"{name}: the same file as {other}")
                    self.store.setdefault(name, []).append(fd)
                if self.count() > self.max_fds:
                    self.violations.append(f"{self.count()} stored, over {self.max_fds}")
                self.most = max(self.most, self.count())
                return
            if kv.get("FDSTOREREMOVE") == "1":
                for fd in self.store.pop(kv.get("FDNAME", ""), []):
                    os.close(fd)
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _identity(fd):
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino)

    def count(self):
        return sum(len(v) for v in self.store.values())

    def sync(self):
        """Returns once every message sent to the notify socket before it is handled."""
        self.sync_sent += 1
        n = self.sync_sent
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(f"X-SYNC={n}".encode(), self.notify_path)
        for _ in range(2000):
            with self.lock:
                if self.synced >= n:
                    return
            threading.Event().wait(0.005)
        raise TimeoutError("the service manager's thread is stuck")

    def names(self, prefix=""):
        """What is stored, by name, once what was sent so far is handled."""
        self.sync()
        with self.lock:
            return sorted(n for n in self.store if n.startswith(prefix))

    def fd_of(self, name):
        self.sync()
        with self.lock:
            return self.store[name][0]

    def put_foreign(self, name, data):
        """Stores a memfd of data under name, as if someone else had."""
        fd = os.memfd_create("foreign")
        os.write(fd, data)
        with self.lock:
            self.store.setdefault(name, []).append(fd)

    # --- the daemon ------------------------------------------------------------
    def start(self, extra_args=(), env=None, wait=True):
        # What the last daemon sent before it died is handled first, as
        # systemd handles notify messages before the SIGCHLD: a FDSTORE=1
        # still queued here would otherwise miss this start (a race seen
        # once in CI: a published tensor's memory not passed back).
        self.sync()
        with self.lock:
            items = [(n, fd) for n, v in self.store.items() for fd in v]
        if self.listener:
            items.append(("tensord.socket", self.listener.fileno()))
        # By name: the daemon must recognise each by its name or type, not its place.
        items.sort()
        r, w = os.pipe()
        names = ":".join(n for n, _ in items)
        fds = [fd for _, fd in items]
        e = dict(os.environ)
        e.pop("TENSORD_SOCKET", None)
        e["NOTIFY_SOCKET"] = self.notify_path
        e["FDSTORE"] = str(self.max_fds)
        if items:
            e["LISTEN_FDNAMES"] = names
        if env:
            e.update(env)
        ready_fd = 3 + len(fds)
        argv = [sys.executable, "-c", LAUNCHER, str(len(fds)), str(len(fds) + 1)] + \
            [str(fd) for fd in fds] + [str(w)] + \
            [build_path(self.binary), "--socket", self.socket, "--ready-fd", str(ready_fd),
             "--log-level", "debug"] + self.args + list(extra_args)
        # The ready pipe rides along after them, outside LISTEN_FDS.
        self.ready.clear()
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, pass_fds=fds + [w], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=e)
        os.close(w)
        with os.fdopen(r, "rb") as rf:
            byte = rf.read(1)
        if wait and byte != b"R":
            self.proc.wait(timeout=10)
            raise RuntimeError("tensord did not start: " + self.read_log())
        return self

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        self.log.close()
        if sig != signal.SIGKILL and rc != 0:
            self.violations.append(f"the daemon exited with {rc} on signal {sig}")

    def restart(self, sig=signal.SIGKILL, **kw):
        self.kill(sig)
        return self.start(**kw)

    def read_log(self):
        if self.log and not self.log.closed:
            self.log.flush()
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        self.stopping = True
        self.thread.join(5)
        text = self.read_log()
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if bad in text:
                self.violations.append(f"the daemon's log reports {bad}")
        self.sock.close()
        if self.listener:
            self.listener.close()
        with self.lock:
            for v in self.store.values():
                for fd in v:
                    os.close(fd)
            self.store.clear()


@contextlib.contextmanager
def managed(tmp_path, **kw):
    """A ServiceManager with its daemon started; closed after the block,
    which then must have broken none of systemd's rules."""
    m = ServiceManager(tmp_path, **kw)
    m.start()
    try:
        yield m
    finally:
        m.close()
    assert not m.violations, m.violations
