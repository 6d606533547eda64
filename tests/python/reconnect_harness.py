"""What the reconnect tests share (test_reconnect*.py): a daemon killed and
started again on its socket, empty or restored through a holder."""
import signal
import subprocess
import time

import pytest

from tdutil import wait_until


def restart(d, down_s=0.0):
    """kill -9 of daemon d, then a new one on the same socket after down_s."""
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    time.sleep(down_s)
    d.start()


@pytest.fixture
def rd(request, daemon_factory, tmp_path):
    """The daemon restart() kills and starts again: a plain one, which comes
    back empty (another lineage), or with BOTH also one that comes back
    through a holder (tensord --hold, docs/restart.md) with its tensors,
    generations and commit ids (the same lineage)."""
    if getattr(request, "param", "empty") == "empty":
        yield daemon_factory(sub="r")
        return
    import subprocess
    from sdharness import build_path
    hold = tmp_path / "hold"
    with open(tmp_path / "holder.log", "ab") as log:
        holder = subprocess.Popen([build_path("tensord"), "--hold", str(hold)], stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: (hold / "take").exists(), timeout=10), "no holder"
        d = daemon_factory("--holder", str(hold), sub="r")
        yield d
        d.stop()
    finally:
        holder.terminate()
        assert holder.wait(timeout=30) == 0


# Tests that hold whichever daemon comes back: run with both.
BOTH = pytest.mark.parametrize("rd", ["empty", "restored"], indirect=True)


def lineage(c):
    return c._restart_state()[1]
