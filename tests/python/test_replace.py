"""Replace never loses the old version (docs/design.md, "Replace"; issue 18,
items 4-6): the old version stays named and attachable until the new one
is published, the swap is one daemon step for every size, and every
failure before the publish leaves the old version as it was. The
daemon-level cases (a client killed between create and publish, a wrong
byte count, tensorctl killed mid-copy) are in
tests/integration/test_replace.py."""
import ctypes
import mmap

import numpy as np
import pytest



def version(client, name):
    """The value every element of name holds (the version written), and its size."""
    with client.attach(name) as t:
        a = np.from_dlpack(t)
        assert (a == a.flat[0]).all(), "a mixed or half-written version"
        return int(a.flat[0]), a.nbytes


@pytest.mark.parametrize("n", [1024, 1 << 18, 1 << 21], ids=["4KiB", "1MiB", "8MiB"])
def test_attach_never_finds_the_name_missing(client, child, n):
    """A reader attaching without waiting while the owner replaces the name
    over and over: it never finds the name missing, and every version it
    sees is whole. 4 KiB goes the inline put path (one request), 1 and
    8 MiB create, write and publish."""
    client.put("v", np.zeros(n, np.int32))
    reader = child("""
        import sys, numpy as np, tensord
        c = tensord.connect()
        missing = seen = 0
        last = -1
        print("ready", flush=True)
        while True:
            try:
                with c.attach("v", timeout=0) as t:
                    a = np.from_dlpack(t)
                    v = int(a[0])
                    assert (a == v).all(), "half-written version"
                    assert v >= last, (v, last)
                    last = v
                    seen += 1
            except tensord.NotFoundError:
                missing += 1
            if last == 20:
                break
        print("missing", missing, "seen", seen, flush=True)
    """)
    reader.expect("ready")
    before = client.stats()["replaces_total"]
    for v in range(1, 21):
        client.put("v", np.full(n, v, np.int32), replace=True)
    line = reader.expect("missing")
    reader.finish()
    assert line.split()[1] == "0", line
    assert version(client, "v") == (20, n * 4)
    # Each publish that swapped a name counts once.
    assert client.stats()["replaces_total"] == before + 20


def test_put_replace_from_a_source_that_faults(client):
    """put(replace=True) of an array whose memory faults half way (a page
    that cannot be read): an error, and the old version is as it was."""
    client.put("f", np.full(1 << 20, 3, np.int32))
    size = 8 << 20
    buf = mmap.mmap(-1, size)
    src = np.frombuffer(buf, np.int32)
    src[:] = 4
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    addr = src.ctypes.data
    # The middle 64 KiB: the copy reaches it after writing half the tensor.
    assert libc.mprotect(addr + size // 2, 65536, 0) == 0, ctypes.get_errno()
    try:
        with pytest.raises(ValueError) as e:     # EFAULT: the source, not the daemon
            client.put("f", src, replace=True)
        assert "'f'" in str(e.value) and "Bad address" in str(e.value), e.value
    finally:
        libc.mprotect(addr + size // 2, 65536, mmap.PROT_READ | mmap.PROT_WRITE)
    assert version(client, "f") == (3, 4 << 20)
    assert client.stats()["tensors"] == 1
    replaced = client.stats()["replaces_total"]
    # And a put that works still replaces it.
    client.put("f", src, replace=True)
    assert version(client, "f") == (4, size)
    assert client.stats()["replaces_total"] == replaced + 1, "the failed put swapped nothing"
