"""Checkpoint import and export speed (issue 34), next to the safetensors
package, in one interleaved run.

A .safetensors file of --size bytes (default 256M) in --tensors arrays of
float32 (default 32) is written once with safetensors.numpy.save_file() to
--dir (default: a temporary directory; /dev/shm keeps the disk out) and read
once, so every variant reads it from the page cache. Then each round runs
every variant once, in turn, and the medians of the rounds are printed
(ms, GB/s of the file's data bytes):

  load_file     safetensors.numpy.load_file(path): into private numpy arrays
  put_file      c.put_file("ck/", path, replace=True): into shared tensors,
                one commit (each round the next version of every name, in the
                memory of the previous one: TENSORD_RECYCLE=0 for fresh memory)
  tensorctl     tensorctl put --force ck2/ FILE, the process start included
  save_file     safetensors.numpy.save_file() of the load_file dict
  get_file      c.get_file("ck/", out): the prefix, from one commit, to a file
  copyto        np.copyto of all the bytes into warm memory (memcpy, the ceiling)

    PYTHONPATH=build/python python3 bench/py_files.py [--size 256M] [--rounds 7]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import tensord
from benchutil import daemon_socket


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=size_arg, default=256 << 20)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--socket", default=None, help="a running daemon (default: a private one)")
    args = ap.parse_args()
    try:
        from safetensors.numpy import load_file, save_file
    except ImportError as e:
        print(f"py_files: skipped: {e}")
        return
    build = os.environ.get("TENSORD_BUILD") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")
    ctl = os.path.join(build, "tensorctl")
    per = args.size // args.tensors // 4
    rng = np.random.default_rng(0)
    arrays = {f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32)
              for i in range(args.tensors)}
    nbytes = sum(a.nbytes for a in arrays.values())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, daemon_socket(args.socket) as sock:
        path = os.path.join(tmp, "ck.safetensors")
        save_file(arrays, path)
        with open(path, "rb") as f:       # into the page cache
            while f.read(1 << 24):
                pass
        c = tensord.connect(sock)
        c.put_file("ck/", path)
        subprocess.run([ctl, "--socket", sock, "put", "ck2/", path], check=True,
                       stdout=subprocess.DEVNULL)
        dst = np.empty(nbytes, np.uint8)
        src = np.concatenate([a.view(np.uint8) for a in arrays.values()])
        loaded = {}

        def load():
            loaded.clear()
            loaded.update(load_file(path))

        variants = {
            "load_file": load,
            "put_file": lambda: c.put_file("ck/", path, replace=True),
            "tensorctl": lambda: subprocess.run(
                [ctl, "--socket", sock, "put", "--force", "ck2/", path], check=True,
                stdout=subprocess.DEVNULL),
            "save_file": lambda: save_file(loaded, os.path.join(tmp, "saved.safetensors")),
            "get_file": lambda: c.get_file("ck/", os.path.join(tmp, "got.safetensors")),
            "copyto": lambda: np.copyto(dst, src),
        }
        load()
        times = {k: [] for k in variants}
        names = list(variants)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                variants[k]()
                times[k].append(time.perf_counter() - t0)
        c.close()
    print(f"checkpoint of {nbytes / 2**20:.0f} MiB in {args.tensors} float32 arrays, "
          f"page cache warm, {args.rounds} rounds, medians:")
    base = statistics.median(times["load_file"])
    for k in names:
        m = statistics.median(times[k])
        print(f"  {k:10s} {m * 1e3:8.1f} ms  {nbytes / m / 1e9:6.2f} GB/s  "
              f"x{m / base:5.2f} of load_file")


if __name__ == "__main__":
    sys.exit(main())
