"""Recycled memory from threads (docs/recycle.md): two threads of one C
client put new versions of 1 MiB and 16 MiB names (ring buffers cycling,
the copy pool sharing the 16 MiB copies, idle buffers given back by the
flusher after 50 ms) while two threads of another client attach them.
Each tensor a reader attaches must be whole and never older than one it
saw before; afterwards the daemon holds no lease and no free ring buffer.
Also run under ASan/UBSan and TSan (make test-asan, make test-tsan)."""
import os
import subprocess

from conftest import build_path, wait_until


def test_threads_put_recycled_versions_while_others_attach(daemon):
    env = dict(os.environ, TENSORD_RECYCLE_IDLE_MS="50")
    r = subprocess.run([build_path("tests", "helpers", "ring_stress"), daemon.socket, "3"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.split()[1:])
    assert r.stdout.startswith("ok ") and int(fields["puts"]) > 20, r.stdout
    assert int(fields["attaches"]) > 20, r.stdout
    s = daemon.stats()
    assert s["host_ring_hits_total"] > 0, s
    assert wait_until(lambda: daemon.stats()["leases"] == 0), daemon.stats()
    assert wait_until(lambda: daemon.stats()["host_ring_buffers"] == 0), daemon.stats()
