"""Integration tests: a real tensord and real client processes (tdclient,
a C program over libtensord driven one command per line)."""
import os
import shutil
import signal
import subprocess
import stat as statmod
import time

import pytest

from conftest import build_path, wait_until
from testlib import copies_for_all, open_dir


def as_nobody():
    """preexec_fn for a client process of uid and gid 65534 (nobody)."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


@pytest.fixture(scope="module")
def tdclient_for_all():
    """tdclient copied into a 0755 directory, for processes of another uid:
    the checkout may lie under a 0700 directory (a clone in /root), where
    they cannot reach build/."""
    d = open_dir()
    [exe] = copies_for_all(d, build_path("tests", "helpers", "tdclient"))
    yield exe
    shutil.rmtree(d)


class Client:
    """One tdclient process."""

    def __init__(self, sock, connect=True, preexec=None, env=None, exe=None):
        self.p = subprocess.Popen([exe or build_path("tests", "helpers", "tdclient")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1, preexec_fn=preexec, env=env)
        if connect:
            self.ok("connect " + sock)

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        assert out, f"tdclient died on {line!r} (rc={self.p.poll()})"
        return out

    def ok(self, line):
        out = self.cmd(line)
        assert out.startswith("ok"), f"{line!r} -> {out!r}"
        return out[3:]

    def err(self, line, code):
        out = self.cmd(line)
        assert out.startswith("err " + code), f"{line!r} -> {out!r}, wanted {code}"
        return out

    def kv(self, line):
        return dict(x.split("=", 1) for x in self.ok(line).split())

    def kill9(self):
        self.p.kill()
        self.p.wait()

    def close(self):
        if self.p.poll() is None:
            try:
                self.cmd("exit")
            except (AssertionError, BrokenPipeError):
                pass
            self.p.wait(timeout=10)


@pytest.fixture
def clients(daemon):
    made = []

    def make(**kw):
        c = Client(daemon.socket, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_socket_mode_0600_by_default(daemon):
    assert statmod.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600


def test_mutable_tensor_written_by_one_process_is_seen_by_another(daemon, clients):
    w, r = clients(), clients()
    w.ok("create shared/m uint8 4096 mutable")
    w.ok("fill shared/m 7")
    w.ok("publish shared/m")
    assert r.ok("attach shared/m 0") == "readonly=0"
    assert r.ok("read shared/m 100") == "7"
    # A later change by the writer shows in the reader: same pages.
    w.ok("write shared/m 100 42")
    assert r.ok("read shared/m 100") == "42"
    # And the other way round.
    r.ok("write shared/m 5 9")
    assert w.ok("read shared/m 5") == "9"


def test_immutable_tensor_cannot_be_changed_through_an_attacher(daemon, clients):
    w, r1, r2 = clients(), clients(), clients()
    w.ok("create shared/i uint8 8192")
    w.ok("fill shared/i 3")
    w.ok("publish shared/i")
    assert r1.ok("attach shared/i 0") == "readonly=1"
    # A consumer ignoring the read-only flag writes: no crash, private copy.
    r1.ok("write shared/i 10 99")
    assert r1.ok("read shared/i 10") == "99"
    r2.ok("attach shared/i 0")
    assert r2.ok("read shared/i 10") == "3"
    # The creator's own pre-publish view: its writes stay private too.
    w.ok("write shared/i 11 77")
    assert r2.ok("read shared/i 11") == "3"
    assert r2.ok("sum shared/i") == str(3 * 8192)


def test_publish_refused_while_a_forked_child_holds_a_writable_mapping(daemon, clients):
    w = clients()
    w.ok("create shared/f uint8 4096")
    pid = int(w.ok("fork-hold shared/f"))
    try:
        out = w.err("publish shared/f", "EBUSY")
        assert "shared/f" in out
    finally:
        os.kill(pid, signal.SIGKILL)
    # With the child gone the same publish succeeds.
    assert wait_until(lambda: w.cmd("publish shared/f") == "ok")


def test_legacy_dlmanagedtensor(daemon, clients):
    w, r = clients(), clients()
    w.ok("create l uint8 64")
    w.ok("fill l 5")
    w.ok("publish l")
    r.ok("legacy l 0")
    assert r.ok("read l 63") == "5"
    assert w.kv("stat l")["refcount"] == "2"
    r.ok("release l")
    # Release is one-way; another connection sees it a moment later.
    assert wait_until(lambda: w.kv("stat l")["refcount"] == "1")


def test_attach_waits_for_publish(daemon, clients):
    w, r = clients(), clients()
    w.ok("create later float32 16")
    # The creator's tensor is invisible to others until published.
    r.err("attach later 0", "ENOENT")
    r.p.stdin.write("attach later 5000\n")
    r.p.stdin.flush()
    # The attach waits in the daemon before the publish: else this would
    # test an attach of a published tensor.
    assert wait_until(lambda: daemon.stats().get("waiters") == 1), daemon.stats()
    w.ok("fill later 1")
    w.ok("publish later")
    assert r.p.stdout.readline().startswith("ok")
    assert r.ok("read later 0") == "1"


def test_attach_times_out_with_etimedout(daemon, clients):
    r = clients()
    t0 = time.monotonic()
    out = r.err("attach never 200", "ETIMEDOUT")
    assert "never" in out
    assert time.monotonic() - t0 >= 0.19


def test_repeat_attach_reuses_the_descriptor_and_a_clean_mapping(daemon, clients):
    """A second lease in the same process costs no descriptor (the daemon sends
    none; the process keeps the one it has) and, while no stray write touched
    the mapping, no mapping either: it shares the first lease's. Once a write
    made the mapping dirty, a further lease gets a private view of its own.
    (128 KiB: larger than a slab slot, so the tensor keeps a memfd of its own.)"""
    w, r = clients(), clients()
    w.ok("create rep uint8 131072")
    w.ok("fill rep 3")
    w.ok("publish rep")
    r.ok("attach rep 0")

    def fds():
        # The library keeps /proc/self/pagemap open once it looked at a mapping.
        return sorted(x for x in os.listdir(f"/proc/{r.p.pid}/fd")
                      if "pagemap" not in os.readlink(f"/proc/{r.p.pid}/fd/{x}"))

    def maps():
        return open(f"/proc/{r.p.pid}/maps").read().count("tensord:rep")

    fds_before = fds()
    r.ok("legacy rep 0 rep2")  # a second lease in the same process: clean, shared
    assert fds() == fds_before
    assert maps() == 1
    assert w.kv("stat rep")["refcount"] == "3"
    r.ok("write rep 10 99")  # a stray write: this process's private copy
    assert r.ok("read rep 10") == "99"
    assert r.ok("read rep2 10") == "99"  # shared while clean: the documented price
    r.ok("legacy rep 0 rep3")  # the mapping is dirty now: a view of its own
    assert r.ok("read rep3 10") == "3"
    assert maps() == 2
    assert fds() == fds_before
    assert w.ok("read rep 10") == "3"  # the creator's, and the shared bytes, never changed


def test_kill9_returns_leases_memory_and_fds(daemon, clients):
    w = clients()
    w.ok("create k uint8 1048576")
    w.ok("publish k")
    w.ok("release k")
    base_fds = daemon.fd_count()
    base = w.kv("stats")
    victim = clients()
    for i in range(5):
        victim.ok("create tmp/%d uint8 65536 connection" % i)
    victim.ok("attach k 0")
    assert w.kv("stat k")["refcount"] == "1"
    victim.kill9()
    assert wait_until(lambda: w.kv("stat k")["refcount"] == "0")
    assert wait_until(lambda: w.kv("stats")["used"] == base["used"])
    after = w.kv("stats")
    assert after["leases"] == base["leases"]
    assert after["tensors"] == base["tensors"]
    assert wait_until(lambda: daemon.fd_count() == base_fds)


def test_unlink_while_attached_keeps_data_until_release(daemon, clients):
    w, r = clients(), clients()
    w.ok("create u uint8 1048576")
    w.ok("fill u 9")
    w.ok("publish u")
    w.ok("release u")
    used0 = int(w.kv("stats")["used"])
    r.ok("attach u 0")
    w.ok("unlink u")
    w.err("stat u", "ENOENT")
    w.err("attach u 0", "ENOENT")
    # The name is free again, while the old memory still lives.
    assert r.ok("sum u") == str(9 * 1048576)
    assert int(w.kv("stats")["used"]) == used0
    r.ok("release u")
    assert wait_until(lambda: int(w.kv("stats")["used"]) == used0 - 1048576)


def test_connection_lifetime_and_unpublished_tensors_go_with_their_creator(daemon, clients):
    a, b = clients(), clients()
    a.ok("create conn/t uint8 16 connection")
    a.ok("publish conn/t")
    a.ok("create conn/p uint8 16")
    a.ok("publish conn/p")
    a.ok("create conn/draft uint8 16")
    b.ok("attach conn/t 0")
    a.ok("close")
    # Connection-lifetime: unlinked; its reader keeps valid memory.
    assert wait_until(lambda: b.cmd("stat conn/t").startswith("err ENOENT"))
    assert b.ok("read conn/t 0") == "0"
    b.err("stat conn/draft", "ENOENT")
    # Persistent: stays.
    assert b.kv("stat conn/p")["state"] == "2"
    # Deleters after tensord_close(): the mapping is still valid, the
    # release is a no-op, and the daemon already ended the lease.
    b.ok("close")
    assert b.ok("read conn/t 0") == "0"
    b.ok("release conn/t")


def test_capacity_enospc(daemon_factory, tmp_path):
    d = daemon_factory("--capacity", "1Mi")
    c = Client(d.socket)
    try:
        c.ok("create a uint8 700000")
        out = c.err("create b uint8 700000", "ENOSPC")
        assert "'b'" in out and "free" in out
        c.ok("release a")
        c.ok("unlink a")
        c.ok("create b uint8 700000")
        assert c.kv("stats")["capacity"] == str(1 << 20)
    finally:
        c.close()


def test_errors_name_the_tensor(daemon, clients):
    c = clients()
    c.ok("create dup uint8 4")
    assert "'dup'" in c.err("create dup uint8 4", "EEXIST")
    assert "'missing'" in c.err("stat missing", "ENOENT")
    assert "'missing'" in c.err("unlink missing", "ENOENT")
    out = c.err("create bad$name uint8 4", "EINVAL")
    assert "bad$name" in out and "[A-Za-z0-9._:/-]" in out
    out = c.err("create neg int32 -1", "EINVAL")
    assert "'neg'" in out and "shape" in out
    c.ok("publish dup")
    assert "'dup'" in c.err("publish dup", "EINVAL")

def test_publish_by_non_creator_is_eperm(daemon, clients):
    a, b = clients(), clients()
    a.ok("create mine uint8 4")
    b.err("publish mine", "ENOENT")  # invisible to others while created
    a.ok("publish mine")
    out = b.err("publish mine", "EPERM")
    assert "mine" in out


def test_stale_socket_replaced_live_socket_refused(daemon_factory, tmp_path):
    d = daemon_factory()
    # A second daemon on the live socket refuses to start.
    p = subprocess.run([build_path("tensord"), "--socket", d.socket], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 1
    assert d.socket in p.stderr and "another tensord" in p.stderr
    # Kill the first one hard: its socket file stays, stale.
    d.proc.kill()
    d.proc.wait()
    assert os.path.exists(d.socket)
    d2 = daemon_factory(sub="d0")  # same socket path
    assert d2.socket == d.socket
    c = Client(d2.socket)
    c.ok("stats")
    c.close()
    d.proc = None  # already reaped; the fixture must not expect exit 0


def test_sigterm_frees_everything_and_exits_0(daemon_factory):
    d = daemon_factory()
    c = Client(d.socket)
    c.ok("create x uint8 4096")
    c.ok("publish x")
    c.ok("attach x 0 x2")
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0
    assert not os.path.exists(d.socket)
    # The client's mapping stays valid after the daemon is gone.
    assert c.ok("read x2 0") == "0"
    c.close()


def test_hup_usr1_usr2_are_logged_not_fatal(daemon_factory):
    d = daemon_factory()
    c = Client(d.socket)
    c.ok("create y uint8 4096")
    c.ok("publish y")
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        d.proc.send_signal(sig)
    assert wait_until(lambda: "SIGUSR2, ignoring" in d.read_log())
    assert d.alive()
    log = d.read_log()
    assert "received SIGHUP, ignoring" in log
    assert "state: 1 clients, 1 tensors (1 named), 1 leases" in log
    assert c.kv("stat y")["refcount"] == "1", "the tensor and its lease are still there"
    c.close()


@pytest.mark.other_uid
def test_permissions_other_uid(daemon_factory, tdclient_for_all):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid (setpriv)")
    d = daemon_factory("--mode", "0666", sub=open_dir())
    owner = Client(d.socket)
    owner.ok("create priv uint8 16")
    owner.ok("publish priv")
    owner.ok("create pub uint8 16 mode=0644")
    owner.ok("publish pub")
    owner.ok("create shared uint8 16 mutable mode=0666")
    owner.ok("publish shared")

    other = Client(d.socket, preexec=as_nobody, exe=tdclient_for_all)
    try:
        out = other.err("attach priv 0", "EACCES")
        assert "priv" in out and "600" in out
        assert other.ok("attach pub 0") == "readonly=1"
        assert other.ok("attach shared 0") == "readonly=0"
        assert "pub" in other.err("unlink pub", "EPERM")
        other.ok("unlink shared")  # mode grants write
        assert owner.kv("stat pub")["owner"] == "0"
    finally:
        other.close()
        owner.close()


@pytest.mark.other_uid
def test_socket_0600_refuses_other_uid(daemon_factory, tdclient_for_all):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    daemon = daemon_factory(sub=open_dir())
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        tdclient_for_all],
                       input=f"connect {daemon.socket}\n", capture_output=True, text=True,
                       timeout=10)
    assert p.stdout.startswith("err EACCES permission denied on " + daemon.socket), p.stdout
    assert "--mode 0660 --group" in p.stdout and "uid 65534" in p.stdout, p.stdout


def test_create_replace_keeps_old_leases(daemon, clients):
    """TENSORD_REPLACE: the new tensor is a draft until its publish, which
    gives it the name in one daemon step; until then others attach the old
    one; a lease on the old one keeps its bytes; the flag is not a tensor
    flag."""
    a, b = clients(), clients()
    a.ok("create r uint8 16")
    a.ok("fill r 7")
    a.ok("publish r")
    a.ok("release r")
    b.ok("attach r 0 old")
    a.err("create r uint8 32", "EEXIST")
    a.ok("create r uint8 32 replace")
    # Until the publish, the name is the old tensor's: others attach it.
    b.ok("attach r 0 before")
    assert b.ok("read before 15") == "7"
    assert b.kv("stat r")["nbytes"] == "16"
    a.ok("fill r 9")
    a.ok("publish r")
    assert b.ok("read old 0") == "7" and b.ok("read old 15") == "7"
    b.ok("attach r 0 new")
    assert b.ok("read new 31") == "9"
    st = b.kv("stat r")
    assert st["nbytes"] == "32" and st["flags"] == "0"
    # Replacing a name nobody has is a plain create.
    a.ok("create fresh uint8 8 replace")
    # Another client's unpublished draft is not the caller's to replace.
    b.err("create fresh uint8 8 replace", "EEXIST")


@pytest.mark.other_uid
def test_replace_by_another_uid_is_refused(daemon_factory, tdclient_for_all):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    d = daemon_factory("--mode", "0666", sub=open_dir())
    owner = Client(d.socket)
    owner.ok("create open uint8 16 mode=0666")
    owner.ok("publish open")

    other = Client(d.socket, preexec=as_nobody, exe=tdclient_for_all)
    try:
        out = other.err("create open uint8 16 replace", "EPERM")
        assert "open" in out and "owner" in out
        assert owner.kv("stat open")["owner"] == "0", "the tensor is untouched"
        other.ok("create mine uint8 4")
        other.ok("publish mine")
        owner.ok("create mine uint8 8 replace")   # root may replace anyone's
        owner.ok("publish mine")
        assert owner.kv("stat mine")["owner"] == "0"
    finally:
        other.close()
        owner.close()
