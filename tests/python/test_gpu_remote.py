"""GPU tensors across nodes (docs/remote.md, "GPU tensors across nodes"):
two real daemons on one machine, peered, UCX over TCP loopback; node-a's
tensors live on cuda:0, written by one client process with the driver API
(tests/python/cudrv.py); a client of node-b attaches "@node-a/NAME" and gets
a cuda:0 tensor on node-b's own device whose bytes match, read-only. The
bytes cross as host bytes: node-a copies them out on its GPU worker, node-b
receives them into host memory and copies them into its replica.

In CI both daemons and every client use the driver double (its report
must then hold no violation and no leak); tests/gpu/run.sh runs the same
tests on hardware (TENSORD_GPU_DRIVER=system), with the UCX it carries.
"""
import hashlib
import json
import os
import signal
import socket
import subprocess
import textwrap

import pytest

import gpu_double
import tensord
from testlib import Child
from gpu_double import SYSTEM
from tdutil import wait_until

CTL = os.path.join(gpu_double.BUILD, "tensorctl")

gpu_double.require()

UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}

PRELUDE = """
import hashlib, os, sys, time
import tensord, cudrv
c = tensord.connect()
def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]
def data(n, seed):
    return bytes((i * 131 + seed) % 256 for i in range(n))
def attach(name, timeout=20):
    # The peers' UCX addresses cross just after they come up.
    end = time.monotonic() + timeout
    while True:
        try:
            return c.attach(name)
        except OSError as e:
            if "has not sent its UCX worker address" not in str(e) or time.monotonic() > end:
                raise
            time.sleep(0.05)
"""


def data(n, seed):
    return bytes((i * 131 + seed) % 256 for i in range(n))


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(d):
    r = subprocess.run([CTL, "--socket", d.socket, "stats", "--json"], capture_output=True,
                       text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def peer_up(d, name):
    r = subprocess.run([CTL, "--socket", d.socket, "peers", "--json"], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        return False
    peers = json.loads(r.stdout)
    peers = peers.get("peers", peers) if isinstance(peers, dict) else peers
    return any(p.get("name") == name and p.get("state") == "up" for p in peers)


def anonymous_maps_of(pid, size):
    """pid's mappings of exactly size bytes backed by no file."""
    found = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo == size and len(parts) < 6:
                found.append(line.strip())
    return found


class Pair:
    """node-a and node-b, each a daemon with its own view of the GPU."""

    def __init__(self, daemon_factory, tmp_path, path, extra_a=(), extra_b=(), env_b=None):
        self.dir = tmp_path / "double"
        self.env = gpu_double.env(self.dir)
        key = tmp_path / "peer.key"
        key.write_bytes(os.urandom(24).hex().encode() + b"\n")
        os.chmod(key, 0o600)
        pa, pb = free_port(), free_port()
        denv = dict(self.env, TENSORD_CUDA_PATH="ipc" if path == "ipc" else "default",
                    **UCX_ENV)
        self.a = daemon_factory("--node-name", "node-a", "--peer-listen", f"127.0.0.1:{pa}",
                                "--peer", f"node-b=127.0.0.1:{pb}", "--peer-secret-file",
                                str(key), "--export", "g/", *extra_a, env=denv, sub="a")
        self.b = daemon_factory("--node-name", "node-b", "--peer-listen", f"127.0.0.1:{pb}",
                                "--peer", f"node-a=127.0.0.1:{pa}", "--peer-secret-file",
                                str(key), *extra_b, env=dict(denv, **(env_b or {})), sub="b")
        assert wait_until(lambda: peer_up(self.a, "node-b") and peer_up(self.b, "node-a")), \
            self.b.read_log()[-3000:]
        if "built without UCX" in self.b.read_log():
            pytest.skip("tensord was built without UCX (libucx-dev: deploy/setup.sh)")
        self.children = []

    def child(self, d, code, **env):
        c = Child(PRELUDE + textwrap.dedent(code), d.socket, dict(self.env, **env))
        self.children.append(c)
        return c

    def publish(self, name, n, seed, shape=None, dtype="uint8", fill=None):
        """A client of node-a that publishes name on cuda:0 and stays until
        told: n bytes of data(n, seed), or every byte fill (a large tensor)."""
        shape = shape or (n,)
        write = (f"cudrv.memset(t, {fill})" if fill is not None
                 else f"cudrv.write(t, data({n}, {seed}))")
        w = self.child(self.a, f"""
            t = c.create({name!r}, {tuple(shape)!r}, {dtype!r}, device="cuda:0", mode=0o644)
            {write}
            t.publish()
            print("published", flush=True)
            sys.stdin.readline()
        """)
        w.expect("published")
        return w

    def finish(self, *daemons, leaks_of=None):
        """Ends the children and the daemons (both, unless named), then
        checks the double's report (leaks: every daemon's, or pid leaks_of's)."""
        gpu_double.end_children(self.children)
        for d in daemons or (self.b, self.a):
            assert d.stop() == 0, d.read_log()[-3000:]
        bad = gpu_double.problems(self.dir, leaks_of)
        assert not bad, "\n".join(bad)


@pytest.fixture(params=["vmm", "ipc"])
def path(request):
    return request.param


SIZES = [("g/small", 4096, 11), ("g/mid", 3 << 20, 23), ("g/big", 40 << 20, 37)]


def test_gpu_tensors_pulled_onto_the_gpu(daemon_factory, tmp_path, path):
    pair = Pair(daemon_factory, tmp_path, path)
    writers = [pair.publish(name, n, seed) for name, n, seed in SIZES]
    writers.append(pair.publish("g/f32", 6 * 1000 * 4, 5, shape=(6, 1000), dtype="float32"))
    r = pair.child(pair.b, """
        held = []
        for name in ("g/small", "g/mid", "g/big", "g/f32"):
            t = attach("@node-a/" + name)
            held.append(t)
            print(name, t.device, t.readonly, t.shape, t.dtype, digest(cudrv.read(t)),
                  flush=True)
            t2 = c.attach("@node-a/" + name)   # the replica: nothing pulled again
            print("again", name, t2.device, digest(cudrv.read(t2)), flush=True)
        print("held", flush=True)
        sys.stdin.readline()
    """)
    for name, n, seed in SIZES:
        got = r.expect(name + " ").split()
        assert got[1:3] == ["cuda:0", "True"], got
        assert got[-1] == digest(data(n, seed)), (name, got)
        again = r.expect("again " + name).split()
        assert again[2:] == ["cuda:0", digest(data(n, seed))], again
    f32 = r.expect("g/f32 ").split()
    assert f32[1] == "cuda:0" and "(6, 1000)" in " ".join(f32) and "float32" in " ".join(f32)
    assert f32[-1] == digest(data(24000, 5))
    assert r.expect("again g/f32").split()[-1] == digest(data(24000, 5))
    r.expect("held")
    sa, sb = stats(pair.a), stats(pair.b)
    # node-a was asked once per name: the second attaches were served by node-b's replicas.
    assert sa["remote_pull_requests_total"] == 4, sa
    # node-a holds no lease and no host copy once the bytes crossed.
    assert sa["remote_pull_leases"] == 0 and sa["remote_inflight_bytes"] == 0, sa
    assert sa["remote_staged_bytes"] == 0, sa
    assert sb["remote_replicas"] == 4 and sb["remote_gpu_pulls_total"] == 4, sb
    # The replicas are node-b's own GPU memory, not host memory.
    gpu_b = [d for d in sb["devices"] if d["device"] == "cuda:0"][0]
    used = gpu_b[next(k for k in gpu_b if "used" in k)]
    assert used >= sum(n for _, n, _ in SIZES), gpu_b
    r.send()
    r.finish()
    for w in writers:
        w.send()
        w.finish()
    pair.finish()


def test_a_replaced_gpu_tensor_is_pulled_anew(daemon_factory, tmp_path, path):
    """node-a tells node-b of the new version: node-b's next attach has its bytes."""
    pair = Pair(daemon_factory, tmp_path, path)
    w1 = pair.publish("g/w", 1 << 20, 1)
    r = pair.child(pair.b, """
        t = attach("@node-a/g/w")
        print("v1", digest(cudrv.read(t)), t.generation, flush=True)
        sys.stdin.readline()
        for _ in range(200):
            t2 = c.attach("@node-a/g/w")
            if t2.generation != t.generation:
                break
            del t2
            time.sleep(0.05)
        print("v2", digest(cudrv.read(t2)), digest(cudrv.read(t)), flush=True)
    """)
    v1 = r.expect("v1 ").split()
    assert v1[1] == digest(data(1 << 20, 1))
    w2 = pair.child(pair.a, """
        t = c.create("g/w", (1 << 20,), "uint8", device="cuda:0", mode=0o644, replace=True)
        cudrv.write(t, data(1 << 20, 2))
        t.publish()
        print("published", flush=True)
        sys.stdin.readline()
    """)
    w2.expect("published")
    r.send()
    v2 = r.expect("v2 ").split()
    # The new version's bytes; the old lease still reads the old ones.
    assert v2[1:] == [digest(data(1 << 20, 2)), digest(data(1 << 20, 1))], v2
    r.finish()
    for w in (w1, w2):
        w.send()
        w.finish()
    pair.finish()


def test_a_gpu_set_in_one_commit_through_a_narrow_staging_bound(daemon_factory, tmp_path,
                                                                path):
    """attach_many of GPU tensors: one commit on node-a, published together on
    node-b; node-a's host copies for node-b stay within --peer-max-inflight
    (1 MiB here, each tensor 2 MiB: one copy at a time)."""
    pair = Pair(daemon_factory, tmp_path, path, extra_a=("--peer-max-inflight", "1M"))
    writer = pair.child(pair.a, """
        tx = c.transaction()
        ts = []
        for i in range(4):
            t = tx.create("g/set/%d" % i, (2 << 20,), "uint8", device="cuda:0", mode=0o644)
            cudrv.write(t, data(2 << 20, 40 + i))
            ts.append(t)
        tx.commit()
        print("published", flush=True)
        sys.stdin.readline()
    """)
    writer.expect("published")
    r = pair.child(pair.b, """
        end = time.monotonic() + 20
        while True:
            try:
                got = c.attach_many("@node-a/g/set/")
                break
            except OSError as e:
                if "UCX worker address" not in str(e) or time.monotonic() > end:
                    raise
                time.sleep(0.05)
        for name in sorted(got):
            t = got[name]
            print("m", name, t.device, t.commit, digest(cudrv.read(t)), flush=True)
    """)
    commits = set()
    for i in range(4):
        m = r.expect("m ").split()
        assert m[1] == "@node-a/g/set/%d" % i and m[2] == "cuda:0", m
        assert m[4] == digest(data(2 << 20, 40 + i)), m
        commits.add(m[3])
    assert len(commits) == 1, commits
    r.finish()
    sa = stats(pair.a)
    assert sa["remote_pull_leases"] == 0 and sa["remote_staged_bytes"] == 0, sa
    # Each copy started with nothing else staged for node-b: 2 MiB at most, never 8.
    staged = [int(x.split(" staged for it)")[0].split("(")[-1])
              for x in pair.a.read_log().splitlines() if " staged for it)" in x]
    assert len(staged) == 4 and max(staged) == 2 << 20, staged
    writer.send()
    writer.finish()
    pair.finish()


def test_a_gpu_set_in_one_allocation_crosses_nodes(daemon_factory, tmp_path, path):
    """put_many's GPU set in one allocation on node-a (docs/recycle.md,
    section 0): node-b's attach_many, and a single attach of a member far
    from the allocation's start, get every member's own bytes (node-a's
    GPU worker copies each out from its offset in the set)."""
    pair = Pair(daemon_factory, tmp_path, path)
    sizes = [100, 5000, 1 << 20, 70001]
    writer = pair.child(pair.a, f"""
        srcs = {{}}
        for i, n in enumerate({sizes!r}):
            t = c.create("src/%d" % i, (n,), "uint8", device="cuda:0")
            cudrv.write(t, data(n, 60 + i))
            t.publish()
            srcs["g/set/%d" % i] = c.attach("src/%d" % i)
        c.put_many(srcs, mode=0o644)
        print("published", flush=True)
        sys.stdin.readline()
    """)
    writer.expect("published")
    assert stats(pair.a)["gpu_arenas"] == 1
    r = pair.child(pair.b, """
        end = time.monotonic() + 20
        while True:
            try:
                got = c.attach_many("@node-a/g/set/")
                break
            except OSError as e:
                if "UCX worker address" not in str(e) or time.monotonic() > end:
                    raise
                time.sleep(0.05)
        for name in sorted(got):
            print("m", name, digest(cudrv.read(got[name])), flush=True)
        print("one", digest(cudrv.read(attach("@node-a/g/set/3"))), flush=True)
    """)
    for i, n in enumerate(sizes):
        m = r.expect("m ").split()
        assert m[1:] == ["@node-a/g/set/%d" % i, digest(data(n, 60 + i))], m
    assert r.expect("one ").split()[1] == digest(data(sizes[3], 63))
    r.finish()
    writer.send()
    writer.finish()
    pair.finish()


def test_no_gpu_on_the_pulling_node_is_a_clear_error(daemon_factory, tmp_path, path):
    """node-b has no CUDA device: the attach says so, naming the peer, the
    tensor and the device; node-a's lease and host copy go."""
    pair = Pair(daemon_factory, tmp_path, path, env_b={"CUDA_VISIBLE_DEVICES": ""}
                if SYSTEM else {"TD_GPU_DOUBLE_DEVICES": "0"})
    w = pair.publish("g/x", 1 << 20, 3)
    r = pair.child(pair.b, """
        try:
            attach("@node-a/g/x")
            print("attached", flush=True)
        except OSError as e:
            print("refused", e.errno, str(e).replace("\\n", " "), flush=True)
    """)
    ans = r.expect()
    print(ans)
    assert ans.startswith("refused"), ans
    assert "node-a" in ans and "g/x" in ans and "cuda" in ans, ans
    r.finish()
    assert wait_until(lambda: stats(pair.a)["remote_pull_leases"] == 0)
    # node-b stays usable: a host tensor of node-a's still comes.
    h = pair.child(pair.a, """
        c.put("g/host", bytearray(b"abc" * 1000), mode=0o644)
        print("put", flush=True)
    """)
    h.expect("put")
    h.finish()
    with tensord.connect(pair.b.socket) as cb:
        t = cb.attach("@node-a/g/host")
        assert bytes(memoryview(t)) == b"abc" * 1000
        t.release()
    w.send()
    w.finish()
    pair.finish()


def test_pulling_node_killed_while_a_gpu_tensor_is_staged(daemon_factory, tmp_path, path):
    """kill -9 of node-b while node-a holds a host copy of its GPU tensor for
    it: node-a's lease, host copy and bytes in flight go, its GPU memory is
    the tensor's alone, and it serves the next node-b."""
    pair = Pair(daemon_factory, tmp_path, path)
    n = 256 << 20
    w = pair.publish("g/huge", n, 0, fill=7)
    maps0 = anonymous_maps_of(pair.a.pid, n)  # (a sanitizer's shadow may be one)
    r = pair.child(pair.b, """
        print("asking", flush=True)
        try:
            attach("@node-a/g/huge", timeout=60)
        except OSError:
            pass
    """)
    r.expect("asking")
    caught = wait_until(lambda: stats(pair.a).get("remote_staged_bytes", 0) > 0, timeout=30)
    os.kill(pair.b.pid, signal.SIGKILL)
    pair.b.proc.wait()
    pair.b.log.close()
    assert caught, "node-a never held a host copy: " + pair.a.read_log()[-2000:]

    def settled():
        s = stats(pair.a)
        return s if (s["remote_pull_leases"] == 0 and s["remote_staged_bytes"] == 0
                     and s["remote_inflight_bytes"] == 0) else None
    assert wait_until(settled, timeout=20), stats(pair.a)
    gpu_a = [d for d in stats(pair.a)["devices"] if d["device"] == "cuda:0"][0]
    assert gpu_a[next(k for k in gpu_a if "used" in k)] == n, gpu_a
    # node-a's host copy (an anonymous mapping of the tensor's size) was unmapped.
    assert anonymous_maps_of(pair.a.pid, n) == maps0, (anonymous_maps_of(pair.a.pid, n), maps0)
    r.finish()
    pair.b.proc = None  # reaped here; node-a alone is stopped and checked
    w.send()
    w.finish()
    pair.finish(pair.a)


def test_gpu_pull_rate_report(daemon_factory, tmp_path, path):
    """Prints (asserts only bytes) the time of a 256 MiB remote attach of a
    GPU tensor against a host tensor's of the same size, interleaved, fresh
    names each round: what the two copies through host memory cost."""
    pair = Pair(daemon_factory, tmp_path, path)
    n, rounds = 256 << 20, 3
    w = pair.child(pair.a, f"""
        for i in range({rounds}):
            t = c.create("g/gpu%d" % i, ({n},), "uint8", device="cuda:0", mode=0o644)
            cudrv.memset(t, i + 1)
            t.publish()
            c.put("g/host%d" % i, bytearray([i + 1]) * {n}, mode=0o644)
        print("published", flush=True)
        sys.stdin.readline()
    """)
    w.expect("published", timeout=300)
    r = pair.child(pair.b, f"""
        attach("@node-a/g/host0").release()   # the UCX endpoints made, outside the timing
        for i in range({rounds}):
            for kind in ("gpu", "host"):
                if kind == "host" and i == 0:
                    continue
                t0 = time.perf_counter()
                t = c.attach("@node-a/g/%s%d" % (kind, i))
                dt = time.perf_counter() - t0
                b = cudrv.read(t, 4096) if kind == "gpu" else bytes(memoryview(t)[:4096])
                print("rate", kind, i, "%.1f" % (dt * 1e3), b == bytes([i + 1]) * 4096,
                      flush=True)
                t.release()
    """)
    got = {"gpu": [], "host": []}
    for _ in range(2 * rounds - 1):
        x = r.expect("rate ", timeout=300).split()
        assert x[4] == "True", x
        got[x[1]].append(float(x[3]))
    r.finish()
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    print(f"\nremote attach of 256 MiB ({path}, {'hardware' if SYSTEM else 'driver double'}),"
          f" ms per round: cuda:0 {got['gpu']} host {got['host']};"
          f" medians {med['gpu']:.1f} / {med['host']:.1f} ms:"
          f" cuda {n / med['gpu'] / 1e6:.2f} GB/s, host {n / med['host'] / 1e6:.2f} GB/s")
    # What each GPU step cost, from the daemons' logs (their GPU workers' own timing).
    for who, d in (("node-a", pair.a), ("node-b", pair.b)):
        steps = {}
        for line in d.read_log().splitlines():
            if "remote attach: GPU " in line and f" of {n} bytes: " in line:
                step = line.split("remote attach: GPU ")[1].split(" of ")[0]
                steps.setdefault(step, []).append(float(line.split(" bytes: ")[1].split()[0]))
        print(f"  {who}: " + "; ".join(f"{k} {sorted(v)} ms" for k, v in steps.items()))
    w.send()
    w.finish()
    pair.finish()


def test_serving_node_killed_mid_gpu_pull(daemon_factory, tmp_path, path):
    """kill -9 of node-a while its GPU tensor's bytes cross (node-b's replica
    allocated, or being allocated, on its GPU meanwhile): node-b's attach
    fails naming node-a, and node-b is left with no replica, no GPU memory,
    no host copy; it serves on."""
    pair = Pair(daemon_factory, tmp_path, path)
    n = 256 << 20
    w = pair.publish("g/huge", n, 0, fill=7)
    maps0 = anonymous_maps_of(pair.b.pid, n)
    r = pair.child(pair.b, """
        print("asking", flush=True)
        try:
            attach("@node-a/g/huge", timeout=60)
            print("attached", flush=True)
        except OSError as e:
            print("refused", e.errno, str(e).replace("\\n", " "), flush=True)
    """)
    r.expect("asking")
    sending = wait_until(lambda: stats(pair.a).get("remote_inflight_bytes", 0) > 0, timeout=30)
    os.kill(pair.a.pid, signal.SIGSTOP)
    os.kill(pair.a.pid, signal.SIGKILL)
    pair.a.proc.wait()
    pair.a.log.close()
    pair.a.proc = None  # reaped here
    assert sending, "node-a never sent: " + pair.b.read_log()[-2000:]
    ans = r.expect(timeout=60)
    assert ans.startswith("refused") and "node-a" in ans and "g/huge" in ans, ans
    r.finish()

    def clean():
        s = stats(pair.b)
        gpu = [d for d in s.get("devices", []) if d["device"] == "cuda:0"]
        used = gpu[0][next(k for k in gpu[0] if "used" in k)] if gpu else None
        return (s.get("remote_pulls") == 0 and s.get("remote_replicas") == 0 and used == 0
                and anonymous_maps_of(pair.b.pid, n) == maps0)
    assert wait_until(clean, timeout=20), (stats(pair.b), anonymous_maps_of(pair.b.pid, n))
    with tensord.connect(pair.b.socket) as cb:
        cb.put("local/x", bytearray(16))
    w.finish()
    pair.finish(pair.b, leaks_of=pair.b.pid)
