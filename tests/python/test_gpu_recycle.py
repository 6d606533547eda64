"""GPU rings (docs/recycle.md, section 4; issue 32): a writer's GPU put of
a new version goes into a CUDA VMM allocation of its own earlier versions
whose leases all ended, and the writer and readers that imported that
allocation before keep their import and mapping across versions. Over the
driver double, whose call counts (tests/python/cudrv.py, calls()) say what
each process asked of the driver; the daemon's side by its figures
(gpu_recycled_creates_total: creates that made no cuMemCreate, export or
zeroing). On hardware (tests/gpu/run.sh) the counts are not known and only
the bytes and figures are checked. Legacy IPC is not recycled (the same
puts there take fresh memory each time: test_ipc_is_not_recycled).
"""
import os
import signal
import time

import pytest

import gpu_double
import tensord
from gpu_double import digest, figures, ring, unlink_all, wait_until
from test_gpu_driver import Gpu

gpu_double.require()

N = 1 << 20  # 1 MiB: half a granule, so each version is one whole allocation
# The driver calls an import or a mapping costs.
FNS = gpu_double.RECYCLE_FNS


def pattern(k):
    return bytes((j * 131 + 7 * k + 3) % 256 for j in range(N))


# What every child of these tests shares: keep parked imports for a
# minute, so that a slow machine cannot make a count depend on timing.
PARK = gpu_double.PARK

# A writer driven line by line on its stdin:
#   put K [MODE]  puts source K (pattern(K)) as "w", prints its driver calls
#   tput K [MODE] the same in a transaction (tx.put, then the commit)
#   tabort K      tx.put of source K as "w", then the transaction aborted
#   ring N        waits until the daemon keeps N free GPU ring buffers
#   quit
WRITER = """
import time
N = {n}
FNS = {fns!r}
def pattern(k):
    return bytes((j * 131 + 7 * k + 3) % 256 for j in range(N))
srcs = []
for k in range({k}):
    t = c.create(f"src/{{k}}", (N,), "uint8", device="cuda:0")
    cudrv.write(t, pattern(k))
    t.publish()
    srcs.append(c.attach(f"src/{{k}}"))
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] in ("put", "tput", "tabort"):
        k = int(cmd[1])
        mode = int(cmd[2], 8) if len(cmd) > 2 else None
        before = [cudrv.calls(f) for f in FNS]
        if cmd[0] == "put":
            c.put("w", srcs[k], mode=mode, replace=True)
        else:
            tx = c.transaction()
            tx.put("w", srcs[k], mode=mode, replace=True)
            tx.commit() if cmd[0] == "tput" else tx.abort()
        after = [cudrv.calls(f) for f in FNS]
        print("put", *[None if b is None else a - b for a, b in zip(after, before)], flush=True)
    elif cmd[0] == "ring":
        end = time.monotonic() + 60
        while c.stats()["gpu_ring_buffers"] != int(cmd[1]):
            if time.monotonic() > end:
                print("ring never", cmd[1], c.stats()["gpu_ring_buffers"], flush=True)
                sys.exit(3)
            time.sleep(0.005)
        print("ring", cmd[1], flush=True)
"""

# A reader: "read" attaches w, reads it whole, prints its digest and driver
# calls, releases; "hold" attaches and keeps it; "held" reads what it keeps.
READER = """
FNS = {fns!r}
held = None
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] in ("read", "hold"):
        before = [cudrv.calls(f) for f in FNS]
        t = c.attach("w")
        after = [cudrv.calls(f) for f in FNS]
        d = digest(cudrv.read(t))
        if cmd[0] == "hold":
            held = t
        else:
            t.release()
        print("read", d, *[None if b is None else a - b for a, b in zip(after, before)],
              flush=True)
    elif cmd[0] == "held":
        print("held", digest(cudrv.read(held)), flush=True)
"""


@pytest.fixture(params=["vmm"])
def gpu(request, daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, request.param)
    yield g
    g.finish()


@pytest.fixture
def ipc(daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, "ipc")
    yield g
    g.finish()


def writer(gpu, k=3):
    w = gpu.child(WRITER.format(n=N, fns=FNS, k=k), **PARK)
    w.expect("ready")
    return w


def reader(gpu):
    r = gpu.child(READER.format(fns=FNS), **PARK)
    r.expect("ready")
    return r


def put(w, k, mode=None, how="put"):
    """Source k as w's next version (how: put, tput in a transaction, or
    tabort: a transaction's put aborted); the writer's driver calls."""
    w.send(f"{how} {k}" + ("" if mode is None else f" {mode:o}"))
    calls = w.expect("put ").split()[1:]
    # Over the double every process's calls are counted; on hardware, none.
    assert (calls[0] == "None") == gpu_double.SYSTEM, calls
    return None if calls[0] == "None" else dict(zip(FNS, map(int, calls)))


def read(r, cmd="read"):
    r.send(cmd)
    got = r.expect("read ").split()[1:]
    assert (got[1] == "None") == gpu_double.SYSTEM, got
    return got[0], None if got[1] == "None" else dict(zip(FNS, map(int, got[1:])))


def assert_all_freed(gpu):
    """Every figure of GPU memory back to zero: no ring buffer, no bytes, no tensor."""
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0), figures(gpu)[0]
    assert wait_until(lambda: figures(gpu)[1]["device_used_bytes"] == 0), figures(gpu)[1]
    s, dev = figures(gpu)
    assert (s["gpu_ring_bytes"], dev["device_used_bytes"], s["tensors"]) == (0, 0, 0)


@pytest.mark.parametrize("how", ["put", "tput"])
def test_the_next_version_reuses_the_writers_allocation(gpu, how):
    """Versions 0 and 1 take new allocations A and B; once version 0's
    leases ended A is a free ring buffer, and version 2 goes into it: the
    daemon made no allocation (the figure), the writer no import and no
    mapping (one cuMemSetAccess read-write at its create, one read-only at
    its publish), and a reader that imported A for version 0 attaches
    version 2 with no driver call at all. Every read is its version's
    bytes. The same for a put in a transaction (tput; before stop 41 a
    transaction's GPU put took new memory every version)."""
    w, r = writer(gpu), reader(gpu)
    first = put(w, 0, how=how)
    if first is not None:
        assert first["cuMemImportFromShareableHandle"] == 1, first
    assert read(r)[0] == digest(pattern(0))
    second = put(w, 1, how=how)
    if first is not None:
        # Read-write for the copy, read-only once written (before stop 41
        # a transaction's member stayed writable in its writer's view).
        assert first["cuMemSetAccess"] == second["cuMemSetAccess"] == 2, (first, second)
    ring(w, 1)  # version 0's allocation, free: its writer's and reader's leases ended
    s0 = figures(gpu)[0]
    assert s0["gpu_recycled_creates_total"] == 0
    assert s0["gpu_ring_bytes"] >= N
    got, calls = read(r)
    assert got == digest(pattern(1))
    again = put(w, 2, how=how)
    s = figures(gpu)[0]
    assert s["gpu_recycled_creates_total"] == 1, s
    # A holds version 2 now; B (version 1's) goes free once its leases end.
    assert s["gpu_ring_buffers"] <= 1, s
    if again is not None:
        assert again == {"cuMemImportFromShareableHandle": 0, "cuMemAddressReserve": 0,
                         "cuMemMap": 0, "cuMemSetAccess": 2}, again
    got, calls = read(r)
    assert got == digest(pattern(2))
    if calls is not None:
        # Imported and mapped for version 0, parked since: nothing to ask.
        assert calls == dict.fromkeys(FNS, 0), calls
    w.send("quit")
    w.finish()
    r.send("quit")
    r.finish()


def test_a_reader_holding_a_version_forever_blocks_only_its_allocation(gpu):
    """A reader keeps version 0; ten more versions cycle through the other
    allocations (two: one published, one written), never version 0's, whose
    bytes stay version 0's."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    assert read(r, "hold")[0] == digest(pattern(0))
    put(w, 1)
    put(w, 2)
    for v in range(3, 13):
        ring(w, 1)  # the version before last, free (never version 0's)
        put(w, v % 3)
        r.send("held")
        assert r.expect("held ") == f"held {digest(pattern(0))}"
        got, _ = read(r)
        assert got == digest(pattern(v % 3))
    s, dev = figures(gpu)
    assert s["gpu_recycled_creates_total"] == 10, s
    # Version 0's, the published one's and one free: three allocations of the name.
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 1)
    w.send("quit")
    w.finish()
    r.send("quit")
    r.finish()


def test_readers_racing_versions_see_whole_versions(gpu):
    """A writer puts 60 versions back to back, each a distinct pattern;
    two readers attach and read the whole tensor meanwhile: every read is
    exactly one version's bytes, and the writer recycled."""
    k = 6
    w = writer(gpu, k)
    put(w, 0)
    code = f"""
        want = {{digest(bytes((j * 131 + 7 * k + 3) % 256 for j in range({N}))): k
                 for k in range({k})}}
        print("ready", flush=True)
        seen, bad = set(), 0
        while True:
            t = c.attach("w")
            d = digest(cudrv.read(t))
            t.release()
            if d in want:
                seen.add(want[d])
            else:
                bad += 1
            if sys.stdin in __import__("select").select([sys.stdin], [], [], 0)[0]:
                break
        print("done", bad, len(seen), flush=True)
    """
    rs = [gpu.child(code, **PARK) for _ in range(2)]
    for r in rs:
        r.expect("ready")
    for v in range(1, 60):
        put(w, v % k)
    for r in rs:
        r.send()
        done = r.expect("done ").split()
        assert done[1] == "0", done  # never a mixed or partial version
        r.finish()
    assert figures(gpu)[0]["gpu_recycled_creates_total"] > 0
    w.send("quit")
    w.finish()


def test_another_mode_never_reuses_an_allocation(gpu):
    """Versions alternate modes 0600 and 0644: a free buffer of one mode
    never takes a version of the other; one of the same mode does."""
    w = writer(gpu)
    put(w, 0, 0o600)  # A, 0600
    put(w, 1, 0o644)  # B, 0644
    ring(w, 1)  # A free, 0600
    put(w, 2, 0o644)  # not A: new memory C
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 0
    ring(w, 2)  # A and B free
    put(w, 0, 0o600)  # A again
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1
    r = reader(gpu)
    assert read(r)[0] == digest(pattern(0))
    r.send("quit")
    r.finish()
    w.send("quit")
    w.finish()


def test_an_aborted_transactions_put_gives_its_allocation_back(gpu):
    """A transaction's GPU put into a free ring buffer, then aborted: the
    name keeps its version, the buffer goes back to the ring, and the next
    transaction's put takes it again; once the name goes every figure is
    back to zero."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0, how="tput")
    put(w, 1, how="tput")
    ring(w, 1)  # version 0's allocation, free
    put(w, 2, how="tabort")
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1
    ring(w, 1)  # back, unpublished
    assert read(r)[0] == digest(pattern(1))
    put(w, 0, how="tput")
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 2
    assert read(r)[0] == digest(pattern(0))
    r.send("quit")
    r.finish()
    w.send("quit")
    w.finish()
    unlink_all(gpu)
    assert_all_freed(gpu)


def test_kill_9_of_the_writer_and_a_reader_leaks_nothing(gpu):
    """A writer killed with a free ring buffer, a published version and a
    reader holding an older one; then the reader killed too: once the name
    goes every figure is back to zero, and the double's report is clean
    (Gpu.finish)."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    assert read(r, "hold")[0] == digest(pattern(0))
    put(w, 1)
    put(w, 2)
    ring(w, 1)
    os.kill(w.pid, signal.SIGKILL)
    w.proc.wait()
    # Its ring went with it: the free buffer is freed.
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0)
    r.send("held")
    assert r.expect("held ") == f"held {digest(pattern(0))}"
    unlink_all(gpu)
    os.kill(r.pid, signal.SIGKILL)
    r.proc.wait()
    assert_all_freed(gpu)


def test_kill_9_of_the_writer_mid_put_leaks_nothing(gpu):
    """The writer puts back to back and is killed (SIGKILL) while doing so:
    the name holds one whole version, and once it goes every figure is
    back to zero."""
    k = 4
    w = gpu.child(WRITER.format(n=N, fns=FNS, k=k).replace(
        'print("ready", flush=True)', """
print("ready", flush=True)
v = 0
while True:
    c.put("w", srcs[v % len(srcs)], replace=True)
    v += 1
    if v == 20:
        print("going", flush=True)
"""), **PARK)
    w.expect("ready")
    w.expect("going")
    os.kill(w.pid, signal.SIGKILL)
    w.proc.wait()
    r = reader(gpu)
    got, _ = read(r)
    assert got in {digest(pattern(i)) for i in range(k)}
    r.send("quit")
    r.finish()
    unlink_all(gpu)
    assert_all_freed(gpu)


def test_ipc_is_not_recycled(ipc):
    """On legacy IPC every version takes fresh memory, as before."""
    w, r = writer(ipc), reader(ipc)
    for v in range(4):
        put(w, v % 3)
        assert read(r)[0] == digest(pattern(v % 3))
    s = figures(ipc)[0]
    assert (s["gpu_recycled_creates_total"], s["gpu_ring_buffers"]) == (0, 0), s
    w.send("quit")
    w.finish()
    r.send("quit")
    r.finish()


def test_a_release_waits_for_the_readers_queued_work(gpu):
    """A reader queues a read of version 0 on a stream of its own, drops
    the array and releases it, and does not synchronize. Its Release must
    not reach the daemon before that read ran (the flusher synchronizes
    first), or version 2, written into the same allocation meanwhile,
    would be what the read finds. The double runs queued work only at a
    synchronize, so the read's bytes are the test."""
    w = writer(gpu)
    put(w, 0)
    r = gpu.child("""
        import ctypes
        t = c.attach("w")
        ptr, dev, cap = cudrv.pointer(t)
        n = t.nbytes
        buf = ctypes.create_string_buffer(n)
        cudrv.enter(dev)
        s = ctypes.c_void_p()
        cudrv.ok(cudrv.cu.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        cudrv.ok(cudrv.cu.cuMemcpyDtoHAsync_v2(buf, cudrv.P(ptr), cudrv.P(n), s),
                 "cuMemcpyDtoHAsync")
        del cap
        t.release()
        del t
        print("queued", flush=True)
        sys.stdin.readline()
        cudrv.ok(cudrv.cu.cuStreamSynchronize(s), "cuStreamSynchronize")
        print("read", digest(buf.raw), flush=True)
    """, **PARK)
    r.expect("queued")
    put(w, 1)
    ring(w, 1)  # version 0's allocation: free once the reader's Release came
    put(w, 2)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1  # into version 0's
    r.send()
    assert r.expect("read ").split()[1] == digest(pattern(0))
    r.finish()
    w.send("quit")
    w.finish()


def test_an_idle_writer_gives_its_allocations_back(gpu):
    """A free ring buffer its writer does not use for TENSORD_RECYCLE_IDLE_MS
    goes back to the daemon (Unreserve, from the writer's flusher) and is
    freed, while the writer stays connected; its next version takes new
    memory."""
    w = gpu.child(WRITER.format(n=N, fns=FNS, k=3), TENSORD_RECYCLE_IDLE_MS="3000", **PARK)
    w.expect("ready")
    put(w, 0)
    put(w, 1)
    ring(w, 1)  # version 0's allocation, free (its idle time runs from its create)
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0)
    assert figures(gpu)[0]["gpu_ring_bytes"] == 0
    put(w, 2)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 0
    w.send("quit")
    w.finish()


def test_restored_allocations_are_never_recycled(tmp_path):
    """A daemon killed with a version published in a ring buffer and
    another buffer free: the restarted daemon restores the version
    (docs/restart.md) as a plain tensor, and the free buffer is gone with
    the old daemon. The writer's next version replaces the restored one,
    which is freed, not taken into any ring; the ring starts afresh from
    the versions made after the restart."""
    with gpu_double.ManagedGpuDaemon(tmp_path, **PARK) as g:
        w = g.child(WRITER.format(n=N, fns=FNS, k=3))
        put(w, 0)
        put(w, 1)
        ring(w, 1)
        g.restart(signal.SIGKILL)
        s = g.stats()
        assert (s["gpu_ring_buffers"], s["gpu_recycled_creates_total"]) == (0, 0), s
        # A writer of the restarted daemon, from the restored sources.
        w2 = g.child(WRITER.format(n=N, fns=FNS, k=0).replace(
            'print("ready"', 'srcs = [c.attach(f"src/{k}") for k in range(3)]\nprint("ready"'))
        put(w2, 2)  # replaces the restored version 1, which is freed
        s = g.stats()
        assert (s["gpu_ring_buffers"], s["gpu_ring_bytes"]) == (0, 0), s
        put(w2, 0)
        ring(w2, 1)  # version 2's allocation, made after the restart
        put(w2, 1)
        assert g.stats()["gpu_recycled_creates_total"] == 1
        r = g.child(READER.format(fns=FNS))
        assert read(r)[0] == digest(pattern(1))
        for c in (w2, r):
            c.send("quit")
            c.finish()


def test_create_fill_publish_recycles_when_asked(gpu):
    """create(..., recycle=True) on cuda:0, filled and published, three
    times: the third goes into the first's allocation (the figure), its
    creator's view is read-only after publish where the driver enforces it,
    and a reader reads each version's bytes."""
    w = gpu.child(f"""
        import time
        N = {N}
        def pattern(k):
            return bytes((j * 131 + 7 * k + 3) % 256 for j in range(N))
        def ring(n):
            end = time.monotonic() + 60
            while c.stats()["gpu_ring_buffers"] != n and time.monotonic() < end:
                time.sleep(0.005)
        for k in range(3):
            if k == 2:
                ring(1)
            t = c.create("w", (N,), "uint8", device="cuda:0", replace=True, recycle=True)
            cudrv.write(t, pattern(k))
            t.publish()
            try:
                cudrv.memset(t, 0xff)
                wrote = "wrote"
            except cudrv.CudaError as e:
                wrote = "refused"
            print("made", k, wrote, t.read_only_enforced, flush=True)
            t.release()
            sys.stdin.readline()
    """, **PARK)
    r = reader(gpu)
    for k in range(3):
        made = w.expect("made ").split()
        assert made[1] == str(k)
        # Read-only after publish, as any GPU creator's view (gpu.md, "Immutability").
        assert made[2:] == ["refused", "True"], made
        assert read(r)[0] == digest(pattern(k)), k
        w.send()
    w.finish()
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1
    r.send("quit")
    r.finish()
