"""GPU attach and put over the driver double, next to host memory.

Over the double (tests/gpudouble/: a libcuda.so.1 whose device memory is
host memory, selected with LD_LIBRARY_PATH, which `make bench` sets), what
is measured is tensord's own cost on the GPU paths: the lease, the mapping
cache, the DLPack capsule. Hardware adds the driver's (tests/gpu/run.sh
prints the same figures on a GPU, next to a torch.multiprocessing hand-off).

1. Warm attach: attach + DLPack capsule + release of a 1 MiB tensor this
   process already maps (the mapping cache hit), cuda:0 next to cpu.
   Target: GPU <= 1.5x host.
2. put() of a 16 MiB CUDA tensor next to a device-to-device copy of the
   same bytes (cuMemcpyDtoD into a buffer of its own: the floor).
3. Cold attach of a GPU set (docs/recycle.md, section 0): in a fresh
   process (its driver loaded already), attach_many of a 300-member set
   put_many made in one allocation, every member's DLPack capsule taken,
   next to one cold attach of one tensor there, and to the same 300
   members with an allocation each (the set's sources). Target (issue 32): the
   set <= 3x the single attach; over the double an import costs host page
   tables, not the driver's work, so hardware has the last word.
4. A GPU state dict as a new version (the weight-sync case: 32 members of
   1 MiB, put_many(replace=True)): recycled (its set allocation a free one
   of this writer's ring: docs/recycle.md, section 0, "GPU rings") next to
   fresh (sealed=True: a new allocation each version), with the writer's
   driver calls per version (imports, reservations, maps, access changes)
   and the versions the daemon served from the ring.

Rounds interleave the variants (A B A B); figures are medians.

    LD_LIBRARY_PATH=build/gpudouble python3 bench/py_gpu_double.py [--rounds 9]
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def start(tmp):
    build = os.environ.get("TENSORD_BUILD") or os.path.join(HERE, "..", "build")
    sock = os.path.join(tmp, "tensord.sock")
    r, w = os.pipe()
    p = subprocess.Popen([os.path.join(build, "tensord"), "--socket", sock, "--ready-fd", str(w),
                          "--log-level", "warn"], pass_fds=(w,), stderr=subprocess.DEVNULL)
    os.close(w)
    if os.read(r, 1) != b"R":
        sys.exit("tensord did not start")
    os.close(r)
    return p, sock


def warm_attach_us(c, name, n):
    t = c.attach(name)  # keeps the mapping cached
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        x = c.attach(name)
        x.__dlpack__(max_version=(1, 0))
        x.release()
        times.append(time.perf_counter() - t0)
    t.release()
    return statistics.median(times) * 1e6


COLD = '''
import sys, time, tensord
c = tensord.connect(sys.argv[1])
warm = c.attach("b/cuda:0")  # the driver loaded and a context made: not what is timed
warm.__dlpack__(max_version=(1, 0))
warm.release()
t0 = time.perf_counter()
if sys.argv[2] in ("set", "src"):
    got = c.attach_many(f"b/{sys.argv[2]}/")
    caps = [t.__dlpack__(max_version=(1, 0)) for t in got.values()]
else:
    t = c.attach("b/one")
    caps = [t.__dlpack__(max_version=(1, 0))]
print(time.perf_counter() - t0)
'''


def cold_s(sock, what):
    out = subprocess.run([sys.executable, "-c", COLD, sock, what], capture_output=True,
                         text=True, check=True).stdout
    return float(out.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if "gpudouble" not in os.environ.get("LD_LIBRARY_PATH", ""):
        sys.exit("run with LD_LIBRARY_PATH=<build>/gpudouble (make bench does)")
    import cudrv
    import tensord

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TD_GPU_DOUBLE_DIR", os.path.join(tmp, "double"))
        d, sock = start(tmp)
        try:
            c = tensord.connect(sock)
            for dev in ("cpu", "cuda:0"):
                t = c.create(f"b/{dev}", (1 << 20,), "uint8", device=dev)
                t.publish()
                t.release()
            big = c.create("b/src", (16 << 20,), "uint8", device="cuda:0")
            cudrv.write(big, bytes(16 << 20))
            big.publish()
            ptr, _, cap = cudrv.pointer(big)
            dst = ctypes.c_uint64()
            cudrv.ok(cudrv.cu.cuMemAlloc_v2(ctypes.byref(dst), cudrv.P(16 << 20)), "cuMemAlloc")
            # A set of 300 members of 64 KiB in one allocation, and one tensor alone.
            srcs = {}
            for i in range(300):
                t = c.create(f"b/src/{i}", (64 << 10,), "uint8", device="cuda:0")
                t.publish()
                t.release()
                srcs[f"b/set/{i}"] = c.attach(f"b/src/{i}")
            c.put_many(srcs)
            one = c.create("b/one", (64 << 10,), "uint8", device="cuda:0")
            one.publish()
            one.release()
            arenas = c.stats()["gpu_arenas"]
            # A state dict of 32 members of 1 MiB, put as versions.
            sd = {}
            for i in range(32):
                t = c.create(f"b/sd/{i}", (1 << 20,), "uint8", device="cuda:0")
                t.publish()
                t.release()
                sd[i] = c.attach(f"b/sd/{i}")
            fns = ("cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap",
                   "cuMemSetAccess")
            vers = {"recycled": ([], []), "fresh": ([], [])}

            def version(kind):
                m = {f"b/{kind}/{i}": t for i, t in sd.items()}
                before = [cudrv.calls(f) for f in fns]
                t0 = time.perf_counter()
                c.put_many(m, replace=True, sealed=kind == "fresh")
                vers[kind][0].append(time.perf_counter() - t0)
                vers[kind][1].append([cudrv.calls(f) - b for f, b in zip(fns, before)])
            host, gpu, put, d2d, cset, cone, csrc = [], [], [], [], [], [], []
            for i in range(args.rounds):
                host.append(warm_attach_us(c, "b/cpu", 300))
                gpu.append(warm_attach_us(c, "b/cuda:0", 300))
                t0 = time.perf_counter()
                c.put(f"b/put{i}", big)
                put.append(time.perf_counter() - t0)
                c.unlink(f"b/put{i}")
                t0 = time.perf_counter()
                cudrv.ok(cudrv.cu.cuMemcpyDtoD_v2(dst, cudrv.P(ptr), cudrv.P(16 << 20)), "DtoD")
                cudrv.ok(cudrv.cu.cuCtxSynchronize(), "sync")
                d2d.append(time.perf_counter() - t0)
                cset.append(cold_s(sock, "set"))
                cone.append(cold_s(sock, "one"))
                csrc.append(cold_s(sock, "src"))
            del cap
            # Versions back to back (as a training loop puts them: parked
            # imports stay, TENSORD_GPU_PARK_MS), interleaved; the first
            # two of each are not timed (the ring fills).
            for _ in range(2):
                for kind in vers:
                    version(kind)
            for kind in vers:
                vers[kind][0].clear()
                vers[kind][1].clear()
            hits0 = c.stats()["gpu_recycled_creates_total"]
            for i in range(args.rounds):
                for kind in vers:
                    version(kind)
            hits = c.stats()["gpu_recycled_creates_total"] - hits0
            h, g = statistics.median(host), statistics.median(gpu)
            p, f = statistics.median(put), statistics.median(d2d)
            print(f"gpu double: warm attach+capsule+release 1 MiB: cpu {h:.1f} us, "
                  f"cuda:0 {g:.1f} us, ratio {g / h:.2f}x (target <= 1.5x)")
            print(f"gpu double: put 16 MiB cuda:0 {p * 1e3:.2f} ms ({(16 << 20) / p / 1e9:.2f} GB/s), "
                  f"device-to-device copy {f * 1e3:.2f} ms ({(16 << 20) / f / 1e9:.2f} GB/s), "
                  f"ratio {p / f:.2f}x")
            cs, co = statistics.median(cset), statistics.median(cone)
            print(f"gpu double: cold attach_many of a 300-member set ({arenas} allocation"
                  f"{'' if arenas == 1 else 's'}) {cs * 1e3:.2f} ms, one cold attach "
                  f"{co * 1e3:.3f} ms, ratio {cs / co:.1f}x (target <= 3x); an allocation "
                  f"per member {statistics.median(csrc) * 1e3:.2f} ms")
            for kind, (ts, calls) in vers.items():
                per = [statistics.median(x[j] for x in calls) for j in range(len(fns))]
                print(f"gpu double: put_many of a 32 x 1 MiB state dict as a new version, "
                      f"{kind}: {statistics.median(ts) * 1e3:.2f} ms; the writer's driver "
                      f"calls per version: {per[0]} imports, {per[1]} reservations, "
                      f"{per[2]} maps, {per[3]} access changes"
                      + (f"; {hits} of {len(ts)} versions from the ring"
                         if kind == "recycled" else ""))
            c.close()
        finally:
            d.terminate()
            d.wait()


if __name__ == "__main__":
    main()
