"""tensord.ray: real Ray actors hand torch tensors to each other through
tensord (tensor_transport="TENSORD"): the producer's put_many, the
consumer's zero-copy attach, and the names gone once Ray frees the object
(or the producer dies)."""
import gc
import hashlib
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="tensord.ray carries torch tensors: no torch here")
ray = pytest.importorskip("ray", reason="no ray here")
try:
    from ray.experimental import register_tensor_transport  # noqa: F401
except ImportError as e:
    pytest.skip("this ray has no tensor transports (ray.experimental.rdt, Ray 2.60): %s" % e,
                allow_module_level=True)

import tensord  # noqa: E402
import tensord.ray  # noqa: E402


def digest(t):
    """sha256 of a tensor's bytes, whatever its dtype."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def made(seed):
    """What the producer returns: a dict with a list inside, three dtypes, a
    4 MiB member (put as a file, not inline) and a strided view."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1024, 1024, generator=g)
    return {"w": w,
            "parts": [torch.arange(1000, dtype=torch.int64) * seed,
                      torch.randn(3, 5, generator=g).to(torch.bfloat16),
                      w[::2, ::4]],
            "step": seed}


@pytest.fixture(scope="module")
def ray_up():
    tensord.ray.register()
    tensord.ray.register()  # again: no effect
    # The actors below use this module's functions; Ray's workers cannot import it.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 -- whatever keeps ray from starting here
        print("ray does not start here: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        pytest.skip("ray does not start here: %s: %s" % (type(e).__name__, e))

    @ray.remote(enable_tensor_transport=True)
    class Producer:
        @ray.method(tensor_transport="TENSORD")
        def make(self, seed):
            return made(seed)

        def pid(self):
            return os.getpid()

    # The receiver needs it too: Ray runs its receive on the actor's system thread,
    # which only an actor with enable_tensor_transport=True has (without, a
    # second hand-off waits behind the method that waits for it, 60 s).
    @ray.remote(enable_tensor_transport=True)
    class Consumer:
        def hold(self, d):
            self.d = d
            return self.digests()

        def digests(self):
            d = self.d
            return {"w": digest(d["w"]), "parts": [digest(t) for t in d["parts"]],
                    "step": d["step"], "dtypes": [str(t.dtype) for t in d["parts"]],
                    "shape": tuple(d["parts"][2].shape), "pid": os.getpid()}

        def drop(self):
            self.d = None
            gc.collect()

    yield Producer, Consumer
    ray.shutdown()


def expected(seed):
    d = made(seed)
    return {"w": digest(d["w"]), "parts": [digest(t) for t in d["parts"]], "step": seed,
            "dtypes": ["torch.int64", "torch.bfloat16", "torch.float32"], "shape": (512, 256)}


def until(pred, what, timeout=60.0):
    """Polls pred() until it holds (Ray frees objects asynchronously)."""
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out waiting until " + what
        time.sleep(0.05)


def names(c):
    return sorted(i.name for i in c.list(tensord.ray.PREFIX))


def env(daemon):
    return {"env_vars": {"TENSORD_SOCKET": daemon.socket}}


def test_actors_hand_tensors_over_through_tensord(daemon, ray_up):
    Producer, Consumer = ray_up
    c = tensord.connect(daemon.socket)
    before = c.stats()["requests_total"]
    producer = Producer.options(runtime_env=env(daemon)).remote()
    consumer = Consumer.options(runtime_env=env(daemon)).remote()
    ref = producer.make.remote(7)
    got = ray.get(consumer.hold.remote(ref), timeout=120)
    pid = got.pop("pid")
    assert got == expected(7)

    # The tensors went through tensord: one put_many (one commit) of four names ...
    oid = ref.hex()
    assert names(c) == ["%s%s/%d" % (tensord.ray.PREFIX, oid, i) for i in range(4)]
    after = c.stats()["requests_total"]
    assert after["commit"] - before["commit"] == 1
    assert after["attach_many"] - before["attach_many"] >= 1
    # ... and the consumer holds them as leases of its own: attached, not copied.
    held = {h.name for h in c.leases() if h.pid == pid}
    assert held == set(names(c)), c.leases()

    # The driver gets the object through the transport too.
    d = ray.get(ref, timeout=60)
    assert digest(d["w"]) == expected(7)["w"] and d["step"] == 7
    del d
    gc.collect()

    # A weight-sync loop: each next object goes the same way, to another consumer.
    rollout = Consumer.options(runtime_env=env(daemon)).remote()
    for seed in (8, 9, 10):
        g = ray.get(rollout.hold.remote(producer.make.remote(seed)), timeout=120)
        g.pop("pid")
        assert g == expected(seed)
    ray.get(rollout.drop.remote(), timeout=60)

    # Ray frees the object: its names go; the consumer's tensors keep their bytes.
    del ref
    until(lambda: names(c) == [], "the object's names are unlinked")
    again = ray.get(consumer.digests.remote(), timeout=60)
    assert again.pop("pid") == pid and again == expected(7)
    assert {h.name for h in c.leases() if h.pid == pid} == held
    ray.get(consumer.drop.remote(), timeout=60)
    until(lambda: not [h for h in c.leases() if h.pid == pid], "the consumer's leases end")
    until(lambda: c.stats()["tensors"] == 0, "the daemon frees the tensors")
    c.close()


def test_a_dead_producer_leaves_no_names(daemon, ray_up):
    Producer, Consumer = ray_up
    c = tensord.connect(daemon.socket)
    producer = Producer.options(runtime_env=env(daemon)).remote()
    ref = producer.make.remote(3)
    ray.wait([ref], timeout=120)
    until(lambda: len(names(c)) == 4, "the producer's put_many is committed")
    # The ref is alive, so Ray never frees the object: the connection's end does.
    ray.kill(producer)
    until(lambda: names(c) == [], "lifetime='connection' unlinks the names")
    del ref
    c.close()


def test_a_tensor_on_an_unsupported_device_is_refused_before_anything_is_put():
    t = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"object o1 has a tensor on meta"):
        tensord.ray.TensordTransport().extract_tensor_transport_metadata("o1", [t])


def test_the_driver_puts_through_tensord_too(daemon, ray_up, monkeypatch):
    """ray.put(..., _tensor_transport="TENSORD") on the driver: the driver is
    the producer (its $TENSORD_SOCKET), an actor the receiver."""
    Producer, Consumer = ray_up
    monkeypatch.setenv("TENSORD_SOCKET", daemon.socket)
    c = tensord.connect(daemon.socket)
    ref = ray.put(made(5), _tensor_transport="TENSORD")
    assert names(c) == ["%s%s/%d" % (tensord.ray.PREFIX, ref.hex(), i) for i in range(4)]
    consumer = Consumer.options(runtime_env=env(daemon)).remote()
    got = ray.get(consumer.hold.remote(ref), timeout=120)
    got.pop("pid")
    assert got == expected(5)
    ray.get(consumer.drop.remote(), timeout=60)
    del ref
    until(lambda: names(c) == [], "the driver's object's names are unlinked")
    c.close()
