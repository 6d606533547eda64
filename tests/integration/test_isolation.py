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
from hostile import Raw, frame, request, f_bytes, f_varint, reply_with_fds, F_CREATE
from test_fairness import fair, raw_as, tensor_body  # noqa: F401 (fair: a fixture)

pytestmark = [pytest.mark.other_uid,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")]

NOBODY, OWNER = 65534, 1001
F_COMMIT = 12
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
