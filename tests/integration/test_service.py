"""tensord as a service: socket activation the way systemd passes a socket
(LISTEN_FDS/LISTEN_PID, fd 3), readiness and stopping on a notify socket,
the journal's log format, debug lines for attaches, releases and refusals,
the config file, and --version."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import build_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TENSORD = build_path("tensord")
CTL = build_path("tensorctl")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TENSORD_SOCKET", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID",
                        "JOURNAL_STREAM")}
    env.update(extra)
    return env


def ctl(sock, *args, timeout=30):
    r = subprocess.run([CTL, "--socket", sock] + list(args), capture_output=True, text=True,
                       timeout=timeout, env=clean_env())
    return r


def stop(proc, timeout=20):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)


def listening_socket(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(16)
    return s


def spawn_activated(listener, log, args=(), listen_pid="$$", env=None):
    """Starts tensord the way systemd does for tensord.socket: the listening
    socket as fd 3, LISTEN_FDS=1, LISTEN_PID the daemon's own pid (the shell
    exec's tensord, so $$ is it)."""
    def to_fd3():
        os.dup2(listener.fileno(), 3)   # dup2 clears FD_CLOEXEC: fd 3 survives exec

    return subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=%s exec "$0" "$@"' % listen_pid, TENSORD,
         "--log-level", "debug"] + list(args),
        preexec_fn=to_fd3, close_fds=False, stdout=log, stderr=subprocess.STDOUT,
        env=clean_env(LISTEN_FDS="1", **(env or {})))


def put_and_list(sock, tmp_path, name="svc/x"):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32))
    r = ctl(sock, "put", name, str(tmp_path / "x.npy"))
    assert r.returncode == 0, r.stderr
    r = ctl(sock, "ls", "--json")
    assert r.returncode == 0, r.stderr
    return [t["name"] for t in json.loads(r.stdout)]


def test_socket_activation_serves_the_passed_socket(tmp_path):
    path = str(tmp_path / "activated.sock")
    unused = str(tmp_path / "unused.sock")
    listener = listening_socket(path)
    # A client that connects before the daemon runs waits in the backlog:
    # the race socket activation exists to remove.
    early = subprocess.Popen([CTL, "--socket", path, "stats", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env())
    with open(tmp_path / "log", "wb") as log:
        proc = spawn_activated(listener, log, ["--socket", unused])
    listener.close()
    try:
        out, err = early.communicate(timeout=30)
        assert early.returncode == 0, err
        assert json.loads(out)["daemon_pid"] == proc.pid
        assert put_and_list(path, tmp_path) == ["svc/x"]
        assert not os.path.exists(unused), "bound its own socket despite the passed one"
    finally:
        rc = stop(proc)
    text = (tmp_path / "log").read_text()
    assert rc == 0, text
    assert "listening on %s (passed by the service manager)" % path in text, text
    # The socket is the service manager's: it stays for the next start.
    assert os.path.exists(path)


def test_listen_pid_of_another_process_is_ignored(tmp_path):
    listener = listening_socket(str(tmp_path / "other.sock"))
    own = str(tmp_path / "own.sock")
    r, w = os.pipe()
    os.set_inheritable(w, True)
    with open(tmp_path / "log", "wb") as log:
        proc = spawn_activated(listener, log, ["--socket", own, "--ready-fd", str(w)],
                               listen_pid="1")
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        assert rf.read(1) == b"R", (tmp_path / "log").read_text()
    try:
        assert put_and_list(own, tmp_path) == ["svc/x"]
    finally:
        assert stop(proc) == 0
    assert "listening on %s (mode 600)" % own in (tmp_path / "log").read_text()


def test_passed_descriptor_that_is_not_a_listening_socket_is_refused(tmp_path):
    not_listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with open(tmp_path / "log", "wb") as log:
        proc = spawn_activated(not_listening, log, ["--socket", str(tmp_path / "s")])
    assert proc.wait(timeout=20) == 1
    assert "not a listening Unix stream socket" in (tmp_path / "log").read_text()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_socket_gets_ready_and_stopping(tmp_path, abstract):
    if abstract:
        name = "@tensord-test-%d-%s" % (os.getpid(), tmp_path.name)
        addr = "\0" + name[1:]
    else:
        name = addr = str(tmp_path / "notify")
    nsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    nsock.bind(addr)
    nsock.settimeout(20)
    sock = str(tmp_path / "s")
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen([TENSORD, "--socket", sock], stdout=log,
                                stderr=subprocess.STDOUT, env=clean_env(NOTIFY_SOCKET=name))
    try:
        ready = nsock.recv(4096).decode()
        assert "READY=1" in ready.split("\n"), ready
        assert "STATUS=listening on %s" % sock in ready.split("\n"), ready
        # Ready means ready: a client connects at once, no retry.
        r = ctl(sock, "stats", "--json")
        assert r.returncode == 0, r.stderr
    finally:
        rc = stop(proc)
    assert rc == 0
    stopping = nsock.recv(4096).decode()
    assert "STOPPING=1" in stopping.split("\n"), stopping
    assert re.search(r"^STATUS=stopping: \d+ clients, 0 tensors$", stopping, re.M), stopping


def spawn_with_stderr(tmp_path, log_name, journal_of=None, args=()):
    """tensord with stderr on a file. JOURNAL_STREAM, when journal_of is
    given, names that file's device:inode, as systemd names the stream it
    connected to the journal; "self" names the log file itself."""
    log = open(tmp_path / log_name, "wb")
    env = {}
    if journal_of is not None:
        st = os.fstat((log if journal_of == "self" else journal_of).fileno())
        env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
    r, w = os.pipe()
    proc = subprocess.Popen([TENSORD, "--socket", str(tmp_path / (log_name + ".sock")),
                             "--ready-fd", str(w)] + list(args), pass_fds=(w,),
                            stdout=subprocess.DEVNULL, stderr=log, env=clean_env(**env))
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        assert rf.read(1) == b"R"
    return proc, log


def test_journal_stream_gets_priority_prefixes_and_no_timestamp(tmp_path):
    proc, log = spawn_with_stderr(tmp_path, "journal.log", journal_of="self")
    assert stop(proc) == 0
    log.close()
    lines = (tmp_path / "journal.log").read_text().splitlines()
    assert lines, "no log lines"
    assert all(re.match(r"^<[3467]>\S", line) for line in lines), lines
    assert any(line.startswith("<6>listening on ") for line in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\dT", line) for line in lines), lines


def test_journal_stream_of_another_file_keeps_the_readable_format(tmp_path):
    other = open(tmp_path / "other", "wb")
    proc, log = spawn_with_stderr(tmp_path, "plain.log", journal_of=other)
    assert stop(proc) == 0
    log.close()
    other.close()
    lines = (tmp_path / "plain.log").read_text().splitlines()
    assert any(re.match(r"^\d{4}-\d\d-\d\dT\S+Z info  listening on ", line) for line in lines), \
        lines
    assert not any(line.startswith("<") for line in lines), lines


def test_debug_log_shows_attach_release_and_refusal(daemon, tmp_path):
    # The fixture runs the daemon with --log-level debug.
    from test_core import Client

    put_and_list(daemon.socket, tmp_path, name="dbg/x")
    # Every attach a round trip: a bound lease (docs/design.md, "Attach
    # without a round trip") is released when it has been idle for 1 s.
    c = Client(daemon.socket, env=dict(os.environ, TENSORD_BIND="0"))
    try:
        c.ok("attach dbg/x 0")
        c.ok("release dbg/x")
        c.ok("stats")               # a request after the one-way release
        c.err("attach dbg/missing 0", "ENOENT")
    finally:
        c.close()
    log = daemon.read_log()
    m = re.search(r"tensor 'dbg/x': attached by pid (\d+), lease ([0-9a-f]+)", log)
    assert m, log
    assert "tensor 'dbg/x': lease %s released by pid %s" % (m.group(2), m.group(1)) in log, log
    assert re.search(r"conn \d+: refused with ENOENT: .*dbg/missing", log), log


def test_info_log_has_no_debug_lines(daemon_factory, tmp_path):
    d = daemon_factory("--log-level", "info")
    put_and_list(d.socket, tmp_path, name="quiet/x")
    assert ctl(d.socket, "get", "quiet/x", str(tmp_path / "y.npy")).returncode == 0
    log = d.read_log()
    assert "attached by" not in log and " debug " not in log, log


def start_with_config(tmp_path, text, *args):
    conf = tmp_path / "tensord.conf"
    conf.write_text(text)
    return subprocess.run([TENSORD, "--config", str(conf)] + list(args), capture_output=True,
                          text=True, timeout=20, env=clean_env())


def test_config_file_sets_options_and_flags_override_it(tmp_path):
    sock = tmp_path / "conf.sock"
    conf = tmp_path / "tensord.conf"
    conf.write_text("# a comment\n\n  socket = %s  \ncapacity=3Mi\nlog-level = debug\n" % sock)
    r, w = os.pipe()
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen([TENSORD, "--config", str(conf), "--capacity", "5Mi",
                             "--ready-fd", str(w)], pass_fds=(w,), stdout=log,
                            stderr=subprocess.STDOUT, env=clean_env())
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        assert rf.read(1) == b"R", (tmp_path / "log").read_text()
    try:
        st = json.loads(ctl(str(sock), "stats", "--json").stdout)
        (cpu,) = [d for d in st["devices"] if d["device"] == "cpu"]
        assert cpu["device_capacity_bytes"] == 5 << 20      # the flag, not the file's 3Mi
    finally:
        assert stop(proc) == 0
    log.close()
    assert " debug " in (tmp_path / "log").read_text()   # the file's log-level


@pytest.mark.parametrize("text,message", [
    ("socket = /tmp/x\ncapacity 12\n", ":2: expected 'key = value', got 'capacity 12'"),
    ("\n\n# c\nfrobnicate = 1\n", ":4: unknown key 'frobnicate'"),
    ("capacity = lots\n", ":1: bad value for 'capacity'"),
    ("ready-fd = 3\n", ":1: 'ready-fd' can only be given on the command line"),
    ("mode =\n", ":1: 'mode' has no value"),
])
def test_bad_config_line_is_named_by_file_and_line(tmp_path, text, message):
    r = start_with_config(tmp_path, text, "--socket", str(tmp_path / "never.sock"))
    assert r.returncode == 2
    assert str(tmp_path / "tensord.conf") + message in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "never.sock")


def test_missing_config_given_by_flag_is_an_error(tmp_path):
    r = subprocess.run([TENSORD, "--config", str(tmp_path / "nope.conf")], capture_output=True,
                       text=True, timeout=20, env=clean_env())
    assert r.returncode == 2
    assert "config file %s: No such file or directory" % (tmp_path / "nope.conf") in r.stderr


def read_version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


@pytest.mark.parametrize("binary", [TENSORD, CTL], ids=["tensord", "tensorctl"])
def test_version(binary):
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "%s %s (protocol 1)\n" % (os.path.basename(binary), read_version())


def test_version_agrees_everywhere():
    """VERSION is the one source: nothing else writes a version down. The
    wheel's version comes from setup.py, which reads VERSION; the Python
    module's __version__ is the extension's, built with it."""
    v = read_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v), v
    with open(os.path.join(ROOT, "client", "python", "pyproject.toml")) as f:
        text = f.read()
        assert 'dynamic = ["version"]' in text and "\nversion =" not in text
    with open(os.path.join(ROOT, "client", "python", "tensord", "__init__.py")) as f:
        assert re.search(r"^__version__ =", f.read(), re.M) is None
    pydir = os.path.join(os.environ.get("TENSORD_BUILD", os.path.join(ROOT, "build")), "python")
    if os.path.isdir(os.path.join(pydir, "tensord")):
        r = subprocess.run([sys.executable, "-c", "import tensord; print(tensord.__version__)"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=pydir))
        assert r.stdout.strip() == v, r.stdout + r.stderr
    with open(os.path.join(ROOT, "deploy", "tensord.pc.in")) as f:
        assert "Version: @VERSION@\n" in f.read()     # filled from VERSION (test_install)
