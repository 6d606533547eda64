"""deploy/demo.sh, what `make run` runs: it uses a daemon that already
serves the socket (and leaves it running), and Ctrl-C in a terminal ends it
with status 0 and no "make: *** Error"."""
import os
import pty
import signal
import subprocess
import sys
import time

from conftest import BUILD, build_path, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "deploy", "demo.sh")


def demo_env(socket):
    return dict(os.environ, TENSORD_SOCKET=socket, PYTHON=sys.executable)


def test_demo_uses_a_running_daemon_and_leaves_it_running(daemon):
    for run in range(2):   # the second run finds the first run's tensor
        r = subprocess.run(["bash", DEMO, BUILD], env=demo_env(daemon.socket),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"run {run}: {r.stdout}\n{r.stderr}"
        assert f"a tensord already serves {daemon.socket}: using it" in r.stdout
        assert "round trip ok" in r.stdout
        assert "tensord stopped" not in r.stdout
        assert f"export PATH={BUILD}:$PATH" in r.stdout and "make install" in r.stdout
        assert daemon.alive()
    st = subprocess.run([build_path("tensorctl"), "--socket", daemon.socket, "stat",
                         "demo/inputs/0"], capture_output=True, text=True)
    assert st.returncode == 0 and "published" in st.stdout


def test_ctrl_c_in_make_run_ends_cleanly(tmp_path):
    """make runs the demo on a terminal; Ctrl-C reaches the whole foreground
    process group, as a terminal sends it."""
    sock = str(tmp_path / "tensord.sock")
    mk = tmp_path / "Makefile"
    mk.write_text(f"run:\n\t@bash {DEMO} {BUILD}\n")
    master, slave = pty.openpty()
    p = subprocess.Popen(["make", "-f", str(mk), "run"], stdin=slave, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=demo_env(sock), start_new_session=True,
                         text=True)
    os.close(slave)
    try:
        out = []
        for line in p.stdout:
            out.append(line)
            if "Ctrl-C stops it" in line:
                break
        assert any("Ctrl-C stops it" in x for x in out), "".join(out)
        os.killpg(p.pid, signal.SIGINT)
        t0 = time.monotonic()
        out.append(p.stdout.read())
        p.wait(timeout=20)
        assert time.monotonic() - t0 < 20
    finally:
        os.close(master)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = "".join(out)
    assert "*** " not in text, text      # no "make: *** [run] Error 1" / "Interrupt"
    assert "== tensord stopped" in text, text
    assert wait_until(lambda: not os.path.exists(sock)), "the daemon removed its socket"


def test_demo_without_a_terminal_stops_its_daemon_and_says_so(tmp_path):
    """make run in a pipe or CI: no Ctrl-C to wait for, so the demo stops
    the daemon it started and exits 0, saying why; the README says both."""
    sock = str(tmp_path / "tensord.sock")
    r = subprocess.run(["bash", DEMO, BUILD], env=demo_env(sock), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "round trip ok" in r.stdout
    assert "== no terminal (or TENSORD_DEMO_EXIT=1): the demo ends" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("== tensord stopped"), r.stdout
    rc = subprocess.run([build_path("tensorctl"), "--socket", sock, "stats"],
                        capture_output=True).returncode
    assert rc == 1, "the demo's daemon is gone"
    readme = open(os.path.join(ROOT, "README.md")).read()
    run = readme[readme.index("make run    #"):readme.index("make test   #")]
    assert "Ctrl-C" in run and "without one" in run and "TENSORD_DEMO_EXIT=1" in run, run
