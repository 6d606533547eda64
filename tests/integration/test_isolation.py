"""What one local uid can do to the daemon and learn of another's tensors
(issue 30, items 2, 3, 5 and 12): a transaction staged past its limit, the
tombstones AttachMany's `after=` counts, watches that never read, and the
lease count of a binding page whose words the client wrote.

Each test acts as real uids against a real daemon, with test_fairness.py's
FairDaemon (a copy of tensord on a 0666 socket) and raw clients connected
with another effective uid (what SO_PEERCRED records). Waits are on states
the daemon reports (its figures and stats), never on sleeps.
"""
import errno
import os

import pytest

from conftest import wait_until
from hostile import Raw, frame, request, f_bytes, f_varint, put_req, reply_with_fds, F_CREATE
from test_fairness import (  # noqa: F401 (fair: a fixture)
    fair, raw_as, stats, tensor_body, usage, U_WAITERS,
)

pytestmark = [pytest.mark.other_uid,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")]

NOBODY, OWNER = 65534, 1001
F_UNLINK, F_COMMIT, F_ATTACH_MANY = 7, 12, 14
R_ATTACH_MANY = 11
# daemon/registry.h
TX_MEMBERS_MAX = 1 << 16


def pipelined(c, payloads, batch=4096):
    """Sends the payloads in batches without waiting; returns their replies."""
    out = []
    for i in range(0, len(payloads), batch):
        chunk = payloads[i:i + batch]
        c.send(b"".join(frame(p) for p in chunk))
        out += [c.reply() for _ in chunk]
    return out


# --- item 2: a full transaction's commit -----------------------------------------------

def test_full_transaction_commits_and_one_more_is_refused(fair):
    """uid 65534 stages 65,536 zero-size creates in one transaction (the
    most it may hold), one more, and commits. The daemon used to die here
    (SIGSEGV: the commit of a full transaction used an uninitialised one);
    now the extra create is refused naming the transaction and the limit,
    the commit publishes the 65,536, and the daemon serves on."""
    d = fair()
    c = raw_as(NOBODY, d.socket)
    c.sock.settimeout(120)
    tx = 9
    reqs = [request(100 + (i & 0xfff), F_CREATE,
                    tensor_body(f"tx/{i}", [0]) + f_varint(21, tx))
            for i in range(TX_MEMBERS_MAX)]
    bad = [r for r in pipelined(c, reqs) if r.status != 0]
    assert not bad, bad[:3]
    r = c.call(request(5, F_CREATE, tensor_body("tx/one-more", [0]) + f_varint(21, tx)))
    assert r.status == -errno.E2BIG, r
    assert f"transaction {tx}" in r.message and str(TX_MEMBERS_MAX) in r.message, r
    r = c.call(request(6, F_COMMIT, f_varint(1, tx)))
    assert r.status == 0, r
    assert d.proc.poll() is None, d.read_log()[-3000:]
    # Published, all of them, for another uid to see; and a second commit of it: gone.
    other = raw_as(OWNER, d.socket)
    other.send(frame(request(7, 5, f_bytes(1, f"tx/{TX_MEMBERS_MAX - 1}"))))
    assert reply_with_fds(other).status == 0
    r = c.call(request(8, F_COMMIT, f_varint(1, tx)))
    assert r.status == -errno.ENOENT and f"transaction {tx}" in r.message, r
    c.close()
    other.close()


# --- item 3: AttachMany's after= hears only of names the caller may read ---------------

def put(c, name, mode, req_id=40):
    r = c.call(put_req(req_id, tensor_body(name, [0], mode), b""))
    assert r.status == 0, r


def unlink(c, name, req_id=41):
    r = c.call(request(req_id, F_UNLINK, f_bytes(1, name)))
    assert r.status == 0, r


def attach_many_req(req_id, prefix, after=0, timeout_ms=0):
    body = f_bytes(2, prefix) + (f_varint(3, after) if after else b"")
    if timeout_ms:  # negative: forever (int64 as a varint)
        body += f_varint(4, timeout_ms & (1 << 64) - 1)
    return request(req_id, F_ATTACH_MANY, body)


def attach_many(c, prefix, after=0, req_id=50):
    """(status, commit, leases) of a no-wait AttachMany of prefix."""
    c.send(frame(attach_many_req(req_id, prefix, after)))
    r = reply_with_fds(c)
    assert r.id == req_id, r
    b = r.body(R_ATTACH_MANY) or {}
    return r.status, b.get(1, [0])[0], len(b.get(2, []))


def test_attach_many_after_is_no_oracle_for_hidden_names(fair):
    """uid 1001 puts and unlinks a 0600 tensor; uid 65534 asks AttachMany
    (prefix=P, after=1, no wait) for prefixes that match its hidden
    tombstone and for prefixes that match nothing. The answers must not
    differ (they were 0 against ETIMEDOUT: the name came out letter by
    letter). An unlink of a tensor 65534 could read still counts."""
    d = fair()
    owner, spy = raw_as(OWNER, d.socket), raw_as(NOBODY, d.socket)
    put(owner, "p/first", 0o644)
    put(owner, "p/u1001/secret-alpha", 0o600)
    unlink(owner, "p/u1001/secret-alpha")
    hidden = [attach_many(spy, p, after=1)[0] for p in (
        "p/u1001/s", "p/u1001/secret-", "p/u1001/secret-alpha")]
    nothing = [attach_many(spy, p, after=1)[0] for p in (
        "p/u1001/t", "p/u1001/secret-b", "p/u1001/secret-alphb")]
    assert hidden == nothing == [-errno.ETIMEDOUT] * 3, (hidden, nothing)
    # The owner itself, and root, hear of it; and of a 0644 unlink 65534 hears too.
    assert attach_many(owner, "p/u1001/s", after=1)[0] == 0
    assert attach_many(raw_as(0, d.socket), "p/u1001/s", after=1)[0] == 0
    put(owner, "p/u1001/open", 0o644)
    unlink(owner, "p/u1001/open")
    assert attach_many(spy, "p/u1001/o", after=1)[0] == 0
    assert attach_many(spy, "p/u1001/s", after=1)[0] == -errno.ETIMEDOUT


def test_parked_attach_many_does_not_wake_for_a_hidden_unlink(fair):
    """uid 65534 parks attach_many("p/", after=now); uid 1001 unlinks its
    0600 p/u1001/hidden. The wait must stay parked: a Stats sent after the
    unlink returned is answered before any AttachMany reply, and counts
    65534's waiter. A publish 65534 may read then wakes it."""
    d = fair()
    owner, spy = raw_as(OWNER, d.socket), raw_as(NOBODY, d.socket)
    spy_stats = raw_as(NOBODY, d.socket)  # the spy's figures, seen from a second connection
    spy.sock.settimeout(30)
    put(owner, "p/u1001/hidden", 0o600)
    put(owner, "p/base", 0o644)
    status, now, n = attach_many(spy, "p/")
    assert status == 0 and now and n == 1, (status, now, n)
    spy.send(frame(attach_many_req(60, "p/", after=now, timeout_ms=-1)))
    assert wait_until(lambda: usage(stats(spy_stats), NOBODY, U_WAITERS) == 1), \
        "the attach_many never parked"
    unlink(owner, "p/u1001/hidden")  # committed (and its wakes run) before this returns
    r = spy.call(request(61, 10, b""))  # Stats on the parked connection
    assert r.id == 61, f"the hidden unlink woke the parked attach_many: {r}"
    assert usage(r.body(8), NOBODY, U_WAITERS) == 1, r.body(8)
    put(owner, "p/u1001/visible", 0o644)
    r = reply_with_fds(spy)
    assert r.id == 60 and r.status == 0, r
    assert r.body(R_ATTACH_MANY)[1][0] > now


# --- item 12: a binding page's hostile counts, summed without wrapping -------------------

F_BIND_PAGE, R_LEASE, L_BIND_SLOT = 25, 5, 12
PAGE_WORDS = 8192  # daemon/registry.h REG_PAGE_WORDS: the client's half starts here
INT32_MAX = (1 << 31) - 1


def test_leases_count_of_a_scribbled_binding_page_is_clamped(fair):
    """A client binds three leases of one tensor and writes the local
    leases each serves into its half of its binding page: 1 each, then
    2^31-1, 2^64-1 and 2^32 each. The count `tensorctl leases` shows for
    that connection is the sum, clamped once at 2^31-1; it was summed in 32
    bits (three times 2^31-1 showed 2147483645)."""
    import json
    import mmap
    import struct as st

    d = fair()
    c = raw_as(NOBODY, d.socket)
    r = c.call(put_req(41, tensor_body("b/x", [4], 0o644), bytes(16)))
    assert r.status == 0, r
    fds = []
    c.send(frame(request(42, F_BIND_PAGE, b"")))
    r = reply_with_fds(c, keep=fds)
    assert r.status == 0 and len(fds) == 1, r
    size = 2 * PAGE_WORDS * 8
    page = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    slots = []
    for i in range(3):
        c.send(frame(request(50 + i, 5, f_bytes(1, "b/x") + f_varint(6, 1))))
        r = reply_with_fds(c)
        assert r.status == 0, r
        slots.append(r.body(R_LEASE).get(L_BIND_SLOT, [0])[0])
    assert len(set(slots)) == 3 and 0 not in slots, slots

    def counts():
        p = fair.tools.run_as(0, ["tensorctl", "--socket", d.socket, "leases", "--json", "b/x"])
        assert p.returncode == 0, p.stderr
        return [row["count"] for row in json.loads(p.stdout)]

    for claim in (1, INT32_MAX, (1 << 64) - 1, 1 << 32):
        for s in slots:
            st.pack_into("<Q", page, (PAGE_WORDS + s) * 8, claim)
        assert counts() == [min(3 * claim, INT32_MAX)], claim
    page.close()
    for fd in fds:
        os.close(fd)
    c.close()
