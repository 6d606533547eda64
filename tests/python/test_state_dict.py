"""State dicts through tensord (issue 34, "Models" and "State dicts"), with
real torch modules: put() of a tensor that requires grad; tensord.torch's
put_state_dict / attach_state_dict / load_state_dict (one commit per
version, the meta-device + assign=True pattern, strict key, shape and dtype
errors naming the keys, read-only tensors that are not trainable unless
asked for, the next version with after=, a rollout in another process);
tensord.state_dict with a plain numpy dict; float8/float4 tensors named as
torch names them, end to end."""
import gc
import importlib.util
import os

import numpy as np
import pytest

import tensord
from tensord.state_dict import StateDict, attach_state_dict, put_state_dict

torch = pytest.importorskip("torch", reason="torch is not installed")
import tensord.torch as tdt  # noqa: E402


def make_model():
    """A small stack with parameters and buffers (BatchNorm's running stats)."""
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def trained(seed=0):
    """A model in eval mode with weights and buffers that are not the defaults."""
    torch.manual_seed(seed)
    m = make_model()
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2.0)
        m[1].num_batches_tracked.fill_(7 + seed)
    return m.eval()


def my_leases(client, name):
    return sum(h.count for h in client.leases(name) if h.pid == os.getpid())


# --- put() of tensors that require grad -------------------------------------------------

def test_put_of_a_parameter_that_requires_grad(client):
    """torch refuses to export it (BufferError before the fix); put copies, so it detaches."""
    lin = torch.nn.Linear(4, 3)
    assert lin.weight.requires_grad
    act = lin(torch.ones(2, 4))                      # a non-leaf that requires grad
    client.put("g/weight", lin.weight)
    client.put_many({"g/bias": lin.bias, "g/act": act})
    with client.transaction() as tx:
        tx.put("g/tx", lin.weight)
    for name, want in [("g/weight", lin.weight), ("g/bias", lin.bias), ("g/act", act),
                       ("g/tx", lin.weight)]:
        with client.attach(name) as t:
            assert torch.equal(torch.from_dlpack(t), want.detach()), name
    assert lin.weight.requires_grad and lin.weight.grad_fn is None   # the source is untouched


# --- tensord.torch ----------------------------------------------------------------------

def test_put_state_dict_is_one_commit(client):
    m = trained()
    sd = m.state_dict()
    commit = tdt.put_state_dict(client, "p/", sd)
    infos = client.list("p/")
    assert sorted(i.name for i in infos) == sorted("p/" + k for k in sd)
    assert {i.commit for i in infos} == {commit}
    got = tdt.attach_state_dict(client, "p/")
    assert isinstance(got, StateDict) and isinstance(got, dict) and got.commit == commit
    assert sorted(got) == sorted(sd)
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    # Parameters come back as plain tensors, not Parameters that require grad.
    assert not any(v.requires_grad for v in got.values())


def test_prefix_without_slash_is_refused(client):
    m = trained()
    for call in (lambda: tdt.put_state_dict(client, "ck/x", m.state_dict()),
                 lambda: tdt.attach_state_dict(client, "ck/x"),
                 lambda: tdt.load_state_dict(client, "ck/x", m),
                 lambda: put_state_dict(client, "ck/x", {"a": np.ones(2)})):
        with pytest.raises(ValueError, match=r"prefix 'ck/x' must end with '/'.*'ck/x/'"):
            call()
    assert client.list("ck") == []


def test_non_tensor_entries_are_refused(client):
    sd = dict(trained().state_dict())
    sd["head._extra_state"] = {"vocab": 32}
    with pytest.raises(TypeError, match=r"entry 'head._extra_state' is a dict, not a torch"):
        tdt.put_state_dict(client, "p/", sd)
    with pytest.raises(TypeError, match=r"entry 'x' is a str, not an array"):
        put_state_dict(client, "n/", {"a": np.ones(2), "x": "hello"})
    with pytest.raises(ValueError, match="empty"):
        tdt.put_state_dict(client, "p/", {})
    with torch.device("meta"):
        meta = make_model()
    with pytest.raises(ValueError, match=r"entry '0.weight' is on the meta device"):
        tdt.put_state_dict(client, "p/", meta.state_dict())
    assert client.list("p/") == [] and client.list("n/") == []


def test_meta_model_loads_zero_copy_and_read_only(client):
    """The rollout pattern: build on meta, load with assign=True; same outputs as the
    trainer's model; parameters are the daemon's memory and not trainable."""
    m = trained()
    commit = tdt.put_state_dict(client, "p/", m.state_dict())
    with torch.device("meta"):
        r = make_model()
    r.eval()
    assert tdt.load_state_dict(client, "p/", r) == commit
    assert not any(t.is_meta for t in r.state_dict().values())
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(r(x), m(x))
    assert all(isinstance(p, torch.nn.Parameter) and not p.requires_grad
               for p in r.parameters())
    assert r[1].num_batches_tracked.item() == 7
    # Zero copy: the model's tensors hold this process's leases on the names...
    assert my_leases(client, "p/0.weight") >= 1 and my_leases(client, "p/1.running_var") >= 1
    # ...and no parameter can be stepped: backward has nothing to differentiate.
    with pytest.raises(RuntimeError, match="does not require grad"):
        r(x).sum().backward()
    del r
    gc.collect()
    assert my_leases(client, "p/0.weight") == 0 and client.stat("p/0.weight").refcount == 0


def test_ordinary_model_loads_too(client):
    m = trained()
    commit = tdt.put_state_dict(client, "p/", m.state_dict())
    r = make_model().eval()
    assert tdt.load_state_dict(client, "p/", r) == commit
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(r(x), m(x))
    assert not any(p.requires_grad for p in r.parameters())


def test_trainable_copies_into_private_memory(client):
    m = trained()
    tdt.put_state_dict(client, "p/", m.state_dict())
    x = torch.randn(4, 8)

    # An ordinary model: values copied in, its Parameter objects kept.
    r = make_model()
    params = list(r.parameters())
    ptrs = [p.data_ptr() for p in params]
    tdt.load_state_dict(client, "p/", r, trainable=True)
    assert [p.data_ptr() for p in r.parameters()] == ptrs
    assert all(a is b for a, b in zip(r.parameters(), params))
    assert all(p.requires_grad for p in r.parameters())
    assert my_leases(client, "p/0.weight") == 0           # nothing of the daemon's is held

    # A meta model: private clones, trainable.
    with torch.device("meta"):
        q = make_model()
    tdt.load_state_dict(client, "p/", q, trainable=True)
    q.eval()
    assert all(p.requires_grad for p in q.parameters())
    for model in (r.eval(), q):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model(x).sum().backward()
        opt.step()
        assert not torch.equal(model[0].weight.detach(), m[0].weight.detach())
    # The shared version is as the trainer put it.
    got = tdt.attach_state_dict(client, "p/")
    for k, v in m.state_dict().items():
        assert torch.equal(got[k], v), k


def test_strict_errors_name_the_keys(client):
    m = trained()
    tdt.put_state_dict(client, "p/", m.state_dict())

    # A model with a layer more: missing keys; one with a layer less: unexpected ones.
    bigger = torch.nn.Sequential(*make_model(), torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"missing keys \(in the model, not under the "
                       r"prefix\): '4.weight', '4.bias'") as e:
        tdt.load_state_dict(client, "p/", bigger)
    assert "unexpected" not in str(e.value) and "prefix 'p/'" in str(e.value)
    smaller = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(ValueError, match=r"unexpected keys \(under the prefix, not in the "
                       r"model\): '1.bias', '1.num_batches_tracked'"):
        tdt.load_state_dict(client, "p/", smaller)
    # Shapes and dtypes are checked even when strict=False.
    wider = torch.nn.Sequential(torch.nn.Linear(8, 15))
    with pytest.raises(ValueError, match=r"'0.weight': stored float32\[16, 8\], model "
                       r"float32\[15, 8\]; '0.bias': stored float32\[16\], model float32\[15\]"):
        tdt.load_state_dict(client, "p/", wider, strict=False)
    halves = make_model().half()
    with pytest.raises(ValueError, match=r"'0.weight': stored float32\[16, 8\], model "
                       r"float16\[16, 8\]"):
        tdt.load_state_dict(client, "p/", halves)
    # strict=False loads what both have.
    assert tdt.load_state_dict(client, "p/", smaller, strict=False) > 0
    assert torch.equal(smaller[0].weight, m[0].weight.detach())
    with torch.device("meta"):
        bigger = torch.nn.Sequential(*make_model(), torch.nn.Linear(4, 2))
    tdt.load_state_dict(client, "p/", bigger, strict=False)
    assert bigger[0].weight.device.type == "cpu" and bigger[4].weight.is_meta


def test_next_version_with_after(client):
    m1, m2 = trained(1), trained(2)
    c1 = tdt.put_state_dict(client, "p/", m1.state_dict(), replace=True)
    with torch.device("meta"):
        r = make_model()
    r.eval()
    assert tdt.load_state_dict(client, "p/", r) == c1
    with pytest.raises(tensord.TimedOutError):
        tdt.load_state_dict(client, "p/", r, after=c1, timeout=0)
    c2 = tdt.put_state_dict(client, "p/", m2.state_dict(), replace=True)
    assert c2 > c1
    assert tdt.load_state_dict(client, "p/", r, after=c1) == c2
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(r(x), m2(x))
    assert not any(p.requires_grad for p in r.parameters())
    # The model let version 1 go; it holds version 2 only.
    gc.collect()
    assert [i.commit for i in client.list("p/")] == [c2] * len(m2.state_dict())
    assert my_leases(client, "p/0.weight") >= 1


def test_rollout_in_another_process(client, child):
    """A rollout process follows the trainer's versions with after=, on a meta model."""
    proc = child("""
        import sys, torch, tensord, tensord.torch as tdt
        def make_model():
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                       torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.arange(16, dtype=torch.float32).reshape(2, 8) / 16
        with tensord.connect() as c:
            with torch.device("meta"):
                r = make_model()
            r.eval()
            last = 0
            print("ready", flush=True)
            for _ in range(3):
                last = tdt.load_state_dict(c, "p/", r, after=last, timeout=60)
                with torch.no_grad():
                    y = r(x)
                print("loaded", last, repr(y.flatten().tolist()), flush=True)
                sys.stdin.readline()
    """)
    proc.expect("ready")
    x = torch.arange(16, dtype=torch.float32).reshape(2, 8) / 16
    for seed in range(3):
        m = trained(seed)
        commit = tdt.put_state_dict(client, "p/", m.state_dict(), replace=True)
        line = proc.expect("loaded ").split(" ", 2)
        assert int(line[1]) == commit
        with torch.no_grad():
            assert eval(line[2]) == m(x).flatten().tolist()
        proc.send("next")
    assert proc.proc.wait(timeout=60) == 0, proc.stderr()


# --- torch-free: numpy --------------------------------------------------------------------

def test_numpy_dict_round_trip(client):
    sd = {"emb": np.arange(12, dtype=np.float32).reshape(3, 4),
          "layers/0/w": np.full((2, 2), 3, np.int64),
          "scale": np.float64(2.5) * np.ones(())}
    commit = put_state_dict(client, "np/", sd)
    got = attach_state_dict(client, "np/")
    assert got.commit == commit and sorted(got) == sorted(sd)
    for k, v in sd.items():
        assert isinstance(got[k], np.ndarray) and got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k], v)
        assert not got[k].flags.writeable              # the daemon's read-only memory
    got2 = attach_state_dict(client, "np/", from_dlpack=lambda t: bytes(t))
    assert got2["layers/0/w"] == sd["layers/0/w"].tobytes()
    # A second version under the same names, replace=True, found with after=.
    commit2 = put_state_dict(client, "np/", {k: v + 1 for k, v in sd.items()}, replace=True)
    got3 = attach_state_dict(client, "np/", after=commit)
    assert got3.commit == commit2
    np.testing.assert_array_equal(got3["emb"], sd["emb"] + 1)
    np.testing.assert_array_equal(got["emb"], sd["emb"])   # the old arrays keep version 1


def test_jax_dict_round_trip(client, child):
    """In a process of its own: JAX's threads would make the forks of later tests unsafe."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    p = child("""
        import jax, jax.numpy as jnp, numpy as np, tensord
        from tensord.state_dict import put_state_dict, attach_state_dict
        with tensord.connect() as c:
            sd = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.ones(3),
                  "q": jnp.arange(8, dtype=jnp.float32).astype(jnp.float8_e4m3fn)}
            commit = put_state_dict(c, "jx/", sd)
            assert c.stat("jx/q").dtype == "float8_e4m3fn"
            got = attach_state_dict(c, "jx/", from_dlpack=jax.dlpack.from_dlpack)
            assert got.commit == commit and sorted(got) == ["b", "q", "w"], got
            for k in sd:
                assert isinstance(got[k], jax.Array), type(got[k])
                assert got[k].dtype == sd[k].dtype, (k, got[k].dtype)
                assert bool((got[k] == sd[k]).all()), k
            print("jax ok", flush=True)
    """)
    p.expect("jax ok", timeout=300)
    p.finish(timeout=120)


# --- float8 and float4 --------------------------------------------------------------------

FP8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
       "float8_e8m0fnu", "float4_e2m1fn_x2"]


@pytest.mark.parametrize("name", FP8)
def test_fp8_round_trip(client, name):
    """Before: Python named them dtype(10,8,1) and so on."""
    dt = getattr(torch, name, None)
    if dt is None:
        pytest.skip("this torch has no torch.%s" % name)
    src = torch.arange(256, dtype=torch.uint8).view(dt).reshape(16, 16)
    client.put("f8/" + name, src)
    assert client.stat("f8/" + name).dtype == name
    assert [i.dtype for i in client.list("f8/")] == [name]
    with client.attach("f8/" + name) as t:
        assert t.dtype == name and (" %s (16, 16) " % name) in repr(t)
        y = torch.from_dlpack(t)
    assert y.dtype == dt and y.shape == src.shape
    assert torch.equal(y.view(torch.uint8), src.view(torch.uint8))
    # create() takes the name and the torch dtype.
    with client.create("f8/c1", (4,), name) as t:
        assert t.dtype == name
    with client.create("f8/c2", (4,), dt) as t:
        assert t.dtype == name


def test_fp8_state_dict(client):
    sd = {"w": torch.randn(8, 8).to(torch.float8_e4m3fn),
          "s": torch.ones(8, dtype=torch.float32)}
    tdt.put_state_dict(client, "q/", sd)
    got = tdt.attach_state_dict(client, "q/")
    assert got["w"].dtype == torch.float8_e4m3fn
    assert torch.equal(got["w"].view(torch.uint8), sd["w"].view(torch.uint8))


def test_ml_dtypes_names_are_accepted(client):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    for name in ["float8_e4m3fn", "float8_e5m2", "float8_e3m4", "float8_e4m3",
                 "float8_e4m3b11fnuz", "float8_e8m0fnu"]:
        with client.create("ml/" + name, (4,), getattr(ml_dtypes, name)) as t:
            assert t.dtype == name


def test_numpy_ml_dtypes_round_trip(client):
    """numpy's DLPack carries neither bfloat16 nor float8 (put raised numpy's
    BufferError, __array__ a RuntimeError): put takes their bits with the
    dtype named, and __array__ / attach_state_dict give ml_dtypes views, zero
    copy; torch reads the same values."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    src = np.linspace(-4, 4, 12, dtype=np.float32).reshape(3, 4)
    sd = {"e4m3": src.astype(ml_dtypes.float8_e4m3fn), "e5m2": src.astype(ml_dtypes.float8_e5m2),
          "bf16": src.astype(ml_dtypes.bfloat16), "f32": src}
    commit = put_state_dict(client, "ml/", sd)
    assert {i.name: i.dtype for i in client.list("ml/")} == {
        "ml/e4m3": "float8_e4m3fn", "ml/e5m2": "float8_e5m2", "ml/bf16": "bfloat16",
        "ml/f32": "float32"}
    got = attach_state_dict(client, "ml/")
    assert got.commit == commit
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert not got[k].flags.writeable, k
        assert np.array_equal(got[k].view(f"u{v.itemsize}"), v.view(f"u{v.itemsize}")), k
    # The Tensors are released; the ml_dtypes arrays hold the leases, then let go.
    assert my_leases(client, "ml/e4m3") == 1
    del got
    gc.collect()
    assert my_leases(client, "ml/e4m3") == 0
    with client.attach("ml/e4m3") as t:
        assert torch.from_dlpack(t).dtype == torch.float8_e4m3fn
        assert torch.equal(torch.from_dlpack(t).float(),
                           torch.from_numpy(sd["e4m3"].astype(np.float32)))
        assert np.asarray(t).dtype == ml_dtypes.float8_e4m3fn
    with pytest.raises(BufferError):            # float4: a byte per value in ml_dtypes
        client.put("ml/fp4", np.zeros(2, ml_dtypes.float4_e2m1fn))
