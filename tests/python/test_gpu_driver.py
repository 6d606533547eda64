"""The Python package's GPU paths with no framework: CUDA tensors made,
filled, published, attached, put, released and forked by real client
processes, their bytes moved with the driver API (tests/python/cudrv.py).

In CI the driver is the double (tests/gpudouble/, docs/gpu.md "The driver
double"), given to the daemon and every client by LD_LIBRARY_PATH; its
report must then hold no violation (an unmap with work pending, a legacy
allocation freed while a client still has it open, a driver call in a
forked child) and no leak in the daemon. tests/gpu/run.sh runs the same
tests on hardware with the system's driver (TENSORD_GPU_DRIVER=system),
where torch and cupy are tested too (test_gpu.py).
"""
import hashlib
import textwrap
import pytest

import gpu_double
import tensord
from testlib import Child

gpu_double.require()

DATA, DIGEST, PRELUDE = gpu_double.DATA, gpu_double.DIGEST, gpu_double.PRELUDE


class Gpu:
    def __init__(self, daemon_factory, tmp_path, path):
        self.dir = tmp_path / "double"
        self.env = gpu_double.env(self.dir)
        # "default" where run.sh exported TENSORD_CUDA_PATH=ipc for its ipc pass.
        denv = dict(self.env, TENSORD_CUDA_PATH="ipc" if path == "ipc" else "default")
        self.daemon = daemon_factory(env=denv)
        self.children = []
        with tensord.connect(self.daemon.socket) as c:
            paths = [d["path"] for d in c.stats()["devices"] if d["device"] == "cuda:0"]
        assert paths, f"the daemon serves no cuda:0: {self.daemon.read_log()[-2000:]}"
        # What the daemon chose: cuda-vmm, or cuda-ipc (forced, or a GPU without VMM).
        self.path = "vmm" if paths[0] == "cuda-vmm" else "ipc"

    def child(self, code, **env):
        c = Child(PRELUDE + textwrap.dedent(code), self.daemon.socket, dict(self.env, **env))
        self.children.append(c)
        return c

    def finish(self):
        gpu_double.end_children(self.children)
        assert self.daemon.stop() == 0, self.daemon.read_log()[-3000:]
        bad = gpu_double.problems(self.dir)
        assert not bad, "\n".join(bad)


@pytest.fixture(params=["vmm", "ipc"])
def gpu(request, daemon_factory, tmp_path):
    g = Gpu(daemon_factory, tmp_path, request.param)
    yield g
    g.finish()


def make(gpu, name="g/a"):
    """A process that creates name on cuda:0, fills it with DATA, publishes it and stays."""
    w = gpu.child(f"""
        t = c.create({name!r}, (len(DATA),), "uint8", device="cuda:0")
        cudrv.write(t, DATA)
        t.publish()
        print("published", flush=True)
        sys.stdin.readline()
    """)
    w.expect("published")
    return w


def test_written_in_one_process_read_in_another(gpu):
    w = make(gpu)
    r = gpu.child("""
        t = c.attach("g/a")
        print("ro", t.readonly, t.read_only_enforced, t.device, flush=True)
        print("digest", digest(cudrv.read(t)), flush=True)
    """)
    ro = r.expect("ro ").split()
    assert ro[1] == "True" and ro[3] == "cuda:0"
    # Read-only is enforced by the hardware on VMM only; legacy IPC has no read-only mapping.
    assert ro[2] == str(gpu.path == "vmm")
    assert r.expect("digest ").split()[1] == DIGEST
    r.finish()
    w.finish()


def test_a_reader_write_is_refused_where_enforced(gpu):
    w = make(gpu)
    r = gpu.child("""
        t = c.attach("g/a")
        try:
            cudrv.memset(t, 0xff)
            print("wrote", flush=True)
        except cudrv.CudaError as e:
            print("refused", e.name, flush=True)
    """)
    ans = r.expect()
    r.finish()
    if gpu.path == "vmm":
        # Refused at once, as the copy engine refuses a read-only target (H200, driver 580).
        assert ans == "refused CUDA_ERROR_INVALID_VALUE"
        check = gpu.child('print("digest", digest(cudrv.read(c.attach("g/a"))), flush=True)')
        assert check.expect("digest ").split()[1] == DIGEST  # the bytes stayed
        check.finish()
    else:
        assert ans == "wrote"  # the documented gap of legacy IPC (docs/gpu.md)
    w.finish()


def test_put_of_a_cuda_tensor(gpu):
    w = make(gpu)
    p = gpu.child("""
        src = c.attach("g/a")
        c.put("g/copy", src)
        print("put", flush=True)
    """)
    p.expect("put")
    p.finish()
    r = gpu.child("""
        t = c.attach("g/copy")
        print(t.device, digest(cudrv.read(t)), flush=True)
    """)
    assert r.expect("cuda:0 ").split()[1] == DIGEST
    r.finish()
    w.finish()


def test_release_with_a_read_still_queued(gpu):
    """Defect 2 of issue 21: the deleter unmaps only after the device is idle."""
    w = make(gpu)
    r = gpu.child("""
        t = c.attach("g/a")
        print("digest", digest(cudrv.read_queued_then_drop(t)), flush=True)
    """)
    assert r.expect("digest ").split()[1] == DIGEST
    r.finish()
    w.finish()


def test_forked_child_drops_inherited_gpu_leases(gpu):
    """The child makes no driver call (CUDA does not survive fork); the parent's leases stay."""
    w = make(gpu)
    r = gpu.child("""
        t = c.attach("g/a")
        first = digest(cudrv.read(t))
        pid = os.fork()
        if pid == 0:
            del t
            c.close()
            os._exit(0)
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print("child", rc, first, digest(cudrv.read(t)), flush=True)
    """)
    ans = r.expect("child ").split()
    assert ans[1:] == ["0", DIGEST, DIGEST]
    r.finish()
    w.finish()


def test_close_with_a_live_import_then_the_memory_is_freed(gpu):
    """The reader closes with its lease alive while nobody else holds the
    tensor: on legacy IPC its handle must be closed before the daemon frees
    (the double reports a free while a process still has it open)."""
    w = make(gpu)
    r = gpu.child("""
        t = c.attach("g/a")
        print("attached", flush=True)
        sys.stdin.readline()
        c.close()
        print("closed", t.released, flush=True)
    """)
    r.expect("attached")
    w.send("")
    w.finish()  # the creator's lease is gone; unlink so the reader's is the last
    u = gpu.child('c.unlink("g/a"); print("unlinked", flush=True)')
    u.expect("unlinked")
    u.finish()
    r.send("")
    r.expect("closed")
    r.finish()



def test_attach_of_its_own_tensor(gpu):
    """Issue 30: the process that created a CUDA tensor attaches it, on the
    same connection and another, before and after its creator's lease ends
    (the allocation is imported once per process: a second import failed
    with cuMemMap: CUDA_ERROR_INVALID_HANDLE on the double)."""
    w = gpu.child("""
        t = c.create("g/a", (len(DATA),), "uint8", device="cuda:0")
        cudrv.write(t, DATA)
        t.publish()
        c2 = tensord.connect()
        a = c.attach("g/a")
        b = c2.attach("g/a")
        print("both", digest(cudrv.read(a)), digest(cudrv.read(b)), a.readonly, flush=True)
        t.release()
        a.release()
        again = c.attach("g/a")
        print("again", digest(cudrv.read(again)), digest(cudrv.read(b)), flush=True)
        b.release()
        again.release()
        last = c2.attach("g/a")
        print("last", digest(cudrv.read(last)), flush=True)
        sys.stdin.readline()
    """)
    assert w.expect("both ").split()[1:] == [DIGEST, DIGEST, "True"]
    assert w.expect("again ").split()[1:] == [DIGEST, DIGEST]
    assert w.expect("last ").split()[1:] == [DIGEST]
    # Another process still reads it while the creator holds its last lease.
    r = gpu.child('print("digest", digest(cudrv.read(c.attach("g/a"))), flush=True)')
    assert r.expect("digest ").split()[1] == DIGEST
    r.finish()
    w.send("")
    w.finish()


def test_a_bound_attach_needs_no_round_trip(gpu):
    """Issue 32: a CUDA VMM tensor this process attached before is attached
    again from its binding, with no request (docs/design.md, "Attach
    without a round trip"), and a new version of the name is seen at the
    next attach. Legacy IPC asks the daemon each time."""
    w = make(gpu)
    r = gpu.child("""
        def asked():
            return c.stats()["attach_duration_seconds"]["count"]
        for _ in range(2):       # the second attach is the one bound
            t = c.attach("g/a")
            t.release()
        n0 = asked()
        for _ in range(5):
            t = c.attach("g/a")
            d = digest(cudrv.read(t))
            t.release()
        print("asked", asked() - n0, d, flush=True)
        sys.stdin.readline()
        t = c.attach("g/a")
        print("after", digest(cudrv.read(t)), flush=True)
    """)
    asked, d = r.expect("asked ").split()[1:]
    assert d == DIGEST
    assert int(asked) == (0 if gpu.path == "vmm" else 5)
    new = bytes(reversed(DATA))
    v = gpu.child("""
        t = c.create("g/a", (len(DATA),), "uint8", device="cuda:0", replace=True)
        cudrv.write(t, bytes(reversed(DATA)))
        t.publish()
        print("replaced", flush=True)
    """)
    v.expect("replaced")
    r.send()
    assert r.expect("after ").split()[1] == hashlib.sha256(new).hexdigest()[:16]
    v.finish()
    r.finish()
    w.finish()
