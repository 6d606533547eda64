"""numpy, torch and jax read tensors written by other processes, zero copy."""
import numpy as np
import pytest

from tdutil import DTYPES

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.dlpack  # noqa: E402

WRITER = """
import sys
import numpy as np
import tensord
c = tensord.connect()
w = c.create("live", (256,), "float32", mutable=True)
a = np.from_dlpack(w)
a[:] = 1.0
w.publish()
print("ready", flush=True)
sys.stdin.readline()
a[:] = 2.0
print("changed", flush=True)
sys.stdin.readline()
"""

READERS = {
    "numpy": lambda t: np.from_dlpack(t),
    "torch": lambda t: torch.from_dlpack(t),
    "jax": lambda t: jax.dlpack.from_dlpack(t),
}


def as_numpy(x):
    if isinstance(x, torch.Tensor):
        return x.numpy()
    return np.asarray(x)


@pytest.mark.parametrize("consumer", sorted(READERS))
def test_reader_sees_writer_changes(client, child, consumer):
    w = child(WRITER)
    w.expect("ready")
    with client.attach("live") as t:
        assert not t.readonly
        x = READERS[consumer](t)
        assert as_numpy(x).tolist() == [1.0] * 256
        w.send()
        w.expect("changed")
        # Only shared memory can show a change made after the import.
        assert as_numpy(x).tolist() == [2.0] * 256
    del x
    w.finish()


def test_numpy_marks_immutable_readonly(client, child):
    p = child("""
        import numpy as np, tensord
        tensord.connect().put("frozen", np.arange(8, dtype=np.int32))
        print("ok", flush=True)
    """)
    p.expect("ok")
    p.finish()
    with client.attach("frozen") as t:
        a = np.from_dlpack(t)
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 42


def test_torch_write_into_immutable_stays_private(client, child):
    """torch ignores READ_ONLY; copy-on-write mapping keeps other processes' bytes intact."""
    client.put("frozen", np.arange(1024, dtype=np.float32))
    scribbler = child("""
        import sys, torch, tensord
        c = tensord.connect()
        t = c.attach("frozen")
        x = torch.from_dlpack(t)
        x.fill_(-7.0)
        assert x.sum().item() == -7.0 * 1024, "the writer sees its own private copy"
        print("written", flush=True)
        sys.stdin.readline()
    """)
    scribbler.expect("written")
    with client.attach("frozen") as t:
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(1024, dtype=np.float32))
    witness = child("""
        import numpy as np, tensord
        with tensord.connect().attach("frozen") as t:
            print("sum", float(np.from_dlpack(t).sum()), flush=True)
    """)
    assert witness.expect("sum") == "sum %s" % float(np.arange(1024).sum())
    witness.finish()
    scribbler.finish()


def test_torch_stray_write_never_shows_in_a_later_attach_in_the_same_process(client):
    """The dirty copy-on-write case: torch writes into an immutable tensor
    anyway; neither a second lease taken while the first lives (which reuses
    the process's descriptor) nor an attach after the last release sees it."""
    ref = np.arange(1024, dtype=np.float32)
    client.put("cow", ref)
    first = client.attach("cow")
    x = torch.from_dlpack(first)
    x.fill_(-7.0)
    assert x.sum().item() == -7.0 * 1024, "the writer sees its own private copy"
    with client.attach("cow") as again:
        np.testing.assert_array_equal(np.from_dlpack(again), ref)
        y = torch.from_dlpack(again)
        y[:8] = 5.0
    assert x.sum().item() == -7.0 * 1024, "one lease's write shows in no other"
    del x, y
    first.release()
    with client.attach("cow") as later:
        np.testing.assert_array_equal(np.from_dlpack(later), ref)


def values(dtype, n=12):
    """Deterministic test values for dtype, as a torch tensor (covers bfloat16)."""
    base = torch.arange(n, dtype=torch.float64) - 3
    if dtype == "bool":
        return base.remainder(2) == 0
    if dtype.startswith("uint"):
        return (base + 3).to(getattr(torch, dtype))
    if dtype.startswith("complex"):
        return torch.complex(base, -base).to(getattr(torch, dtype))
    return base.to(getattr(torch, dtype))


# numpy has no bfloat16; torch and jax have all of them (jax, with x64 off,
# converts 64-bit types to 32-bit, which is a copy).
SUPPORTED = {
    "numpy": [d for d, n in DTYPES.items() if n is not None],
    "torch": list(DTYPES),
    "jax": list(DTYPES),
}


def put_all_dtypes(child):
    """Every CONTRACT §3 dtype, written by another process as 'dt/<name>', 3x4."""
    p = child("""
        import torch, tensord
        c = tensord.connect()
        base = torch.arange(12, dtype=torch.float64) - 3
        for name in %r:
            dt = getattr(torch, name)
            if name == "bool":
                v = base.remainder(2) == 0
            elif name.startswith("uint"):
                v = (base + 3).to(dt)
            elif name.startswith("complex"):
                v = torch.complex(base, -base).to(dt)
            else:
                v = base.to(dt)
            c.put("dt/" + name, v.reshape(3, 4))
        print("ok", flush=True)
    """ % list(DTYPES))
    p.expect("ok")
    p.finish()


def read_as_torch(consumer, t, dtype):
    """Imports t with consumer and converts the result to torch for comparison."""
    x = READERS[consumer](t)
    if consumer == "torch":
        assert x.dtype == getattr(torch, dtype)
        return x
    if consumer == "numpy":
        assert x.dtype == np.dtype(DTYPES[dtype])
        return torch.from_numpy(np.array(x))
    if dtype == "bfloat16":
        return torch.tensor(np.asarray(x).astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.asarray(x).astype(DTYPES[dtype]))


@pytest.mark.parametrize("consumer", sorted(READERS))
def test_every_dtype(client, child, consumer):
    put_all_dtypes(child)
    wrong = []
    for dtype in SUPPORTED[consumer]:
        with client.attach("dt/" + dtype) as t:
            assert t.dtype == dtype
            got = read_as_torch(consumer, t, dtype)
            if not torch.equal(got, values(dtype).reshape(3, 4)):
                wrong.append((dtype, got))
    assert wrong == []


@pytest.mark.parametrize("consumer", sorted(READERS))
def test_zero_d_zero_size_and_strided(client, consumer):
    client.put("s/scalar", np.array(2.5, np.float32))
    client.put("s/empty", np.zeros((3, 0), np.float32))
    # A transposed layout (every consumer, jax included, takes permuted compact strides)...
    with client.create("s/t", (3, 4), "float32", strides=(1, 3)) as w:
        np.from_dlpack(w)[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
        w.publish()
    # ...and a sliced one with gaps (every other column), which jax refuses.
    with client.create("s/gaps", (3, 4), "float32", strides=(8, 2)) as w:
        np.from_dlpack(w)[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
        w.publish()
    read = READERS[consumer]
    with client.attach("s/scalar") as t:
        x = as_numpy(read(t))
        assert x.shape == () and x[()] == 2.5
    with client.attach("s/empty") as t:
        assert as_numpy(read(t)).shape == (3, 0)
    with client.attach("s/t") as t:
        np.testing.assert_array_equal(as_numpy(read(t)),
                                      np.arange(12, dtype=np.float32).reshape(3, 4))
    with client.attach("s/gaps") as t:
        if consumer == "jax":
            # jax takes only compact layouts; copy=True on our side is the way in.
            x = jax.numpy.asarray(np.from_dlpack(t, copy=True))
        else:
            x = read(t)
        np.testing.assert_array_equal(as_numpy(x),
                                      np.arange(12, dtype=np.float32).reshape(3, 4))


def test_consumer_refusal_leaks_nothing(client):
    """E7: jax refuses a layout with gaps before taking the capsule; the capsule frees it."""
    with client.create("gappy", (3, 4), "float32", strides=(8, 2)) as w:
        w.publish()
    t = client.attach("gappy")
    with pytest.raises(Exception):
        jax.dlpack.from_dlpack(t)
    t.release()
    import gc
    gc.collect()
    assert client.stat("gappy").refcount == 0
