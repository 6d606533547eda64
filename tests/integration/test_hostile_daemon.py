"""A hostile daemon against a real client process (tdclient, over
libtensord): reply frames whose descriptor count (proto/frame.h) and the
descriptors that come with them disagree, more descriptors at once than the
client's control room holds (MSG_CTRUNC), counts above what a reply
carries. The call fails with EPROTO and says why, every descriptor the
client received is closed at once (its /proc/PID/fd is counted), and the
client neither crashes nor leaks: it exits 0, which under ASan
(`make test-asan`) includes LeakSanitizer's verdict. An honest reply with
a counted descriptor goes through. A reserve whose memfd is smaller than
the size its reply names is given back unread, not read into SIGBUS.

The fake daemon answers Hello as tensord does and the next request (a
Stats) with the frame and descriptors of the case, then keeps the
connection open until the client closes it, so the client's failure is its
own finding, not an end of file."""
import os
import socket
import threading

import pytest

from hostile import (
    f_bytes, f_varint, fd_flags, frame, decode, F_HELLO, R_HELLO, R_STATS, VERSION, MAX_REQUEST,
)
from conftest import wait_until
from test_core import Client

COUNT_ABOVE = "more descriptors than the 240 a reply carries"
ONE_KIND = "2 descriptors with a reply that carries one"


def reply(req_id, body_field, body=b""):
    return f_varint(1, req_id) + f_bytes(body_field, body)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


class FakeDaemon:
    """Serves one connection on path: Hello honestly, then every other
    request with answer(sock, request_id)."""

    def __init__(self, path, answer):
        self.answer = answer
        self.errors = []
        self.requests = []  # every request but Hello, decoded, in order
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            try:
                while True:
                    head = recv_exact(conn, 8)
                    if head is None:
                        return
                    length = int.from_bytes(head[:4], "little")
                    fields = decode(recv_exact(conn, length) or b"")
                    req_id = fields.get(1, [0])[0]
                    if F_HELLO in fields:
                        body = f_varint(1, VERSION) + f_varint(2, os.getpid()) \
                            + f_varint(3, MAX_REQUEST)
                        conn.sendall(frame(reply(req_id, R_HELLO, body)))
                    else:
                        self.requests.append(fields)
                        self.answer(conn, req_id)
            except Exception as e:  # the test reads self.errors
                self.errors.append(e)

    def close(self):
        self.listener.close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the fake daemon is still serving"
        assert not self.errors, self.errors


def send_with_fds(n_fds_counted, n_sent, flags=None):
    """An answer: a Stats reply whose header counts n_fds_counted (or has
    these raw flags), sent in one message with n_sent descriptors."""
    # One figure (StatsReply.figures = 60): "tensors", a sample of 0.
    figures = f_bytes(60, f_bytes(1, b"tensors") + f_bytes(7, b""))

    def answer(conn, req_id):
        data = frame(reply(req_id, R_STATS, figures),
                     flags=fd_flags(n_fds_counted) if flags is None else flags)
        fds = [os.memfd_create("hostile", os.MFD_CLOEXEC) for _ in range(min(n_sent, 1))]
        try:
            if n_sent:
                socket.send_fds(conn, [data], fds * n_sent)
            else:
                conn.sendall(data)
        finally:
            for fd in fds:
                os.close(fd)
    return answer


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def started(c):
    """c's descriptors once it runs tdclient: until its exec, the forked
    child also holds subprocess's error pipe."""
    c.err("ready?", "EINVAL")
    return fd_count(c.p.pid)


@pytest.mark.parametrize("answer,why", [
    (send_with_fds(1, 0), "sent 0 descriptors with frames that count 1"),      # (a)
    (send_with_fds(1, 2), "sent 2 descriptors with frames that count 1"),      # (b)
    (send_with_fds(0, 1), "sent 1 descriptor with frames that count 0"),
    (send_with_fds(1, 250), "MSG_CTRUNC"),                                     # (c)
    (send_with_fds(2, 2), ONE_KIND),
    (send_with_fds(256, 0), COUNT_ABOVE),
    (send_with_fds(0, 1, flags=0x0100), COUNT_ABOVE),   # beyond the first, no first
], ids=["counted-none-came", "two-for-one", "uncounted", "ctrunc", "count-2", "count-256",
        "extra-without-first"])
def test_client_refuses_fd_mismatch(tmp_path, answer, why):
    fake = FakeDaemon(str(tmp_path / "fake.sock"), answer)
    c = Client(None, connect=False)
    try:
        before = started(c)
        c.ok("connect " + str(tmp_path / "fake.sock"))
        connected = fd_count(c.p.pid)
        out = c.err("stats", "EPROTO")
        assert why in out, out
        # Every descriptor that came is closed already; the socket is
        # the client's until it closes.
        assert fd_count(c.p.pid) == connected, os.listdir(f"/proc/{c.p.pid}/fd")
        c.err("stats", "EPROTO")     # the connection stays failed, nothing opened
        c.ok("close")
        assert fd_count(c.p.pid) == before, os.listdir(f"/proc/{c.p.pid}/fd")
        c.ok("exit")
        assert c.p.wait(timeout=30) == 0
    finally:
        c.close()
        fake.close()


@pytest.mark.parametrize("n_fds", [0, 1])
def test_client_takes_counted_fd(tmp_path, n_fds):
    """Honest framing: the descriptor a frame counts is taken with it (and
    closed by a call that has no use for one); the connection goes on."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"), send_with_fds(n_fds, n_fds))
    c = Client(None, connect=False)
    try:
        before = started(c)
        c.ok("connect " + str(tmp_path / "fake.sock"))
        connected = fd_count(c.p.pid)
        for _ in range(3):
            assert c.ok("stats").startswith("tensors=0"), "stats"
            assert fd_count(c.p.pid) == connected
        c.ok("close")
        assert fd_count(c.p.pid) == before
        c.ok("exit")
        assert c.p.wait(timeout=30) == 0
    finally:
        c.close()
        fake.close()


def test_client_survives_a_reserve_smaller_than_it_says(tmp_path):
    """A Reserve reply whose memfd is smaller than the size it names: the
    library populates a reserve by reading every page, and a read past the
    memfd's end is SIGBUS. The client checks first: it gives the reserve
    back (Unreserve), asks for no more, and goes on serving."""
    F_STATS_REQ, F_RESERVE, F_UNRESERVE = 10, 23, 24
    fakes = []

    def answer(conn, req_id):
        fields = fakes[0].requests[-1]
        if F_RESERVE in fields:
            fd = os.memfd_create("hostile", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, 4096)  # and says 4 MiB
                body = f_varint(1, 7) + f_varint(2, 4 << 20)
                socket.send_fds(conn, [frame(reply(req_id, 23, body), flags=fd_flags(1))], [fd])
            finally:
                os.close(fd)
        elif F_UNRESERVE in fields:
            pass  # one-way: no reply
        elif F_STATS_REQ in fields:
            figures = f_bytes(60, f_bytes(1, b"tensors") + f_bytes(7, b""))
            conn.sendall(frame(reply(req_id, R_STATS, figures)))
        else:  # the creates: refused with ENOSPC (status, sint32 zigzag)
            conn.sendall(frame(f_varint(1, req_id) + f_varint(2, 2 * 28 - 1)))

    fakes.append(FakeDaemon(str(tmp_path / "fake.sock"), answer))
    asked = lambda kind: sum(kind in f for f in fakes[0].requests)  # noqa: E731
    c = Client(None, connect=False)
    try:
        c.ok("connect " + str(tmp_path / "fake.sock"))
        # Two creates of one size class make the library want a reserve of it.
        for i in range(2):
            c.err("create t%d uint8 %d" % (i, 4 << 20), "ENOSPC")
        assert wait_until(lambda: asked(F_UNRESERVE) == 1, 10), fakes[0].requests
        assert c.ok("stats").startswith("tensors=0")
        assert asked(F_RESERVE) == 1, "it asked again"
        c.ok("close")
        c.ok("exit")
        assert c.p.wait(timeout=30) == 0
    finally:
        c.close()
        fakes[0].close()
