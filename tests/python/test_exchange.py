"""The DLPack C exchange table, driven from C (tdtest_helper.c) through the type's capsule."""
import gc

import numpy as np
import pytest

import tensord

READ_ONLY = 1


def test_table_is_published_on_the_type():
    """K1, K6."""
    api = tensord.Tensor.__dlpack_c_exchange_api__
    assert 'capsule object "dlpack_exchange_api"' in repr(api)
    assert isinstance(tensord.Tensor.__c_dlpack_exchange_api__, int)


def test_roundtrip_tensor_to_managed_and_back(client, tdtest):
    """K2, K4, K5: Tensor -> DLManagedTensorVersioned -> Python object, same memory."""
    client.put("x", np.arange(6, dtype=np.float64).reshape(2, 3))
    t = client.attach("x")
    info, view, stream_is_null, obj = tdtest.exchange_roundtrip(t)
    assert stream_is_null
    assert info["major"] == 1 and info["flags"] & READ_ONLY
    assert info["shape"] == (2, 3) and info["strides"] == (3, 1)
    assert view["data"] == info["data"]
    assert refcount(client) == 1, "the share rides on t's lease"

    assert isinstance(obj, tensord.Tensor)
    assert obj.name == "x" and obj.shape == (2, 3) and obj.readonly
    assert tdtest.inspect(obj.__dlpack__(max_version=(1, 0)))["data"] == info["data"]
    t.release()
    a = np.from_dlpack(obj)
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3))
    assert not a.flags.writeable
    assert refcount(client) == 1, "obj owns the stolen share"
    del obj
    assert refcount(client) == 1, "a still holds a share"
    del a
    gc.collect()
    assert refcount(client) == 0


def refcount(client):
    return client.stat("x").refcount


def test_from_py_rejects_other_objects(tdtest, client):
    """K3: -1 with a Python exception set."""
    client.put("x", b"ab")
    with client.attach("x") as t:
        with pytest.raises(TypeError, match="tensord.Tensor"):
            tdtest.exchange_from_py(t, np.zeros(2))
    with pytest.raises(BufferError, match="released"):
        tdtest.exchange_from_py(t, t)


def test_allocator(client, tdtest):
    """The allocator makes private host tensors; errors go through SetError exactly once."""
    client.put("x", b"ab")
    with client.attach("x") as t:
        obj = tdtest.exchange_alloc(t, (4, 5), 1)
        assert isinstance(obj, tensord.Tensor)
        assert obj.name is None and obj.shape == (4, 5) and obj.dtype == "float32"
        a = np.from_dlpack(obj)
        assert a.flags.writeable and a.shape == (4, 5)
        a[:] = 3.0
        assert np.from_dlpack(obj).sum() == 60.0
        # A foreign tensor shares like ours: two exports, one memory.
        b = np.from_dlpack(obj)
        assert b.ctypes.data == a.ctypes.data
        del obj, a, b
        kind, message, calls = tdtest.exchange_alloc(t, (2,), 2)
        assert calls == 1 and kind == "BufferError" and "cpu" in message
