"""A torch tensor handed from one Ray actor to another: tensord's tensor
transport (tensord.ray, tensor_transport="TENSORD") next to Ray's object
store (the same method without a tensor transport: "store" returns the
torch tensor, which Ray pickles; "store np" returns tensor.numpy(), which
Ray hands to the consumer zero-copy out of its shared-memory store, read-only,
and the consumer wraps with torch.from_numpy: Ray's fastest plain path).

Per size, each round times, in turn (A B A B ...), one hand-off of each
kind: from the producer's method call (it returns a tensor it holds
already, so nothing is computed) until the consumer's method that received
the tensor as an argument has returned; the consumer reads one element of
each 4 KiB page of it (--touch none: only its shape) so that a lazily
mapped tensor costs what it must. The object is freed (the ref dropped)
before the next round. Medians of the rounds are printed, and the ratios
object store / tensord (above 1: tensord faster).

    PYTHONPATH=build/python python3 bench/py_ray_transport.py [--sizes 64M,256M] [--rounds 9]

Uses the daemon at --socket (or $TENSORD_SOCKET); with neither, starts its
own from $TENSORD_BUILD (default: build/). When ray does not import or
start, says so and exits 0.
"""
import argparse
import gc
import os
import statistics
import sys
import time
import warnings

from benchutil import daemon_socket

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(s):
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def label(n):
    for u in "GMK":
        if n >= UNITS[u] and n % UNITS[u] == 0:
            return "%d %siB" % (n // UNITS[u], u)
    return "%d B" % n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--sizes", default="64M,256M")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--touch", choices=["pages", "none"], default="pages")
    args = ap.parse_args()
    try:
        import ray
        import torch

        import tensord.ray
        from ray.experimental import register_tensor_transport  # noqa: F401
    except ImportError as e:
        print("py_ray_transport: skipped (%s)" % e)
        return
    sizes = [size(s) for s in args.sizes.split(",")]
    with daemon_socket(args.socket) as sock:
        tensord.ray.register()
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     object_store_memory=max(1 << 30, 4 * max(sizes)))
        except Exception as e:  # noqa: BLE001 - any failure means: no ray here
            print("py_ray_transport: skipped (ray does not start: %s: %s)"
                  % (type(e).__name__, e))
            return
        env = {"env_vars": {"TENSORD_SOCKET": sock}}
        touch = args.touch == "pages"

        @ray.remote(enable_tensor_transport=True)
        class Producer:
            def hold(self, n):
                self.t = torch.ones(n // 4, dtype=torch.float32)

            @ray.method(tensor_transport="TENSORD")
            def via_tensord(self):
                return self.t

            def via_store(self):
                return self.t

            def via_store_numpy(self):
                return self.t.numpy()

        @ray.remote(enable_tensor_transport=True)
        class Consumer:
            def take(self, t):
                if not isinstance(t, torch.Tensor):  # Ray's zero-copy numpy, read-only
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t = torch.from_numpy(t)
                if touch:
                    float(t[::1024].sum())  # one float of each 4 KiB page
                return t.numel()

        producer = Producer.options(runtime_env=env).remote()
        consumer = Consumer.options(runtime_env=env).remote()
        print("py_ray_transport: producer actor -> consumer actor, %s, medians of %d "
              "interleaved rounds (ray %s, %s)"
              % ("consumer reads a float per 4 KiB page" if touch else "consumer takes the shape",
                 args.rounds, ray.__version__, "tensord socket " + sock))
        print("  %-9s %12s %12s %12s %10s %10s" % ("size", "tensord ms", "store ms",
                                                    "store np ms", "store/td", "np/td"))
        for n in sizes:
            ray.get(producer.hold.remote(n))
            kinds = {"tensord": producer.via_tensord, "store": producer.via_store,
                     "numpy": producer.via_store_numpy}
            got = {k: [] for k in kinds}
            for k, m in kinds.items():  # warm: workers, transports, memory
                for _ in range(2):
                    ref = m.remote()
                    ray.get(consumer.take.remote(ref))
                    del ref
            for _ in range(args.rounds):
                for k, m in kinds.items():
                    gc.collect()
                    t0 = time.perf_counter()
                    ref = m.remote()
                    assert ray.get(consumer.take.remote(ref)) == n // 4
                    got[k].append(time.perf_counter() - t0)
                    del ref
            td, st, npy = (statistics.median(got[k]) for k in ("tensord", "store", "numpy"))
            print("  %-9s %12.1f %12.1f %12.1f %9.2fx %9.2fx"
                  % (label(n), td * 1e3, st * 1e3, npy * 1e3, st / td, npy / td), flush=True)
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
