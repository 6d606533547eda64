"""The Client API: operations, records, errors, threads."""
import array
import errno
import math
import os
import threading
import time

import numpy as np
import pytest

import tensord
from tdutil import wait_refcount, wait_until


def test_connect_default_path_uses_env(daemon, monkeypatch):
    monkeypatch.setenv("TENSORD_SOCKET", daemon.socket)
    assert tensord.default_socket_path() == daemon.socket
    with tensord.connect() as c:
        assert c.path is None
        assert isinstance(c.stats(), dict)
    assert c.closed


def test_connect_without_daemon(tmp_path):
    with pytest.raises(tensord.NoDaemonError) as ei:
        tensord.connect(str(tmp_path / "nothing.sock"))
    assert isinstance(ei.value, ConnectionRefusedError)
    assert isinstance(ei.value, tensord.Error)
    assert ei.value.errno in (errno.ENOENT, errno.ECONNREFUSED)


def test_connect_accepts_pathlike(daemon):
    import pathlib
    with tensord.connect(pathlib.Path(daemon.socket)) as c:
        c.stats()


def test_put_attach_roundtrip(client):
    src = np.arange(32, dtype=np.float32).reshape(4, 8)
    client.put("model/inputs/0", src)
    with client.attach("model/inputs/0") as t:
        assert t.name == "model/inputs/0"
        assert t.shape == (4, 8)
        assert t.strides == (8, 1)
        assert t.dtype == "float32"
        assert t.device == "cpu"
        assert t.nbytes >= 4 * 8 * 4
        assert t.readonly
        assert not t.mutable
        assert t.__dlpack_device__() == (1, 0)
        a = np.from_dlpack(t)
        np.testing.assert_array_equal(a, src)
        assert "model/inputs/0" in repr(t)
    assert t.released
    # The array outlives the with block: its own share keeps the memory mapped.
    np.testing.assert_array_equal(a, src)


def test_create_publish_and_stat(client):
    w = client.create("out", (4, 8), "float32", device="cpu", mutable=False,
                      lifetime="persistent")
    assert not w.readonly
    assert client.stat("out").state == "created"
    np.from_dlpack(w)[:] = 2.0
    w.publish()
    assert w.readonly, "an immutable tensor is read-only for its creator after publish"
    info = client.stat("out")
    assert isinstance(info, tensord.TensorInfo)
    assert (info.name, info.dtype, info.shape, info.strides, info.device) == \
        ("out", "float32", (4, 8), (8, 1), "cpu")
    assert info.nbytes >= 128
    assert info.state == "published"
    assert info.refcount == 1  # w's lease
    assert info.owner_uid == os.getuid()
    assert info.mutable is False and info.lifetime == "persistent"
    assert abs(info.created - time.time()) < 60
    assert info.id > 0
    assert info.mode == 0o600
    with client.attach("out") as t:
        assert np.from_dlpack(t).sum() == 64.0
        assert client.stat("out").refcount == 2
    w.release()
    assert client.stat("out").refcount == 0


def test_create_accepts_numpy_and_torch_dtypes(client):
    torch = pytest.importorskip("torch")
    with client.create("d1", 3, np.dtype("int16")) as t:
        assert t.dtype == "int16" and t.shape == (3,)
    with client.create("d2", [2, 2], torch.bfloat16) as t:
        assert t.dtype == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype"):
        client.create("d3", (1,), "float31")
    with pytest.raises(ValueError, match="unknown device"):
        client.create("d4", (1,), "float32", device="tpu")
    with pytest.raises(ValueError, match="lifetime"):
        client.create("d5", (1,), "float32", lifetime="forever")


def test_create_with_strides(client):
    # Column-major 3x4: element (i, j) at i + 3j.
    with client.create("fortran", (3, 4), "int32", strides=(1, 3)) as w:
        assert w.strides == (1, 3)
        a = np.from_dlpack(w)
        assert a.strides == (4, 12)
        a[...] = np.arange(12, dtype=np.int32).reshape(3, 4)
        w.publish()
    with client.attach("fortran") as t:
        np.testing.assert_array_equal(np.from_dlpack(t),
                                      np.arange(12, dtype=np.int32).reshape(3, 4))
    with pytest.raises(ValueError, match="strides has 1 entries"):
        client.create("bad", (3, 4), "int32", strides=(1,))


def test_list_and_stats(client):
    for n in ("a/1", "a/2", "b/1"):
        client.put(n, np.zeros(4, np.uint8))
    assert [i.name for i in client.list("a/")] == ["a/1", "a/2"]
    assert [i.name for i in client.list()] == ["a/1", "a/2", "b/1"]
    assert client.list("zzz") == []
    s = client.stats()
    assert s["tensors"] == 3
    assert s["clients"] >= 1
    assert s["uptime_seconds"] > 0
    assert s["daemon_pid"] > 0
    cpu = [d for d in s["devices"] if d["device"] == "cpu"]
    assert cpu and cpu[0]["device_used_bytes"] >= 12 and cpu[0]["device_capacity_bytes"] > 0
    # Host memory has no GPU figure; the key is there for every device.
    assert cpu[0]["device_gpu_bytes"] == 0


def test_unlink_keeps_attached_memory(client):
    client.put("gone", np.full(8, 7, np.int64))
    t = client.attach("gone")
    client.unlink("gone")
    with pytest.raises(FileNotFoundError):
        client.attach("gone")
    np.testing.assert_array_equal(np.from_dlpack(t), np.full(8, 7))
    t.release()


def test_errors_map_to_builtins(client):
    with pytest.raises(tensord.NotFoundError) as ei:
        client.stat("no/such")
    e = ei.value
    assert isinstance(e, FileNotFoundError) and isinstance(e, tensord.Error)
    assert e.errno == errno.ENOENT
    assert "no/such" in str(e)

    client.put("dup", b"abc")
    with pytest.raises(FileExistsError) as ei:
        client.put("dup", b"abc")
    assert isinstance(ei.value, tensord.ExistsError) and ei.value.errno == errno.EEXIST
    assert "dup" in str(ei.value)

    with pytest.raises(tensord.Error) as ei:
        client.put("bad name!", b"x")
    assert ei.value.errno == errno.EINVAL
    assert type(ei.value) is tensord.Error

    with pytest.raises(FileNotFoundError):
        client.unlink("no/such")


def test_attach_timeout(client):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as ei:
        client.attach("late", timeout=0.2)
    assert isinstance(ei.value, tensord.TimedOutError)
    assert ei.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - t0 >= 0.15
    with pytest.raises(FileNotFoundError):
        client.attach("late")  # timeout=None: no wait
    with pytest.raises(ValueError):
        client.attach("late", timeout=-1)


def test_attach_waits_for_publish_from_another_thread(client, daemon):
    def publish_later():
        with tensord.connect(daemon.socket) as c2:
            # Once the attach waits in the daemon: else it finds the tensor there.
            assert wait_until(lambda: c2.stats()["waiters"] == 1, timeout=30)
            c2.put("late", np.ones(3, np.float64))

    th = threading.Thread(target=publish_later)
    th.start()
    with client.attach("late", timeout=math.inf) as t:
        assert np.from_dlpack(t).sum() == 3.0
    th.join()


def test_connection_lifetime(client, daemon):
    with tensord.connect(daemon.socket) as c2:
        c2.put("tmp/x", np.zeros(2), lifetime="connection")
        assert client.stat("tmp/x").lifetime == "connection"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not client.list("tmp/"):
            break
        time.sleep(0.01)
    assert client.list("tmp/") == []


def test_mutable_and_mode(client):
    client.put("m", np.zeros(4, np.float32), mutable=True, mode=0o640)
    info = client.stat("m")
    assert info.mutable and info.mode == 0o640
    with client.attach("m") as t:
        assert not t.readonly and t.mutable
        np.from_dlpack(t)[:] = 5
    with client.attach("m") as t:
        assert np.from_dlpack(t).tolist() == [5, 5, 5, 5]
    with pytest.raises(ValueError, match="mode"):
        client.put("m2", b"x", mode=0o70000)


def test_put_buffer_protocol(client):
    client.put("bytes", b"hello")
    client.put("darr", array.array("d", [1.5, 2.5]))
    base = np.arange(20, dtype=np.int32).reshape(4, 5)
    client.put("mv", memoryview(base[::2, 1::2]))  # a strided buffer
    with client.attach("bytes") as t:
        assert t.dtype == "uint8" and bytes(np.from_dlpack(t)) == b"hello"
    with client.attach("darr") as t:
        assert t.dtype == "float64" and np.from_dlpack(t).tolist() == [1.5, 2.5]
    with client.attach("mv") as t:
        assert t.strides == (2, 1), "put stores row-major compact"
        np.testing.assert_array_equal(np.from_dlpack(t), base[::2, 1::2])
    with pytest.raises(BufferError):
        client.put("be", memoryview(np.arange(3, dtype=">i4")))
    with pytest.raises(TypeError):
        client.put("no", object())


@pytest.mark.parametrize("make", [
    lambda: np.arange(600 * 3000, dtype=np.float32).reshape(600, 3000)[::2],  # 12 KB runs
    lambda: np.arange(40 * 40000, dtype=np.float32).reshape(40, 40000)[::3],  # 160 KB runs
    lambda: np.arange(1000 * 1000, dtype=np.int32).reshape(1000, 1000).T,     # 4 B runs
    lambda: np.arange(7, dtype=np.int64)[::-1][None, :, None],               # one dim of runs
    lambda: np.zeros((3, 0, 4), np.float32),                                 # no bytes
    lambda: np.float64(2.5),                                                 # 0-d
])
def test_put_large_and_strided_sources_land_compact(client, make):
    """put() writes host sources through the descriptor: small runs gathered,
    large runs written straight, across buffer boundaries, stored compact."""
    src = np.asarray(make())
    client.put("big/strided", src)
    with client.attach("big/strided") as t:
        a = np.from_dlpack(t)
        assert a.shape == src.shape and a.flags.c_contiguous
        np.testing.assert_array_equal(a, src)


def test_put_dlpack_producers(client):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    client.put("torch/t", base.t())  # non-contiguous
    client.put("torch/bf16", base.to(torch.bfloat16))
    client.put("jax/a", jnp.arange(5, dtype=jnp.int32))
    client.put("np/nc", np.arange(10.0)[::-2])  # negative strides
    with client.attach("torch/t") as t:
        assert t.shape == (6, 4)
        assert torch.equal(torch.from_dlpack(t), base.t())
    with client.attach("torch/bf16") as t:
        assert t.dtype == "bfloat16"
        assert torch.equal(torch.from_dlpack(t), base.to(torch.bfloat16))
    with client.attach("jax/a") as t:
        assert np.from_dlpack(t).tolist() == [0, 1, 2, 3, 4]
    with client.attach("np/nc") as t:
        assert np.from_dlpack(t).tolist() == [9.0, 7.0, 5.0, 3.0, 1.0]
    # A Tensor is a producer too; the source's lease is untouched.
    with client.attach("np/nc") as src:
        client.put("copy/of/nc", src)
        assert client.stat("np/nc").refcount == 1
    assert client.stat("np/nc").refcount == 0
    # torch refuses to export a tensor that requires grad; put detaches it (issue 34).
    client.put("grad", torch.ones(2, requires_grad=True))
    with client.attach("grad") as t:
        assert torch.equal(torch.from_dlpack(t), torch.ones(2))


def test_put_raw_capsule_is_consumed(client):
    a = np.arange(4, dtype=np.int8)
    cap = a.__dlpack__(max_version=(1, 0))
    client.put("cap", cap)
    assert "used_dltensor_versioned" in repr(cap)
    with pytest.raises(BufferError):
        client.put("cap2", cap)


def test_closed_client(client, daemon):
    c = tensord.connect(daemon.socket)
    c.put("x", b"1")
    t = c.attach("x")
    c.close()
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.stat("x")
    # Arrays and tensors stay readable after close; the daemon ended the lease.
    assert bytes(np.from_dlpack(t)) == b"1"
    assert wait_refcount(client, "x", 0) == 0
    t.release()


def test_close_while_another_thread_waits(daemon):
    c = tensord.connect(daemon.socket)
    errors = []

    def waiter():
        try:
            c.attach("never", timeout=1.0)
        except Exception as e:  # noqa: BLE001 - any tensord error is fine here
            errors.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    # The close comes while the attach waits, not before it started.
    assert wait_until(lambda: daemon.stats()["waiters"] == 1), daemon.stats()
    c.close()
    th.join(10)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], tensord.Error)
    assert c.closed


def test_threads_share_one_client(client):
    client.put("shared", np.arange(1000, dtype=np.float64))
    errors = []

    def work():
        try:
            for _ in range(300):
                with client.attach("shared") as t:
                    assert np.from_dlpack(t)[999] == 999.0
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert client.stat("shared").refcount == 0


def test_docstrings():
    for obj in (tensord.connect, tensord.Client, tensord.Tensor, tensord.TensorInfo):
        assert obj.__doc__
    for name in ("put", "attach", "create", "stat", "list", "stats", "unlink", "close"):
        assert getattr(tensord.Client, name).__doc__, name
    for name in ("__dlpack__", "__dlpack_device__", "publish", "release", "name", "shape",
                 "dtype", "device", "strides", "nbytes", "readonly"):
        assert getattr(tensord.Tensor, name).__doc__, name


@pytest.mark.parametrize("timeout", ["math.inf", "30"])
def test_ctrl_c_interrupts_a_waiting_attach(daemon, timeout):
    """SIGINT while attach() waits for a publish raises KeyboardInterrupt at
    once, whatever the timeout, instead of after it (or never)."""
    import signal
    import subprocess
    import sys
    import time
    code = """
import math, sys, tensord
c = tensord.connect()
print("waiting", flush=True)
try:
    c.attach("never/published", timeout=%s)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
""" % timeout
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout.readline().strip() == "waiting"
    # SIGINT while the attach waits in the daemon, not before it is sent.
    assert wait_until(lambda: daemon.stats().get("waiters") == 1), daemon.stats()
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=10)
    assert time.monotonic() - t0 < 1.0
    assert p.returncode == 3 and "interrupted" in out


def test_dtypes_as_numpy_and_torch_users_write_them(client):
    """Anything numpy.dtype() accepts ("float" is float64, as in numpy), torch
    dtypes, and the CONTRACT names; big-endian is refused with the fix."""
    torch = pytest.importorskip("torch")
    cases = [(np.float32, "float32"), (np.dtype("f4"), "float32"), ("<f4", "float32"),
             ("f8", "float64"), ("float", "float64"), ("double", "float64"), ("half", "float16"),
             ("bfloat16", "bfloat16"), (torch.bfloat16, "bfloat16"), (torch.int16, "int16"),
             (np.uint8, "uint8"), (bool, "bool"), ("complex128", "complex128")]
    for i, (given, name) in enumerate(cases):
        with client.create("dt/%d" % i, (2,), given) as t:
            assert t.dtype == name, (given, t.dtype)
    with pytest.raises(ValueError, match="big-endian"):
        client.create("dt/be", (2,), ">f4")
    with pytest.raises(ValueError, match="unknown dtype"):
        client.create("dt/bad", (2,), "float128x")


def test_buffer_protocol_and_array(client):
    """memoryview(t), bytes(t) and numpy.asarray(t) see a host tensor zero copy;
    read-only stays read-only; an export outlives release(); what has no
    buffer format is refused by name."""
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    client.put("buf/x", ref)
    t = client.attach("buf/x")
    m = memoryview(t)
    assert (m.format, m.shape, m.strides, m.readonly) == ("f", (2, 3), (12, 4), True)
    assert m.tolist() == ref.tolist()
    assert bytes(t) == ref.tobytes()
    a = np.asarray(t)
    assert a.ctypes.data == np.from_dlpack(t).ctypes.data and not a.flags.writeable
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    t.release()
    assert m.tolist() == ref.tolist(), "the export holds its own share of the lease"
    assert client.stat("buf/x").refcount >= 1
    del m, a
    assert wait_refcount(client, "buf/x", 0) == 0
    with client.create("buf/w", (4,), "int16", mutable=True) as w:
        mv = memoryview(w)
        mv[1] = 7
        assert np.from_dlpack(w).tolist() == [0, 7, 0, 0]
        del mv
        w.publish()
    client.put("buf/bf", np.zeros(2, np.uint16))
    torch = pytest.importorskip("torch")
    client.put("buf/b16", torch.zeros(2, dtype=torch.bfloat16))
    with client.attach("buf/b16") as t:
        with pytest.raises(BufferError, match="bfloat16"):
            memoryview(t)


@pytest.mark.parametrize("n", [16, 1 << 20], ids=["inline", "through-a-memfd"])
def test_put_replace(client, n):
    """put(replace=True) over a name the caller owns: the new bytes under the
    name, the old tensor's arrays keep theirs; without it, ExistsError."""
    client.put("rep", np.full(n, 1, np.uint8))
    old = client.attach("rep")
    old_arr = np.from_dlpack(old)
    with pytest.raises(tensord.ExistsError):
        client.put("rep", np.full(n, 2, np.uint8))
    client.put("rep", np.full(2 * n, 3, np.uint8), replace=True)
    with client.attach("rep") as t:
        new = np.from_dlpack(t)
        assert new.shape == (2 * n,) and (new == 3).all()
    assert (old_arr == 1).all() and old_arr.shape == (n,)
    info = client.stat("rep")
    assert info.nbytes == 2 * n and not info.mutable
    old.release()
    client.put("rep/absent", np.zeros(3, np.float32), replace=True)   # no old one: a plain put
    assert client.stat("rep/absent").shape == (3,)


def test_create_replace(client):
    client.put("crep", np.zeros(4, np.int32))
    with pytest.raises(tensord.ExistsError):
        client.create("crep", (4,), "int32")
    with client.create("crep", (8,), "int32", replace=True) as w:
        np.from_dlpack(w)[:] = 5
        w.publish()
    with client.attach("crep") as t:
        assert np.from_dlpack(t).tolist() == [5] * 8
