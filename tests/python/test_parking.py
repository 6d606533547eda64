"""Parked mappings (client/lib/mapcache.h): after its last lease a process
keeps a whole host tensor's descriptor, not its pages, for a bounded time,
so that attaching the same tensor again is one round trip with no
descriptor passed. What must hold: a repeat attach passes no descriptor,
sees the published bytes (never a stray write), sees a replaced name's new
bytes, and the process lets every parked descriptor go within the bounds
(count, bytes, about a second) even when it stays idle."""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch writes into read-only tensors")

# Larger than a slab slot (64 KiB), so each tensor has a memfd of its own.
N = 1 << 16  # float32: 256 KiB
PARK_MAX, PARK_SECONDS = 64, 1.0


def tensor_memfds():
    """Descriptors of whole-tensor memfds this process holds (not slabs)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        n += link.startswith("/memfd:tensord") and "slab" not in link
    return n


def wait_for(cond, seconds=5.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


def test_repeat_attach_reuses_the_parked_descriptor(client):
    ref = np.arange(N, dtype=np.float32)
    client.put("park/a", ref)
    base = tensor_memfds()
    with client.attach("park/a") as t:
        np.testing.assert_array_equal(np.from_dlpack(t), ref)
        assert tensor_memfds() == base + 1
    assert tensor_memfds() == base + 1, "the last release parks the descriptor"
    for _ in range(3):
        with client.attach("park/a") as t:
            # A second descriptor would show here: the daemon sent none.
            assert tensor_memfds() == base + 1
            np.testing.assert_array_equal(np.from_dlpack(t), ref)


def test_stray_write_never_survives_parking(client):
    ref = np.arange(N, dtype=np.float32)
    client.put("park/cow", ref)
    t = client.attach("park/cow")
    x = torch.from_dlpack(t)
    x.fill_(-7.0)  # torch ignores the read-only flag: a private copy
    del x
    t.release()
    with client.attach("park/cow") as again:
        np.testing.assert_array_equal(np.from_dlpack(again), ref)
        y = torch.from_dlpack(again)
        y[:8] = 5.0
        del y
    with client.attach("park/cow") as later:
        np.testing.assert_array_equal(np.from_dlpack(later), ref)


def test_a_replaced_name_shows_its_new_bytes(client):
    client.put("park/r", np.zeros(N, np.float32))
    with client.attach("park/r") as t:
        assert np.from_dlpack(t).sum() == 0
    client.unlink("park/r")
    client.put("park/r", np.ones(N, np.float32))
    with client.attach("park/r") as t:
        assert np.from_dlpack(t).sum() == N


def test_an_idle_process_lets_parked_descriptors_go(client):
    client.put("park/idle", np.ones(N, np.float32))
    base = tensor_memfds()
    with client.attach("park/idle") as t:
        np.from_dlpack(t).sum()
    assert tensor_memfds() == base + 1
    time.sleep(PARK_SECONDS / 2)
    assert tensor_memfds() == base + 1, "kept for about a second"
    # No call into the library from here on: its own thread expires it.
    assert wait_for(lambda: tensor_memfds() == base, PARK_SECONDS + 4)
    # The tensor's memory is the daemon's to free once unlinked.
    client.unlink("park/idle")


BIND_IDLE_MAX = 64


def test_parking_is_bounded(client):
    base = tensor_memfds()
    for i in range(PARK_MAX + 16):
        client.put("park/many/%d" % i, np.full(N, i, np.float32))
        with client.attach("park/many/%d" % i) as t:
            assert np.from_dlpack(t)[0] == i
    # Parked mappings, and the mappings of idle bindings (attach without a
    # round trip: client/lib/bindings.h, TD_BIND_IDLE_MAX), each bounded.
    assert tensor_memfds() - base <= PARK_MAX + BIND_IDLE_MAX
    # The newest are the ones kept: attaching it again needs no descriptor.
    held = tensor_memfds()
    with client.attach("park/many/%d" % (PARK_MAX + 15)) as t:
        assert tensor_memfds() == held
        assert np.from_dlpack(t)[0] == PARK_MAX + 15
    assert wait_for(lambda: tensor_memfds() == base, PARK_SECONDS + 4)


def test_close_drops_parked_descriptors(daemon):
    import tensord

    c = tensord.connect(daemon.socket)
    c.put("park/close", np.ones(N, np.float32))
    base = tensor_memfds()
    with c.attach("park/close") as t:
        np.from_dlpack(t).sum()
    assert tensor_memfds() == base + 1
    c.close()
    assert tensor_memfds() == base
