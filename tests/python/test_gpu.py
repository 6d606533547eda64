"""GPU tensors through the Python module: CUDA memory owned by the daemon,
handed to torch and cupy with from_dlpack, zero copy, across processes.

Every test here needs an NVIDIA GPU and torch built with CUDA (cupy tests
also need cupy); without them they are skipped with the reason printed
(run pytest with -rs). tests/gpu/run.sh runs them on a GPU machine.
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch (torch.cuda.is_available() is False)",
                allow_module_level=True)

try:
    import cupy
    cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # ImportError, or cupy without a usable GPU
    cupy = None
    CUPY_WHY = f"cupy unavailable: {e}"
else:
    CUPY_WHY = ""

pytestmark = pytest.mark.cuda

needs_cupy = pytest.mark.skipif(cupy is None, reason=CUPY_WHY or "cupy unavailable")


def daemon_cuda_path(client):
    """The sharing path the daemon reports for cuda:0, or None."""
    for d in client.stats()["devices"]:
        if d["device"] == "cuda:0":
            return d["path"]
    return None


def test_create_fill_publish_attach_torch(client):
    w = client.create("gpu/t0", (4, 8), "float32", device="cuda:0")
    assert w.device == "cuda:0"
    wt = torch.from_dlpack(w)
    assert wt.is_cuda and wt.shape == (4, 8)
    wt.copy_(torch.arange(32, dtype=torch.float32, device="cuda:0").reshape(4, 8))
    # publish() synchronizes the current stream: readers see finished bytes.
    w.publish()

    t = client.attach("gpu/t0")
    assert t.readonly
    rt = torch.from_dlpack(t)
    assert rt.is_cuda and rt.device.index == 0
    assert torch.equal(rt.cpu(), torch.arange(32, dtype=torch.float32).reshape(4, 8))
    # Zero copy: both views of one lease are the same device memory.
    assert torch.from_dlpack(t).data_ptr() == rt.data_ptr()
    del rt, wt
    t.release()
    w.release()


def test_put_torch_cuda_tensor(client):
    x = torch.linspace(0, 1, 1000, device="cuda:0", dtype=torch.float64)
    client.put("gpu/put", x)
    info = client.stat("gpu/put")
    assert info.device == "cuda:0"
    assert info.nbytes >= x.numel() * 8
    with client.attach("gpu/put") as t:
        y = torch.from_dlpack(t)
        assert y.is_cuda
        assert torch.equal(y, x)
        # The daemon's memory, not the caller's tensor.
        assert y.data_ptr() != x.data_ptr()
        del y


def test_mutable_write_seen_without_reattach(client):
    w = client.create("gpu/mut", (1024,), "int32", device="cuda:0", mutable=True)
    wt = torch.from_dlpack(w)
    wt.fill_(1)
    w.publish()
    with client.attach("gpu/mut") as t:
        rt = torch.from_dlpack(t)
        assert int(rt.sum()) == 1024
        wt.fill_(7)
        torch.cuda.synchronize()
        # Same memory: the reader's existing view changes.
        assert int(rt.sum()) == 7 * 1024
        del rt
    del wt
    w.release()


def test_other_process_reads_gpu_tensor(client, child):
    w = client.create("gpu/xp", (256, 256), "float32", device="cuda:0")
    torch.from_dlpack(w).fill_(3.5)
    w.publish()
    p = child("""
        import sys, torch, tensord
        c = tensord.connect()
        t = c.attach("gpu/xp", timeout=10)
        y = torch.from_dlpack(t)
        print("sum", float(y.sum()), y.is_cuda, flush=True)
        sys.stdin.readline()
        del y
        t.release()
        c.close()
    """)
    line = p.expect("sum ")
    _, total, is_cuda = line.split()
    assert float(total) == 3.5 * 256 * 256
    assert is_cuda == "True"
    assert client.stat("gpu/xp").refcount >= 2
    p.send()
    p.finish()
    w.release()
    assert client.stat("gpu/xp").refcount == 0


def test_killed_reader_releases_gpu_lease(client, child):
    w = client.create("gpu/kill", (1 << 20,), "uint8", device="cuda:0")
    w.publish()
    w.release()
    p = child("""
        import sys, torch, tensord
        c = tensord.connect()
        ts = [c.attach("gpu/kill") for _ in range(8)]
        ys = [torch.from_dlpack(t) for t in ts]
        print("held", flush=True)
        sys.stdin.readline()
    """)
    p.expect("held")
    assert client.stat("gpu/kill").refcount == 8
    p.proc.kill()
    p.proc.wait()
    import time
    end = time.monotonic() + 5
    while client.stat("gpu/kill").refcount and time.monotonic() < end:
        time.sleep(0.01)
    assert client.stat("gpu/kill").refcount == 0


@needs_cupy
def test_attach_cupy_from_dlpack(client):
    w = client.create("gpu/cp", (3, 5), "float32", device="cuda:0")
    torch.from_dlpack(w).copy_(torch.arange(15, dtype=torch.float32).reshape(3, 5))
    w.publish()
    with client.attach("gpu/cp") as t:
        a = cupy.from_dlpack(t)
        assert a.shape == (3, 5)
        assert a.device.id == 0
        assert cupy.asnumpy(a).tolist() == [[float(5 * i + j) for j in range(5)]
                                            for i in range(3)]
        # Zero copy: cupy and torch see one address.
        assert a.data.ptr == torch.from_dlpack(t).data_ptr()
        del a
    w.release()


def test_stats_report_cuda_path(client):
    path = daemon_cuda_path(client)
    assert path in ("cuda-vmm", "cuda-ipc"), client.stats()
    print(f"daemon shares cuda:0 through {path}")
