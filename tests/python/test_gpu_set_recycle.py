"""GPU sets recycled across versions (docs/recycle.md, section 0, "GPU
rings"; issue 32): the RL weight-sync case, a writer that republishes a
GPU state dict with put_many(..., replace=True) to the same readers. Each
version's set allocation (one CUDA VMM allocation for every member) goes
back to its writer's ring when the last lease on its last member ends,
and a later version of the same size, group and mode takes it: no
cuMemCreate, export or zeroing in the daemon (gpu_recycled_creates_total),
no import or mapping in the writer (one cuMemSetAccess read-write at the
first member's create, one read-only when the set is written), none at
all in a reader that imported the allocation for an earlier version.
Over the driver double, whose call counts (tests/python/cudrv.py,
calls()) say what each process asked of the driver; on hardware
(tests/gpu/run.sh) the counts are not known and only the bytes and
figures are checked.
"""
import os
import signal

import pytest

import gpu_double
import tensord
from gpu_double import digest, figures, ring, unlink_all, wait_until
from test_gpu_driver import Gpu

gpu_double.require()

# Members of several sizes (under 256 bytes, under a page, odd, large): one
# set allocation of under a granule, the same size every version.
SIZES = [100, 3000, 70001, 1 << 19]
NAMES = [f"set/{i}" for i in range(len(SIZES))]
# The driver calls an import or a mapping costs.
FNS = gpu_double.RECYCLE_FNS
NONE = dict.fromkeys(FNS, 0)
# Every child keeps parked imports for a minute: no count depends on timing.
PARK = gpu_double.PARK


def pattern(k, i, n):
    """Member i's bytes in version source k: distinct for every k and i."""
    return bytes((j * 131 + 7 * k + 13 * i + 3) % 256 for j in range(n))


def want(k):
    return [digest(pattern(k, i, n)) for i, n in enumerate(SIZES)]


PATTERN = """
SIZES = {sizes!r}
NAMES = {names!r}
FNS = {fns!r}
def pattern(k, i, n):
    return bytes((j * 131 + 7 * k + 13 * i + 3) % 256 for j in range(n))
def calls():
    return [cudrv.calls(f) for f in FNS]
def delta(after, before):
    return [None if b is None else a - b for a, b in zip(after, before)]
"""

# A writer driven line by line on its stdin; its sources are k sets of
# CUDA tensors of its own (src/K/I, pattern(K, I)):
#   put K [sealed]  put_many's source set K as set/*, prints the commit
#                   and its driver calls
#   ring N          waits until the daemon keeps N free GPU ring buffers
#   quit
WRITER = PATTERN + """
import time
srcs = []
for k in range({k}):
    d = {{}}
    for i, n in enumerate(SIZES):
        t = c.create(f"src/{{k}}/{{i}}", (n,), "uint8", device="cuda:0")
        cudrv.write(t, pattern(k, i, n))
        t.publish()
        d[NAMES[i]] = c.attach(f"src/{{k}}/{{i}}")
    srcs.append(d)
print("ready", flush=True)
{loop}
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] == "put":
        before = calls()
        commit = c.put_many(srcs[int(cmd[1])], replace=True, sealed="sealed" in cmd)
        print("put", commit, *delta(calls(), before), flush=True)
    elif cmd[0] == "ring":
        end = time.monotonic() + 60
        while c.stats()["gpu_ring_buffers"] != int(cmd[1]):
            if time.monotonic() > end:
                print("ring never", cmd[1], c.stats()["gpu_ring_buffers"], flush=True)
                sys.exit(3)
            time.sleep(0.005)
        print("ring", cmd[1], flush=True)
"""

# A reader: "read [AFTER]" attaches the set (attach_many, after= when
# given), reads every member, prints their digests and its driver calls,
# releases; "hold" keeps the set, "hold1" keeps set/1 attached alone;
# "held" reads what it keeps; "drop" releases what it keeps, and "syncs"
# says how many device syncs it made since; "fork" forks a child that
# exits at once.
READER = PATTERN + """
import time
held = {{}}
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] in ("read", "hold"):
        before = calls()
        if len(cmd) > 1:
            got = c.attach_many(NAMES, after=int(cmd[1]), timeout=60)
        else:
            got = c.attach_many(NAMES)
        spent = delta(calls(), before)
        ds = [digest(cudrv.read(got[n])) for n in NAMES]
        if cmd[0] == "hold":
            held = got
        else:
            for t in got.values():
                t.release()
        print("read", *ds, *spent, flush=True)
    elif cmd[0] == "hold1":
        held = {{NAMES[1]: c.attach(NAMES[1])}}
        print("hold1", digest(cudrv.read(held[NAMES[1]])), flush=True)
    elif cmd[0] == "held":
        print("held", *[digest(cudrv.read(t)) for t in held.values()], flush=True)
    elif cmd[0] == "drop":
        # What it keeps, released member by member, a pause between two.
        syncs = cudrv.calls("cuCtxSynchronize")
        for t in held.values():
            t.release()
            time.sleep(0.05)
        held = {{}}
        print("dropped", flush=True)
    elif cmd[0] == "syncs":
        print("syncs", None if syncs is None else cudrv.calls("cuCtxSynchronize") - syncs,
              flush=True)
    elif cmd[0] == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("forked", flush=True)
"""


@pytest.fixture
def gpu(daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, "vmm")
    yield g
    g.finish()


@pytest.fixture
def ipc(daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, "ipc")
    yield g
    g.finish()


def writer(gpu, k=3, loop="", **env):
    w = gpu.child(WRITER.format(sizes=SIZES, names=NAMES, fns=FNS, k=k, loop=loop),
                  **dict(PARK, **env))
    w.expect("ready")
    return w


def reader(gpu):
    r = gpu.child(READER.format(sizes=SIZES, names=NAMES, fns=FNS), **PARK)
    r.expect("ready")
    return r


def counts(words):
    # Over the double every process's calls are counted; on hardware, none.
    assert (words[0] == "None") == gpu_double.SYSTEM, words
    return None if words[0] == "None" else dict(zip(FNS, map(int, words)))


def put(w, k, sealed=False):
    """Version source k put_many'd: (its commit, the writer's driver calls)."""
    w.send(f"put {k}" + (" sealed" if sealed else ""))
    got = w.expect("put ").split()[1:]
    return int(got[0]), counts(got[1:])


def read(r, after=None, cmd="read"):
    """The set as r attaches it: (its members' digests, r's driver calls)."""
    r.send(cmd + ("" if after is None else f" {after}"))
    got = r.expect("read ").split()[1:]
    return got[:len(SIZES)], counts(got[len(SIZES):])


def quit(*children):
    for c in children:
        c.send("quit")
        c.finish()


def test_the_next_set_reuses_the_writers_allocation(gpu):
    """Versions 0 and 1 take new allocations A and B; once version 0's
    leases ended A is a free ring buffer, and version 2 goes into it: the
    daemon made no allocation (the figure), the writer no import and no
    mapping (one cuMemSetAccess read-write, one read-only), and a reader
    that imported A for version 0 attaches version 2 with no driver call at
    all; version 3 goes into B, where the same holds. One import per set
    allocation per process; every member of every version byte-right."""
    w, r = writer(gpu), reader(gpu)
    c0, first = put(w, 0)
    if first is not None:
        assert first["cuMemImportFromShareableHandle"] == 1, first
    got, calls = read(r)
    assert got == want(0)
    if calls is not None:
        assert calls == {"cuMemImportFromShareableHandle": 1, "cuMemAddressReserve": 1,
                         "cuMemMap": 1, "cuMemSetAccess": 1}, calls
    c1, _ = put(w, 1)
    ring(w, 1)  # A, free: version 0's members unlinked, every lease on them ended
    s = figures(gpu)[0]
    assert (s["gpu_recycled_creates_total"], s["gpu_arenas"]) == (0, 1), s
    assert s["gpu_ring_bytes"] >= sum(SIZES), s
    got, calls = read(r, c0)
    assert got == want(1)
    if calls is not None:
        assert calls["cuMemImportFromShareableHandle"] == 1, calls  # B, new to it
    c2, again = put(w, 2)
    s = figures(gpu)[0]
    assert s["gpu_recycled_creates_total"] == 1, s
    if again is not None:
        assert again == {"cuMemImportFromShareableHandle": 0, "cuMemAddressReserve": 0,
                         "cuMemMap": 0, "cuMemSetAccess": 2}, again
    got, calls = read(r, c1)
    assert got == want(2)
    if calls is not None:
        assert calls == NONE, calls  # imported and mapped for version 0, parked since
    ring(w, 1)  # B, free
    c3, again = put(w, 0)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 2
    if again is not None:
        assert again == {"cuMemImportFromShareableHandle": 0, "cuMemAddressReserve": 0,
                         "cuMemMap": 0, "cuMemSetAccess": 2}, again
    got, calls = read(r, c2)
    assert got == want(0)
    if calls is not None:
        assert calls == NONE, calls
    quit(w, r)


@pytest.mark.parametrize("hold", ["hold", "hold1"])
def test_a_reader_holding_a_version_forever_blocks_only_its_allocation(gpu, hold):
    """A reader keeps version 0's set (or one member of it, attached
    alone); ten more versions cycle through two other allocations, never
    version 0's, whose bytes stay version 0's."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    if hold == "hold":
        assert read(r, cmd="hold")[0] == want(0)
        kept = want(0)
    else:
        r.send("hold1")
        kept = [want(0)[1]]
        assert r.expect("hold1 ").split()[1:] == kept
    put(w, 1)
    put(w, 2)
    for v in range(3, 13):
        ring(w, 1)  # the version before last, free (never version 0's)
        put(w, v % 3)
        r.send("held")
        assert r.expect("held ").split()[1:] == kept
        assert read(r)[0] == want(v % 3)
    s = figures(gpu)[0]
    assert s["gpu_recycled_creates_total"] == 10, s
    # Version 0's, the published one's, and one free.
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 1)
    assert figures(gpu)[0]["gpu_arenas"] == 2
    quit(w, r)


def test_readers_racing_versions_see_whole_versions(gpu):
    """A writer put_many's 40 versions back to back, each a distinct
    pattern in every member; two readers attach_many(after=) meanwhile:
    every set they get is exactly one version in every member, never a
    mix or a half-written recycled allocation, and the writer recycled."""
    k = 5
    w = writer(gpu, k)
    put(w, 0)
    code = PATTERN.format(sizes=SIZES, names=NAMES, fns=FNS) + f"""
import select
want = {{}}
for k in range({k}):
    for i, n in enumerate(SIZES):
        want[digest(pattern(k, i, n))] = (k, i)
print("ready", flush=True)
last, sets, bad, seen = 0, 0, 0, set()
while not select.select([sys.stdin], [], [], 0)[0]:
    try:
        got = c.attach_many(NAMES, after=last, timeout=0.2)
    except TimeoutError:
        continue
    ks = set()
    for i, n in enumerate(NAMES):
        kk, ii = want.get(digest(cudrv.read(got[n])), (None, None))
        if ii != i:
            bad += 1
        ks.add(kk)
    if len(ks) != 1:
        bad += 1
    seen |= ks
    last = max(t.commit for t in got.values())
    for t in got.values():
        t.release()
    sets += 1
print("done", bad, sets, len(seen), flush=True)
"""
    rs = [gpu.child(code, **PARK) for _ in range(2)]
    for r in rs:
        r.expect("ready")
    for v in range(1, 40):
        put(w, v % k)
    for r in rs:
        r.send()
        done = r.expect("done ").split()
        assert done[1] == "0", done  # never a mixed or partial version
        assert int(done[2]) > 0, done
        r.finish()
    assert figures(gpu)[0]["gpu_recycled_creates_total"] > 0
    quit(w)


def test_kill_9_of_the_writer_and_a_reader_leaks_nothing(gpu):
    """A writer killed with a free ring buffer, a published set and a
    reader holding an older one; then the reader killed too: once the
    names go every figure is back to zero, and the double's report is
    clean (Gpu.finish)."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    assert read(r, cmd="hold")[0] == want(0)
    put(w, 1)
    put(w, 2)
    ring(w, 1)
    os.kill(w.pid, signal.SIGKILL)
    w.proc.wait()
    # Its ring went with it: the free allocation is freed.
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0)
    r.send("held")
    assert r.expect("held ").split()[1:] == want(0)
    unlink_all(gpu)
    os.kill(r.pid, signal.SIGKILL)
    r.proc.wait()
    assert_all_freed(gpu)


def test_kill_9_of_the_writer_mid_put_many_leaks_nothing(gpu):
    """The writer put_many's back to back and is killed (SIGKILL) while
    doing so: the names hold one whole version, and once they go every
    figure is back to zero."""
    k = 4
    loop = """
v = 0
while True:
    c.put_many(srcs[v % len(srcs)], replace=True)
    v += 1
    if v == 20:
        print("going", flush=True)
"""
    w = gpu.child(WRITER.format(sizes=SIZES, names=NAMES, fns=FNS, k=k, loop=loop), **PARK)
    w.expect("ready")
    w.expect("going")
    os.kill(w.pid, signal.SIGKILL)
    w.proc.wait()
    assert figures(gpu)[0]["gpu_recycled_creates_total"] > 0
    r = reader(gpu)
    got, _ = read(r)
    assert got in [want(v) for v in range(k)]
    quit(r)
    unlink_all(gpu)
    assert_all_freed(gpu)


def assert_all_freed(gpu):
    """Every figure of GPU memory back to zero: no ring buffer, no set
    allocation, no bytes, no tensor."""
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0), figures(gpu)[0]
    assert wait_until(lambda: figures(gpu)[1]["device_used_bytes"] == 0), figures(gpu)[1]
    s, dev = figures(gpu)
    assert (s["gpu_ring_bytes"], s["gpu_arenas"], s["gpu_arena_bytes"], s["tensors"]) == \
        (0, 0, 0, 0), s


@pytest.mark.parametrize("how", ["sealed", "TENSORD_RECYCLE=0"])
def test_sealed_or_recycling_off_takes_fresh_memory(gpu, how):
    """put_many(sealed=True), or a writer with TENSORD_RECYCLE=0: every
    version's set allocation is new memory, freed with its last member,
    never kept in a ring."""
    env = {"TENSORD_RECYCLE": "0"} if how != "sealed" else {}
    w, r = writer(gpu, **env), reader(gpu)
    for v in range(4):
        put(w, v % 3, sealed=how == "sealed")
        assert read(r)[0] == want(v % 3)
    s = figures(gpu)[0]
    assert (s["gpu_recycled_creates_total"], s["gpu_ring_buffers"], s["gpu_arenas"]) == \
        (0, 0, 1), s
    quit(w, r)


def test_ipc_sets_are_not_recycled(ipc):
    """On legacy IPC every version's set allocation is fresh memory, as before."""
    w, r = writer(ipc), reader(ipc)
    for v in range(4):
        put(w, v % 3)
        assert read(r)[0] == want(v % 3)
    s = figures(ipc)[0]
    assert (s["gpu_recycled_creates_total"], s["gpu_ring_buffers"]) == (0, 0), s
    quit(w, r)


def test_a_set_released_member_by_member_waits_for_the_device_once(gpu):
    """A reader releases the four members of a set it kept, one by one with
    pauses (the flusher wakes in between): only the last Release, after
    which the process holds no mapping of the allocation, waits for a
    device sync, so the process syncs once for the set, not once per
    member, and the allocation goes free once that Release came."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    assert read(r, cmd="hold")[0] == want(0)
    put(w, 1)
    r.send("drop")
    r.expect("dropped")
    ring(w, 1)  # version 0's allocation: every member's Release came
    r.send("syncs")
    syncs = r.expect("syncs ").split()[1]
    if syncs != "None":
        assert syncs == "1", syncs
    put(w, 2)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1
    assert read(r)[0] == want(2)
    quit(w, r)


def test_a_set_leased_across_fork_is_never_recycled(gpu):
    """A reader keeping version 0's set forks: its allocation is tainted
    (the child could read it without a lease of its own) and freed when
    its last member goes, never kept in the ring; version 1's is kept."""
    w, r = writer(gpu), reader(gpu)
    put(w, 0)
    assert read(r, cmd="hold")[0] == want(0)
    r.send("fork")
    r.expect("forked")
    r.send("drop")
    r.expect("dropped")
    put(w, 1)  # version 0's members unlinked, unleased: its allocation freed
    assert wait_until(lambda: figures(gpu)[0]["gpu_arenas"] == 1)
    assert figures(gpu)[0]["gpu_ring_buffers"] == 0
    put(w, 2)
    ring(w, 1)  # version 1's, kept
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 0
    put(w, 0)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 1
    assert read(r)[0] == want(0)
    quit(w, r)


def test_an_idle_writer_gives_its_set_allocations_back(gpu):
    """A free set allocation its writer does not use for
    TENSORD_RECYCLE_IDLE_MS goes back to the daemon and is freed while the
    writer stays connected; its next version takes new memory."""
    w = writer(gpu, TENSORD_RECYCLE_IDLE_MS="3000")
    put(w, 0)
    put(w, 1)
    ring(w, 1)
    assert wait_until(lambda: figures(gpu)[0]["gpu_ring_buffers"] == 0)
    assert figures(gpu)[0]["gpu_ring_bytes"] == 0
    put(w, 2)
    assert figures(gpu)[0]["gpu_recycled_creates_total"] == 0
    quit(w)


def test_restored_set_allocations_are_never_recycled(tmp_path):
    """A daemon killed with a set published in a ring allocation and
    another free: the restarted daemon restores the set (docs/restart.md)
    in an allocation of no writer's, and the free one is gone with the old
    daemon. The next version replaces the restored one, which is freed,
    not kept in any ring; the ring starts afresh from the versions made
    after the restart."""
    with gpu_double.ManagedGpuDaemon(tmp_path, **PARK) as g:
        w = g.child(WRITER.format(sizes=SIZES, names=NAMES, fns=FNS, k=3, loop=""))
        put(w, 0)
        put(w, 1)
        ring(w, 1)
        g.restart(signal.SIGKILL)
        s = g.stats()
        assert (s["gpu_ring_buffers"], s["gpu_recycled_creates_total"]) == (0, 0), s
        assert s["gpu_arenas"] >= 1, s  # the restored set's allocation
        # A writer of the restarted daemon, from the restored sources.
        w2 = g.child(WRITER.format(sizes=SIZES, names=NAMES, fns=FNS, k=0, loop="").replace(
            'print("ready"', 'srcs = [{n: c.attach(f"src/{k}/{i}") for i, n in enumerate(NAMES)}'
            ' for k in range(3)]\nprint("ready"'))
        r = g.child(READER.format(sizes=SIZES, names=NAMES, fns=FNS))
        assert read(r)[0] == want(1)
        put(w2, 2)  # replaces the restored version 1, whose allocation is freed
        s = g.stats()
        assert (s["gpu_ring_buffers"], s["gpu_ring_bytes"]) == (0, 0), s
        put(w2, 0)
        ring(w2, 1)  # version 2's allocation, made after the restart
        put(w2, 1)
        assert g.stats()["gpu_recycled_creates_total"] == 1
        assert read(r)[0] == want(1)
        for c in (w2, r):
            c.send("quit")
            c.finish()
