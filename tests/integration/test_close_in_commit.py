"""A connection whose send fails is closed later, never under the caller
that saw the failure (issue 30, item 1; docs/design.md, "Closing a
connection").

Closing a connection runs its on_close, which frees what refers to it: its
connection-lifetime tensors, its watchers, its waiters. When a send to a
client that had just closed its socket closed the connection at once, a
reply sent from inside a commit freed what the commit was still using: the
red team's mutator found three such use-after-frees within seconds under
AddressSanitizer. Each case here replays one deterministically: the daemon
is stopped (SIGSTOP) while the clients send and close in the order that
makes the daemon meet the closed socket in the middle of the commit, then
let go. The ASan suite (make test-asan) runs these against the sanitized
daemon, whose report fails the test; every build checks the daemon survived
with nothing leaked (descriptors back to the baseline) and still serves.
"""
import os
import signal
import socket

import pytest

from conftest import wait_until
from hostile import (F_ATTACH, F_CREATE, Raw, create_body, f_bytes, f_varint, frame, healthy, hd,
                     put_req, reply_with_fds, request)

F_PUBLISH, F_WATCH = 4, 16
LIFETIME_CONNECTION = 1 << 1

__all__ = ["hd"]  # the fixture, imported for pytest


def attach_req(req_id, name, timeout_ms):
    return request(req_id, F_ATTACH, f_bytes(1, name) + f_varint(2, timeout_ms))


def watch_req(req_id, prefix, replay=False):
    return request(req_id, F_WATCH, f_bytes(1, prefix) + (f_varint(4, 1) if replay else b""))


def put_frame(req_id, name, flags=0):
    return frame(put_req(req_id, create_body(name, (4,), flags=flags), b"\1" * 16))


class Stopped:
    """The daemon stopped for the with-block: what clients send and close
    meanwhile reaches it all at once, in that order, when it goes on."""

    def __init__(self, d):
        self.d = d

    def __enter__(self):
        os.kill(self.d.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.d.pid, signal.SIGCONT)


def hard_close(c):
    """Closes with nothing unread kept: the daemon's next send gets EPIPE."""
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()


def served_requests(d):
    """Requests the daemon has handled, less the hellos and stats of the
    checks themselves."""
    n = d.stats().get("requests_total", {})
    return sum(v for k, v in n.items() if k not in ("hello", "stats"))


def settle(d, before, n):
    """Waits until the daemon has served n more requests than before."""
    assert wait_until(lambda: served_requests(d) >= before + n), d.read_log()[-3000:]


@pytest.mark.parametrize("how", ["put", "create_publish"])
def test_own_waiter_answered_by_a_commit_on_a_closed_socket(hd, how):
    """Attach(n, 10 s) parks a waiter; a put (or create + publish) of n on
    the same connection, made connection-lifetime, wakes it; the socket is
    already closed, so its lease reply fails. The close that failure causes
    frees the tensor, which the put's own reply still reads."""
    for round_ in range(3):
        c = Raw(hd.socket)
        c.hello()
        name = f"uaf/own-{how}-{round_}"
        if how == "create_publish":
            # The create's reply (and its descriptor) must get through: the
            # socket closes only after.
            c.send(frame(request(3, F_CREATE, create_body(name, (4,), flags=LIFETIME_CONNECTION))))
            r = reply_with_fds(c)
            assert r.status == 0, r
        frames = frame(attach_req(2, name, 10000))
        if how == "put":
            frames += put_frame(3, name, LIFETIME_CONNECTION)
        else:
            frames += frame(request(4, F_PUBLISH, f_bytes(1, name)))
        before = served_requests(hd)
        with Stopped(hd):
            c.send(frames)
            hard_close(c)
        settle(hd, before, 2)
        assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, hd.baseline)


def test_watch_replay_on_a_closed_socket(hd):
    """Watch(p/, replay) on a socket closed at once: its own reply fails,
    and the replay that follows must not use the watcher that close frees."""
    w = Raw(hd.socket)
    w.hello()
    for i in range(4):
        r = w.call(put_req(10 + i, create_body(f"p/r{i}", (4,)), b"\0" * 16))
        assert r.status == 0, r
    w.close()
    base = hd.fd_count()  # the tensors' memory (a slab) stays
    for _ in range(3):
        c = Raw(hd.socket)
        c.hello()
        before = served_requests(hd)
        with Stopped(hd):
            c.send(frame(watch_req(2, "p/", replay=True)))
            hard_close(c)
        settle(hd, before, 1)
        assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, base)


def watchers(d, n_conns, per_conn, prefix):
    """n_conns connections, each watching prefix per_conn times."""
    out = []
    for _ in range(n_conns):
        c = Raw(d.socket)
        c.hello()
        for k in range(per_conn):
            r = c.call(watch_req(100 + k, prefix))
            assert r.status == 0, r
        out.append(c)
    return out


def test_watchers_closed_while_another_connection_commits(hd):
    """A put on one connection commits while the connections of several
    watchers are already closed (the put's frame arrives first): each
    watcher's event fails to send, and the close that causes frees every
    watcher of that connection while the commit walks them."""
    base = None
    for round_ in range(3):
        ws = watchers(hd, 3, 4, "q/")
        p = Raw(hd.socket)
        p.hello()
        before = served_requests(hd)
        with Stopped(hd):
            p.send(put_frame(2, f"q/x{round_}"))
            for w in ws:
                hard_close(w)
        settle(hd, before, 1)
        r = p.reply()
        assert r.status == 0, r
        p.close()
        assert hd.alive(), hd.read_log()[-3000:]
        base = base or hd.fd_count()  # the first put's slab stays
    healthy(hd, base)


def test_lifetime_tensors_unlinked_at_eof_meet_closed_watchers(hd):
    """No request in flight: a connection holding connection-lifetime
    tensors ends (EOF), and the commit of their unlink meets watchers whose
    connections closed just after it."""
    for round_ in range(3):
        ws = watchers(hd, 3, 4, "l/")
        owner = Raw(hd.socket)
        owner.hello()
        for i in range(3):
            r = owner.call(put_req(10 + i, create_body(f"l/t{round_}-{i}", (4,),
                                                       flags=LIFETIME_CONNECTION), b"\0" * 16))
            assert r.status == 0, r
        assert hd.stats()["tensors"] == 3
        # The watchers heard of the puts; drain nothing: their sockets go.
        with Stopped(hd):
            hard_close(owner)
            for w in ws:
                hard_close(w)
        assert wait_until(lambda: (lambda s: s.get("clients") == 1 and s.get("tensors") == 0)(
            hd.stats())), hd.read_log()[-3000:]
        assert hd.alive(), hd.read_log()[-3000:]
    healthy(hd, hd.baseline)
