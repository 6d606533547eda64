"""GPU creates are answered when the GPU worker has the memory, not on the
loop thread (issue 11): the daemon over the unit tests' fake CUDA driver
(tests/fakegpu/tensord_fakegpu.c), whose cuMemCreate takes
TENSORD_FAKE_ALLOC_MS. Raw frames (hostile.py), so the test sees the reply
order the daemon produces.

No GPU and no wall-clock assertion: while an allocation is in flight, the
daemon answers later requests first (reply order), and what a create left
behind is checked through stats and the daemon's descriptors.
"""
import os
import signal
import socket
import subprocess

import pytest

from conftest import build_path, wait_until
from hostile import (F_CREATE, F_UNLINK, R_STATS, Raw, create_body, decode, f_bytes, frame,
                     reply_with_fds, request, stats_req)

F_PUBLISH = 4
R_LEASE = 5
HANDLE_CUDA_VMM_FD = 2
ALLOC_MS = 400
MiB = 1 << 20


# DeviceStats fields (proto/tensord.proto).
DS_DEVICE, DS_BYTES_USED, DS_TENSORS = 1, 4, 6


def raw_cuda0(reply):
    """The cuda:0 DeviceStats of a raw stats reply, decoded."""
    for raw in reply.body(R_STATS).get(6, []):        # StatsReply.devices
        ds = decode(raw)
        dev = decode(ds[DS_DEVICE][0])
        if dev.get(1, [0])[0] == 2 and dev.get(2, [0])[0] == 0:
            return ds
    raise AssertionError(f"no cuda:0 in {reply}")


def gpu_create(req_id, name, n=1024):
    return request(req_id, F_CREATE, create_body(name, [n], device=(2, 0)))


def publish_req(req_id, name):
    return request(req_id, F_PUBLISH, f_bytes(1, name))


def start_fake(daemon_factory, *args):
    """The fake-GPU daemon, each cuMemCreate taking ALLOC_MS."""
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs the fake-GPU daemon this test starts")
    if not os.path.exists(build_path("tests/helpers/tensord-fakegpu")):
        pytest.fail("build/tests/helpers/tensord-fakegpu is missing: run make all")
    d = daemon_factory(*args, env={"TENSORD_FAKE_ALLOC_MS": str(ALLOC_MS)},
                       binary="tests/helpers/tensord-fakegpu")
    c = Raw(d.socket)
    c.hello()
    c.close()
    d.baseline = wait_until(lambda: d.fd_count(), timeout=5)
    return d


@pytest.fixture
def fake(daemon_factory):
    """The fake-GPU daemon with the default --gpu-context-hold (5 s)."""
    return start_fake(daemon_factory)


def cuda0(d):
    st = d.stats()
    return next(x for x in st["devices"] if x["device"] == "cuda:0"), st


def settled(d):
    """cuda:0 holds nothing and the daemon no descriptor beyond its baseline."""
    def done():
        dev, st = cuda0(d)
        return sum(dev["device_tensors"].values()) == 0 and dev["device_used_bytes"] == 0 and st["tensors"] == 0
    assert wait_until(done, timeout=10), (d.stats(), d.read_log()[-3000:])
    assert wait_until(lambda: d.fd_count() == d.baseline, timeout=10), \
        (d.fd_count(), d.baseline)


def test_later_requests_are_answered_while_the_memory_is_allocated(fake):
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(10, "g/a")) + frame(stats_req(11)))
    # A second client is served meanwhile too.
    other = Raw(fake.socket)
    other.hello()
    other.stats(req_id=3)
    other.close()
    first = c.reply()
    assert first.id == 11 and first.status == 0, first
    # That stats reply was made while the create waited for the worker:
    # cuda:0 is charged (as asked) from the request on.
    dev = raw_cuda0(first)
    assert dev[DS_TENSORS][0] == 1 and dev[DS_BYTES_USED][0] == 4096, dev
    created = reply_with_fds(c)
    assert created.id == 10 and created.status == 0, created
    lease = created.body(R_LEASE)
    assert lease[3][0] == HANDLE_CUDA_VMM_FD, lease
    assert lease[4][0] == 2 * MiB, lease          # rounded to the fake's granularity
    dev = next(x for x in fake.stats()["devices"] if x["device"] == "cuda:0")
    assert dev["device_used_bytes"] == 2 * MiB, dev
    # Published once created; the name then serves.
    r = c.call(publish_req(12, "g/a"))
    assert r.id == 12 and r.status == 0, r
    r = c.call(request(13, F_UNLINK, f_bytes(1, "g/a")))
    assert r.id == 13 and r.status == 0, r
    c.close()
    settled(fake)


def test_publish_before_the_create_answered_is_refused(fake):
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(1, "g/early")) + frame(publish_req(2, "g/early")))
    r = c.reply()
    assert r.id == 2 and r.status == -16, r          # EBUSY, before the create's reply
    assert "still being allocated" in r.message and "'g/early'" in r.message, r
    created = reply_with_fds(c)
    assert created.id == 1 and created.status == 0, created
    # The same name again while it exists: EEXIST, at once.
    r = c.call(gpu_create(3, "g/early"))
    assert r.id == 3 and r.status == -17, r
    c.close()
    settled(fake)


def test_a_client_gone_mid_allocation_leaks_nothing(fake):
    for i in range(3):
        c = Raw(fake.socket)
        c.hello()
        c.send(frame(gpu_create(1, "g/gone")))
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    settled(fake)
    log = fake.read_log()
    assert "'g/gone': its creator went away while its memory was being allocated" in log, \
        log[-3000:]
    # The name is free again, and a create of it completes.
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(5, "g/gone")))
    created = reply_with_fds(c)
    assert created.id == 5 and created.status == 0, created
    c.close()
    settled(fake)


def test_creates_in_flight_per_connection_are_bounded(fake):
    """At most 16 GPU creates of one connection wait for the worker; the
    17th and later get EAGAIN at once, naming the tensor; all 16 complete.
    A host create meanwhile is neither refused nor kept waiting."""
    c = Raw(fake.socket)
    c.hello()
    c.send(b"".join(frame(gpu_create(i, f"g/q{i}", n=1)) for i in range(1, 21))
           + frame(request(30, F_CREATE, create_body("h/q", [4]))))
    replies = [reply_with_fds(c) for _ in range(21)]
    # A host create after them is answered at once, not behind the GPU worker.
    host = replies.pop(4)
    assert host.id == 30 and host.status == 0, host
    refused = [r for r in replies if r.status != 0]
    assert [r.id for r in refused] == [17, 18, 19, 20], replies
    assert all(r.status == -11 and "'g/q" in r.message and "16 GPU creates" in r.message
               for r in refused), refused
    # Refusals first: they did not wait behind the worker.
    assert [r.id for r in replies[:4]] == [17, 18, 19, 20], replies
    assert sorted(r.id for r in replies if r.status == 0) == list(range(1, 17))
    # With the replies read, the connection may create again.
    c.send(frame(gpu_create(21, "g/q21", n=1)))
    r = reply_with_fds(c)
    assert r.id == 21 and r.status == 0, r
    c.close()
    settled(fake)


CTX_BYTES = 300 * MiB    # what the fake driver counts for a primary context


HOLD_MS = 2000


def test_gpu_memory_with_its_context_in_stats(daemon_factory):
    """stats' gpu_bytes: what the driver (NVML's fake) counts for the daemon
    on the device, the primary context included; the context alone while
    the daemon holds it after the last tensor went (--gpu-context-hold),
    and back to 0 once the hold passed and the daemon released it."""
    fake = start_fake(daemon_factory, "--gpu-context-hold", str(HOLD_MS))
    assert cuda0(fake)[0]["device_gpu_bytes"] == 0
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(1, "g/m", n=1 << 20)))      # 4 MiB of float32
    created = reply_with_fds(c)
    assert created.status == 0, created
    dev = cuda0(fake)[0]
    assert dev["device_gpu_bytes"] == CTX_BYTES + 4 * MiB, dev
    assert dev["device_used_bytes"] == 4 * MiB, dev
    r = subprocess.run([build_path("tensorctl"), "--socket", fake.socket, "stats"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("cuda:0"))
    assert row.split()[-2:] == ["304.0", "MiB"], row
    r = subprocess.run([build_path("tensorctl"), "--socket", fake.socket, "stats",
                        "--prometheus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    want = f'{{device="cuda:0",backend="cuda",path="cuda-vmm"}} {CTX_BYTES + 4 * MiB}'
    assert "tensord_device_gpu_bytes" + want in r.stdout, r.stdout
    c.close()                                           # unpublished: freed with it
    # Held idle after the free (on the worker): the context alone, still
    # memory the daemon costs. Without the hold it would go straight to 0.
    assert wait_until(lambda: cuda0(fake)[0]["device_gpu_bytes"] == CTX_BYTES, timeout=10), \
        cuda0(fake)
    assert cuda0(fake)[0]["device_used_bytes"] == 0
    assert wait_until(lambda: cuda0(fake)[0]["device_gpu_bytes"] == 0, timeout=10), cuda0(fake)
    assert "primary context released after the hold without a tensor" in fake.read_log()
    settled(fake)


def test_gpu_context_kept_between_bursts_and_released_at_the_stop(fake):
    """Create, free, create within the hold: the context made once (one
    NVML measurement, logged as it is made); the stop releases it at once."""
    for i in range(3):
        c = Raw(fake.socket)
        c.hello()
        c.send(frame(gpu_create(1, f"g/burst{i}", n=1 << 20)))
        created = reply_with_fds(c)
        assert created.status == 0, created
        c.close()                                       # unpublished: freed with it
        assert wait_until(lambda: cuda0(fake)[0]["device_gpu_bytes"] == CTX_BYTES, timeout=10), \
            cuda0(fake)
    log = fake.read_log()
    assert log.count("its primary context took") == 1, log[-3000:]
    assert "primary context released" not in log
    fake.proc.send_signal(signal.SIGTERM)
    assert fake.proc.wait(timeout=20) == 0, fake.read_log()[-3000:]
    log = fake.read_log()
    assert log.count("primary context released at the stop") == 1, log[-3000:]


def test_stop_with_an_allocation_in_flight(fake):
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(1, "g/stop", n=1 << 20)) + frame(stats_req(2)))
    # The stats reply comes while the allocation is on the worker.
    r = c.reply()
    assert r.id == 2 and raw_cuda0(r)[DS_TENSORS][0] == 1, r
    fake.proc.send_signal(signal.SIGTERM)
    assert fake.proc.wait(timeout=20) == 0, fake.read_log()[-3000:]
    c.close()
    log = fake.read_log()
    # The allocation completed after the stop began, and was freed.
    stop = log.index("received SIGTERM")
    assert log.index("'g/stop': its creator went away", stop) < log.index("stopped", stop), \
        log[-3000:]
    # The fixture checks the exit status and that no sanitizer report was logged.


def error_count(d, request_kind, code):
    """tensord_errors_total{request=..., code=...} from the metrics text."""
    r = subprocess.run([build_path("tensorctl"), "--socket", d.socket, "stats",
                        "--prometheus"], capture_output=True, text=True, timeout=30)
    want = f'tensord_errors_total{{request="{request_kind}",code="{code}"}} '
    for line in r.stdout.splitlines():
        if line.startswith(want):
            return int(line.split()[-1])
    return 0


def test_a_late_create_error_counts_against_create(fake):
    """A GPU create answered after later requests were decoded (here: its
    creator unlinks the name meanwhile, so it is answered ECANCELED) counts
    its error against create, not against whichever request was decoded
    last (an unlink, then stats: they used to get it)."""
    c = Raw(fake.socket)
    c.hello()
    c.send(frame(gpu_create(1, "g/gone")) + frame(request(2, F_UNLINK, f_bytes(1, "g/gone"))) +
           frame(stats_req(3)))
    seen = {}
    for _ in range(3):
        r = reply_with_fds(c)
        seen[r.id] = r
    assert seen[2].status == 0 and seen[3].status == 0, seen
    assert seen[1].status == -125, seen[1]                 # ECANCELED, answered last
    assert error_count(fake, "create", "ECANCELED") == 1
    assert error_count(fake, "stats", "ECANCELED") == 0
    assert error_count(fake, "unlink", "ECANCELED") == 0
    c.close()
    settled(fake)
