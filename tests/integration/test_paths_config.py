"""Configuration and paths (issue 18, items 14-17): the names a root daemon
creates or opens, and the values it reads, cannot be turned against it.

- item 14: the socket and the --metrics unix: socket. Another uid that may
  write in the socket's directory races a symbolic link into the socket's
  place right after bind(); the daemon refuses such a directory, and never
  changes the mode or owner of anything but the socket it made.
- item 15: --log-file. A symbolic link, a FIFO or a file another uid planted
  is refused; so is a directory that uid owns; the link's target is never
  written, also at SIGHUP's reopen.
- item 16: --config. /dev/zero, a FIFO, a directory, a file over 1 MiB and a
  NUL byte are refused at once, with the path (and the line).
- item 17: numbers. Out-of-range, signed, blank-padded or empty values are
  usage errors (exit 2) naming the option, the value and the range.

Each shows the bad input refused and an honest start still working. Other
uids are played by a Python child that drops to the uid before doing
anything, or by `setpriv`; uids are numbers with no passwd entry.
"""
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import build_path, wait_until
from testlib import copies_for_all, open_dir

ATTACKER, HONEST = 4211, 4212
# Its other uids run copies in bin/ (Host): test_checkout.py runs it from a 0700 checkout.
pytestmark = pytest.mark.other_uid
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root (a root daemon, and other uids played with setpriv)")
# A light daemon: many starts per test.
LIGHT = ["--pool", "0", "--capacity", "16Mi", "--log-level", "info"]


def clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("TENSORD_SOCKET", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID",
                         "JOURNAL_STREAM", "XDG_RUNTIME_DIR")}


class Host:
    """A directory tree like a host's: bin/ (every uid may run it), tmp/
    (sticky and open to all, as /tmp), safe/ (root's, 0755), an attacker's
    own directory, and a root-only file the attacker would like to own."""

    def __init__(self):
        self.root = open_dir(prefix="tensord-paths-")
        self.bin = self.mkdir("bin", 0o755)
        copies_for_all(self.bin, build_path("tensord"), build_path("tensorctl"))
        self.tmp = self.mkdir("tmp", 0o1777)
        self.safe = self.mkdir("safe", 0o755)
        self.evil = self.mkdir("evil", 0o755)
        os.chown(self.evil, ATTACKER, ATTACKER)
        self.secret = os.path.join(self.root, "secret")
        with open(self.secret, "w") as f:
            f.write("root only\n")
        os.chmod(self.secret, 0o600)
        self.procs = []

    def mkdir(self, name, mode):
        p = os.path.join(self.root, name)
        os.mkdir(p)
        os.chmod(p, mode)
        return p

    def secret_state(self):
        st = os.stat(self.secret)
        with open(self.secret) as f:
            return (st.st_mode, st.st_uid, st.st_gid, f.read())

    def tensord(self, *args, uid=0, timeout=30):
        """Starts tensord; (proc, ready, log path). A refusal has exited."""
        r, w = os.pipe()
        log = tempfile.NamedTemporaryFile(dir=self.root, prefix="log-", delete=False)
        cmd = [os.path.join(self.bin, "tensord"), "--ready-fd", str(w)] + list(args)
        if uid:
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] + cmd
        proc = subprocess.Popen(cmd, pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT,
                                env=clean_env(), cwd="/")
        os.close(w)
        with os.fdopen(r, "rb") as rf:
            ready = rf.read(1) == b"R"
        if not ready:
            proc.wait(timeout=timeout)
        else:
            self.procs.append(proc)
        log.close()
        return proc, ready, log.name

    def stop(self, proc):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def no_sanitizer_report(log):
    for report in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        assert report not in log, log


@pytest.fixture
def host():
    h = Host()
    yield h
    h.close()


# What the attacker runs, as its own uid: watch each name; the moment it is
# a socket, rename a symbolic link to the target over it (the swap after
# bind()); with "plant", also put the link there while nothing is, and take
# it away again, so a start sometimes finds it and sometimes not.
RACER = r"""
import os, stat, sys
uid, mode, target, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
names = sys.argv[5:]
os.setgroups([]); os.setgid(uid); os.setuid(uid)
lstat, rename, symlink, unlink = os.lstat, os.rename, os.symlink, os.unlink
S_ISSOCK, S_ISLNK = stat.S_ISSOCK, stat.S_ISLNK
swaps = plants = 0


def ready_link(name):
    # The link is made ahead, so the swap itself is one rename().
    try:
        symlink(target, name + ".swap")
    except FileExistsError:
        pass


for name in names:
    ready_link(name)
print("ready", flush=True)
while not os.path.exists(stop):
    for _ in range(2000):
        for name in names:
            try:
                st = lstat(name)
            except FileNotFoundError:
                if mode == "plant":
                    try:
                        symlink(target, name)
                        plants += 1
                    except OSError:
                        pass
                continue
            if S_ISSOCK(st.st_mode):
                try:
                    rename(name + ".swap", name)
                    swaps += 1
                    ready_link(name)
                except OSError:
                    pass
            elif S_ISLNK(st.st_mode) and st.st_uid == uid:
                try:
                    unlink(name)
                except OSError:
                    pass
print(swaps, plants, flush=True)
"""


class Racer:
    def __init__(self, host, mode, names):
        self.stop_file = os.path.join(host.root, "racer.stop")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RACER, str(ATTACKER), mode, host.secret, self.stop_file]
            + names, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        # Racing from the first daemon on: a loaded machine may take a while
        # to start a Python process, and a test must not finish first.
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", (line, self.proc.stderr.read())

    def finish(self):
        open(self.stop_file, "w").close()
        out, err = self.proc.communicate(timeout=30)
        os.unlink(self.stop_file)
        assert self.proc.returncode == 0, err
        swaps, plants = map(int, out.split())
        return swaps, plants


# --- item 14: the sockets --------------------------------------------------------

@needs_root
def test_socket_in_a_directory_another_uid_owns_is_refused_while_it_races(host):
    sock = os.path.join(host.evil, "tensord.sock")
    metrics = os.path.join(host.evil, "metrics.sock")
    before = host.secret_state()
    racer = Racer(host, "swap", [sock, metrics])
    try:
        for i in range(40):
            # The daemon's socket, then the metrics socket, in the attacker's directory.
            if i % 2 == 0:
                args = ["--socket", sock]
            else:
                args = ["--socket", os.path.join(host.safe, f"s{i}.sock"),
                        "--metrics", "unix:" + metrics]
            proc, ready, log = host.tensord(*args, "--mode", "0666", "--group", str(HONEST),
                                            *LIGHT)
            assert not ready and proc.returncode == 1, read(log)
            text = read(log)
            assert (f"refusing its directory: {host.evil} is owned by uid {ATTACKER}, not "
                    "by root or uid 0 (the daemon's)") in text, text
            no_sanitizer_report(text)
    finally:
        swaps, _ = racer.finish()
    # Nothing was bound there, so nothing was swapped; the target is untouched.
    assert swaps == 0
    assert host.secret_state() == before
    assert not os.listdir(host.safe), "the main socket is removed again"

    # An honest start in a safe directory: the mode and group asked for.
    sock = os.path.join(host.safe, "tensord.sock")
    metrics = os.path.join(host.safe, "metrics.sock")
    proc, ready, log = host.tensord("--socket", sock, "--metrics", "unix:" + metrics,
                                    "--mode", "0660", "--group", str(HONEST), *LIGHT)
    assert ready, read(log)
    for p in (sock, metrics):
        st = os.lstat(p)
        assert stat.S_ISSOCK(st.st_mode)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, HONEST, 0o660), p
    # A user of that group is served (its client trusts root's socket).
    r = subprocess.run(["setpriv", f"--reuid={HONEST}", f"--regid={HONEST}", "--clear-groups",
                        os.path.join(host.bin, "tensorctl"), "--socket", sock, "stats",
                        "--json"], capture_output=True, text=True, timeout=30,
                       env=clean_env(), cwd="/")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["clients"] >= 1
    s = socket.socket(socket.AF_UNIX)
    s.connect(metrics)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.0 200")
    s.close()
    host.stop(proc)
    assert not os.path.exists(sock) and not os.path.exists(metrics)
    no_sanitizer_report(read(log))


@needs_root
def test_socket_in_a_sticky_directory_is_never_redirected(host):
    """In a sticky directory open to all (as /tmp) others may add names but
    not replace the daemon's: a start either finds the attacker's link and
    refuses it, or binds and keeps its socket. Either way the target keeps
    its mode and owner, and every socket that was made is the daemon's."""
    sock = os.path.join(host.tmp, "team.sock")
    metrics = os.path.join(host.tmp, "team-metrics.sock")
    before = host.secret_state()
    started = refused = 0
    racer = Racer(host, "plant", [sock, metrics])
    try:
        for _ in range(16):
            proc, ready, log = host.tensord("--socket", sock, "--metrics", "unix:" + metrics,
                                            "--mode", "0666", "--group", str(HONEST), *LIGHT)
            text = read(log)
            if ready:
                started += 1
                for p in (sock, metrics):
                    st = os.lstat(p)
                    assert stat.S_ISSOCK(st.st_mode), p
                    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, HONEST, 0o666)
                host.stop(proc)
            else:
                refused += 1
                assert proc.returncode == 1, text
                assert ("exists and is a symbolic link; not touching it" in text
                        or "bind: Address already in use" in text), text
            no_sanitizer_report(read(log))
    finally:
        swaps, plants = racer.finish()
    print(f"{started} started, {refused} refused; the racer planted {plants} links")
    assert started + refused == 16
    assert plants > 0, "the racer never planted a link"
    assert host.secret_state() == before
    # Once the attacker stops, an honest start in the same directory works.
    for p in (sock, metrics):
        if os.path.islink(p):
            os.unlink(p)
    proc, ready, log = host.tensord("--socket", sock, "--metrics", "unix:" + metrics, *LIGHT)
    assert ready, read(log)
    assert os.lstat(sock).st_mode & 0o777 == 0o600
    host.stop(proc)


@needs_root
def test_group_writable_directory_is_refused_with_the_reason(host):
    shared = host.mkdir("shared", 0o775)
    os.chown(shared, 0, HONEST)
    proc, ready, log = host.tensord("--socket", os.path.join(shared, "s.sock"), *LIGHT)
    assert not ready and proc.returncode == 1
    text = read(log)
    assert (f"{shared} has mode 0775: others may write in it and it is not sticky" in text), text
    assert "its directory is not safe to use" in text


def test_socket_mode_is_exact_under_a_default_acl(daemon_factory, tmp_path):
    """A default ACL on the directory can take bits the umask at bind()
    left; the mode asked for is then set on the socket's own inode
    (through its O_PATH descriptor), never by name."""
    d = tmp_path / "acl"
    d.mkdir(mode=0o755)
    # system.posix_acl_default: version 2; user::rwx, group::---, other::---.
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xffffffff)
                                          for tag, perm in ((0x01, 7), (0x04, 0), (0x20, 0)))
    try:
        os.setxattr(d, "system.posix_acl_default", acl)
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on {tmp_path}: {e}")
    probe = socket.socket(socket.AF_UNIX)
    probe.bind(str(d / "probe"))
    probe.close()
    assert os.lstat(d / "probe").st_mode & 0o077 == 0, "the ACL takes group and other bits"
    metrics = d / "m.sock"
    daemon = daemon_factory("--mode", "0666", "--metrics", f"unix:{metrics}", sub="acl")
    assert daemon.socket == str(d / "tensord.sock")
    for p in (daemon.socket, metrics):
        assert os.lstat(p).st_mode & 0o7777 == 0o666, p


# --- item 15: the log file -------------------------------------------------------

def as_attacker(*cmd):
    subprocess.run(["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}",
                    "--clear-groups"] + list(cmd), check=True, cwd="/")


@needs_root
def test_log_file_planted_by_another_uid_is_refused(host):
    before = host.secret_state()
    link = os.path.join(host.tmp, "tensord.log")
    as_attacker("ln", "-s", host.secret, link)
    own = os.path.join(host.tmp, "own.log")
    as_attacker("touch", own)
    fifo = os.path.join(host.tmp, "fifo.log")
    as_attacker("mkfifo", fifo)
    cases = [
        (link, "it is a symbolic link, not a regular file"),
        (own, f"it is owned by uid {ATTACKER}, not by root or uid 0 (the daemon's)"),
        (fifo, "it is a FIFO, not a regular file"),       # and no hang on the open
        (os.path.join(host.evil, "tensord.log"),
         f"refusing its directory: {host.evil} is owned by uid {ATTACKER}"),
        ("/dev/null", "it is a character device, not a regular file"),
    ]
    for path, why in cases:
        proc, ready, log = host.tensord("--socket", os.path.join(host.safe, "s.sock"),
                                        "--log-file", path, *LIGHT)
        assert not ready and proc.returncode == 2, read(log)
        assert f"tensord: --log-file {path}: {why}" in read(log), read(log)
    assert host.secret_state() == before
    assert os.path.getsize(own) == 0
    assert not os.path.exists(os.path.join(host.evil, "tensord.log"))

    # An honest log file in the same sticky directory.
    honest = os.path.join(host.tmp, "honest.log")
    proc, ready, log = host.tensord("--socket", os.path.join(host.safe, "s.sock"),
                                    "--log-file", honest, *LIGHT)
    assert ready, read(log)
    st = os.lstat(honest)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_mode & 0o777) == (0, 0o640)
    assert "listening on" in read(honest)
    host.stop(proc)


@needs_root
def test_log_reopen_does_not_follow_a_link_planted_after_rotation(host):
    """SIGHUP reopens the log by name: after a rotation moved it away, the
    attacker plants a link in its place. The reopen refuses it, says so in
    the old file, and the daemon serves on."""
    before = host.secret_state()
    logf = os.path.join(host.tmp, "rot.log")
    sock = os.path.join(host.safe, "s.sock")
    proc, ready, log = host.tensord("--socket", sock, "--log-file", logf, *LIGHT)
    assert ready, read(log)
    os.rename(logf, logf + ".1")                          # logrotate
    as_attacker("ln", "-s", host.secret, logf)
    os.kill(proc.pid, signal.SIGHUP)
    assert wait_until(lambda: "cannot reopen the log file" in read(logf + ".1")), \
        read(logf + ".1")
    assert f"log file {logf}: it is a symbolic link, not a regular file" in read(logf + ".1")
    assert host.secret_state() == before
    r = subprocess.run([os.path.join(host.bin, "tensorctl"), "--socket", sock, "stats"],
                       capture_output=True, text=True, timeout=30, env=clean_env())
    assert r.returncode == 0, r.stderr
    # With the link gone, the next SIGHUP reopens an honest file.
    os.unlink(logf)
    os.kill(proc.pid, signal.SIGHUP)
    assert wait_until(lambda: os.path.exists(logf) and "reopened the log file" in read(logf))
    host.stop(proc)
    assert host.secret_state() == before


# --- item 16: the config file ----------------------------------------------------

def tensord_rc(*args, timeout=30):
    return subprocess.run([build_path("tensord")] + list(args), capture_output=True,
                          text=True, timeout=timeout, env=clean_env())


def test_config_that_is_not_a_small_regular_text_file_is_refused(tmp_path):
    sock = str(tmp_path / "never.sock")
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    big = tmp_path / "big.conf"
    big.write_bytes(b"# padding\n" * 200000)               # 2,000,000 bytes
    nul = tmp_path / "nul.conf"
    nul.write_bytes(b"log-level = info\nmode = 06\x0066\n")
    cases = [
        ("/dev/zero", "config file /dev/zero: is a character device, not a regular file"),
        (str(fifo), f"config file {fifo}: is a FIFO, not a regular file"),
        (str(tmp_path), f"config file {tmp_path}: is a directory, not a regular file"),
        (str(big), f"config file {big}: larger than the limit of 1048576 bytes (1 MiB)"),
        (str(nul), f"{nul}:2: contains a NUL byte"),
    ]
    for path, message in cases:
        # A timeout, not a measurement: /dev/zero used to be read for 0.7 GiB.
        r = tensord_rc("--config", path, "--socket", sock, timeout=20)
        assert r.returncode == 2, (path, r.stderr)
        assert message in r.stderr, r.stderr
        assert not os.path.exists(sock)

    # An honest file just under the limit is read and applied.
    honest = tmp_path / "honest.conf"
    honest.write_text("# padding\n" * 100000 + f"socket = {sock}\ncapacity = 3Mi\n")
    assert honest.stat().st_size < 1 << 20
    r, w = os.pipe()
    proc = subprocess.Popen([build_path("tensord"), "--config", str(honest), "--ready-fd",
                             str(w), "--pool", "0"], pass_fds=(w,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env())
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        assert rf.read(1) == b"R"
    try:
        out = subprocess.run([build_path("tensorctl"), "--socket", sock, "stats", "--json"],
                             capture_output=True, text=True, timeout=30, env=clean_env())
        (cpu,) = [d for d in json.loads(out.stdout)["devices"] if d["device"] == "cpu"]
        assert cpu["device_capacity_bytes"] == 3 << 20
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


# --- item 17: numbers ------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--max-clients", "-5"], "--max-clients -5: not a number from 1 to 4294967295"),
    (["--max-clients", "4294967297"], "--max-clients 4294967297: not a number from 1 to "),
    (["--max-clients", "0"], "--max-clients 0: not a number from 1 to 4294967295"),
    (["--capacity", " -1"], "--capacity ' -1': not a size from 1 to 18446744073709551615"),
    (["--capacity", "17179869184Gi"], "--capacity 17179869184Gi: not a size from 1 to "),
    (["--pool", "-1"], "--pool -1: not a size from 0 to 18446744073709551614 bytes"),
    (["--ready-fd", "4294967299"], "--ready-fd 4294967299: not a descriptor from 0 to "
                                   "2147483647"),
    (["--group", ""], "--group '': no such group, and not a gid from 0 to 4294967294"),
    (["--group", "4294967295"], "--group 4294967295: not a gid from 0 to 4294967294"),
    (["--mode", "+600"], "--mode +600: not an octal mode from 0 to 0777"),
    (["--mode", "0666 "], "--mode '0666 ': not an octal mode from 0 to 0777"),
    (["--max-tensors-per-uid", "4294967296"], "--max-tensors-per-uid 4294967296: not a "
                                              "number from 1 to 4294967295"),
    (["--max-waiters-per-conn", "1e3"], "--max-waiters-per-conn 1e3: not a number"),
    (["--quota-exempt-uid", "-1"], "--quota-exempt-uid -1: not a uid from 0 to 4294967294"),
    (["--max-bytes-per-uid", "0x10"], "--max-bytes-per-uid 0x10: not a size from 1 to "),
])
def test_numbers_out_of_range_are_usage_errors(tmp_path, args, message):
    sock = str(tmp_path / "never.sock")
    r = tensord_rc("--socket", sock, *args)
    assert r.returncode == 2, r.stderr
    assert f"tensord: {message}" in r.stderr, r.stderr
    assert not os.path.exists(sock)


def test_numbers_in_the_config_file_are_checked_the_same_way(tmp_path):
    conf = tmp_path / "tensord.conf"
    conf.write_text("max-clients = -5\n")
    r = tensord_rc("--config", str(conf), "--socket", str(tmp_path / "never.sock"))
    assert r.returncode == 2
    assert "tensord: --max-clients -5: not a number from 1 to 4294967295" in r.stderr
    assert f"{conf}:1: bad value for 'max-clients'" in r.stderr


def test_numbers_at_their_bounds_still_start(daemon_factory):
    d = daemon_factory("--max-clients", "8", "--capacity", "3Mi", "--pool", "0",
                       "--max-waiters-per-conn", "4294967295", "--max-tensors-per-uid",
                       "4294967295", "--quota-exempt-uid", "4294967294", "--mode", "0600",
                       "--group", "0")
    # max-clients landed as 8 (the per-uid default is a quarter of it), not wrapped.
    assert "shares per uid: 2 connections, 4294967295 tensors" in d.read_log(), d.read_log()
    assert "per connection 4294967295 waiters" in d.read_log()
    (cpu,) = [x for x in d.stats()["devices"] if x["device"] == "cpu"]
    assert cpu["device_capacity_bytes"] == 3 << 20
    assert os.lstat(d.socket).st_gid == 0
