"""Draws the comparisons `make bench` printed as SVG bar charts, with an HTML
page that shows them: latency and bandwidth next to the peers (attach, put,
weight sync, the Ray hand-off, remote attach, asyncio).

    python3 bench/plots.py BENCH_OUTPUT.txt OUT_DIR

BENCH_OUTPUT.txt is what the benches printed (`make bench` writes
build/bench/bench.txt and runs this into build/bench/plots/). Each chart
comes from the lines one bench prints; a bench whose lines are not there
(skipped, or not run) is named with the reason, and the rest are drawn.
The SVG is written here, with no plotting library (the project's
environment has no matplotlib), so the charts need nothing installed.
"""
import html
import math
import os
import re
import sys

NUM = r"([\d.]+)"


class Chart:
    """A grouped bar chart: groups (e.g. sizes) down the page, one bar per series."""

    def __init__(self, slug, title, unit, note, log=False, better="lower"):
        self.slug, self.title, self.unit, self.note = slug, title, unit, note
        self.log, self.better = log, better
        self.groups = []   # group labels, in order
        self.series = []   # series names, in order
        self.values = {}   # (group, series) -> value

    def add(self, group, series, value):
        if group not in self.groups:
            self.groups.append(group)
        if series not in self.series:
            self.series.append(series)
        self.values[(group, series)] = float(value)

    def __bool__(self):
        return bool(self.values)


# --- what the benches print ----------------------------------------------------------------

def attach_c(text):
    c = Chart("attach_c", "C attach + release, p50", "us",
              "build/bench/attach_bench: one attach and release, cold (descriptor + mmap) "
              "and warm, by a round trip or from a binding; the bare Unix-socket round "
              "trip beside it", log=True)
    m = re.search(r"^bare unix-socket round trip +p50 +" + NUM + " us", text, re.M)
    for m2 in re.finditer(r"^attach\+release (\S+ \S+) (cold|warm) \(([\w ]+)\) +p50 +" + NUM +
                          " us", text, re.M):
        c.add(m2.group(1), "%s, %s" % (m2.group(2), m2.group(3)), m2.group(4))
        if m:
            c.add(m2.group(1), "bare socket round trip", m.group(1))
    return c


def attach_py(text):
    c = Chart("attach_py", "Python attach cycle next to SharedMemory", "us",
              "bench/py_attach.py: attach + np.from_dlpack + release, next to "
              "SharedMemory(name) + view + close")
    m = re.search(r"^py_attach: tensord " + NUM + r" us, SharedMemory\(name\)\+view\+close " +
                  NUM + " us", text, re.M)
    if m:
        c.add("one cycle", "tensord", m.group(1))
        c.add("one cycle", "SharedMemory", m.group(2))
    return c


def put_py(text):
    bw = Chart("put_bandwidth", "Python put, bandwidth", "GB/s",
               "bench/py_put.py: a new tensor from an array (put), next to np.copyto into "
               "warm memory (memcpy), SharedMemory create + copy, create + fill + publish "
               "(cfp), and ray.put; first run printed", log=True, better="higher")
    for block in re.finditer(r"^put (\d+ [KMG]iB) \(.*?\)\n((?:  .*\n?)+)", text, re.M):
        size = block.group(1)
        if size in bw.groups:
            continue  # a later run of the same size (pinned, then unpinned): the first
        for m in re.finditer(r"^  ([\w/]+) +" + NUM + " us +" + NUM + " GB/s", block.group(2),
                             re.M):
            bw.add(size, m.group(1), m.group(3))
    return bw


def weight_sync(text):
    c = Chart("weight_sync", "Weight sync: a commit to three readers, p50", "ms",
              "bench/py_sets.py --parts sync: the writer publishes a set, three reader "
              "processes hold it; tensord next to ray.put / ray.get", log=True)
    for m in re.finditer(r"^py_sets: weight sync (.+?), \d+ commits, (\d+) readers.*\n"
                         r"  tensord .*?commit -> \d+ hold it +" + NUM + r" /.*?-> held +" + NUM +
                         r" /.*\n  ray .*?put +-> \d+ hold it +" + NUM + r" /.*?-> held +" + NUM,
                         text, re.M):
        g = m.group(1)
        if g in c.groups:
            continue
        c.add(g, "tensord commit -> held", m.group(3))
        c.add(g, "tensord publish start -> held", m.group(4))
        c.add(g, "ray put -> held", m.group(5))
        c.add(g, "ray put start -> held", m.group(6))
    return c


def ray_transport(text):
    c = Chart("ray_transport", "Ray actor to actor: a torch tensor", "ms",
              "bench/py_ray_transport.py: tensord's tensor transport next to Ray's object "
              "store (the torch tensor pickled; tensor.numpy() zero-copy)", log=True)
    head = re.search(r"^py_ray_transport: .*\n.*\n((?:  \d+ [KMG]iB .*\n?)+)", text, re.M)
    if head:
        for m in re.finditer(r"^  (\d+ [KMG]iB) +" + NUM + " +" + NUM + " +" + NUM, head.group(1),
                             re.M):
            c.add(m.group(1), "tensord transport", m.group(2))
            c.add(m.group(1), "object store", m.group(3))
            c.add(m.group(1), "object store, numpy", m.group(4))
    return c


def aio(text):
    lat = Chart("aio_put", "asyncio: await put()", "us",
                "bench/py_aio.py: the caller's latency, the copy inline on the loop "
                "or on the client's worker thread", log=True)
    stall = Chart("aio_stall", "asyncio: the loop's longest stall during puts", "ms",
                  "bench/py_aio.py: the longest gap a 1 ms ticker task saw", log=True)
    head = re.search(r"^py_aio: .*\n.*\n((?:  \d+ [KMG]iB .*\n?)+)", text, re.M)
    if head:
        for m in re.finditer(r"^  (\d+ [KMG]iB) +" + NUM + " +" + NUM + " +" + NUM + " ms +" +
                             NUM + " ms", head.group(1), re.M):
            lat.add(m.group(1), "inline", m.group(2))
            lat.add(m.group(1), "offloaded", m.group(3))
            stall.add(m.group(1), "inline", m.group(4))
            stall.add(m.group(1), "offloaded", m.group(5))
    return [lat, stall]


def remote(text):
    lat = Chart("remote_attach", "Remote attach (another node's tensor), 4 KiB p50", "us",
                "bench/py_remote.py: two daemons peered over TCP loopback, next to Ray's "
                "get of an object put on the other raylet", log=True)
    bw = Chart("remote_bandwidth", "Remote attach, bandwidth", "GB/s",
               "bench/py_remote.py: a large tensor pulled from the peer, next to Ray",
               better="higher")
    m = re.search(r"^py_remote: 4 KiB remote attach \(pull\) p50 " + NUM, text, re.M)
    if m:
        lat.add("4 KiB", "tensord pull", m.group(1))
    m = re.search(r"^py_remote: 4 KiB second attach of a live replica, new connection p50 " + NUM +
                  " us, a local tensor the same way " + NUM, text, re.M)
    if m:
        lat.add("4 KiB", "tensord replica", m.group(1))
        lat.add("4 KiB", "tensord local tensor", m.group(2))
    m = re.search(r"^py_remote: ray 4 KiB get .*? p50 " + NUM, text, re.M)
    if m:
        lat.add("4 KiB", "ray get", m.group(1))
    for m in re.finditer(r"^py_remote: (\d+) MiB remote attach \(pull\) " + NUM + " GB/s", text,
                         re.M):
        bw.add("%s MiB" % m.group(1), "tensord pull", m.group(2))
    for m in re.finditer(r"^py_remote: ray (\d+) MiB get .*? " + NUM + " GB/s", text, re.M):
        bw.add("%s MiB" % m.group(1), "ray get", m.group(2))
    return [lat, bw]


SOURCES = [("attach_bench", attach_c), ("py_attach", attach_py), ("py_put", put_py),
           ("py_sets (weight sync)", weight_sync), ("py_ray_transport", ray_transport),
           ("py_aio", aio), ("py_remote", remote)]


def charts(text):
    """[(bench, [Chart...])] of everything the text holds."""
    out = []
    for name, parse in SOURCES:
        got = parse(text)
        out.append((name, [c for c in (got if isinstance(got, list) else [got]) if c]))
    return out


# --- SVG -----------------------------------------------------------------------------------

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f"]


def fmt(v):
    return ("%.3g" % v) if v < 1000 else "{:,.0f}".format(v)


def svg(c):
    """The chart as an SVG document: horizontal bars, a group per block."""
    bar, gap, left, right, top = 16, 10, 150, 90, 48
    width = 760
    plot = width - left - right
    n = len(c.groups) * (len(c.series) * bar + gap)
    legend_h = 18 * len(c.series)
    height = top + n + 30 + legend_h
    vals = [v for v in c.values.values() if v > 0]
    hi = max(vals) if vals else 1.0
    lo = min(vals) if vals else 1.0
    if c.log and lo < hi:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        b = max(b, a + 1)

        def x(v):
            return plot * (math.log10(max(v, 10.0 ** a)) - a) / (b - a)
        ticks = [10.0 ** k for k in range(a, b + 1)]
    else:
        def x(v):
            return plot * v / hi
        ticks = [hi * k / 4 for k in range(5)]
    e = html.escape
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<text x="10" y="20" font-size="15" font-weight="bold">%s</text>' % e(c.title),
           '<text x="10" y="38" fill="#555">%s, %s is better%s</text>'
           % (e(c.unit), c.better, ", log scale" if c.log and lo < hi else "")]
    for t in ticks:
        tx = left + x(t)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   % (tx, top - 4, tx, top + n))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>'
                   % (tx, top + n + 14, fmt(t)))
    y = top
    for g in c.groups:
        out.append('<text x="%d" y="%d" text-anchor="end" font-weight="bold">%s</text>'
                   % (left - 8, y + bar * len(c.series) / 2 + 4, e(g)))
        for i, s in enumerate(c.series):
            v = c.values.get((g, s))
            if v is not None:
                w = max(1.0, x(v))
                out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s">'
                           '<title>%s, %s: %s %s</title></rect>'
                           % (left, y, w, bar - 2, COLOURS[i % len(COLOURS)], e(g), e(s),
                              fmt(v), e(c.unit)))
                out.append('<text x="%.1f" y="%d">%s</text>' % (left + w + 4, y + bar - 5, fmt(v)))
            y += bar
        y += gap
    y = top + n + 30
    for i, s in enumerate(c.series):
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>'
                   % (left, y, COLOURS[i % len(COLOURS)]))
        out.append('<text x="%d" y="%d">%s</text>' % (left + 18, y + 10, e(s)))
        y += 18
    out.append("</svg>")
    return "\n".join(out) + "\n"


def page(found, source):
    e = html.escape
    parts = ["<!doctype html>", "<html><head><meta charset=\"utf-8\"><title>tensord benchmarks"
             "</title><style>body{font-family:sans-serif;max-width:800px;margin:2em auto}"
             "figure{margin:2em 0}figcaption{color:#555}</style></head><body>",
             "<h1>tensord benchmarks</h1>",
             "<p>Drawn by bench/plots.py from %s.</p>" % e(source)]
    for bench, cs in found:
        if not cs:
            parts.append("<p><b>%s</b>: not drawn (its figures are not in the output: "
                         "skipped or not run).</p>" % e(bench))
        for c in cs:
            parts.append('<figure><img src="%s.svg" alt="%s"><figcaption>%s</figcaption></figure>'
                         % (c.slug, e(c.title), e(c.note)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: plots.py BENCH_OUTPUT.txt OUT_DIR")
    with open(argv[1]) as f:
        text = f.read()
    os.makedirs(argv[2], exist_ok=True)
    found = charts(text)
    drawn = 0
    for bench, cs in found:
        if not cs:
            print("plots: %s: not drawn (its figures are not in %s)" % (bench, argv[1]))
        for c in cs:
            with open(os.path.join(argv[2], c.slug + ".svg"), "w") as f:
                f.write(svg(c))
            drawn += 1
    with open(os.path.join(argv[2], "index.html"), "w") as f:
        f.write(page(found, argv[1]))
    print("plots: %d charts, %s" % (drawn, os.path.join(argv[2], "index.html")))


if __name__ == "__main__":
    main(sys.argv)
