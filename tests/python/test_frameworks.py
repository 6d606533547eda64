"""More DLPack consumers read tensord tensors zero copy, each through its
own from_dlpack: TensorFlow, PaddlePaddle, tvm-ffi and array-api-strict.

Each framework runs in a child process of its own: TensorFlow and Paddle
crash when imported into one process (a segfault in the second import),
and none of them needs to load into the test process. The child attaches
the tensors, imports them, and reports values, dtype, shape, strides (in
elements) and the imported data pointer next to the address the lease maps
(numpy's view of the same Tensor object). A framework that is not installed
(no wheel for this Python) is skipped with the reason; deploy/setup.sh
installs them for `make test`.
"""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PROLOGUE = """
import json, os, sys
import numpy as np
import tensord
c = tensord.connect(os.environ["TENSORD_SOCKET"])

def report(name, view):
    t = c.attach(name)
    addr = np.from_dlpack(t).__array_interface__["data"][0]   # the mapped address
    try:
        r = view(t)
    except Exception as e:
        r = {"error": type(e).__name__ + ": " + str(e)}
    r.update(name=name, addr=addr)
    print(json.dumps(r), flush=True)

def via_numpy(x):
    # The imported array's own memory, seen through numpy's DLPack import.
    a = np.from_dlpack(x)
    return a, a.__array_interface__["data"][0]

def elems(strides_bytes, itemsize):
    return [s // itemsize for s in strides_bytes]
"""

VIEWS = {
    "tensorflow": """
import tensorflow as tf

class Capsule:   # hands tf's own export to numpy, to read tf's data pointer
    def __init__(self, cap): self.cap = cap
    def __dlpack__(self, **kw): return self.cap
    def __dlpack_device__(self): return (1, 0)

def view(t):
    x = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    a, ptr = via_numpy(Capsule(tf.experimental.dlpack.to_dlpack(x)))
    return {"values": x.numpy().tolist(), "dtype": x.dtype.name, "shape": list(x.shape),
            "strides": elems(a.strides, a.itemsize), "ptr": ptr}
""",
    "paddle": """
import paddle

def view(t):
    x = paddle.from_dlpack(t)
    legacy = paddle.utils.dlpack.from_dlpack(t.__dlpack__())
    assert legacy.data_ptr() == x.data_ptr(), "the legacy capsule import is zero copy too"
    return {"values": x.numpy().tolist(), "dtype": str(x.dtype).replace("paddle.", ""),
            "shape": list(x.shape), "strides": list(x.strides), "ptr": x.data_ptr()}
""",
    "tvm_ffi": """
import tvm_ffi

def view(t):
    x = tvm_ffi.from_dlpack(t)
    a, ptr = via_numpy(x)
    assert ptr == x.data_ptr()
    return {"values": a.tolist(), "dtype": str(x.dtype), "shape": list(x.shape),
            "strides": list(x.strides), "ptr": x.data_ptr()}
""",
    "array_api_strict": """
import array_api_strict as xp

def view(t):
    x = xp.from_dlpack(t)
    a, ptr = via_numpy(x)
    return {"values": a.tolist(), "dtype": str(x.dtype).replace("array_api_strict.", ""),
            "shape": list(x.shape), "strides": elems(a.strides, a.itemsize), "ptr": ptr}
""",
}

# name -> (array, strides in elements or None for row-major). Small tensors
# live in a shared slab at an offset, large ones in a memfd of their own.
SOURCES = {
    "fw/f32": (np.arange(15, dtype=np.float32).reshape(3, 5), None),
    "fw/i64": (np.arange(-6, 6, dtype=np.int64).reshape(2, 3, 2), None),
    "fw/u8": (np.arange(7, dtype=np.uint8), None),
    "fw/f64-big": (np.linspace(0, 1, 1 << 17).reshape(256, 512), None),
    "fw/f32-colmajor": (np.arange(12, dtype=np.float32).reshape(3, 4), (1, 3)),
}


def publish_sources(client):
    for name, (arr, strides) in SOURCES.items():
        if strides is None:
            client.put(name, arr)
            continue
        with client.create(name, arr.shape, arr.dtype, strides=strides) as w:
            np.from_dlpack(w)[...] = arr
            w.publish()


@pytest.mark.parametrize("fw", sorted(VIEWS))
def test_framework_reads_zero_copy(client, daemon, fw):
    if importlib.util.find_spec(fw) is None:
        pytest.skip(f"{fw} is not installed for Python {sys.version.split()[0]} "
                    "(deploy/setup.sh installs it unless TENSORD_SKIP_FRAMEWORKS=1 or it has "
                    "no wheel for this Python)")
    publish_sources(client)
    code = PROLOGUE + VIEWS[fw] + "".join(f"report({n!r}, view)\n" for n in SOURCES)
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, f"{fw} child exited {r.returncode}:\n{r.stderr[-3000:]}"
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            rep = json.loads(line)
            got[rep["name"]] = rep
    assert set(got) == set(SOURCES), r.stdout + r.stderr[-2000:]
    for name, (arr, strides) in SOURCES.items():
        rep = got[name]
        if fw == "tensorflow" and strides is not None:
            # TensorFlow imports row-major tensors only; it refuses rather than copies.
            assert "strides" in rep.get("error", ""), rep
            continue
        assert "error" not in rep, f"{fw} {name}: {rep['error']}"
        assert rep["values"] == arr.tolist(), f"{fw} {name}: values"
        assert rep["dtype"] == str(arr.dtype), f"{fw} {name}: dtype {rep['dtype']}"
        assert rep["shape"] == list(arr.shape), f"{fw} {name}: shape"
        want = list(strides) if strides else [s // arr.itemsize for s in arr.strides]
        assert rep["strides"] == want, f"{fw} {name}: strides {rep['strides']}, want {want}"
        assert rep["ptr"] == rep["addr"] != 0, f"{fw} {name}: copied (data pointer is not the mapping)"
