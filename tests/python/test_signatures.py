"""Every public function and method of the extension has a text signature
(inspect.signature, help(), IDEs), matching what the call accepts; and
TensorInfo.mode shows itself in octal while staying an int."""
import ast
import inspect
import json
import os
import pickle

import numpy as np
import pytest

import tensord
from tensord import _tensord


def public_callables():
    """(qualified name, callable) for the extension's functions, its
    non-exception classes, and their methods (dunders users call
    included)."""
    wanted_dunders = {"__dlpack__", "__dlpack_device__", "__array__", "__enter__", "__exit__"}
    out = []
    for name in dir(_tensord):
        obj = getattr(_tensord, name)
        if name.startswith("_") or not callable(obj):
            continue
        if inspect.isclass(obj):
            if issubclass(obj, BaseException) or obj is tensord.TensorInfo:
                continue   # exceptions: BaseException's; TensorInfo: a struct sequence
            if obj is tensord.Client:   # the one class users construct
                out.append((name, obj))
            for m, v in vars(obj).items():
                if callable(v) and (not m.startswith("_") or m in wanted_dunders):
                    out.append((f"{name}.{m}", getattr(obj, m)))
        else:
            out.append((name, obj))
    return out


def test_every_public_callable_has_a_signature():
    found = public_callables()
    names = {n for n, _ in found}
    # The list is not empty by accident: the main entry points are in it.
    assert {"connect", "default_socket_path", "Client", "Client.put", "Client.attach",
            "Tensor.__dlpack__", "Tensor.publish"} <= names, names
    missing = []
    for name, obj in found:
        try:
            inspect.signature(obj)
        except (ValueError, TypeError) as e:
            missing.append(f"{name}: {e}")
    assert not missing, "\n".join(missing)


def test_signatures_match_the_calls(client):
    sig = inspect.signature(tensord.Client.put)
    assert list(sig.parameters) == ["self", "name", "obj", "mutable", "lifetime", "mode", "replace",
                                    "sealed"]
    assert sig.parameters["replace"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["mode"].default is None
    # Bound methods drop self, and binding with the signature works as the call does.
    bound = inspect.signature(client.put).bind("x", b"ab", replace=True)
    assert bound.arguments == {"name": "x", "obj": b"ab", "replace": True}
    client.put(*bound.args, **bound.kwargs)
    stat = inspect.signature(client.stat)
    assert [p.kind for p in stat.parameters.values()] == [inspect.Parameter.POSITIONAL_ONLY]
    with pytest.raises(TypeError):
        client.stat(name="x")   # positional only, as the signature says
    dl = inspect.signature(tensord.Tensor.__dlpack__).parameters
    assert [p for p in dl if dl[p].kind is inspect.Parameter.KEYWORD_ONLY] == \
        ["stream", "max_version", "dl_device", "copy"]
    for f in (tensord.connect, tensord.Client):
        ps = inspect.signature(f).parameters
        assert list(ps) == ["path", "name"]
        assert ps["name"].kind is inspect.Parameter.KEYWORD_ONLY
    # The docstring still reads well after the signature lines.
    assert tensord.Client.put.__doc__.startswith("Copies obj once")


def test_mode_reads_octal_and_is_an_int(client):
    client.put("m", np.zeros(2), mode=0o640)
    info = client.stat("m")
    m = info.mode
    assert repr(m) == "0o640" and str(m) == "0o640" and f"{m}" == "0o640"
    assert "mode=0o640" in repr(info)
    assert isinstance(m, int) and m == 0o640 and m == 416 and hash(m) == hash(416)
    assert m & 0o040 and f"{m:o}" == "640" and "%d" % m == "416" and oct(m) == "0o640"
    assert json.dumps({"mode": m}) == '{"mode": 416}'
    back = pickle.loads(pickle.dumps(m))
    assert back == 416 and type(back) is int
    assert repr(client.stat("m").mode) == "0o640"
    client.put("d", b"x")
    assert repr(client.stat("d").mode) == "0o600"


def test_stats_is_typed_as_the_figures_dict(client):
    """stats() returns what the stub says: a dict of figures by name (the
    daemon defines them, so the stub fixes no keys; test_figures.py checks
    they match the daemon's table)."""
    path = os.path.join(os.path.dirname(tensord.__file__), "__init__.pyi")
    with open(path) as f:
        tree = ast.parse(f.read())
    [alias] = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_Stats"]
    assert ast.unparse(alias.value) == "dict[str, Any]"
    s = client.stats()
    assert isinstance(s, dict) and all(isinstance(k, str) for k in s)
    assert isinstance(s["devices"], list) and isinstance(s["uids"], list)
