"""A GPU set in one allocation (docs/recycle.md, sections 0 and 5; issue 32):
put_many of CUDA members of one device makes one device allocation, and a
reader imports it once per process, every member a pointer into it. Over
the driver double, whose call counts (tests/python/cudrv.py, calls()) say
how many imports each process made, on both CUDA paths: VMM (one
cuMemImportFromShareableHandle, one range reserved and mapped) and legacy
IPC (one cuIpcOpenMemHandle). On hardware (tests/gpu/run.sh) the counts
are not known and only the bytes and figures are checked.
"""
import hashlib
import os
import signal
import time

import pytest

import gpu_double
import tensord
from gpu_double import unlink_all, wait_until
from test_gpu_driver import Gpu

gpu_double.require()

# Members of several sizes: under 256 bytes, under a page, odd, and large.
SIZES = [100, 3000, 4096, 70001, 1 << 20, 3 << 20]


def data(i, n):
    return bytes((j * 131 + 7 * i + 3) % 256 for j in range(n))


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


# A writer: its sources are CUDA tensors of its own (src/i), put_many'd into
# set/i; it prints its own imports of the set (its calls less the sources').
WRITER = """
import sys
sizes = {sizes!r}
def data(i, n):
    return bytes((j * 131 + 7 * i + 3) % 256 for j in range(n))
srcs = {{}}
for i, n in enumerate(sizes):
    t = c.create(f"src/{{i}}", (n,), "uint8", device="cuda:0")
    cudrv.write(t, data(i, n))
    t.publish()
    srcs[f"set/{{i}}"] = c.attach(f"src/{{i}}")
before = cudrv.calls("cuMemImportFromShareableHandle")
c.put_many(srcs)
after = cudrv.calls("cuMemImportFromShareableHandle")
print("put", None if before is None else after - before, flush=True)
{after_put}
"""


@pytest.fixture(params=["vmm", "ipc"])
def gpu(request, daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, request.param)
    yield g
    g.finish()


def stats(gpu):
    with tensord.connect(gpu.daemon.socket) as c:
        s = c.stats()
    dev = [d for d in s["devices"] if d["device"] == "cuda:0"][0]
    return s, dev


def put_set(gpu, after_put="sys.stdin.readline()"):
    w = gpu.child(WRITER.format(sizes=SIZES, after_put=after_put))
    imports = w.expect("put ").split()[1]
    return w, imports


def imports_word(gpu):
    return ("cuMemImportFromShareableHandle" if gpu.path == "vmm"
            else "cuIpcOpenMemHandle_v2")


def test_a_set_is_one_allocation_and_one_import_per_reader(gpu):
    w, writer_imports = put_set(gpu)
    if writer_imports != "None" and gpu.path == "vmm":
        # The writer imported the set once too, not once per member.
        assert writer_imports == "1", writer_imports
    s, dev = stats(gpu)
    assert s["gpu_arenas"] == 1, s["gpu_arenas"]
    total = sum(SIZES)
    assert total <= s["gpu_arena_bytes"] < total + len(SIZES) * 4096 + (2 << 20)
    r = gpu.child(f"""
        sizes = {SIZES!r}
        fn = {imports_word(gpu)!r}
        before = {{k: cudrv.calls(k) for k in (fn, "cuMemMap", "cuMemAddressReserve")}}
        got = c.attach_many([f"set/{{i}}" for i in range(len(sizes))])
        ds = [digest(cudrv.read(got[f"set/{{i}}"])) for i in range(len(sizes))]
        after = {{k: cudrv.calls(k) for k in before}}
        print("calls", *[None if before[k] is None else after[k] - before[k] for k in before],
              flush=True)
        print("digests", *ds, flush=True)
        print("devices", *{{str(t.device) for t in got.values()}}, flush=True)
        sys.stdin.readline()
    """)
    calls = r.expect("calls ").split()[1:]
    if calls[0] != "None":
        assert calls[0] == "1", calls  # one import (or IPC opening) for the set
        if gpu.path == "vmm":
            assert calls[1:] == ["1", "1"], calls  # one range, mapped once
    want = [digest(data(i, n)) for i, n in enumerate(SIZES)]
    assert r.expect("digests ").split()[1:] == want
    assert r.expect("devices ").split()[1:] == ["cuda:0"]
    r.send()
    r.finish()
    w.send()
    w.finish()


def test_single_member_attaches_and_a_member_replaced_alone(gpu):
    w, _ = put_set(gpu)
    fn = imports_word(gpu)
    r = gpu.child(f"""
        fn = {fn!r}
        n0 = cudrv.calls(fn)
        a = c.attach("set/1")
        b = c.attach("set/4")
        print("two", digest(cudrv.read(a)), digest(cudrv.read(b)),
              None if n0 is None else cudrv.calls(fn) - n0, flush=True)
        sys.stdin.readline()
        a.release()
        b.release()
        again = c.attach("set/1")
        new = c.attach("set/4")
        print("after", digest(cudrv.read(again)), digest(cudrv.read(new)), flush=True)
        sys.stdin.readline()
    """)
    two = r.expect("two ").split()[1:]
    assert two[:2] == [digest(data(1, SIZES[1])), digest(data(4, SIZES[4]))]
    if two[2] != "None":
        assert two[2] == "1", two  # both members through one import
    # set/4 replaced alone: a version of its own outside the set's allocation.
    new = bytes(reversed(data(4, SIZES[4])))
    v = gpu.child(f"""
        t = c.create("set/4", ({SIZES[4]},), "uint8", device="cuda:0", replace=True)
        cudrv.write(t, bytes(reversed(bytes((j * 131 + 7 * 4 + 3) % 256
                                            for j in range({SIZES[4]})))))
        t.publish()
        print("replaced", flush=True)
    """)
    v.expect("replaced")
    v.finish()
    r.send()
    assert r.expect("after ").split()[1:] == [digest(data(1, SIZES[1])), digest(new)]
    s, _ = stats(gpu)
    assert s["gpu_arenas"] == 1  # the other members keep it
    r.send()
    r.finish()
    w.send()
    w.finish()
    unlink_all(gpu)
    assert_all_freed(gpu)




def assert_all_freed(gpu):
    """Every figure of memory back to zero: no set allocation, no bytes, no tensor."""
    assert wait_until(lambda: stats(gpu)[0]["gpu_arenas"] == 0), stats(gpu)[0]
    assert wait_until(lambda: stats(gpu)[1]["device_used_bytes"] == 0), stats(gpu)[1]
    s, dev = stats(gpu)
    assert (s["gpu_arena_bytes"], dev["device_used_bytes"], s["tensors"]) == (0, 0, 0)


def test_kill_9_of_the_writer_and_a_reader_leaks_nothing(gpu):
    """A writer killed after its set is published, with a reader holding
    every member, then the reader killed too: every figure back to zero
    once the names go."""
    w, _ = put_set(gpu)
    r = gpu.child(f"""
        got = c.attach_many([f"set/{{i}}" for i in range({len(SIZES)})])
        print("held", len(got), flush=True)
        sys.stdin.readline()
    """)
    assert r.expect("held ") == f"held {len(SIZES)}"
    os.kill(w.pid, signal.SIGKILL)
    w.proc.wait()
    unlink_all(gpu)
    assert stats(gpu)[0]["gpu_arenas"] == 1  # the reader's leases keep it
    os.kill(r.pid, signal.SIGKILL)
    r.proc.wait()
    assert_all_freed(gpu)


def test_kill_9_of_the_writer_mid_put_many_leaks_nothing(gpu):
    """The writer kills itself (SIGKILL) from a second thread as soon as
    the daemon counts its set's allocation, while its main thread is in
    put_many: the set is published whole or not at all, and once the
    names go every figure is back to zero."""
    n = 64
    w = gpu.child(WRITER.format(sizes=[256 << 10] * n, after_put="") .replace(
        "c.put_many(srcs)", """
import threading, time
def killer():
    end = time.monotonic() + 60
    with tensord.connect() as k:
        while k.stats()["gpu_arenas"] < 1:
            if time.monotonic() > end:
                print("no set allocation seen", flush=True)
                os._exit(3)
    os.kill(os.getpid(), 9)
threading.Thread(target=killer, daemon=True).start()
c.put_many(srcs)
sys.stdin.readline()"""))
    assert w.proc.wait(timeout=120) == -signal.SIGKILL, w.stderr()
    with tensord.connect(gpu.daemon.socket) as c:
        names = [x.name for x in c.list()]
    assert len([x for x in names if x.startswith("set/")]) in (0, n), names
    unlink_all(gpu)
    assert_all_freed(gpu)


def test_a_set_of_host_and_gpu_members_makes_one_allocation_of_each(gpu):
    """put_many of host members past 64 KiB and CUDA members: the host ones
    in one ring buffer, the GPU ones in one device allocation, each read
    back right by another process."""
    w = gpu.child("""
        import numpy as np
        srcs = {}
        for i in range(3):
            t = c.create(f"src/{i}", (5000 + i,), "uint8", device="cuda:0")
            cudrv.write(t, bytes([i + 1]) * (5000 + i))
            t.publish()
            srcs[f"mix/g{i}"] = c.attach(f"src/{i}")
            srcs[f"mix/h{i}"] = np.full(100000 + i, i + 7, dtype=np.uint8)
        c.put_many(srcs)
        s = c.stats()
        print("arenas", s["host_arenas"], s["gpu_arenas"], flush=True)
        sys.stdin.readline()
    """)
    assert w.expect("arenas ").split()[1:] == ["1", "1"]
    r = gpu.child("""
        import numpy as np
        got = c.attach_many("mix/")
        for i in range(3):
            g = cudrv.read(got[f"mix/g{i}"])
            h = np.from_dlpack(got[f"mix/h{i}"])
            print("m", i, g == bytes([i + 1]) * (5000 + i),
                  h.size == 100000 + i and bool((h == i + 7).all()), flush=True)
    """)
    for i in range(3):
        assert r.expect("m ").split() == ["m", str(i), "True", "True"]
    r.finish()
    w.send()
    w.finish()
    unlink_all(gpu)
    assert_all_freed(gpu)


def test_a_member_released_with_a_read_queued(gpu):
    """A member released with a read of it still queued: while another
    member is held nothing is unmapped (and nothing waits); the last
    member's release waits for the device before it unmaps the set's range.
    The double reports an unmap with work pending (a violation) and faults
    the read, so a clean report and right bytes are the test."""
    w, _ = put_set(gpu)
    r = gpu.child(f"""
        sizes = {SIZES!r}
        got = c.attach_many([f"set/{{i}}" for i in range(len(sizes))])
        for i in range(len(sizes) - 1):
            print("queued", i, digest(cudrv.read_queued_then_drop(got.pop(f"set/{{i}}"))),
                  flush=True)
        last = got.pop(f"set/{{len(sizes) - 1}}")
        print("last", digest(cudrv.read_queued_then_drop(last)), flush=True)
    """)
    for i, n in enumerate(SIZES[:-1]):
        assert r.expect("queued ").split()[1:] == [str(i), digest(data(i, n))]
    assert r.expect("last ").split()[1] == digest(data(len(SIZES) - 1, SIZES[-1]))
    r.finish()
    w.send()
    w.finish()
