"""The HIP path end to end without AMD hardware: the real daemon and real
client processes over the driver double's libamdhip64.so.6
(tests/gpudouble/hip.c), which moves real memory between processes
(memfds, legacy IPC through /proc/PID/fd) and reports what a driver would
punish: a hipFree while another live process still has the memory open
through IPC, work left queued under an unmap, calls after fork, and
(for the daemon, TD_GPU_DOUBLE_LEAKS=tensord) what it still holds at exit.

The daemon and the clients load the double by soname (LD_LIBRARY_PATH=
<build>/gpudouble); TENSORD_HIP_KFD points the loader's /dev/kfd check at
a file of the test's. Clients are Python processes (the tensord package
and a ctypes handle on the double, to copy bytes in and out of device
memory as a HIP program would). Every test ends by reading the double's
report: no violation, and after the daemon stopped no leak of its.
"""
import json
import os
import re
import signal
import subprocess

import pytest

from conftest import BUILD, build_path, wait_until
from testlib import Child

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DBL = build_path("gpudouble")
HIPLIB = os.path.join(DBL, "libamdhip64.so.6")
MiB = 1 << 20


def python_dir():
    """The tensord package: the build's own, else the plain build's (the
    sanitizer run builds no Python extension; the daemon is what it checks)."""
    for d in (build_path("python"), os.path.join(ROOT, "build", "python")):
        if os.path.exists(os.path.join(d, "tensord", "__init__.py")):
            return d
    return None


@pytest.fixture
def dbl(tmp_path):
    """The double's environment and its report."""
    if not os.path.exists(HIPLIB):
        pytest.fail(f"{HIPLIB} is missing: run make all")
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    state = tmp_path / "double"

    class Double:
        dir = str(state)
        report_path = str(state / "report")
        env = {
            "LD_LIBRARY_PATH": DBL,
            "TENSORD_HIP_KFD": str(kfd),
            "TD_GPU_DOUBLE_DIR": str(state),
            "TD_BUILD": BUILD,
        }

        def report(self):
            try:
                with open(self.report_path) as f:
                    return f.read().splitlines()
            except FileNotFoundError:
                return []

        def violations(self):
            return [x for x in self.report() if "violation" in x or "fault" in x]

        def leaks(self):
            return [x for x in self.report() if "leak" in x]

    d = Double()
    yield d
    # After the daemon stopped (hipd tears down first): nothing was wrong.
    assert d.violations() == [] and d.leaks() == [], d.report()


PRELUDE = r'''
import ctypes, os, sys
hip = ctypes.CDLL(os.path.join(os.environ["TD_BUILD"], "gpudouble", "libamdhip64.so.6"))
hip.hipGetErrorName.restype = ctypes.c_char_p
hip.hipGetErrorName.argtypes = [ctypes.c_int]
hip.hipSetDevice.argtypes = [ctypes.c_int]
hip.hipMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
hip.hipFree.argtypes = [ctypes.c_void_p]
hip.hipMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
hip.hipIpcGetMemHandle.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
class HANDLE(ctypes.Structure):  # hipIpcMemHandle_t, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]
hip.hipIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), HANDLE, ctypes.c_uint]
hip.hipIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
DEFAULT = 4  # hipMemcpyDefault

def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: {hip.hipGetErrorName(r).decode()} ({r})")

class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype = ctypes.c_void_p
get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

def device_ptr(t):
    """The tensor's device address, from its (unconsumed) DLPack capsule."""
    cap = t.__dlpack__()
    dl = DLTensor.from_address(get_pointer(cap, b"dltensor"))
    return dl.data + dl.byte_offset, (dl.device_type, dl.device_id)

def ordinal(t):
    kind, n = t.device.split(":")
    assert kind == "rocm", t.device
    return int(n)

def write(t, data):
    ptr, _ = device_ptr(t)
    check(hip.hipSetDevice(ordinal(t)), "hipSetDevice")
    buf = ctypes.create_string_buffer(data, len(data))
    check(hip.hipMemcpy(ptr, buf, len(data), DEFAULT), "hipMemcpy to the device")

def read(t, n):
    ptr, _ = device_ptr(t)
    check(hip.hipSetDevice(ordinal(t)), "hipSetDevice")
    buf = ctypes.create_string_buffer(n)
    check(hip.hipMemcpy(buf, ptr, n, DEFAULT), "hipMemcpy from the device")
    return buf.raw

def pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))

def say(*words):
    print(*words, flush=True)

def wait(word):
    line = sys.stdin.readline().strip()
    assert line == word, (line, word)
'''


def child(code, env):
    """A Python process running PRELUDE + code; it and the test talk in lines."""
    return Child(code, env=env, prelude=PRELUDE)


@pytest.fixture
def hipd(dbl, daemon_factory):
    """The real daemon over the double, with the HIP backend up; .client(code, **env)."""
    if os.environ.get("TENSORD_TEST_DAEMON"):
        pytest.skip("needs the daemon this test starts over the driver double")
    pydir = python_dir()
    if not pydir:
        pytest.skip("no tensord Python package built (make all)")
    d = daemon_factory(env=dict(dbl.env, TD_GPU_DOUBLE_LEAKS="tensord"))
    log = d.read_log()
    assert re.search(r"backend hip: device 0 ready, .*hip-ipc", log), log
    assert re.search(r"backend hip: device 1 ready, .*hip-ipc", log), log
    # The double's runtime, not a ROCm installed here (libamdhip64.so.7 is tried first).
    assert "runtime 60200000" in log, log
    children = []

    def client(code, **extra):
        env = dict(os.environ, PYTHONPATH=pydir, TENSORD_SOCKET=d.socket, **dbl.env)
        env.pop("HIP_VISIBLE_DEVICES", None)
        env.pop("TD_GPU_DOUBLE_LEAKS", None)
        env.update(extra)
        c = child(code, env)
        children.append(c)
        return c

    d.client = client
    d.dbl = dbl
    yield d
    for c in children:
        c.kill()


def rocm(d, n):
    """The daemon's rocm:n in its stats."""
    return next(x for x in d.stats()["devices"] if x["device"] == f"rocm:{n}")


BARRIER = '''
import tensord
c = tensord.connect()
c.create("hip/barrier", (1,), "uint8", device=os.environ["DEV"]).release()
c.close()
say("done")
'''


def freed(d, n=0):
    """Waits until the daemon holds nothing on rocm:n and its hipFree ran:
    the GPU worker runs jobs in order, so a create on the device answered
    after the release was counted comes after that free."""
    ok = wait_until(lambda: rocm(d, n)["device_used_bytes"] == 0, timeout=20)
    assert ok, (rocm(d, n), d.read_log()[-3000:])
    b = d.client(BARRIER, DEV=f"rocm:{n}")
    b.expect("done")
    b.finish()
    ok = wait_until(lambda: rocm(d, n)["device_used_bytes"] == 0, timeout=20)
    assert ok, (rocm(d, n), d.read_log()[-3000:])


def stop_without_leaks(d):
    """Stops the daemon; the double then lists nothing the daemon still held."""
    assert d.stop() == 0, d.read_log()[-3000:]
    assert d.dbl.leaks() == [], d.dbl.report()


def tensorctl(d, *args):
    r = subprocess.run([build_path("tensorctl"), "--socket", d.socket, *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


WRITER = '''
import tensord
name, n, seed = os.environ["W"].split()
n, seed = int(n), int(seed)
c = tensord.connect()
t = c.create(name, (n,), "uint8", device="rocm:0")
ptr, dev = device_ptr(t)
say("created", t.device, dev[0], dev[1])
write(t, pattern(n, seed))
assert read(t, n) == pattern(n, seed)
t.publish()
say("published")
wait("close")
t.release()
c.close()
say("closed")
'''

READER = '''
import tensord
name, n, seed = os.environ["R"].split()
n, seed = int(n), int(seed)
c = tensord.connect()
t = c.attach(name, timeout=30)
ptr, dev = device_ptr(t)
got = read(t, n)
say("read", t.device, dev[0], dev[1], t.__dlpack_device__(), got == pattern(n, seed), t.readonly)
cmd = sys.stdin.readline().strip()
if cmd == "close":
    # The lease is still alive: close must close the IPC handle first.
    c.close()
    say("closed")
    wait("exit")
    t.release()
elif cmd == "release":
    t.release()
    c.close()
    say("closed")
'''


def write_tensor(d, name, n, seed, **env):
    w = d.client(WRITER, W=f"{name} {n} {seed}", **env)
    created = w.expect("created").split()
    w.expect("published")
    return w, created


def test_tensor_crosses_processes_under_another_ordinal(hipd):
    """A rocm:0 tensor filled through the double in one process reads back
    identical in another that sees the same GPU as rocm:1
    (HIP_VISIBLE_DEVICES=1,0), and in one with the default numbering."""
    n = 3 * MiB + 123  # not a multiple of the 2 MiB rounding
    w, created = write_tensor(hipd, "hip/a", n, 5)
    assert created[1:] == ["rocm:0", "10", "0"], created
    info = tensorctl(hipd, "stat", "hip/a")
    assert "rocm:0" in info, info

    swapped = hipd.client(READER, R=f"hip/a {n} 5", HIP_VISIBLE_DEVICES="1,0")
    line = swapped.expect("read")
    assert line == "read rocm:1 10 1 (10, 1) True True", line
    plain = hipd.client(READER, R=f"hip/a {n} 5")
    line = plain.expect("read")
    assert line == "read rocm:0 10 0 (10, 0) True True", line
    for r in (swapped, plain):
        r.send("release")
        r.expect("closed")
        r.finish()
    w.send("close")
    w.expect("closed")
    w.finish()

    tensorctl(hipd, "rm", "hip/a")
    freed(hipd)
    stop_without_leaks(hipd)


def test_create_goes_by_uuid(hipd):
    """A process that sees only the second GPU creates on its rocm:0: the
    daemon places it on its own rocm:1 (the UUID crossed the socket), and
    a reader with the default numbering finds it there."""
    w, created = write_tensor(hipd, "hip/u", MiB, 9, HIP_VISIBLE_DEVICES="1")
    assert created[1:] == ["rocm:0", "10", "0"], created
    assert rocm(hipd, 1)["device_used_bytes"] == 2 * MiB, hipd.stats()
    assert rocm(hipd, 0)["device_used_bytes"] == 0, hipd.stats()
    r = hipd.client(READER, R=f"hip/u {MiB} 9")
    line = r.expect("read")
    assert line == "read rocm:1 10 1 (10, 1) True True", line
    r.send("release")
    r.expect("closed")
    r.finish()
    w.send("close")
    w.expect("closed")
    w.finish()
    tensorctl(hipd, "rm", "hip/u")
    freed(hipd, 1)
    stop_without_leaks(hipd)


def test_close_with_a_live_lease_closes_the_handle_before_the_free(hipd):
    """The reader holds the last lease of an unlinked tensor and closes its
    client: its IPC handle must be closed before the daemon's hipFree (the
    double reports a free while a live process has the memory open; the
    reader stays alive past the free so it would be seen)."""
    n = MiB
    w, _ = write_tensor(hipd, "hip/c", n, 1)
    r = hipd.client(READER, R=f"hip/c {n} 1", HIP_VISIBLE_DEVICES="1,0")
    assert r.expect("read").endswith("True True")
    w.send("close")
    w.expect("closed")
    w.finish()
    tensorctl(hipd, "rm", "hip/c")
    assert rocm(hipd, 0)["device_used_bytes"] == 2 * MiB  # the reader's lease keeps it
    r.send("close")
    r.expect("closed")
    freed(hipd)
    assert r.proc.poll() is None, "the reader must still be alive at the free"
    assert hipd.dbl.violations() == [], hipd.dbl.report()
    r.send("exit")
    r.finish()
    stop_without_leaks(hipd)


def test_kill9_of_a_holder_leaves_the_daemon_serving(hipd):
    """A reader holding a lease (and the IPC mapping) is killed with -9;
    the daemon ends its lease, frees once the name goes, and serves the
    next writer and reader."""
    n = MiB
    w, _ = write_tensor(hipd, "hip/k", n, 3)
    victim = hipd.client(READER, R=f"hip/k {n} 3", HIP_VISIBLE_DEVICES="1,0")
    assert victim.expect("read").endswith("True True")
    os.kill(victim.pid, signal.SIGKILL)
    # Reaped before the name goes, so the free cannot race the exit: the
    # double counts a dying process that still has the memory open.
    victim.proc.wait()
    holders = lambda: [x["pid"] for x in json.loads(tensorctl(hipd, "leases", "hip/k", "--json"))]
    assert wait_until(lambda: victim.pid not in holders(), timeout=10), holders()
    w.send("close")
    w.expect("closed")
    w.finish()
    tensorctl(hipd, "rm", "hip/k")
    freed(hipd)

    w2, _ = write_tensor(hipd, "hip/k2", n, 4)
    r2 = hipd.client(READER, R=f"hip/k2 {n} 4")
    assert r2.expect("read").endswith("True True")
    r2.send("release")
    r2.expect("closed")
    r2.finish()
    w2.send("close")
    w2.expect("closed")
    w2.finish()
    tensorctl(hipd, "rm", "hip/k2")
    freed(hipd)
    stop_without_leaks(hipd)


# A set of HIP tensors (docs/recycle.md, section 5): put_many of sources
# of several sizes on rocm:0; its figures, then each member's bytes and
# device address in a reader.
SET_SIZES = [100, 3000, 70001, MiB + 5]

SET_WRITER = '''
import tensord
sizes = SIZES
c = tensord.connect()
srcs = {}
for i, n in enumerate(sizes):
    t = c.create(f"src/{i}", (n,), "uint8", device="rocm:0")
    write(t, pattern(n, i))
    t.publish()
    srcs[f"set/{i}"] = c.attach(f"src/{i}")
c.put_many(srcs)
s = c.stats()
say("put", s["gpu_arenas"], s["gpu_arena_bytes"])
wait("close")
for t in srcs.values():
    t.release()
c.close()
say("closed")
'''

SET_READER = '''
import tensord
sizes = SIZES
c = tensord.connect()
got = c.attach_many([f"set/{i}" for i in range(len(sizes))])
ok = all(read(got[f"set/{i}"], n) == pattern(n, i) for i, n in enumerate(sizes))
ptrs = [device_ptr(got[f"set/{i}"])[0] for i in range(len(sizes))]
say("read", ok, min(ptrs), max(p + n for p, n in zip(ptrs, sizes)))
single = c.attach("set/2")
say("single", read(single, sizes[2]) == pattern(sizes[2], 2), device_ptr(single)[0] == ptrs[2])
single.release()
for t in got.values():
    t.release()
c.close()
say("closed")
'''


def test_a_hip_set_is_one_allocation_read_through_one_handle(hipd):
    """put_many of four rocm:0 tensors makes one device allocation (before
    stop 41, HIP members kept one each): the daemon counts one set
    allocation; a reader gets every member's bytes, its members lie within
    that one allocation's span of its address space, and a member attached
    alone is the same address. Once the names go, the daemon frees it and
    the double reports nothing."""
    code = lambda c: c.replace("SIZES", repr(SET_SIZES))
    w = hipd.client(code(SET_WRITER))
    put = w.expect("put").split()
    assert put[1] == "1", put
    arena = int(put[2])
    assert sum(SET_SIZES) <= arena <= 4 * MiB, put
    r = hipd.client(code(SET_READER), HIP_VISIBLE_DEVICES="1,0")
    got = r.expect("read").split()
    assert got[1] == "True", got
    assert int(got[3]) - int(got[2]) <= arena, got
    assert r.expect("single") == "single True True"
    r.expect("closed")
    r.finish()
    w.send("close")
    w.expect("closed")
    w.finish()
    for i in range(len(SET_SIZES)):
        tensorctl(hipd, "rm", f"set/{i}", f"src/{i}")
    freed(hipd)
    stop_without_leaks(hipd)


OWNER = '''
p = ctypes.c_void_p()
check(hip.hipMalloc(ctypes.byref(p), 1 << 20), "hipMalloc")
buf = ctypes.create_string_buffer(pattern(1 << 20, 2), 1 << 20)
check(hip.hipMemcpy(p, buf, 1 << 20, DEFAULT), "hipMemcpy")
h = ctypes.create_string_buffer(64)
check(hip.hipIpcGetMemHandle(h, p), "hipIpcGetMemHandle")
say("handle", h.raw.hex())
wait("free")
check(hip.hipFree(p), "hipFree")
say("freed")
'''

OPENER = '''
h = HANDLE.from_buffer_copy(bytes.fromhex(sys.stdin.readline().strip()))
q = ctypes.c_void_p()
# ROCm 6 takes only hipIpcMemLazyEnablePeerAccess (1); HIP 5's 0 is refused.
r0 = hip.hipIpcOpenMemHandle(ctypes.byref(q), h, 0)
check(hip.hipIpcOpenMemHandle(ctypes.byref(q), h, 1), "hipIpcOpenMemHandle")
buf = ctypes.create_string_buffer(1 << 20)
check(hip.hipMemcpy(buf, q, 1 << 20, DEFAULT), "hipMemcpy")
say("open", hip.hipGetErrorName(r0).decode(), buf.raw == pattern(1 << 20, 2))
wait("close")
check(hip.hipIpcCloseMemHandle(q), "hipIpcCloseMemHandle")
say("closed")
'''


def test_the_double_sees_a_free_under_an_open_handle(dbl):
    """What the tests above rely on: two processes over the double alone.
    hipFree while the other still has the memory open through IPC is a
    violation naming that process; the same after its hipIpcCloseMemHandle
    is not."""
    env = dict(os.environ, **dbl.env)
    env.pop("HIP_VISIBLE_DEVICES", None)

    def round_trip(close_first):
        owner = child(OWNER, env)
        opener = child(OPENER, env)
        try:
            opener.send(owner.expect("handle").split()[1])
            assert opener.expect("open") == "open hipErrorInvalidValue True"
            if close_first:
                opener.send("close")
                opener.expect("closed")
            owner.send("free")
            owner.expect("freed")
            if not close_first:
                opener.send("close")
                opener.expect("closed")
            owner.finish()
            opener.finish()
        finally:
            owner.kill()
            opener.kill()
        return opener.pid

    round_trip(close_first=True)
    assert dbl.violations() == [], dbl.report()
    pid = round_trip(close_first=False)
    found = dbl.violations()
    assert len(found) == 1 and "hipFree" in found[0], dbl.report()
    assert f"while pid {pid} still has it open through IPC" in found[0], found
    os.unlink(dbl.report_path)  # expected: the fixture checks for others
