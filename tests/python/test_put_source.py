"""put() of what a buggy DLPack producer hands over (issue 18, item 20): a
NULL data pointer, a byte_offset of 2**40, a byte_offset that wraps around
the address space. Each is a ValueError naming the argument, on the inline
path (up to 60 KiB) and on the create + copy path alike, and leaves nothing
in the daemon: no tensor, no draft, no lease. An honest producer with a
byte_offset is still served, byte for byte.

The bad puts run in a child process: before the fix they killed the
interpreter (SIGSEGV), which would take the test session with them. The
capsules come from _tdtest.raw_capsule() (tdtest_helper.c), which builds
them by hand with whatever pointer and offset it is given."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# 64 B and 64 KiB travel inside the Put request; 1 MiB is created, then copied.
SIZES = [64, 64 * 1024, 1 << 20]

CHILD = r"""
import importlib.util, json, sys
import numpy as np, tensord

spec = importlib.util.spec_from_file_location("_tdtest", sys.argv[2])
tdt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tdt)
kind, sizes = sys.argv[3], json.loads(sys.argv[4])


class Producer:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kw):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


buf = np.full(2 << 20, 0xAB, np.uint8)      # real memory that stray reads would find
addr = buf.ctypes.data
made = 0
c = tensord.connect(sys.argv[1])
for n in sizes:
    if kind == "null":
        data, off = 0, 0
    elif kind == "offset_2_40":
        data, off = addr, 1 << 40
    elif kind == "wrapping":
        # data + byte_offset wraps to addr: readable bytes, not the producer's
        data, off = addr + 4096, (1 << 64) - 4096
    for how in ("producer", "capsule"):
        cap = tdt.raw_capsule(data, n, off)
        made += 1
        try:
            c.put(f"bad/{n}/{how}", Producer(cap) if how == "producer" else cap)
        except ValueError as e:
            print(json.dumps(["ValueError", n, how, str(e)]), flush=True)
        except Exception as e:
            print(json.dumps([type(e).__name__, n, how, str(e)]), flush=True)
        else:
            print(json.dumps(["stored", n, how, ""]), flush=True)
        del cap
# What this connection still holds: its drafts would show in its own list.
st = c.stats()
print(json.dumps(["left", [t.name for t in c.list()], st["tensors"], st["leases"]]), flush=True)
print(json.dumps(["deleted", tdt.raw_deleted(), made]), flush=True)
# The interpreter and the connection still work, and the names are free.
for n in sizes:
    c.put(f"bad/{n}/producer", np.arange(10, dtype=np.int32))
    with c.attach(f"bad/{n}/producer") as t:
        assert np.from_dlpack(t).tolist() == list(range(10))
    c.unlink(f"bad/{n}/producer")
print(json.dumps(["done"]), flush=True)
"""


def run_child(daemon, tdtest, kind):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), daemon.socket,
                        tdtest.__file__, kind, json.dumps(SIZES)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"the interpreter died (rc {r.returncode}): {r.stdout}{r.stderr}"
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("kind,reason", [
    ("null", "data pointer is NULL"),
    ("offset_2_40", "are not mapped in this process"),
    ("wrapping", "runs past the end of the address space"),
])
def test_bad_source_is_a_value_error_and_leaves_nothing(daemon, tdtest, client, kind, reason):
    lines = run_child(daemon, tdtest, kind)
    puts = [x for x in lines if x[0] not in ("left", "deleted", "done")]
    assert len(puts) == 2 * len(SIZES), lines
    for what, n, how, msg in puts:
        assert what == "ValueError", (n, how, what, msg)
        assert msg.startswith("put() argument 'obj': "), msg
        assert f"'bad/{n}/{how}'" in msg and reason in msg, msg
    left = next(x for x in lines if x[0] == "left")
    assert left[1:] == [[], 0, 0], f"the daemon holds something: {left}"
    deleted = next(x for x in lines if x[0] == "deleted")
    assert deleted[1] == deleted[2], f"each capsule's deleter runs once: {deleted}"
    assert lines[-1] == ["done"]
    # And from another connection, after the child is gone: nothing at all.
    assert client.list() == [] and client.stats()["tensors"] == 0


@pytest.mark.parametrize("n", SIZES)
def test_honest_byte_offset_is_served(client, tdtest, n):
    """The checks refuse no honest producer: a byte_offset into real memory,
    a capsule passed as is, and an empty tensor with no data at all."""
    buf = np.random.default_rng(n).integers(0, 256, n + 4096, dtype=np.uint8)
    cap = tdtest.raw_capsule(buf.ctypes.data, n, 4096)
    client.put("ok", cap)
    with client.attach("ok") as t:
        assert np.array_equal(np.from_dlpack(t), buf[4096:])
    client.unlink("ok")
    # Data at the very start, offset to the end of the same array.
    cap = tdtest.raw_capsule(buf.ctypes.data + 4096, n, 0)
    client.put("ok2", cap)
    with client.attach("ok2") as t:
        assert np.array_equal(np.from_dlpack(t), buf[4096:])


def test_empty_source_needs_no_data(client, tdtest):
    client.put("empty", tdtest.raw_capsule(0, 0, 1 << 40))
    info = client.stat("empty")
    assert info.shape == (0,) and info.nbytes == 0


def test_reversed_strides_below_the_data_pointer_are_read(client):
    """Negative strides read before the first element's address: the check
    counts them (a view of numpy's, not a hand-made capsule)."""
    a = np.arange(100_000, dtype=np.float64)[::-3]
    client.put("rev", a)
    with client.attach("rev") as t:
        assert np.array_equal(np.from_dlpack(t), a)
