"""The hardware GPU suite (tests/gpu/gpu_suite.c) over the driver double.

The double (tests/gpudouble/, docs/gpu.md "The driver double") is a
libcuda.so.1 and libnvidia-ml.so.1 that move real memory between
processes; LD_LIBRARY_PATH selects it for the daemon and every client the
suite starts. Each sharing path runs the whole suite: a real daemon, real
client processes, bytes written in one process and read in another,
read-only readers, kill -9 and death mid-import, close with live imports,
a release with a read still queued, GPU memory back to its baseline. The
double's report file must then hold no "violation" line (an unmap with
work pending, a legacy allocation freed while another process has it
open, a driver call after fork) and no "leak" line for the daemon.

The second half checks the double itself: each of those reports, and the
faults it models, happen when provoked, so a clean report means something.
"""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD, build_path

SUITE = build_path("tests", "gpu", "gpu_suite")
DOUBLE = build_path("gpudouble")

pytestmark = pytest.mark.skipif(
    not os.path.exists(SUITE),
    reason=f"{SUITE} not built: it needs the CUDA toolkit's cuda.h (CUDA_HOME)")


def double_env(tmp_path, **extra):
    env = dict(os.environ)
    env.pop("TENSORD_SOCKET", None)
    env.update(LD_LIBRARY_PATH=DOUBLE, TD_GPU_DOUBLE_DIR=str(tmp_path / "double"),
               TD_GPU_DOUBLE_LEAKS="tensord", GPU_SUITE_TIMEOUT="200",
               GPU_SUITE_CHILD_TIMEOUT="60")
    env.update(extra)
    return env


def report(tmp_path):
    try:
        with open(tmp_path / "double" / "report") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def run_suite(tmp_path, **extra):
    p = subprocess.run([SUITE, build_path("tensord")], env=double_env(tmp_path, **extra),
                       capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    lines = report(tmp_path)
    bad = [x for x in lines if " violation: " in x or " leak at exit" in x]
    assert not bad, "\n".join(bad)
    return out


def passed(out):
    return {line.split()[1] for line in out.splitlines() if line.startswith("PASS ")}


EVERY_PATH = {"stats_path", "write_then_read_other_process", "mutable_change_seen_by_reader",
              "reader_exit_releases", "other_process_writes_this_reads",
              "other_cuda_visible_devices", "release_with_work_queued",
              "close_with_live_import", "kill9_releases_leases",
              "daemon_survives_death_mid_import", "gpu_memory_back_to_baseline"}


def test_vmm_path(tmp_path):
    out = run_suite(tmp_path)
    assert "info cuda:0 path cuda-vmm" in out
    got = passed(out)
    assert EVERY_PATH <= got, EVERY_PATH - got
    # Read-only enforced where the driver grants PROT_READ: a memset is refused
    # at once (as on an H200: docs/gpu.md), bytes stay.
    assert {"reader_cannot_write_immutable", "creator_view_after_publish"} <= got
    assert "read-only enforced: 1): denied CUDA_ERROR_INVALID_VALUE" in out
    # The cold and warm attach figures are printed for both devices.
    assert "bench cuda:0" in out and "bench cpu" in out
    # The refused writes faulted nothing: the writers' contexts stayed usable.
    assert not [x for x in report(tmp_path) if " fault: " in x]


def test_legacy_ipc_path(tmp_path):
    out = run_suite(tmp_path, TENSORD_CUDA_PATH="ipc")
    assert "info cuda:0 path cuda-ipc" in out
    got = passed(out)
    assert EVERY_PATH <= got, EVERY_PATH - got
    assert "reader_write_not_refused_on_legacy_ipc" in got
    assert "PASS close_with_live_import (ipc-unmapped)" in out


def test_device_without_vmm_uses_legacy_ipc(tmp_path):
    out = run_suite(tmp_path, TD_GPU_DOUBLE_NO_VMM="1")
    assert "info cuda:0 path cuda-ipc" in out
    assert EVERY_PATH <= passed(out)


def test_driver_refusing_prot_read_falls_back(tmp_path):
    out = run_suite(tmp_path, TD_GPU_DOUBLE_NO_PROT_READ="1")
    assert "info cuda:0 path cuda-vmm" in out
    got = passed(out)
    assert EVERY_PATH <= got, EVERY_PATH - got
    assert "reader_write_not_refused_on_vmm_without_prot_read" in got


# --- the double itself ------------------------------------------------------------

PRELUDE = r"""
import ctypes, os, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        print("ERR", what, r, flush=True)
        sys.exit(1)
P = ctypes.c_uint64
ok(cu.cuInit(0), "init")
ctx = ctypes.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
ok(cu.cuCtxSetCurrent(ctx), "set")
"""


def py(tmp_path, code, **extra):
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                            env=double_env(tmp_path, **extra), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def done(p, timeout=30):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def test_double_reports_an_unmap_with_work_pending(tmp_path):
    rc, out, err = done(py(tmp_path, """
        gran = 2 << 20
        h = ctypes.c_uint64()
        class Prop(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("ht", ctypes.c_int), ("lt", ctypes.c_int),
                        ("id", ctypes.c_int), ("w", ctypes.c_void_p), ("f", ctypes.c_uint64)]
        class Acc(ctypes.Structure):
            _fields_ = [("lt", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]
        ok(cu.cuMemCreate(ctypes.byref(h), P(gran), ctypes.byref(Prop(1, 1, 1, 0)), P(0)), "create")
        va = P()
        ok(cu.cuMemAddressReserve(ctypes.byref(va), P(gran), P(0), P(0), P(0)), "reserve")
        ok(cu.cuMemMap(va, P(gran), P(0), h, P(0)), "map")
        ok(cu.cuMemSetAccess(va, P(gran), ctypes.byref(Acc(1, 0, 3)), P(1)), "access")
        buf = ctypes.create_string_buffer(64)
        s = ctypes.c_void_p()
        ok(cu.cuStreamCreate(ctypes.byref(s), 0), "stream")
        ok(cu.cuMemcpyDtoHAsync_v2(buf, va, P(64), s), "queue")
        ok(cu.cuMemUnmap(va, P(gran)), "unmap")
        print("sync", cu.cuStreamSynchronize(s), "then", cu.cuMemsetD8_v2(va, 0, P(1)))
    """))
    assert rc == 0, err
    # The queued read faults (700, sticky: the next call answers it too).
    assert out.strip() == "sync 700 then 700"
    assert any("violation: cuMemUnmap of" in x and "1 queued operation" in x
               for x in report(tmp_path)), report(tmp_path)


def test_double_reports_a_free_while_another_process_has_it_open(tmp_path):
    owner = py(tmp_path, """
        p = P()
        ok(cu.cuMemAlloc_v2(ctypes.byref(p), P(1 << 20)), "alloc")
        ok(cu.cuMemsetD8_v2(p, 0x5a, P(1 << 20)), "memset")
        ok(cu.cuCtxSynchronize(), "sync")  # the memset is queued until then
        h = ctypes.create_string_buffer(64)
        ok(cu.cuIpcGetMemHandle(h, p), "get")
        print(h.raw.hex(), flush=True)
        sys.stdin.readline()
        ok(cu.cuMemFree_v2(p), "free")
        print("freed", flush=True)
        sys.stdin.readline()
    """)
    handle = owner.stdout.readline().strip()
    reader = py(tmp_path, f"""
        class H(ctypes.Structure):
            _fields_ = [("b", ctypes.c_char * 64)]
        p = P()
        h = H.from_buffer_copy(bytes.fromhex("{handle}"))
        ok(cu.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1), "open")
        b = ctypes.create_string_buffer(4)
        ok(cu.cuMemcpyDtoH_v2(b, p, P(4)), "read")
        print(b.raw.hex(), flush=True)
        sys.stdin.readline()
    """)
    assert reader.stdout.readline().strip() == "5a5a5a5a"
    owner.stdin.write("\n")
    owner.stdin.flush()
    assert owner.stdout.readline().strip() == "freed"
    for p in (owner, reader):
        p.stdin.write("\n")
        p.stdin.flush()
        assert done(p)[0] == 0
    assert any("violation: cuMemFree of allocation" in x and "still has it open through IPC" in x
               for x in report(tmp_path)), report(tmp_path)


def test_double_refuses_copies_and_memsets_into_read_only(tmp_path):
    rc, out, err = done(py(tmp_path, """
        gran = 2 << 20
        class Prop(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("ht", ctypes.c_int), ("lt", ctypes.c_int),
                        ("id", ctypes.c_int), ("w", ctypes.c_void_p), ("f", ctypes.c_uint64)]
        class Acc(ctypes.Structure):
            _fields_ = [("lt", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]
        h = ctypes.c_uint64()
        va = P()
        ok(cu.cuMemCreate(ctypes.byref(h), P(gran), ctypes.byref(Prop(1, 1, 1, 0)), P(0)), "create")
        ok(cu.cuMemAddressReserve(ctypes.byref(va), P(gran), P(0), P(0), P(0)), "reserve")
        ok(cu.cuMemMap(va, P(gran), P(0), h, P(0)), "map")
        ok(cu.cuMemSetAccess(va, P(gran), ctypes.byref(Acc(1, 0, 1)), P(1)), "read-only")
        src = ctypes.create_string_buffer(b"x" * 16)
        print("copy", cu.cuMemcpyHtoD_v2(va, src, P(16)))
        print("memset", cu.cuMemsetD8_v2(va, 1, P(16)), "sync", cu.cuCtxSynchronize())
        print("after", cu.cuMemcpyDtoH_v2(src, va, P(16)))
    """))
    assert rc == 0, err
    # Both are refused at once (1, not sticky), as on an H200 (docs/gpu.md,
    # 2026-11-26); the context stays usable.
    assert out.split("\n")[:3] == ["copy 1", "memset 1 sync 0", "after 0"]


def test_double_counts_memory_across_processes_and_drops_the_dead(tmp_path):
    holder = py(tmp_path, """
        p = P()
        ok(cu.cuMemAlloc_v2(ctypes.byref(p), P(256 << 20)), "alloc")
        print("held", flush=True)
        sys.stdin.readline()
    """)
    assert holder.stdout.readline().strip() == "held"
    probe = """
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ok(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "info")
        print(total.value - free.value)
    """
    rc, out, err = done(py(tmp_path, probe, TD_GPU_DOUBLE_CTX_BYTES="0"))
    assert rc == 0, err
    used_with = int(out)
    holder.kill()
    holder.wait()
    rc, out, err = done(py(tmp_path, probe, TD_GPU_DOUBLE_CTX_BYTES="0"))
    # The holder's context (64 MiB by default) and its 256 MiB went with it.
    assert used_with - int(out) == (256 << 20) + (64 << 20), (used_with, out)


def test_double_refuses_a_driver_call_after_fork(tmp_path):
    rc, out, err = done(py(tmp_path, """
        pid = os.fork()
        if pid == 0:
            p = P()
            os._exit(cu.cuMemAlloc_v2(ctypes.byref(p), P(4096)))
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """))
    assert rc == 0, err
    assert out.strip() == "child 3"  # CUDA_ERROR_NOT_INITIALIZED
    assert any("violation: cuMemAlloc_v2 in a child forked" in x for x in report(tmp_path))


def test_double_cuda_visible_devices_renumbers(tmp_path):
    code = """
        class U(ctypes.Structure):
            _fields_ = [("b", ctypes.c_ubyte * 16)]
        n = ctypes.c_int()
        ok(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
        u = U()
        ok(cu.cuDeviceGetUuid_v2(ctypes.byref(u), 0), "uuid")
        print(n.value, bytes(u.b).hex())
    """
    outs = {}
    for vis in (None, "1,0", "1"):
        extra = {} if vis is None else {"CUDA_VISIBLE_DEVICES": vis}
        rc, out, err = done(py(tmp_path, code, **extra))
        assert rc == 0, err
        outs[vis] = out.split()
    assert outs[None][0] == "2" and outs["1,0"][0] == "2" and outs["1"][0] == "1"
    assert outs["1,0"][1] == outs["1"][1] != outs[None][1]
