"""Checkpoint files from Python (issue 34): Client.put_file() imports a
.safetensors / .npz written by the real `safetensors` package and numpy as
one commit, Client.get_file() exports a prefix or a list of names as one
file from one commit, read back by the same packages; torch's float8 types
pass both ways; bad files are refused with the file, the array and the
reason named, and leave nothing behind."""
import json
import os
import pathlib
import struct
import threading

import numpy as np
import pytest

import tensord

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")


def arrays():
    rng = np.random.default_rng(11)
    return {"layer0.weight": rng.standard_normal((16, 8)).astype(np.float32),
            "layer0.bias": np.arange(8, dtype=np.int64),
            "scale": np.array(0.5, np.float64),
            "mask": np.array([True, False, True]),
            "half": rng.standard_normal((3, 5)).astype(np.float16),
            "empty": np.zeros((0, 4), np.uint16)}


def listed(client, prefix):
    return {i.name: i for i in client.list(prefix)}


def header(path):
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8:8 + n])


@pytest.mark.parametrize("kind", ["safetensors", "npz"])
def test_put_file_of_package_written_files_is_one_commit(client, tmp_path, kind):
    want = arrays()
    path = tmp_path / f"ck.{kind}"
    if kind == "npz":
        np.savez(path, **want)
    else:
        safetensors_numpy.save_file(want, str(path))
    commit = client.put_file("ck/", path)              # a pathlib.Path is fine
    infos = listed(client, "ck/")
    assert sorted(infos) == sorted("ck/" + k for k in want)
    assert {i.commit for i in infos.values()} == {commit}
    for k, a in want.items():
        t = client.attach("ck/" + k)
        assert t.shape == a.shape and infos["ck/" + k].dtype == a.dtype.name
        assert bytes(memoryview(t)) == a.tobytes(), k


def test_put_file_replace_makes_the_next_version(client, tmp_path):
    safetensors_numpy.save_file({"w": np.ones(4, np.float32)}, str(tmp_path / "a.safetensors"))
    safetensors_numpy.save_file({"w": np.full(4, 2, np.float32)}, str(tmp_path / "b.safetensors"))
    first = client.put_file("r/", str(tmp_path / "a.safetensors"))
    with pytest.raises(tensord.ExistsError, match=r"tensor 'r/w' already exists.*replace=True"):
        client.put_file("r/", str(tmp_path / "b.safetensors"))
    second = client.put_file("r/", str(tmp_path / "b.safetensors"), replace=True)
    assert second > first
    assert np.from_dlpack(client.attach("r/w")).tolist() == [2, 2, 2, 2]
    assert client.stat("r/w").generation == 2


def test_float8_from_torch_both_ways(client, tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch for its float8 tensors")
    st_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(5)
    want = {"e4m3": torch.randn(8, 16, generator=g).to(torch.float8_e4m3fn),
            "e5m2": torch.randn(4, 4, generator=g).to(torch.float8_e5m2),
            "e4m3fnuz": torch.randn(3, generator=g).to(torch.float8_e4m3fnuz),
            "e5m2fnuz": torch.randn(3, generator=g).to(torch.float8_e5m2fnuz),
            "e8m0": torch.rand(5, generator=g).to(torch.float8_e8m0fnu),
            "fp4": torch.randint(0, 255, (2, 6), dtype=torch.uint8,
                                 generator=g).view(torch.float4_e2m1fn_x2),
            "bf16": torch.randn(2, 3, generator=g).to(torch.bfloat16)}
    src = tmp_path / "fp8.safetensors"
    st_torch.save_file(want, str(src))
    assert {e["dtype"] for k, e in header(src)[1].items() if k != "__metadata__"} >= \
        {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"}
    client.put_file("q/", src)
    infos = listed(client, "q/")
    # Named as torch names them (issue 34: not dtype(10,8,1)).
    assert infos["q/e4m3"].dtype == "float8_e4m3fn" and infos["q/e5m2"].dtype == "float8_e5m2"
    assert infos["q/e8m0"].dtype == "float8_e8m0fnu"
    assert infos["q/fp4"].dtype == "float4_e2m1fn_x2" and infos["q/fp4"].shape == (2, 6)
    for k, v in want.items():
        t = torch.from_dlpack(client.attach("q/" + k))
        assert t.dtype == v.dtype and t.shape == v.shape, k
        assert torch.equal(t.view(torch.uint8), v.view(torch.uint8)), k
    # And back out: safetensors' own reader gets the same tensors and dtypes.
    out = tmp_path / "out.safetensors"
    commit = client.get_file("q/", out)
    n, h = header(out)
    assert n % 8 == 0 and h["__metadata__"]["tensord_commit"] == str(commit)
    assert h["e4m3"]["dtype"] == "F8_E4M3" and h["fp4"] == {
        "dtype": "F4", "shape": [2, 12], "data_offsets": h["fp4"]["data_offsets"]}
    back = st_torch.load_file(str(out))
    assert sorted(back) == sorted(want)
    for k, v in want.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k].view(torch.uint8),
                                                        v.view(torch.uint8)), k
    # numpy has no float8: an .npz of them is refused, naming the tensor, and no file is left.
    with pytest.raises(tensord.Error, match=r"q/bf16.*no \.npy equivalent.*\.safetensors"):
        client.get_file("q/", tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_get_file_read_back_by_numpy_and_safetensors(client, tmp_path):
    want = arrays()
    # A Fortran-order array is stored strided: the file holds it row-major.
    want["fortran"] = np.asfortranarray(np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    commit = client.put_many({"m/" + k: v for k, v in want.items()})
    st = tmp_path / "m.safetensors"
    assert client.get_file("m/", str(st)) == commit
    back = safetensors_numpy.load_file(str(st))
    assert sorted(back) == sorted(want)
    for k, a in want.items():
        assert back[k].dtype == a.dtype and np.array_equal(back[k], a), k
    npz = tmp_path / "m.npz"
    assert client.get_file("m/", npz) == commit
    with np.load(npz) as z:
        assert sorted(z.files) == sorted(want)
        for k, a in want.items():
            assert z[k].dtype == a.dtype and np.array_equal(z[k], a), k
    # A list of names: each stored under its whole name. A .npy: one tensor.
    client.get_file(["m/scale", "m/mask"], tmp_path / "two.npz")
    with np.load(tmp_path / "two.npz") as z:
        assert sorted(z.files) == ["m/mask", "m/scale"]
    client.get_file("m/fortran", tmp_path / "one.npy")
    assert np.array_equal(np.load(tmp_path / "one.npy"), want["fortran"])
    # The file round-trips through put_file too.
    client.put_file("again/", st)
    for k, a in want.items():
        assert np.array_equal(np.from_dlpack(client.attach("again/" + k)), a), k


def test_get_file_is_one_commit_while_a_writer_republishes(daemon, client, tmp_path):
    """Every file holds one version of the set, never a mix, while another
    client puts new versions of every name as fast as it can."""
    names = [f"live/{i}" for i in range(8)]
    client.put_many({n: np.full(4096, 0, np.int64) for n in names})
    stop = threading.Event()
    puts = [0]

    def writer():
        w = tensord.connect(daemon.socket)
        try:
            v = 1
            while not stop.is_set():
                w.put_many({n: np.full(4096, v, np.int64) for n in names}, replace=True)
                v += 1
                puts[0] = v
        finally:
            w.close()

    th = threading.Thread(target=writer)
    th.start()
    seen = set()
    try:
        for i in range(60):
            path = tmp_path / f"s{i % 2}.safetensors"
            client.get_file("live/", path)
            back = safetensors_numpy.load_file(str(path))
            values = {int(a[0]) for a in back.values()}
            assert len(back) == 8 and all((a == a[0]).all() for a in back.values())
            assert len(values) == 1, f"file {i} mixes versions {sorted(values)}"
            seen |= values
            if i >= 20 and len(seen) > 2:
                break
    finally:
        stop.set()
        th.join()
    print(f"{len(seen)} versions exported while the writer made {puts[0]}")
    assert len(seen) > 1, "the writer never republished during the exports"


def test_bad_files_are_refused_and_leave_nothing(client, tmp_path):
    good = tmp_path / "good.safetensors"
    safetensors_numpy.save_file({"a": np.ones(1000, np.float32), "b": np.ones(10, np.int8)},
                                str(good))
    raw = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-100])
    hlen = struct.unpack("<Q", raw[:8])[0]
    with pytest.raises(tensord.Error, match=r"cut\.safetensors: truncated: expected 4010 data "
                       r"bytes after the header, the file has 3910") as e:
        client.put_file("bad/", tmp_path / "cut.safetensors")
    assert e.value.errno not in (0, None)
    np.savez(tmp_path / "foreign.npz", a=np.ones(3))
    os.rename(tmp_path / "foreign.npz", tmp_path / "foreign.safetensors")
    with pytest.raises(tensord.Error, match=r"foreign\.safetensors: not a safetensors file: "
                       r"it is a zip archive \(an \.npz\? name it \.npz\)"):
        client.put_file("bad/", tmp_path / "foreign.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"hello, this is not a checkpoint\n")
    with pytest.raises(tensord.Error, match=r"text\.safetensors: header of \d+ bytes is too long"):
        client.put_file("bad/", tmp_path / "text.safetensors")
    np.save(tmp_path / "x.npy", np.ones(3))
    os.rename(tmp_path / "x.npy", tmp_path / "notzip.npz")
    with pytest.raises(tensord.Error, match=r"notzip\.npz: not a readable \.npz"):
        client.put_file("bad/", tmp_path / "notzip.npz")
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        client.put_file("bad/", tmp_path / "missing.safetensors")
    with pytest.raises(tensord.Error, match=r"prefix 'bad' does not end in a separator.*'bad/'"):
        client.put_file("bad", good)
    with pytest.raises(tensord.Error, match=r"not a checkpoint"):
        client.put_file("bad/", tmp_path / "x.txt")
    assert client.list() == []
    # The prefix rule holds for export too, and an empty prefix is fine both ways.
    client.put_file("", good)
    assert sorted(listed(client, "")) == ["a", "b"]
    with pytest.raises(tensord.Error, match=r"prefix 'a' does not end in a separator: it would "
                       r"take 'aNAME' too; write 'a/' .*or list the names"):
        client.get_file("a", tmp_path / "o.safetensors")
    with pytest.raises(FileNotFoundError, match="no tensors under 'nothing/'"):
        client.get_file("nothing/", tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()
    assert hlen > 0


def test_aio_put_file_and_get_file_run_off_the_loop(daemon, tmp_path):
    """tensord.aio: the file is read and written on a worker thread, so a
    wait on the loop (here, for the name the import publishes) is served
    meanwhile and completes with the import's commit."""
    import asyncio
    import tensord.aio

    want = arrays()
    safetensors_numpy.save_file(want, str(tmp_path / "in.safetensors"))

    async def main():
        async with await tensord.aio.connect(daemon.socket) as c:
            waiting = asyncio.ensure_future(c.attach("io/scale", timeout=60))
            await asyncio.sleep(0)
            commit = await c.put_file("io/", tmp_path / "in.safetensors")
            t = await asyncio.wait_for(waiting, 60)
            assert float(np.from_dlpack(t)) == 0.5
            assert await c.get_file("io/", tmp_path / "out.npz") == commit
            return commit

    asyncio.run(asyncio.wait_for(main(), 120))
    with np.load(tmp_path / "out.npz") as z:
        for k, a in want.items():
            assert np.array_equal(z[k], a), k
