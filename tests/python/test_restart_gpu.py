"""CUDA VMM tensors outlive the daemon (docs/restart.md; issue 33, "GPU"):
the export the daemon keeps of each VMM allocation goes into the
descriptor store, and a restarted daemon imports it again
(backend_ops.import_fd), so a tensor made on cuda:0 is served after a
kill -9 with the same bytes and generation, over the driver double here
(tests/gpudouble/) and on hardware by tests/gpu/run.sh. Legacy IPC memory
cannot survive (an IPC handle is no descriptor): it is counted as
unprotected and not restored."""
import signal
import textwrap

import pytest

import gpu_double
import tensord
from sdharness import ServiceManager
from testlib import Child

gpu_double.require()

DATA, DIGEST, PRELUDE = gpu_double.DATA, gpu_double.DIGEST, gpu_double.PRELUDE


@pytest.fixture(params=["vmm", "ipc"])
def run(request, tmp_path):
    env = gpu_double.env(tmp_path / "double")
    env["TENSORD_CUDA_PATH"] = "ipc" if request.param == "ipc" else "default"
    m = ServiceManager(tmp_path)
    m.start(env=env)
    children = []

    def child(code):
        c = Child(PRELUDE + textwrap.dedent(code), m.socket, env)
        children.append(c)
        return c
    yield request.param, m, child, env
    gpu_double.end_children(children)
    m.close()
    assert not m.violations, m.violations
    bad = gpu_double.problems(tmp_path / "double")
    assert not bad, "\n".join(bad)


def test_a_cuda_tensor_survives_kill_9(run):
    path, m, child, env = run
    w = child("""
        t = c.create("g/a", (len(DATA),), "uint8", device="cuda:0")
        cudrv.write(t, DATA)
        t.publish()
        t.release()
        c.put("h/x", bytes(range(256)) * 16)
        print("published", c.stat("g/a").generation, c.stats()["restart_unprotected_tensors"],
              flush=True)
        sys.stdin.readline()
    """)
    line = w.expect("published").split()
    assert line[1] == "1"
    # Legacy IPC memory has no descriptor to keep: counted, not stored.
    assert line[2] == ("0" if path == "vmm" else "1")
    m.restart(sig=signal.SIGKILL, env=env)
    r = child("""
        names = sorted(i.name for i in c.list())
        print("names", *names, flush=True)
        if "g/a" in names:
            with c.attach("g/a") as t:
                print("digest", digest(cudrv.read(t)), t.device, c.stat("g/a").generation,
                      flush=True)
        print("restored", c.stats()["restart_restored_tensors"], flush=True)
    """)
    names = r.expect("names").split()[1:]
    if path == "vmm":
        assert names == ["g/a", "h/x"]
        assert r.expect("digest").split()[1:] == [DIGEST, "cuda:0", "1"]
        assert r.expect("restored") == "restored 2"
    else:
        assert names == ["h/x"]
        assert r.expect("restored") == "restored 1"
    w.send("")


def test_a_gpu_set_in_one_allocation_survives_kill_9(run):
    """put_many of CUDA members makes one device allocation (issue 32): its
    one export is stored, and after a kill -9 every member comes back at its
    offset, read right in another process, and freed with the last."""
    path, m, child, env = run
    sizes = [5000, 70000, 4096, 123457]
    w = child(f"""
        sizes = {sizes!r}
        def data(i, n):
            return bytes((j * 131 + 7 * i + 3) % 256 for j in range(n))
        srcs = {{}}
        for i, n in enumerate(sizes):
            t = c.create(f"src/{{i}}", (n,), "uint8", device="cuda:0")
            cudrv.write(t, data(i, n))
            t.publish()
            srcs[f"set/{{i}}"] = c.attach(f"src/{{i}}")
        c.put_many(srcs)
        for t in srcs.values():
            t.release()
        for i in range(len(sizes)):
            c.unlink(f"src/{{i}}")
        st = c.stats()
        print("put", st["gpu_arenas"], st["restart_unprotected_tensors"], flush=True)
        sys.stdin.readline()
    """)
    put = w.expect("put").split()
    assert put[1] == "1"                          # one allocation for the set
    assert put[2] == ("0" if path == "vmm" else "4")
    # No restart hold (docs/restart.md, section 5): unlinked, the set goes at once.
    m.restart(sig=signal.SIGKILL, env=env, extra_args=["--readopt-grace", "0"])
    r = child(f"""
        sizes = {sizes!r}
        def data(i, n):
            return bytes((j * 131 + 7 * i + 3) % 256 for j in range(n))
        names = sorted(i.name for i in c.list())
        print("names", *names, flush=True)
        if names:
            s = c.attach_many("set/")
            ok = all(cudrv.read(s[f"set/{{i}}"]) == data(i, n) for i, n in enumerate(sizes))
            print("bytes", ok, c.stats()["gpu_arenas"], flush=True)
            for t in s.values():
                t.release()
            for i in range(len(sizes)):
                c.unlink(f"set/{{i}}")
        st = c.stats()
        print("after", st["gpu_arenas"], st["restart_stored_fds"], flush=True)
    """)
    names = r.expect("names").split()[1:]
    if path == "vmm":
        assert names == [f"set/{i}" for i in range(len(sizes))]
        assert r.expect("bytes").split()[1:] == ["True", "1"]
    else:
        assert names == []
    # Unlinked, the set's allocation is freed and leaves the store: the
    # log and the listening socket are left.
    after = r.expect("after").split()
    assert after[1:] == ["0", "2"], after
    w.send("")
