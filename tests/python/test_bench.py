"""The Python benchmarks in bench/ run and print their figures."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")


def test_py_attach_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_attach.py"), "--socket",
                        daemon.socket, "--seconds", "0.2", "--procs", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4
    assert re.match(r"py_attach: 1 client: +[\d,]+ attach\+from_dlpack\+release/s", lines[0])
    assert re.match(r"py_attach: tensord [\d.]+ us, SharedMemory\(name\)\+view\+close [\d.]+ us "
                    r".*: [\d.]+x shm$", lines[1])
    assert re.match(r"py_attach: kernel floor here: socket round trip [\d.]+ us, descriptor round "
                    r"trip [\d.]+ us, mmap\+touch\+munmap 4 KiB [\d.]+ us$", lines[2])
    assert re.match(r"py_attach: 2 clients: +[\d,]+ attach\+from_dlpack\+release/s", lines[3])


def test_py_put_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_put.py"), "--socket",
                        daemon.socket, "--sizes", "4K,2M", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for size in ("4 KiB", "2 MiB"):
        block = out[out.index("put %s" % size):]
        for name in ("memcpy", "shm", "put", "cfp"):
            assert re.search(r"^  %-8s +[\d.]+ us +[\d.]+ GB/s +[\d.]+x memcpy( +[\d.]+x \w+)*$"
                             % name, block, re.M), out
        assert re.search(r"^  cfp/put +[\d.]+x", block, re.M), out


def test_py_aio_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_aio.py"), "--socket",
                        daemon.socket, "--sizes", "64K,8M", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for size in ("64 KiB", "8 MiB"):
        assert re.search(r"^  %s +[\d.]+ +[\d.]+ +[\d.]+ ms +[\d.]+ ms$" % size, r.stdout,
                         re.M), r.stdout


def test_py_ray_transport_bench_runs(daemon):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_ray_transport.py"), "--socket",
                        daemon.socket, "--sizes", "1M", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if re.match(r"py_ray_transport: skipped \(.+\)$", r.stdout):
        pytest.skip(r.stdout.strip())
    assert re.search(r"^  1 MiB +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+x +[\d.]+x$", r.stdout,
                     re.M), r.stdout


def test_py_spin_bench_runs():
    """Every condition prints both cycles with the ratios, or says why the
    cpuset was skipped (the figures themselves are not asserted)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_spin.py"), "--rounds", "1",
                        "--seconds", "0.02", "--fixed"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.match(r"py_spin: us per cycle, medians of 1 interleaved rounds", out), out
    for cond in ("unpinned", "pinned", "cpuset", "hogs"):
        if cond == "cpuset" and re.search(r"^  cpuset +skipped: no cgroup cpuset could be made "
                                          r"\(.+\)$", out, re.M):
            continue
        for cycle in ("attach", "put 4K"):
            assert re.search(r"^  %s +%s +[\d.]+( +[\d.]+){4} +[\d.]+x +[\d.]+x$" % (cond, cycle),
                             out, re.M), out
    assert re.search(r"^ +the adaptive daemon polled: \d+ hit, \d+ missed, \d+ lost the CPU, "
                     r"\d+ back-offs; at the end 1 CPUs, budget 0 us$", out, re.M), out


def test_py_names_bench_runs():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_names.py"), "--names", "2000",
                        "--samples", "400", "--rounds", "2"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    assert re.match(r"py_names: 10 names: +attach p50 +[\d.]+ us +p99 +[\d.]+ us$", lines[0])
    assert re.match(r"py_names: p99 ratio [\d.]+ \(any of 2000 names / 10 names\).*"
                    r"daemon: \d+ descriptors, \d+ slabs, RSS \d+ MiB$", lines[2])


def test_py_gpu_async_bench_runs():
    """The fake-driver daemon's bench prints both rows and the ratios (the
    figures themselves are not asserted)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_gpu_async.py"), "--rounds", "2",
                        "--alloc-ms", "100"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  idle baseline: +median +[\d.]+ us, slowest +[\d.]+ us$", r.stdout,
                     re.M), r.stdout
    assert re.search(r"^  during the alloc: median +[\d.]+ us, slowest +[\d.]+ us "
                     r"\([\d.]+x / [\d.]+x the baseline\)$", r.stdout, re.M), r.stdout


def test_py_sets_bench_runs(daemon):
    """bench/py_sets.py --quick: every part runs and prints its figures (the
    figures and the targets met or missed are not asserted)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_sets.py"), "--socket",
                        daemon.socket, "--quick", "--no-ray"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    num = r"[\d.]+"
    for size in ("4 KiB", "64 KiB"):
        assert re.search(r"^py_sets: attach 16 x %s: attach_many +%s us, "
                         r"16 attach\+release +%s us: +%sx \(target >= 10x: (met|MISSED)\)$"
                         % (size, num, num, num), out, re.M), out
    for size in ("4 KiB", "64 KiB"):
        assert re.search(r"^py_sets: put 16 x %s: put_many +%s us, 16 put +%s us: +%sx "
                         r"\(target >= 2x: (met|MISSED)\)$" % (size, num, num, num), out,
                         re.M), out
    # The watch figure, unpinned and pinned (switched at run time, rounds alternating).
    for mode in ("unpinned", "pinned"):
        assert re.search(r"^py_sets: watch %s: put\(\) start -> watcher woken: p50 +%s us +p99 "
                         r"+%s us; -> watcher holds it: p50 +%s us +p99 +%s us; put\(\) "
                         r"returned: p50 +%s us$" % ((mode,) + (num,) * 5), out, re.M), out
        assert re.search(r"^py_sets: watch %s: attach round trip: p50 +%s us +p99 +%s us; "
                         r"woken p50 = %sx attach \(rounds: %s %s\) \(target <= 2x: "
                         r"(met|MISSED)\) \(40 samples each\)$" % ((mode,) + (num,) * 5), out,
                         re.M), out
        assert re.search(r"^py_sets: watch %s: floor: a byte to a process asleep in recv\(\) "
                         r"-> it wakes: p50 +%s us +p99 +%s us; woken p50 - floor p50 = +-?%s us$"
                         % ((mode,) + (num,) * 3), out, re.M), out
    assert re.search(r"^py_sets: weight sync 8 x 64 KiB \(512 KiB\), 3 commits, 3 readers", out,
                     re.M), out
    assert re.search(r"^  tensord  tx.put +%s / +%s ms; commit -> 3 hold it +%s / +%s ms; "
                     r"tx.put start +-> held +%s / +%s ms$" % ((num,) * 6), out, re.M), out
    assert "ray: skipped (--no-ray)" in out


def run_py_remote(*args, pythonpath=None, timeout=120):
    """bench/py_remote.py with a few small pulls and one of 1 MiB."""
    env = dict(os.environ)
    env.setdefault("TENSORD_BUILD", os.path.join(HERE, "..", "..", "build"))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath] + ([env["PYTHONPATH"]]
                                                            if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "py_remote.py"), "--small", "6",
                        "--rounds", "1", "--big", "1M"] + list(args), capture_output=True,
                       text=True, timeout=timeout, env=env)
    if "built without UCX" in r.stderr:
        pytest.skip("tensord was built without UCX")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "py_remote: 4 KiB remote attach (pull) p50" in r.stdout
    assert "py_remote: 1 MiB remote attach (pull)" in r.stdout
    return r.stdout


def test_py_remote_runs():
    """Two peered daemons, a few small pulls and one of 1 MiB: the lines print."""
    out = run_py_remote("--no-ray")
    assert "py_remote: ray: skipped (--no-ray)" in out
    assert "py_remote: ray 4 KiB" not in out


def test_py_remote_without_ray(tmp_path):
    """A ray that does not import: the Ray part is skipped with the reason,
    tensord's figures print all the same."""
    (tmp_path / "ray.py").write_text("raise ImportError('no ray in this test')\n")
    out = run_py_remote(pythonpath=str(tmp_path))
    assert "py_remote: ray: skipped (ray does not import: no ray in this test)" in out
    assert "py_remote: ray 4 KiB" not in out


def test_py_remote_ray_does_not_start():
    """Two raylets that cannot start (an object store below Ray's minimum):
    skipped with Ray's reason, tensord's figures all the same."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        pytest.skip("ray does not import here: %s" % e)
    out = run_py_remote("--ray-store", "4M")
    assert re.search(r"^py_remote: ray: skipped \(two raylets did not start: \w+: .*object store",
                     out, re.M), out
    assert "py_remote: ray 4 KiB" not in out


def test_py_remote_with_ray():
    """Two raylets next to the two daemons: the Ray lines print with their
    ratios, the check finds the objects crossed object stores, and no raylet
    is left behind."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        pytest.skip("ray does not import here: %s" % e)
    out = run_py_remote("--interleave", "2", "--ray-store", "256M", timeout=300)
    num = r"[\d.]+"
    assert re.search(r"^py_remote: ray 4 KiB get on node_b of an object put on node_a p50 %s us "
                     r"p99 %s us \(6 gets\): Ray / tensord p50 %sx$" % (num, num, num), out,
                     re.M), out
    assert re.search(r"^py_remote: 4 KiB p50 by round, tensord/Ray us: \d+/\d+ \d+/\d+$", out,
                     re.M), out
    assert re.search(r"^py_remote: ray check: .* of 3 fresh 4 KiB objects 3 on node_a alone "
                     r"before node_b's get, 3 on both after; .*: crosses object stores: yes$",
                     out, re.M), out
    assert re.search(r"^py_remote: ray 1 MiB get on node_b of an object put on node_a %s GB/s "
                     r"\(median of 1; .*on node_b after its get: 1 of 1\): tensord / Ray %sx$"
                     % (num, num), out, re.M), out
    gcs = re.search(r"^py_remote: ray [\w.]+: two raylets, GCS at (\S+), object stores of 256 "
                    r"MiB each$", out, re.M)
    assert gcs, out
    assert not ray_processes(gcs.group(1)), ray_processes(gcs.group(1))


def ray_processes(gcs):
    """The command lines of live processes that name this GCS address."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if gcs in cmd:
            found.append(cmd)
    return found


# What the benches that start Ray print (taken from real runs), for the plots
# test below, which runs the quick benches itself.
RAY_BENCH_LINES = """\
put 4 KiB (1 rounds x 2000, medians, gap 0 ms)
  memcpy          0.5 us      8.92 GB/s   1.00x memcpy
  shm            39.3 us      0.10 GB/s   0.01x memcpy
  put            13.3 us      0.31 GB/s   0.03x memcpy  79.14x ray
  cfp           215.5 us      0.02 GB/s   0.00x memcpy   4.89x ray
  ray          1054.5 us      0.00 GB/s   0.00x memcpy
  cfp/put   0.06x (create + fill + publish over put)
py_sets: weight sync 8 x 64 KiB (512 KiB), 3 commits, 3 readers (p50 / p99):
  tensord  tx.put       0.60 /     3.38 ms; commit -> 3 hold it    0.673 /    1.248 ms; \
tx.put start   -> held     1.85 /     4.00 ms
  ray      ray.put      1.80 /     3.21 ms; put    -> 3 hold it    5.466 /    5.838 ms; \
ray.put start  -> held     7.20 /     9.04 ms
py_ray_transport: producer actor -> consumer actor, consumer reads a float per 4 KiB page, \
medians of 9 interleaved rounds (ray 2.60.0, tensord socket /tmp/x/tensord.sock)
  size        tensord ms     store ms  store np ms   store/td      np/td
  64 MiB            23.9        357.1         20.5     14.92x      0.86x
  256 MiB           60.9       1330.6         56.6     21.83x      0.93x
"""
# What py_remote prints where UCX is (its formats; the figures made up).
REMOTE_LINES = """\
py_remote: 4 KiB remote attach (pull) p50 210.5 us p99 400.2 us (200 pulls)
py_remote: 4 KiB second attach of a live replica, new connection p50 30.1 us, a local tensor \
the same way 28.0 us: 1.08x (node-a asked 0 times, synced 0)
py_remote: ray 4 KiB get on node_b of an object put on node_a p50 900.0 us p99 1500.0 us \
(200 gets): Ray / tensord p50 4.3x
py_remote: 64 MiB remote attach (pull) 2.10 GB/s (median of 5; min 1.90, max 2.20)
py_remote: ray 64 MiB get on node_b of an object put on node_a 0.80 GB/s (median of 5; min \
0.70, max 0.90; on node_b after its get: 5 of 5): tensord / Ray 2.62x
"""


def test_plots_draw_what_the_benches_print(daemon, tmp_path):
    """bench/plots.py draws a chart per comparison from real bench output (the
    quick benches run here, the Ray ones as printed), names what it could not
    draw, and writes an HTML page that shows every chart."""
    import xml.etree.ElementTree as ET
    build = os.environ.get("TENSORD_BUILD") or os.path.join(HERE, "..", "..", "build")
    out = [subprocess.run([os.path.join(build, "bench", "attach_bench")], capture_output=True,
                          text=True, timeout=300, check=True).stdout]
    for cmd in (["py_attach.py", "--seconds", "0.2", "--procs", "2"],
                ["py_aio.py", "--sizes", "64K,8M", "--rounds", "1"]):
        out.append(subprocess.run([sys.executable, os.path.join(BENCH, cmd[0]), "--socket",
                                   daemon.socket] + cmd[1:], capture_output=True, text=True,
                                  timeout=300, check=True).stdout)
    log = tmp_path / "bench.txt"
    log.write_text("".join(out) + RAY_BENCH_LINES + REMOTE_LINES)
    r = subprocess.run([sys.executable, os.path.join(BENCH, "plots.py"), str(log),
                        str(tmp_path / "plots")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "plots: 9 charts, %s\n" % (tmp_path / "plots" / "index.html"), r.stdout
    page = (tmp_path / "plots" / "index.html").read_text()
    want = {"attach_c": ["cold, round trip", "warm, bound", "bare socket round trip"],
            "attach_py": ["tensord", "SharedMemory"],
            "put_bandwidth": ["memcpy", "put", "ray"],
            "weight_sync": ["tensord commit -&gt; held", "ray put -&gt; held"],
            "ray_transport": ["tensord transport", "object store, numpy"],
            "aio_put": ["inline", "offloaded"], "aio_stall": ["inline", "offloaded"]}
    for slug, series in want.items():
        assert '<img src="%s.svg"' % slug in page, slug
        text = (tmp_path / "plots" / (slug + ".svg")).read_text()
        root = ET.fromstring(text)  # well-formed
        bars = [el for el in root.iter("{http://www.w3.org/2000/svg}rect")
                if el.find("{http://www.w3.org/2000/svg}title") is not None]
        assert bars and all(float(b.get("width")) > 0 for b in bars), slug
        for s in series:
            assert s in text, (slug, s)
    assert "64 MiB, object store: 357 ms" in (tmp_path / "plots" / "ray_transport.svg").read_text()
    assert "4 KiB, ray get: 900 us" in (tmp_path / "plots" / "remote_attach.svg").read_text()
    assert "64 MiB, tensord pull: 2.1 GB/s" in \
        (tmp_path / "plots" / "remote_bandwidth.svg").read_text()

    # A bench that did not run (skipped, or left out) is named, on the page too.
    log.write_text(out[-1])  # py_aio's lines alone
    r = subprocess.run([sys.executable, os.path.join(BENCH, "plots.py"), str(log),
                        str(tmp_path / "few")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for bench in ("attach_bench", "py_attach", "py_put", "py_sets (weight sync)",
                  "py_ray_transport", "py_remote"):
        assert "plots: %s: not drawn (its figures are not in %s)" % (bench, log) in r.stdout
        assert "<b>%s</b>: not drawn" % bench in (tmp_path / "few" / "index.html").read_text()
    assert "plots: 2 charts" in r.stdout, r.stdout
