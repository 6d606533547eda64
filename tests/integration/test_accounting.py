"""Accounting a reader cannot break (issue 18, items 7-9), as real uids
(docs/security.md, "What a reader can pin"): what a tensor takes is what
its owner and the device are charged; bytes that only others' leases keep
alive count against those others, not the owner; and memory of freed
tensors that clients still map shows in the daemon's cgroup figure.

The daemons and the other uids come from test_fairness.py's fixture: a root
daemon on a socket every uid may reach, uids played with setresuid."""
import os
import subprocess

import pytest

from conftest import build_path, wait_until
from hostile import (
    F_RELEASE, F_UNLINK, decode, f_bytes, f_varint, frame, put_req, reply_with_fds, request,
)
from test_fairness import (  # noqa: F401 (fair is a fixture)
    R_LEASE, fair, make_tensor, raw_as, stats, tensor_body, usage,
)

pytestmark = [pytest.mark.other_uid,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")]

NOBODY, OWNER, READER, HONEST = 65534, 4301, 4302, 4303
U_BYTES = 4
S_DEVICES, S_TENSORS = 6, 1


def put(c, req_id, name, data, mode=0o644, replace=False):
    body = tensor_body(name, [len(data)], mode)
    # uint8 tensors: tensor_body makes float32 ones; patch the dtype to uint8.
    body = body.replace(f_bytes(2, f_varint(1, 2) + f_varint(2, 32) + f_varint(3, 1)),
                        f_bytes(2, f_varint(1, 1) + f_varint(2, 8) + f_varint(3, 1)))
    if replace:
        body += f_varint(20, 1)
    return c.call(put_req(req_id, body, data))


def device_used(sb):
    """The host device's bytes in use, from StatsReply.devices[0].bytes_used."""
    return decode(sb[S_DEVICES][0]).get(4, [0])[0]


def test_item7_one_byte_puts_are_charged_their_slot(fair):
    """uid 65534 puts 1-byte tensors under a 64 KiB share: each takes a
    256-byte slab slot and is charged that, so the share stops it after 256
    (it used to take 65,536 of them, 2 MB of slabs, counted as 64 KiB), and
    the device counts what the slabs hold. An honest uid is still served."""
    d = fair("--max-bytes-per-uid", "64Ki", "--capacity", "4Mi", "--pool", "0")
    c = raw_as(NOBODY, d.socket)
    n = 0
    while True:
        r = put(c, 10 + n, b"one/%d" % n, b"\x01")
        if r.status:
            break
        n += 1
        assert n <= 1024, "a 64 KiB share took more than 1024 one-byte tensors"
    assert r.status == -122, r                            # EDQUOT
    assert "--max-bytes-per-uid" in r.message, r.message
    assert n == 64 * 1024 // 256, n
    sb = stats(c)
    assert usage(sb, NOBODY, U_BYTES) == 64 * 1024
    assert device_used(sb) == 64 * 1024
    h = raw_as(HONEST, d.socket)
    assert put(h, 5, b"honest", b"\x07" * 100).status == 0
    h.close()
    c.close()


def test_item8_readers_pinning_old_versions_do_not_starve_the_owner(fair):
    """The owner replaces a 2 MiB tensor ten times under an 8 MiB share while
    a reader of another uid keeps a lease on every version it attached. The
    owner is never refused (the old versions count against the reader), and
    the reader, once its leases keep more than its pinned share alive, may
    attach nothing more until it lets them go."""
    d = fair("--max-bytes-per-uid", "8Mi", "--capacity", "64Mi", "--pool", "0")
    owner = raw_as(OWNER, d.socket)
    reader = raw_as(READER, d.socket)
    data = b"\x05" * (2 << 20)
    leases = []
    refused = None
    for i in range(10):
        # Too large for one request: create (replace), write, publish.
        body = tensor_body(b"w", [512 * 1024], 0o644) + f_varint(20, 1)
        owner.send(frame(request(100 + i, 3, body)))
        r = reply_with_fds(owner)
        assert r.status == 0, (i, r)                      # never refused
        lease = r.body(R_LEASE)[1][0]
        r = owner.call(request(200 + i, 4, f_bytes(1, b"w")))
        assert r.status == 0, (i, r)
        owner.send(frame(request(0, F_RELEASE, f_varint(1, lease))))
        reader.send(frame(request(300 + i, 5, f_bytes(1, b"w"))))
        r = reply_with_fds(reader)
        if r.status == 0:
            leases.append(r.body(R_LEASE)[1][0])
        elif refused is None:
            refused = (i, r)
    sb = stats(owner)
    assert usage(sb, OWNER, U_BYTES) == 2 << 20           # only what it names
    assert refused is not None, "the reader was never refused"
    i, r = refused
    assert r.status == -122, r                            # EDQUOT
    assert "--max-pinned-bytes-per-uid" in r.message and "'w'" in r.message, r.message
    assert i == 5, i              # 4 old versions = 8 MiB pinned fit, the fifth not
    # Letting them go frees them and lets the reader attach again.
    for lease in leases:
        reader.send(frame(request(0, F_RELEASE, f_varint(1, lease))))
    assert wait_until(lambda: stats(owner).get(S_TENSORS, [0])[0] == 1)
    reader.send(frame(request(400, 5, f_bytes(1, b"w"))))
    assert reply_with_fds(reader).status == 0
    reader.close()
    owner.close()


def metric(d, name):
    """A figure of `tensorctl stats --prometheus` (root's view), or None."""
    out = subprocess.run([build_path("tensorctl"), "--socket", d.socket, "stats",
                          "--prometheus"], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        if (line.startswith(name + " ") or line.startswith(name + "{")) and \
                ("{" not in line or 'device="cpu"' in line):
            return int(line.split()[-1])
    return None


def test_item9_descriptors_a_reader_keeps_show_in_the_cgroup_figure(fair):
    """A reader attaches a 32 MiB tensor, keeps the memfd descriptor the
    daemon sent, and releases its lease; the owner unlinks it. The daemon
    counts nothing for it any more, but the kernel keeps its pages while the
    reader holds the descriptor, charged to the daemon's memory cgroup: the
    figure the daemon reports from there shows them, until the reader closes
    it. (The daemon cannot bound this: docs/security.md, "What a reader can
    pin", says what an operator sets.)"""
    d = fair("--pool", "0")
    base = metric(d, "tensord_host_cgroup_shmem_bytes")
    if base is None:
        pytest.fail("tensord_host_cgroup_shmem_bytes is missing: the daemon's memory "
                    "cgroup has no readable memory.stat here")
    used0 = metric(d, "tensord_device_used_bytes")
    owner = raw_as(OWNER, d.socket)
    make_tensor(owner, b"big", 8 << 20)                   # 8 Mi floats: 32 MiB
    reader = raw_as(READER, d.socket)
    fds = []
    try:
        reader.send(frame(request(5, 5, f_bytes(1, b"big"))))
        r = reply_with_fds(reader, keep=fds)
        assert r.status == 0 and len(fds) == 1, r
        reader.send(frame(request(0, F_RELEASE, f_varint(1, r.body(R_LEASE)[1][0]))))
        r = owner.call(request(6, F_UNLINK, f_bytes(1, b"big")))
        assert r.status == 0, r
        owner.close()                                     # its creator lease goes too
        # The daemon has let it go ...
        assert wait_until(lambda: metric(d, "tensord_device_used_bytes") == used0), \
            metric(d, "tensord_device_used_bytes")
        # ... the kernel has not: the reader's descriptor holds 32 MiB.
        held = metric(d, "tensord_host_cgroup_shmem_bytes")
        assert held - base >= 32 << 20, (base, held)
        os.close(fds.pop())
        assert wait_until(lambda: metric(d, "tensord_host_cgroup_shmem_bytes") <
                          held - (30 << 20), timeout=20), \
            (held, metric(d, "tensord_host_cgroup_shmem_bytes"))
    finally:
        for fd in fds:
            os.close(fd)
        reader.close()
