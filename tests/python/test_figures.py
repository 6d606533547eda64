"""The daemon's figures are declared once (daemon/figures.def, its per-uid rows
from daemon/base/quota.def) and every front end renders them from that one
collect: each figure of the table appears under the same name in the
Prometheus text (a family "tensord_" + name), in Python's stats() and in
`tensorctl stats --json`, and the dict and the JSON have one shape."""
import json
import os
import re
import subprocess

import numpy as np


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("TENSORD_BUILD") or os.path.join(ROOT, "build")
# Figures the daemon leaves out where it cannot know them (figures.def says so).
OPTIONAL = {"host_cgroup_shmem_bytes"}


def read(name):
    with open(os.path.join(ROOT, "daemon", name)) as f:
        return re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)


def table():
    """{name: scope} of every row of figures.def and quota.def."""
    rows = {m.group(2): m.group(3) for m in re.finditer(
        r"^(FIGURE|SERIES)\((\w+), \w+, (\w+),", read("figures.def"), re.M)}
    for m in re.finditer(r'QUOTA\(\w+, "[^"]*", \w+,\s*(?:"[^"]*"\s*)+,\s*(\w+),',
                         read(os.path.join("base", "quota.def"))):
        rows[m.group(1)] = "UID"
    return rows


def test_every_figure_has_its_row_in_operating_md():
    """figures.def's header counts a new figure as three files: its row, the
    line that counts it, and its row in docs/operating.md's "Metrics" table.
    The third is checked here, with quota.def's per-uid rows."""
    with open(os.path.join(ROOT, "docs", "operating.md")) as f:
        documented = set(re.findall(r"^\| `(\w+)` \|", f.read(), re.M))
    rows = table()
    assert len(rows) >= 30 and "remote_pulls" in rows, rows
    missing = sorted(set(rows) - documented)
    assert not missing, f"docs/operating.md has no row for {missing}"


def names_in(stats):
    """The figures a stats() dict (or tensorctl's JSON) shows, by scope."""
    seen = {("DAEMON", k) for k in stats if k not in ("devices", "uids")}
    seen |= {("DEVICE", k) for d in stats["devices"] for k in d
             if k not in ("device", "backend", "path")}
    seen |= {("UID", k) for u in stats["uids"] for k in u if k != "uid"}
    return seen


def shape(v):
    """A value with its numbers replaced by their types: what two reads share."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(x) for x in v]
    return type(v).__name__


def ctl_json(daemon):
    r = subprocess.run([os.path.join(BUILD, "tensorctl"), "--socket", daemon.socket, "stats",
                        "--json"], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(r.stdout)


def test_every_figure_has_one_name_in_prometheus_stats_and_tensorctl_json(daemon, client):
    client.put("fig/a", np.ones(1000, np.float32))
    with client.attach("fig/a"):
        rows = table()
        assert len(rows) >= 30 and "uid_pinned_bytes" in rows, rows
        families = set(re.findall(r"^# TYPE tensord_(\w+) ", client.metrics(), re.M))
        py, js = client.stats(), ctl_json(daemon)
        want = {(scope, name) for name, scope in rows.items()}
        for where, got in (("stats()", names_in(py)), ("tensorctl --json", names_in(js)),
                           ("prometheus", {(rows.get(n, "?"), n) for n in families})):
            missing = {w for w in want - got if w[1] not in OPTIONAL}
            assert not missing, f"{where} lacks {sorted(missing)}"
            assert got <= want, f"{where} shows figures not in the table: {sorted(got - want)}"
        for name in OPTIONAL:      # absent everywhere or present everywhere
            assert (name in py) == (name in js) == (name in families), name
        # One shape: the same keys at every level, the same kinds of numbers.
        assert shape(py) == shape(js)
        assert py["daemon_pid"] == js["daemon_pid"] == daemon.pid
        assert py["devices"][0]["device_capacity_bytes"] == \
            js["devices"][0]["device_capacity_bytes"] > 0
        mine = {u["uid"]: u for u in py["uids"]}[os.geteuid()]
        assert mine["uid_tensors"] >= 1 and mine["uid_owned_bytes"] >= 4000, mine
        assert isinstance(py["uptime_seconds"], float)
        assert py["requests_total"]["attach"] >= 1
        assert py["attach_duration_seconds"]["count"] >= 1
        assert py["attach_duration_seconds"]["buckets"]["+Inf"] == \
            py["attach_duration_seconds"]["count"]


def test_a_daemon_figure_is_the_same_number_in_every_front_end(daemon, client):
    """Counted once: after a known number of puts, the figure reads the same
    in stats(), the JSON and the Prometheus text."""
    for i in range(3):
        client.put(f"fig/n{i}", np.zeros(4, np.uint8))
    text = client.metrics()
    m = re.search(r'^tensord_device_tensors\{device="cpu",backend="host",path="memfd",'
                  r'state="published"\} (\d+)$', text, re.M)
    assert m, text[:2000]
    py, js = client.stats(), ctl_json(daemon)
    for s in (py, js):
        [cpu] = [d for d in s["devices"] if d["device"] == "cpu"]
        assert cpu["device_tensors"]["published"] == 3 == int(m.group(1)), cpu
        assert s["tensors"] == 3


def test_the_legacy_c_structs_are_filled_from_the_figures(daemon, client):
    """tensord_stats() and tensord_uid_usage() fill their fixed structs by
    figure name: a C client (tests/integration/tdclient.c) reads what
    stats() says."""
    client.put("fig/c", np.zeros(4096, np.uint8))
    tool = subprocess.Popen([os.path.join(BUILD, "tests", "helpers", "tdclient")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, _ = tool.communicate(f"connect {daemon.socket}\nstats\nexit\n", timeout=60)
    lines = out.splitlines()
    assert lines[0].startswith("ok") and lines[1].startswith("ok "), out
    got = dict(kv.split("=", 1) for kv in lines[1][3:].split())
    py = client.stats()
    [cpu] = [d for d in py["devices"] if d["device"] == "cpu"]
    assert int(got["tensors"]) == py["tensors"] == 1
    assert int(got["used"]) == cpu["device_used_bytes"] > 0
    assert int(got["capacity"]) == cpu["device_capacity_bytes"]
    assert int(got["dev_tensors"]) == sum(cpu["device_tensors"].values()) == 1
    assert int(got["pool_budget"]) == py["host_pool_budget_bytes"]
    assert int(got["pid"]) == py["daemon_pid"] == daemon.pid


def test_attach_many_members_are_timed_from_their_request(daemon):
    """Each member of an attach_many counts in attach_duration_seconds, timed
    from the AttachMany request (it once was timed from the last single
    attach, or from 0 on the monotonic clock: hours a member)."""
    import time
    import tensord
    with tensord.connect(daemon.socket) as w, tensord.connect(daemon.socket) as r:
        w.put_many({"tm/a": np.ones(1000, np.float32), "tm/b": np.ones(10, np.float32)})
        before = r.stats()["attach_duration_seconds"]
        start = time.monotonic()
        for _ in range(3):
            for t in r.attach_many(["tm/a", "tm/b"]).values():
                t.release()
        elapsed = time.monotonic() - start
        after = r.stats()["attach_duration_seconds"]
    assert after["count"] - before["count"] == 6
    # Six members served within `elapsed`: each took at most that long.
    assert 0 < after["sum"] - before["sum"] <= 6 * elapsed, (before, after, elapsed)
