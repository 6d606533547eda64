"""Client.leases(), Client.clients() and Client.metrics() from Python."""
import os
import time

import numpy as np
import pytest

import tensord


def test_leases_records_name_the_holder(client, child):
    client.put("obs/x", np.arange(4, dtype=np.float32))
    ch = child("""
        import sys, tensord
        c = tensord.connect()
        t = c.attach("obs/x")
        print("held", flush=True)
        sys.stdin.read()
    """)
    ch.expect("held")
    [h] = client.leases("obs/x")
    assert isinstance(h, tensord.LeaseHolder)
    assert (h.name, h.pid, h.uid, h.count, h.state) == \
        ("obs/x", ch.proc.pid, os.geteuid(), 1, "published")
    assert h.comm.startswith("python")
    assert h.held >= 0 and h.since > 0
    assert [r.name for r in client.leases()] == ["obs/x"]
    assert [r.name for r in client.leases(None)] == ["obs/x"]
    ch.finish()
    end = time.monotonic() + 5
    while client.leases("obs/x") and time.monotonic() < end:
        time.sleep(0.01)
    assert client.leases("obs/x") == []
    with pytest.raises(tensord.Error) as e:
        client.leases("bad name!")
    assert e.value.errno == 22 and "bad name!" in str(e.value)


def test_leases_are_paged_past_one_reply(client):
    """1030 leases: more than the daemon's 1024 holders per reply."""
    held = []
    for i in range(1030):
        client.put(f"p/{i:04d}", np.zeros(1, np.uint8))
        held.append(client.attach(f"p/{i:04d}"))
    rows = client.leases()
    assert [r.name for r in rows] == [f"p/{i:04d}" for i in range(1030)]
    assert all(r.pid == os.getpid() and r.count == 1 for r in rows)
    for t in held:
        t.release()


def test_clients_and_metrics(client):
    [me] = [r for r in client.clients() if r.pid == os.getpid()]
    assert isinstance(me, tensord.ClientInfo)
    assert me.client == "libtensord" and me.uid == os.geteuid() and me.requests >= 1
    client.put("m/y", np.ones(2))
    assert client.clients()[0].tensors_created == 1
    parser = pytest.importorskip("prometheus_client.parser")
    fams = {f.name: f for f in parser.text_string_to_metric_families(client.metrics())}
    [s] = [s for s in fams["tensord_device_tensors"].samples if s.labels["state"] == "published"]
    assert s.value == 1


def test_stats_report_what_this_uid_holds(client):
    """stats()["uids"]: one row per uid (root sees all), counting this uid's
    tensors, the bytes in them and those that hold a descriptor of their own."""
    def mine():
        rows = {r["uid"]: r for r in client.stats()["uids"]}
        return rows[os.geteuid()]

    before = mine()
    assert before["uid_clients"] >= 1
    client.put("uids/small", np.zeros(1024, np.float32))     # into a slab
    client.put("uids/large", np.zeros(1 << 16, np.float32))  # a memfd of its own
    after = mine()
    assert after["uid_tensors"] == before["uid_tensors"] + 2
    assert after["uid_bytes"] == before["uid_bytes"] + 4096 + (1 << 18)
    assert after["uid_fds"] == before["uid_fds"] + 1
    client.unlink("uids/small")
    client.unlink("uids/large")
    assert mine()["uid_tensors"] == before["uid_tensors"]
