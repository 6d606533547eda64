"""deploy/grafana/tensord.json asks only for what the daemon exports: every
metric its queries name is a row of the figures table (daemon/figures.def,
daemon/base/quota.def) and a family of a live daemon's Prometheus text,
and every label a query selects, groups by or shows is one that metric has
(its scope's, its own, le for a histogram's buckets, and the instance and
job labels Prometheus adds when it scrapes)."""
import json
import os
import re

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "tensord.json")
SCOPE_LABELS = {"DAEMON": set(), "DEVICE": {"device", "backend", "path"}, "UID": {"uid"}}
SCRAPE_LABELS = {"instance", "job"}
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def read(name):
    with open(os.path.join(ROOT, "daemon", name)) as f:
        return re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)


def table():
    """{family: (type, labels)} of every row of figures.def and quota.def."""
    rows = {}
    text = read("figures.def")
    for m in re.finditer(r"^FIGURE\((\w+), (\w+), (\w+),", text, re.M):
        rows["tensord_" + m.group(1)] = (m.group(2), set(SCOPE_LABELS[m.group(3)]))
    for m in re.finditer(r"^SERIES\((\w+), (\w+), (\w+), \w+, \w+,\s*(?:LABELS\(([^)]*)\)|NO_LABELS)",
                         text, re.M):
        own = set(re.findall(r'"(\w+)"', m.group(4) or ""))
        rows["tensord_" + m.group(1)] = (m.group(2), SCOPE_LABELS[m.group(3)] | own)
    for m in re.finditer(r'QUOTA\(\w+, "[^"]*", \w+,\s*(?:"[^"]*"\s*)+,\s*(\w+),',
                         read(os.path.join("base", "quota.def"))):
        rows["tensord_" + m.group(1)] = ("GAUGE", {"uid"})
    return rows


def queries(dash):
    """(where, expr, legend) of every panel target (rows' panels too) and variable."""
    out = []

    def panels(ps):
        for p in ps:
            for t in p.get("targets", []):
                out.append(("panel %r" % p["title"], t["expr"], t.get("legendFormat", "")))
            panels(p.get("panels", []))

    panels(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            out.append(("variable %r" % v["name"], v["definition"], ""))
    return out


def family(name, rows):
    """The figure a metric name belongs to (a histogram's _bucket to its family)."""
    if name in rows:
        return name
    for part in HISTOGRAM_PARTS:
        if name.endswith(part) and rows.get(name[:-len(part)], ("",))[0] == "HISTOGRAM":
            return name[:-len(part)]
    return None


def test_every_query_names_exported_metrics_and_their_labels(client):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    rows = table()
    assert len(rows) >= 60 and "tensord_uid_bytes" in rows, sorted(rows)
    client.put("graf/a", np.ones(1000, np.float32))
    with client.attach("graf/a"):
        text = client.metrics()
    exported = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))
    live = {}  # family -> label names of its samples in the live text
    for m in re.finditer(r"^(\w+)(?:\{([^}]*)\})? ", text, re.M):
        live.setdefault(m.group(1), set()).update(re.findall(r"(\w+)=", m.group(2) or ""))

    found = queries(dash)
    assert len(found) >= 40, len(found)
    used = set()
    for where, expr, legend in found:
        names = set(re.findall(r"\b(tensord_\w+)", expr))
        assert names, "%s: %r names no tensord metric" % (where, expr)
        allowed = set(SCRAPE_LABELS)
        for name in names:
            fam = family(name, rows)
            assert fam, "%s: %s is no figure of daemon/figures.def or quota.def" % (where, name)
            assert fam in exported, "%s: the daemon's metrics have no family %s" % (where, fam)
            assert exported[fam] == rows[fam][0].lower(), (where, fam, exported[fam])
            labels = rows[fam][1] | ({"le"} if name.endswith("_bucket") else set())
            if name in live:  # what the daemon wrote is what the table says
                assert live[name] <= labels, (where, name, live[name], labels)
            allowed |= labels
            used.add(fam)
        for sel in re.findall(r"\{([^}]*)\}", re.sub(r"\{\{\w+\}\}", "", expr)):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", sel):
                assert label in allowed, "%s: %r selects %s, which %s lack" % (
                    where, expr, label, sorted(names))
        grouped = set()
        for _, ls in re.findall(r"\b(by|without)\s*\(([^)]*)\)", expr):
            for label in re.findall(r"\w+", ls):
                assert label in allowed, "%s: %r groups by %s, which %s lack" % (
                    where, expr, label, sorted(names))
                grouped.add(label)
        shown = set(re.findall(r"\{\{(\w+)\}\}", legend))
        assert shown <= (grouped - {"le"} if grouped else allowed - {"le"}), \
            "%s: legend %r shows labels %r does not keep" % (where, legend, expr)
    # The dashboard covers the figures an operator watches first.
    for must in ("tensord_clients", "tensord_requests_total", "tensord_errors_total",
                 "tensord_attach_duration_seconds", "tensord_device_used_bytes",
                 "tensord_uid_bytes", "tensord_peer_up"):
        assert must in used, must


def test_the_dashboard_is_well_formed():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}
