"""Versions, sets and watches through libtensord's C API (tdclient), so that
the library's transaction, set, watch and event-loop paths also run in the
AddressSanitizer suite: put_many and hand-made transactions commit in one
step, abort leaves nothing, attach_many never sees a mix, waits for newer
versions are woken by the right commit and can be cancelled, and a watch
reports commits in order."""
import re

from conftest import wait_until
from test_core import Client


def kv(line):
    return dict(x.split("=", 1) for x in line.split() if "=" in x)


def test_put_many_and_transactions(daemon):
    c = Client(daemon.socket)
    w = Client(daemon.socket)
    try:
        first = int(kv(c.ok("putmany s/ 300 512 1"))["commit"])
        got = kv(w.ok("many s/ 0 0"))
        assert (got["n"], got["commit"], got["value"]) == ("300", str(first), "1")
        # A new version of all of them, by hand: nothing shows before the commit.
        c.ok("tx begin")
        for i in range(299):
            c.ok(f"tx put s/{i} 512 2 replace")
        c.ok("tx unlink s/299")
        assert kv(w.ok("many s/ 0 0"))["value"] == "1"
        second = int(kv(c.ok("tx commit"))["commit"])
        assert second > first
        got = kv(w.ok("many s/ 0 0"))
        assert (got["n"], got["commit"], got["value"]) == ("299", str(second), "2")
        # An abort leaves no trace.
        c.ok("tx begin")
        c.ok("tx put s/0 512 3 replace")
        c.ok("tx put s/new 8 3")
        c.ok("tx abort")
        assert kv(w.ok("many s/ 0 0"))["value"] == "2"
        w.err("after s/new 0 0", "ENOENT")
        # Nothing newer than the last commit yet: no wait asked, so none.
        w.err(f"many s/ {second} 0", "ETIMEDOUT")
    finally:
        c.close()
        w.close()


def test_waits_for_newer_versions_and_their_cancellation(daemon):
    c = Client(daemon.socket)
    w = Client(daemon.socket)
    try:
        c.ok("putmany v/ 1 4 1")
        got = kv(w.ok("after v/0 0 0"))
        assert got == {"generation": "1", "value": "1"}
        w.err("after v/0 1 0", "ETIMEDOUT")
        w.err("after v/0 1 100", "ETIMEDOUT")
        # Through the event-loop operations: cancelled after 50 ms...
        w.err("async v/0 1 10000 cancel", "ECANCELED")
        # ...and woken by a newer generation (committed by c meanwhile).
        w.p.stdin.write("async v/0 1 10000\n")
        w.p.stdin.flush()
        c.ok("putmany v/ 1 4 2 replace")
        out = w.p.stdout.readline().strip()
        assert out == "ok generation=2 value=2", out
        # w's binding of the first version goes once the replace cleared it
        # (its watcher wakes, the release goes out within 1 ms).
        assert wait_until(lambda: kv(c.ok("stats"))["tensors"] == "1")
    finally:
        c.close()
        w.close()


def test_watch_reports_commits_in_order(daemon):
    c = Client(daemon.socket)
    w = Client(daemon.socket)
    try:
        w.p.stdin.write("watch ev/ 4 10000\n")
        w.p.stdin.flush()
        assert w.p.stdout.readline().strip() == "ok watching"
        c.ok("putmany ev/ 2 4 1")
        c.ok("putmany ev/ 1 4 2 replace")
        c.ok("unlink ev/1")
        out = w.p.stdout.readline().strip()
        assert re.fullmatch(r"ok published:ev/0:1 published:ev/1:1 published:ev/0:2 "
                            r"unlinked:ev/1:1", out), out
    finally:
        c.close()
        w.close()


def test_checkpoint_files_through_the_c_api(daemon, tmp_path):
    """tensord_put_file() and tensord_get_file_fd() (issue 34), so that the
    library's file paths also run in the AddressSanitizer suite: a file of the
    safetensors package in as one commit, the names block, a set out to a
    descriptor as .safetensors and one tensor as .npy, read back by numpy and
    the package; a short file refused with nothing published."""
    import json
    import struct

    import numpy as np
    import pytest
    st = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")
    want = {"b": np.arange(6, dtype=np.int32).reshape(2, 3), "a": np.ones(5, np.float64)}
    st.save_file(want, str(tmp_path / "in.safetensors"))
    c = Client(daemon.socket)
    try:
        got = kv(c.ok(f"putfile ck/ {tmp_path / 'in.safetensors'}"))
        assert got["n"] == "2" and got["first"] == "ck/a" and int(got["commit"]) > 0
        out = kv(c.ok(f"getfd ck/ {tmp_path / 'out.safetensors'} safetensors"))
        assert out == {"commit": got["commit"], "n": "2"}
        raw = (tmp_path / "out.safetensors").read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        assert json.loads(raw[8:8 + n])["__metadata__"]["tensord_commit"] == got["commit"]
        back = st.load_file(str(tmp_path / "out.safetensors"))
        for k, a in want.items():
            assert np.array_equal(back[k], a), k
        c.ok(f"getfd ck/b {tmp_path / 'b.npy'} npy")
        assert np.array_equal(np.load(tmp_path / "b.npy"), want["b"])
        c.err(f"putfile ck/ {tmp_path / 'in.safetensors'}", "EEXIST")
        assert int(kv(c.ok(f"putfile ck/ {tmp_path / 'in.safetensors'} replace"))["commit"]) > \
            int(got["commit"])
        (tmp_path / "cut.safetensors").write_bytes(raw[:-3])
        c.err(f"putfile cut/ {tmp_path / 'cut.safetensors'}", "EBADMSG")
        c.err("stat cut/a", "ENOENT")          # nothing of it published
        c.err("stat cut/b", "ENOENT")
        c.err(f"getfd none/ {tmp_path / 'none.safetensors'} safetensors", "ENOENT")
    finally:
        c.close()


def test_a_long_c_wait_goes_on_across_a_restart(daemon):
    """tensord_attach_after() without a timeout that waited longer than
    TENSORD_RECONNECT_MS before its daemon was killed still gets the grace
    in full (it runs from when the daemon stopped answering): it waits
    through 0.3 s without a daemon and takes the new daemon's version."""
    import os
    import signal
    import time
    w = Client(daemon.socket, env=dict(os.environ, TENSORD_RECONNECT_MS="2000"))
    c = Client(daemon.socket)
    try:
        c.ok("putmany v/ 1 4 1")
        w.p.stdin.write("after v/0 1 -1\n")
        w.p.stdin.flush()
        time.sleep(2.5)                 # longer than the grace
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        daemon.log.close()
        time.sleep(0.3)
        daemon.start()
        c.ok("putmany v/ 1 4 7")        # the new daemon's first version
        out = w.p.stdout.readline().strip()
        assert out == "ok generation=1 value=7", out
    finally:
        c.close()
        w.close()
