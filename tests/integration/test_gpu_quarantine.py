"""Legacy IPC memory outlives a connection that ended without its client's
orderly close, until the client's process exits (issue 21; docs/gpu.md,
"When a connection ends with legacy IPC leases").

With legacy CUDA IPC and HIP IPC the daemon is the exporter: freeing an
allocation that a live process still has open is undefined behaviour on
the GPU. tensord_close() closes its IPC handles and releases those leases
before its socket shuts, so a legacy IPC lease still held when a
connection ends is one whose handle may still be open; its memory is kept
(counted in device_quarantined_bytes) until the peer process has exited.

The daemon runs over the fake driver (tests/fakegpu/tensord_fakegpu.c),
which writes "fakegpu: cuMemFree 0x..." (cuMemRelease, hipFree) to the
log when the memory really goes. The client holding the lease is another
process (lease_holder.py, raw frames), so the test decides when it exits.
"""
import os
import signal
import subprocess
import sys

import pytest

from conftest import build_path, wait_until
from hostile import (F_CREATE, F_RELEASE, F_UNLINK, Raw, create_body, f_bytes, f_varint, frame,
                     reply_with_fds, request)

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
F_PUBLISH = 4
R_LEASE = 5
CUDA, ROCM = 2, 10
HANDLE_CUDA_VMM_FD, HANDLE_CUDA_IPC, HANDLE_HIP_IPC = 2, 3, 4
# What frees a device's memory in the fake driver, by path.
FREE = {"cuda-ipc": "cuMemFree", "hip-ipc": "hipFree", "cuda-vmm": "cuMemRelease"}


def start_daemon(daemon_factory, cuda_path):
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs the fake-GPU daemon this test starts")
    if not os.path.exists(build_path("tests/helpers/tensord-fakegpu")):
        pytest.fail("build/tests/helpers/tensord-fakegpu is missing: run make all")
    env = {"TENSORD_CUDA_PATH": cuda_path} if cuda_path else {}
    d = daemon_factory(env=env, binary="tests/helpers/tensord-fakegpu")
    c = Raw(d.socket)
    c.hello()
    c.close()
    d.baseline = wait_until(lambda: d.fd_count(), timeout=5)
    return d


@pytest.fixture
def ipc(daemon_factory):
    """The fake-GPU daemon on legacy IPC: cuda-ipc and hip-ipc."""
    return start_daemon(daemon_factory, "ipc")


@pytest.fixture
def vmm(daemon_factory):
    """The fake-GPU daemon on its default path for CUDA: cuda-vmm."""
    return start_daemon(daemon_factory, None)


class Holder:
    """lease_holder.py in a process of its own."""

    def __init__(self, d, dev_type, how, name, ending):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "lease_holder.py"), d.socket, str(dev_type),
             how, name, ending],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["ready"], (line, d.read_log()[-3000:])
        self.kind = int(line[1])

    def exit(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc.stdin.close()


def device(d, name):
    st = d.stats()
    return next(x for x in st["devices"] if x["device"] == name), st


def frees(d, path):
    return d.read_log().count(f"fakegpu: {FREE[path]} ")


def quarantined(d, name):
    dev, st = device(d, name)
    return dev["device_quarantined_bytes"], st["quarantined_processes"]


def settled(d, name):
    """name's device holds nothing, nothing is quarantined, and the daemon
    holds no descriptor beyond its baseline."""
    def done():
        dev, st = device(d, name)
        return (dev["device_used_bytes"] == 0 and dev["device_quarantined_bytes"] == 0
                and st["quarantined_processes"] == 0 and st["tensors"] == 0)
    assert wait_until(done, timeout=10), (d.stats(), d.read_log()[-3000:])
    assert wait_until(lambda: d.fd_count() == d.baseline, timeout=10), \
        (d.fd_count(), d.baseline)


def still_kept(d, name, path, freed_before):
    """The memory is kept: quarantined, charged to its device, not freed."""
    assert quarantined(d, name) == (2 * MiB, 1), (d.stats(), d.read_log()[-3000:])
    assert device(d, name)[0]["device_used_bytes"] == 2 * MiB
    assert frees(d, path) == freed_before, d.read_log()[-3000:]


@pytest.mark.parametrize("name,dev_type,path,kind", [
    ("cuda:0", CUDA, "cuda-ipc", HANDLE_CUDA_IPC),
    ("rocm:0", ROCM, "hip-ipc", HANDLE_HIP_IPC),
])
def test_a_kicked_client_keeps_its_legacy_ipc_memory_until_it_exits(ipc, name, dev_type, path,
                                                                    kind):
    """The daemon ends the connection itself (a frame it rejects) while the
    client holds its creator's lease: the unpublished tensor goes with the
    connection, but its memory stays until the client's process exits."""
    h = Holder(ipc, dev_type, "create", "q/kick", "kick")
    assert h.kind == kind
    assert wait_until(lambda: quarantined(ipc, name) == (2 * MiB, 1), timeout=10), \
        (ipc.stats(), ipc.read_log()[-3000:])
    still_kept(ipc, name, path, 0)
    log = ipc.read_log()
    assert "frame with an unknown protocol version, closing" in log, log[-3000:]
    assert f"pid {h.proc.pid}: connection ended holding 1 legacy IPC lease" in log, log[-3000:]
    # The name is free at once; only the memory waits.
    c = Raw(ipc.socket)
    c.hello()
    c.send(frame(request(2, F_CREATE, create_body("q/kick", [4]))))
    assert reply_with_fds(c).status == 0
    c.close()
    h.exit()
    assert wait_until(lambda: frees(ipc, path) == 1, timeout=10), ipc.read_log()[-3000:]
    assert f"pid {h.proc.pid} exited" in ipc.read_log()
    settled(ipc, name)


def test_a_killed_client_gives_its_memory_back_promptly(ipc):
    """kill -9 of a client holding a legacy IPC lease: its process is gone,
    so its memory is freed as soon as the daemon sees it exit."""
    h = Holder(ipc, CUDA, "create", "q/killed", "hold")
    assert h.kind == HANDLE_CUDA_IPC
    assert frees(ipc, "cuda-ipc") == 0
    h.kill()
    assert wait_until(lambda: frees(ipc, "cuda-ipc") == 1, timeout=5), ipc.read_log()[-3000:]
    settled(ipc, "cuda:0")


def test_an_orderly_close_frees_at_once(ipc):
    """Release before the shutdown, as tensord_close() does after closing
    its IPC handles: freed at once, the process still alive."""
    h = Holder(ipc, CUDA, "create", "q/orderly", "release")
    assert wait_until(lambda: frees(ipc, "cuda-ipc") == 1, timeout=10), ipc.read_log()[-3000:]
    assert h.proc.poll() is None
    assert quarantined(ipc, "cuda:0") == (0, 0)
    settled(ipc, "cuda:0")
    h.exit()


def test_a_connection_shut_without_release_waits_for_the_process(ipc):
    """A reader's attach lease, its socket shut down with no Release (an
    older client, or the socket shut from outside) while the process lives:
    its creator unlinking the name does not free the memory; the reader's
    exit does."""
    c = Raw(ipc.socket)
    c.hello()
    c.send(frame(request(2, F_CREATE, create_body("q/shared", [1024], device=(CUDA, 0)))))
    r = reply_with_fds(c)
    assert r.status == 0, r
    mine = r.body(R_LEASE)[1][0]
    assert c.call(request(3, F_PUBLISH, f_bytes(1, "q/shared"))).status == 0
    h = Holder(ipc, CUDA, "attach", "q/shared", "eof")
    assert h.kind == HANDLE_CUDA_IPC
    assert wait_until(lambda: quarantined(ipc, "cuda:0") == (2 * MiB, 1), timeout=10), \
        ipc.stats()
    assert c.call(request(4, F_UNLINK, f_bytes(1, "q/shared"))).status == 0
    # The creator closes as tensord_close() does: its lease released first.
    c.send(frame(request(0, F_RELEASE, f_varint(1, mine))))
    c.close()
    wait_until(lambda: ipc.stats()["leases"] == 0, timeout=10)
    still_kept(ipc, "cuda:0", "cuda-ipc", 0)
    assert device(ipc, "cuda:0")[0]["device_tensors"]["unlinked"] == 1
    h.exit()
    assert wait_until(lambda: frees(ipc, "cuda-ipc") == 1, timeout=10), ipc.read_log()[-3000:]
    settled(ipc, "cuda:0")


def test_vmm_leases_are_not_quarantined(vmm):
    """The driver refcounts VMM memory across processes: a kicked client's
    lease ends and the memory is released at once, the process alive."""
    h = Holder(vmm, CUDA, "create", "q/vmm", "kick")
    assert h.kind == HANDLE_CUDA_VMM_FD
    assert wait_until(lambda: frees(vmm, "cuda-vmm") == 1, timeout=10), vmm.read_log()[-3000:]
    assert h.proc.poll() is None
    assert quarantined(vmm, "cuda:0") == (0, 0)
    settled(vmm, "cuda:0")
    h.exit()


def test_a_stop_frees_quarantined_memory(ipc):
    """The daemon's stop ends every quarantine: the memory is freed and the
    daemon exits 0 (under ASan with nothing leaked)."""
    h = Holder(ipc, CUDA, "create", "q/stop", "eof")
    assert wait_until(lambda: quarantined(ipc, "cuda:0") == (2 * MiB, 1), timeout=10), \
        ipc.stats()
    ipc.proc.send_signal(signal.SIGTERM)
    assert ipc.proc.wait(timeout=20) == 0, ipc.read_log()[-3000:]
    log = ipc.read_log()
    assert log.count("fakegpu: cuMemFree ") == 1, log[-3000:]
    assert log.index("fakegpu: cuMemFree ") < log.index("stopped"), log[-3000:]
    h.exit()
