"""Attach without a round trip, from threads (docs/design.md, "Attach without
a round trip"): three threads of one C client attach and release names
served from bindings while another connection of the process replaces and
unlinks them, so the fast path, the watcher thread, idle expiry and sweeps
run at once. Each tensor a reader attaches must be whole and never older
than one it saw before; afterwards the daemon holds no lease. Also run
under ASan/UBSan and TSan (make test-asan, make test-tsan)."""
import subprocess

from conftest import build_path, wait_until


def test_threads_attach_while_names_move_on(daemon):
    r = subprocess.run([build_path("tests", "helpers", "bind_stress"), daemon.socket, "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.split()[1:])
    assert r.stdout.startswith("ok ") and int(fields["attaches"]) > 1000, r.stdout
    assert int(fields["versions"]) > 100, r.stdout
    assert wait_until(lambda: daemon.stats()["leases"] == 0), daemon.stats()
    s = daemon.stats()
    assert s["bindings_total"] > 0 and s["bindings_cleared_total"] > 0, s
