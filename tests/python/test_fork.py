"""fork() with a live client (docs/design.md, "Fork"; issue 18, items 1-3).

A child inherits its parent's client: the socket, the leases, the queued
releases, the locks. Whatever the child does with them (close, exit, drop
the inherited tensors, be killed, use the client), the parent keeps its
connection, its leases and its bytes, and nothing leaks in the daemon.
The child's own requests go over a connection of its own.

The forks happen in subprocesses (the `child` fixture), never in the pytest
process itself: a forked copy of pytest would run its own teardown.
"""
import os
import textwrap

import numpy as np
import pytest

from tdutil import wait_until

import tensord

# The start of every scenario: the parent holds an attached tensor, a
# connection-lifetime tensor of its own, and arrays on both; then forks.
PARENT = """
import gc, os, signal, sys, time
import numpy as np
import tensord

c = tensord.connect()
c.put("x", np.arange(1000, dtype=np.int64))
c.put("mine", np.full(16, 7, np.int32), lifetime="connection")
t = c.attach("x")
a = np.from_dlpack(t)
m = np.from_dlpack(c.attach("mine"))

def parent_checks(pid, want_status=0):
    _, st = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(st)
    assert code == want_status, f"child exit {code}"
    # The parent's connection serves, its leases and bytes are intact.
    assert c.stat("x").refcount == 1, c.stat("x").refcount
    assert c.stat("mine").refcount == 1, c.stat("mine").refcount
    assert a.tolist() == list(range(1000))
    assert m.tolist() == [7] * 16
    with c.attach("mine") as again:
        assert np.from_dlpack(again).tolist() == [7] * 16
    print("parent ok", flush=True)
"""


def run(child, body):
    """Runs PARENT then body in a fresh Python; returns its Child."""
    return child(PARENT + textwrap.dedent(body))


def daemon_at_rest(daemon, client, leases, clients):
    """Waits until the daemon counts exactly these leases and clients."""
    def ok():
        s = client.stats()
        return s["leases"] == leases and s["clients"] == clients
    assert wait_until(ok, 20), client.stats()


def nothing_left(daemon, client, fds):
    """Unlinks what the scenario left named; then the daemon holds the
    descriptors it held before it (fds), no more."""
    for info in client.list(""):
        client.unlink(info.name)
    assert wait_until(lambda: daemon.fd_count() == fds), (daemon.fd_count(), fds)


def test_child_close_leaves_the_parents_connection(child, client, daemon):
    fds = daemon.fd_count()
    p = run(child, """
        pid = os.fork()
        if pid == 0:
            c.close()           # used to shut the parent's socket down
            os._exit(0)
        parent_checks(pid)
        c.close()
    """)
    p.expect("parent ok")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)
    nothing_left(daemon, client, fds)


def test_child_normal_exit_does_not_hang(child, client, daemon):
    """A child that exits through the interpreter's finalisation (which
    deallocates the inherited Client and Tensor objects) used to wait
    forever for a flusher thread it does not have."""
    p = run(child, """
        pid = os.fork()
        if pid == 0:
            # Finalisation drops t, a, m and c; exit status 3 says we got there.
            sys.exit(3)
        parent_checks(pid, 3)
    """)
    p.expect("parent ok", timeout=60)
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)


def test_child_drops_inherited_tensors(child, client, daemon):
    """The inherited tensors' deleters run in the child and send nothing:
    the parent's lease survives the child's next request and the owner's
    unlink, and its array keeps its bytes."""
    p = run(child, """
        pid = os.fork()
        if pid == 0:
            assert a[999] == 999          # inherited mappings are readable
            del a, t, m
            gc.collect()
            c.stat("x")                   # a request: used to carry the releases
            os._exit(0)
        parent_checks(pid)
        c.unlink("x")                     # the owner unlinks: the lease keeps the bytes
        assert a.tolist() == list(range(1000))
        print("after unlink ok", flush=True)
    """)
    p.expect("parent ok")
    p.expect("after unlink ok")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)


def test_child_killed_holding_everything(child, client, daemon):
    fds = daemon.fd_count()
    p = run(child, """
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            own = c.attach("x")             # a lease of the child's own connection
            os.write(w, b"1")
            signal.pause()
        assert os.read(r, 1) == b"1"
        print("child holds", c.stat("x").refcount, flush=True)
        os.kill(pid, signal.SIGKILL)
        parent_checks(pid, -signal.SIGKILL)
    """)
    assert p.expect("child holds") == "child holds 2"
    p.expect("parent ok")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)
    nothing_left(daemon, client, fds)


def test_child_uses_the_inherited_client(child, client, daemon):
    """The child's requests on the inherited client go over a new
    connection of its own: its leases are its own and end with it."""
    p = run(child, """
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            with c.attach("x") as own:
                assert np.from_dlpack(own)[10] == 10
            c.put("from-child", np.arange(5, dtype=np.int16))
            kept = c.attach("from-child")
            n = c.stats()["clients"]
            os.write(w, str(n).encode())
            os._exit(0)                      # without releasing `kept`
        print("clients seen by the child", os.read(r, 16).decode(), flush=True)
        parent_checks(pid)
        assert c.stat("from-child").refcount == 0
        assert np.from_dlpack(c.attach("from-child")).tolist() == [0, 1, 2, 3, 4]
        # Publishing what the parent created is still the parent's own.
        c.close()
        print("done", flush=True)
    """)
    # The test's client, the parent and the child's own connection.
    assert p.expect("clients seen by the child") == "clients seen by the child 3"
    p.expect("parent ok")
    p.expect("done")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)


def test_child_cannot_publish_the_parents_draft(child, client, daemon):
    p = run(child, """
        w = c.create("draft", (4,), "float32")
        np.from_dlpack(w)[:] = 1.5
        pid = os.fork()
        if pid == 0:
            try:
                w.publish()
            except tensord.Error as e:
                print("child publish refused:", type(e).__name__, e, flush=True)
                os._exit(0)
            os._exit(1)
        parent_checks(pid)
        w.publish()
        assert np.from_dlpack(c.attach("draft")).tolist() == [1.5] * 4
        print("parent published", flush=True)
    """)
    line = p.expect("child publish refused:")
    assert "draft" in line, line
    p.expect("parent ok")
    p.expect("parent published")
    p.finish()


def test_nested_forks(child, client, daemon):
    """A grandchild uses the client too: each generation gets its own
    connection, none touches another's."""
    p = run(child, """
        pid = os.fork()
        if pid == 0:
            with c.attach("x") as own:
                pass
            pid2 = os.fork()
            if pid2 == 0:
                with c.attach("x") as own2:
                    assert np.from_dlpack(own2)[1] == 1
                c.close()
                os._exit(0)
            _, st = os.waitpid(pid2, 0)
            assert os.waitstatus_to_exitcode(st) == 0
            with c.attach("x") as own3:          # the child's connection still serves
                pass
            os._exit(0)
        parent_checks(pid)
    """)
    p.expect("parent ok")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)


def test_multiprocessing_fork_pool(child, client, daemon):
    p = run(child, """
        import multiprocessing as mp

        def work(i):
            # The inherited module-level client serves each worker.
            with c.attach("x") as v:
                s = int(np.from_dlpack(v)[i])
            c.put(f"pool/{i}", np.array([s * 2], np.int64), replace=True)
            return s

        with mp.get_context("fork").Pool(3) as pool:
            got = pool.map(work, range(20))
        assert got == list(range(20)), got
        for i in range(20):
            with c.attach(f"pool/{i}") as v:
                assert np.from_dlpack(v)[0] == 2 * i
        assert c.stat("x").refcount == 1
        assert a.tolist() == list(range(1000))
        print("parent ok", flush=True)
    """)
    p.expect("parent ok")
    p.finish()
    daemon_at_rest(daemon, client, 0, 1)


def test_torch_dataloader_forked_workers(child, client, daemon):
    """A real DataLoader with two forked workers: the dataset holds a client
    made in the parent; each worker attaches inputs and puts outputs while
    the parent holds leases of its own."""
    torch = pytest.importorskip("torch")
    p = child(textwrap.dedent("""
        import numpy as np, torch, tensord
        from torch.utils.data import DataLoader, Dataset

        c = tensord.connect()
        for i in range(16):
            c.put(f"in/{i}", np.full((8, 8), i, np.float32))
        held = [c.attach(f"in/{i}") for i in range(16)]      # the parent's leases
        views = [torch.from_dlpack(h) for h in held]

        class Inputs(Dataset):
            def __init__(self, client):
                self.c = client
            def __len__(self):
                return 16
            def __getitem__(self, i):
                with self.c.attach(f"in/{i}") as t:
                    x = torch.from_dlpack(t).clone()
                self.c.put(f"out/{i}", (x * 2).numpy(), replace=True)
                return x.sum()

        dl = DataLoader(Inputs(c), batch_size=4, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=False)
        sums = torch.cat([b for b in dl]).tolist()
        assert sums == [64.0 * i for i in range(16)], sums
        del dl
        for i in range(16):
            assert c.stat(f"in/{i}").refcount == 1, (i, c.stat(f"in/{i}").refcount)
            assert views[i].sum().item() == 64.0 * i
            with c.attach(f"out/{i}") as o:
                assert torch.from_dlpack(o).sum().item() == 128.0 * i
        print("dataloader ok", c.stats()["clients"], flush=True)
    """))
    line = p.expect("dataloader ok", timeout=300)
    p.finish(timeout=120)
    # Only the test's client and the parent were connected at the end.
    assert line == "dataloader ok 2", line
    daemon_at_rest(daemon, client, 0, 1)


def test_torch_dataloader_zero_copy_samples(child, client, daemon):
    """docs/python.md's fork example: workers return torch.from_dlpack(t) as it
    is, no clone (the tensor holds the lease); batched (collate copies into
    the batch) and unbatched (the sample itself crosses the worker queue)."""
    pytest.importorskip("torch")
    p = child(textwrap.dedent("""
        import numpy as np, torch, tensord
        from torch.utils.data import DataLoader, Dataset

        c = tensord.connect()
        for i in range(16):
            c.put(f"in/{i}", np.full((8, 8), i, np.float32))

        class Inputs(Dataset):
            def __len__(self):
                return 16
            def __getitem__(self, i):
                with c.attach(f"in/{i}") as t:
                    return torch.from_dlpack(t)

        for bs in (4, None):
            dl = DataLoader(Inputs(), batch_size=bs, num_workers=2,
                            multiprocessing_context="fork")
            got = torch.cat([b.reshape(-1, 8, 8) for b in dl])
            assert got.shape == (16, 8, 8), got.shape
            assert got.sum(dim=(1, 2)).tolist() == [64.0 * i for i in range(16)]
            del dl
        for i in range(16):
            assert c.stat(f"in/{i}").refcount == 0, (i, c.stat(f"in/{i}").refcount)
        print("zero copy ok", flush=True)
    """))
    p.expect("zero copy ok", timeout=300)
    p.finish(timeout=120)
    daemon_at_rest(daemon, client, 0, 1)


def test_forked_child_connects_with_the_parents_label(child):
    """A labelled client's child connects anew under the same label (issue 34)."""
    p = child("""
        import os
        import tensord
        c = tensord.connect(name="trainer-0")
        pid = os.fork()
        if pid == 0:
            mine = [x for x in c.clients() if x.pid == os.getpid()]
            os._exit(0 if [x.label for x in mine] == ["trainer-0"] else 3)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0
        print("child labelled", flush=True)
    """)
    p.expect("child labelled")
    p.finish()
