"""The DLPack producer against research/dlpack.md §4 (IDs in the test names' docstrings)."""
import gc
import sys

import numpy as np
import pytest

import tensord

READ_ONLY, IS_COPIED = 1, 2


@pytest.fixture
def t(client):
    client.put("x", np.arange(12, dtype=np.float32).reshape(3, 4))
    with client.attach("x") as t:
        yield t


def test_capsule_fields(t, tdtest):
    """A4, A5, B1, B2, B5, B7, B14, H1: version, flags, strides, offset, alignment."""
    info = tdtest.inspect(t.__dlpack__(max_version=(1, 0)))
    assert info["versioned"] and info["major"] == 1 and info["minor"] <= 3
    assert info["flags"] == READ_ONLY
    assert (info["device_type"], info["device_id"]) == (1, 0)
    assert info["dtype"] == (2, 32, 1)
    assert info["shape"] == (3, 4) and info["strides"] == (4, 1)
    assert info["byte_offset"] == 0
    assert info["data"] % 64 == 0


def test_every_export_shares_the_same_memory(t, tdtest):
    """D12, D13: no copy, N exports give N capsules over one pointer."""
    a = tdtest.inspect(t.__dlpack__(max_version=(1, 0)))
    b = tdtest.inspect(t.__dlpack__(max_version=(1, 0), copy=False))
    c = tdtest.inspect(t.__dlpack__())
    assert a["data"] == b["data"] == c["data"]
    assert b["flags"] & IS_COPIED == 0


def test_type_level_lookup(t):
    """D1: numpy <= 2.0 calls type(x).__dlpack__(x)."""
    assert "dltensor" in repr(type(t).__dlpack__(t))


def test_capsule_kinds_follow_max_version(t):
    """D2-D5."""
    def name(cap):
        return repr(cap).split('"')[1]
    assert name(t.__dlpack__()) == "dltensor"
    assert name(t.__dlpack__(stream=None)) == "dltensor"
    assert name(t.__dlpack__(dl_device=None, copy=None, max_version=(1, 0))) == \
        "dltensor_versioned"
    assert name(t.__dlpack__(max_version=(1, 5))) == "dltensor_versioned"
    assert name(t.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
    assert name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=[1, 0])
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(1, 0, 0))


def test_keyword_only_and_unknown_keywords(t):
    """D6, D7."""
    with pytest.raises(TypeError):
        t.__dlpack__(None)
    with pytest.raises(TypeError):
        t.__dlpack__(foo=1)


def test_dl_device(t):
    """D9, D10."""
    assert t.__dlpack_device__() == (1, 0)
    t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(1, 0), dl_device="cpu")


def test_stream_on_cpu(t):
    """G1: None and -1 are fine on the host; a real stream is not."""
    t.__dlpack__(stream=None)
    t.__dlpack__(stream=-1)
    with pytest.raises(ValueError):
        t.__dlpack__(stream=1)


def test_copy_true(t, tdtest):
    """D11, H5: a private writable copy flagged IS_COPIED."""
    shared = tdtest.inspect(t.__dlpack__(max_version=(1, 0)))
    info = tdtest.inspect(t.__dlpack__(max_version=(1, 0), copy=True))
    assert info["flags"] == IS_COPIED
    assert info["data"] != shared["data"] and info["data"] % 64 == 0
    a = np.from_dlpack(t, copy=True)
    assert a.flags.writeable
    a[:] = -1
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(12).reshape(3, 4))


def test_copy_true_of_strided_tensor(client, tdtest):
    with client.create("f", (2, 3), "int16", strides=(1, 2)) as w:
        np.from_dlpack(w)[...] = [[1, 2, 3], [4, 5, 6]]
        c = np.from_dlpack(w, copy=True)
        assert c.flags.c_contiguous
        np.testing.assert_array_equal(c, [[1, 2, 3], [4, 5, 6]])


def test_readonly_and_writable(client):
    """H1, H4."""
    client.put("ro", np.zeros(3))
    client.put("rw", np.zeros(3), mutable=True)
    with client.attach("ro") as ro, client.attach("rw") as rw:
        a = np.from_dlpack(ro)
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
        assert np.from_dlpack(rw).flags.writeable


def test_read_only_enforced_is_false_for_host_tensors(client):
    """Host memory is never write-refused: an immutable attach is a private
    copy-on-write mapping, so a stray write stays in this process."""
    client.put("ro", np.arange(3.0))
    client.put("rw", np.zeros(3), mutable=True)
    with client.attach("ro") as ro, client.attach("rw") as rw:
        assert ro.readonly and not ro.read_only_enforced
        assert not rw.readonly and not rw.read_only_enforced
        # What "not enforced" means for host memory: a write through the
        # memory (ctypes ignores numpy's flag) stays private.
        import ctypes
        ctypes.c_double.from_address(np.from_dlpack(ro).ctypes.data).value = 42.0
        with client.attach("ro") as again:
            assert np.from_dlpack(again)[0] == 0.0
    w = client.create("c", (4,), "uint8")
    assert not w.read_only_enforced
    w.publish()
    assert w.readonly and not w.read_only_enforced
    w.release()
    assert not w.read_only_enforced


def test_legacy_capsule_of_readonly_tensor_is_exported(t):
    """H2: exported anyway (JAX only asks for legacy capsules); see docs/python.md."""
    assert "dltensor" in repr(t.__dlpack__())


def test_unused_capsule_is_freed(client, t):
    """E2: the capsule destructor calls the deleter once; the lease goes back."""
    caps = [t.__dlpack__(max_version=(1, 0)), t.__dlpack__()]
    assert client.stat("x").refcount == 1
    t.release()
    assert client.stat("x").refcount == 1, "the capsules hold the lease"
    del caps
    gc.collect()
    assert client.stat("x").refcount == 0


def test_consumed_capsule_is_not_freed_twice(client, t):
    """E3, E5: a consumer renames the capsule; consuming it again fails cleanly."""
    torch = pytest.importorskip("torch")
    cap = t.__dlpack__(max_version=(1, 0))
    x = torch.from_dlpack(cap)
    assert "used_dltensor_versioned" in repr(cap)
    with pytest.raises(Exception):
        torch.from_dlpack(cap)
    t.release()
    del cap
    gc.collect()
    assert client.stat("x").refcount == 1, "x still holds its share"
    assert x.sum().item() == 66.0
    del x
    gc.collect()
    assert client.stat("x").refcount == 0


def test_destructor_keeps_exception_in_flight(t):
    """E6."""
    try:
        raise KeyError("in flight")
    except KeyError:
        cap = t.__dlpack__()
        del cap
        assert sys.exc_info()[0] is KeyError


def test_deleter_on_thread_without_gil(client, t, tdtest):
    """F1: a consumer may run the deleter on any thread, without the GIL."""
    tdtest.consume_in_thread(t.__dlpack__(max_version=(1, 0)))
    tdtest.consume_in_thread(t.__dlpack__())
    t.release()
    assert client.stat("x").refcount == 0


def test_released_tensor_cannot_be_exported(t):
    t.release()
    t.release()
    with pytest.raises(BufferError, match="released"):
        t.__dlpack__()
    assert t.shape == (3, 4) and t.name == "x", "metadata survives release"


def test_zero_d_and_zero_size(client, tdtest):
    """B3, B4."""
    client.put("scalar", np.array(3.5))
    client.put("empty", np.zeros((0, 4), np.int32))
    with client.attach("scalar") as s, client.attach("empty") as e:
        assert s.shape == () and s.strides == ()
        assert np.from_dlpack(s)[()] == 3.5
        assert tdtest.inspect(s.__dlpack__(max_version=(1, 0)))["ndim"] == 0
        assert e.shape == (0, 4)
        assert np.from_dlpack(e).shape == (0, 4)
        assert not np.from_dlpack(e).flags.writeable


def test_tensor_not_instantiable():
    with pytest.raises(TypeError):
        tensord.Tensor()
