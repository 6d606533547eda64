"""Leases re-adopted while other threads of the same client take and end
theirs (docs/restart.md, 0.3): three threads of one C client
(readopt_stress.c) attach, hold and release tensors of a daemon that keeps
its store in a holder, while the daemon is killed and started again three
times. Every tensor stays whole while held, through every restart; the
client's leases move to each new daemon; once it is done the daemon holds
none. Also run under ASan/UBSan and TSan (make test-asan, make test-tsan)."""
import subprocess
import time

import numpy as np

from conftest import build_path, wait_until
from test_remote import tensord  # the build's Python module, found as test_remote finds it

NAMES = 8


def test_threads_take_and_end_leases_while_the_daemon_restarts(daemon_factory, holder):
    d = daemon_factory("--holder", str(holder), sub="r")
    with tensord.Client(d.socket) as c:
        for k in range(NAMES):
            # Slab tensors and memory of their own, by turns.
            c.put(f"ro/{k}", np.full(512 if k % 2 == 0 else 1 << 16, k, np.int64),
                  mode=0o644)
    stress = subprocess.Popen([build_path("tests", "helpers", "readopt_stress"), d.socket,
                               "8", str(NAMES)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    readopted = 0
    for _ in range(3):
        time.sleep(1.5)
        d.proc.kill()
        d.proc.wait()
        d.log.close()
        d.start()
        # The stress's leases come back: its threads hold some at every instant.
        assert wait_until(lambda: d.stats()["restart_readopted_leases_total"] > 0,
                          timeout=20), d.read_log()[-2000:]
        readopted += d.stats()["restart_readopted_leases_total"]
    out, _ = stress.communicate(timeout=120)
    assert stress.returncode == 0 and out.startswith("ok "), out
    fields = dict(kv.split("=") for kv in out.split()[1:])
    assert int(fields["attaches"]) > 100, out
    assert readopted >= 3
    assert wait_until(lambda: d.stats()["leases"] == 0, timeout=20), d.stats()
    d.stop()
