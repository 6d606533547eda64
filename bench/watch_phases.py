"""Where the time of publish -> watcher goes: the phase table of docs/design.md
("Publish -> watcher"), from the kernel's own timestamps.

The watch figure of bench/py_sets.py (put() start in this process -> watch()
returning the event in another, an attach round trip after each) runs while
`perf record` takes the scheduler's and the system calls' tracepoints of the
three processes (this one, the daemon's loop, the watcher's reader), on
CLOCK_MONOTONIC (-k mono), the clock of time.perf_counter_ns(). Each sample
is then cut into phases:

  put() start -> request sent        Python and the library (the writer's send)
  -> daemon reads it                 the daemon's wake-up, when it slept
  -> watch frame sent                the daemon's work: commit, queue, send
  -> watcher woken                   the kernel's wake-up of the reader
  -> watcher on a CPU                waiting for a CPU: an idle one waking, or
                                     whoever runs there
  -> its poll() returns
  -> Python has the event            the library's read, the Event object

With --vs BUILD, a second daemon (BUILD/tensord) and its own watcher (with
--vs-python, that PYTHONPATH's client library) run in the same perf session,
blocks of 50 samples alternating A B A B, so that both see the same load.

Needs perf, x86_64 (system call numbers), and the right to trace the whole
machine (root, or kernel.perf_event_paranoid <= -1); a measurement, not a
test. Starts its own daemon(s) from $TENSORD_BUILD (default build/):

    sudo PYTHONPATH=build/python python3 bench/watch_phases.py [--samples 400]
        [--vs OTHER/build [--vs-python OTHER/build/python]]
"""
import argparse
import bisect
import collections
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import py_sets as ps
import tensord
from benchutil import start_daemon

# x86_64 system call numbers
SENDTO, SENDMSG, RECVMSG, POLL = 44, 46, 47, 7

PHASES = ("put() start -> request sent", "-> daemon reads it (recvmsg)",
          "-> watch frame sent (sendmsg)", "-> watcher woken (sched_waking)",
          "-> watcher on a CPU", "-> its poll() returns", "-> Python has the event")


def start_side(build, python, tmp):
    os.environ["TENSORD_BUILD"] = build
    proc, sock = start_daemon(tmp)
    env_py = os.environ.get("PYTHONPATH")
    if python:
        os.environ["PYTHONPATH"] = python
    c = tensord.connect(sock)
    arr = np.zeros(1024, np.int64)
    c.put(ps.WATCHED, arr, replace=True)  # before the watch: no event of its own
    c.put(ps.RTT, arr, replace=True)
    g = c.put(ps.RTT, arr, replace=True)  # after= >= 1: a round trip
    w = ps.spawn("watcher", sock)
    if python:
        os.environ["PYTHONPATH"] = env_py or ""
    assert w.stdout.readline().strip() == "ready"
    return {"name": build, "proc": proc, "c": c, "w": w, "g": g, "arr": arr, "rows": [],
            "pids": {"daemon": ps.peer_pid(c), "watcher": w.pid, "writer": os.getpid()}}


def sample(sd, keep):
    c, w, arr = sd["c"], sd["w"], sd["arr"]
    t0 = time.perf_counter_ns()
    c.put(ps.WATCHED, arr, replace=True)
    t1 = time.perf_counter_ns()
    woken, held = map(int, w.stdout.readline().split())
    t2 = time.perf_counter_ns()
    c.attach(ps.RTT, after=sd["g"] - 1).release()
    t3 = time.perf_counter_ns()
    if keep:
        sd["rows"].append((t0, t1, woken, held, t2, t3))


LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def parse(text):
    ev = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            _, pid, tid, cpu, t, name, rest = m.groups()
            ev.append((int(round(float(t) * 1e9)), int(pid), int(tid), int(cpu), name, rest))
    ev.sort()
    return ev


def nr(rest):
    m = re.match(r"NR (\d+)", rest)
    return int(m.group(1)) if m else -1


def phases(sd, ev, ts):
    D, W, A = sd["pids"]["daemon"], sd["pids"]["watcher"], sd["pids"]["writer"]
    out = collections.defaultdict(list)
    notes = collections.Counter()
    for (t0, t1, woken, _, t2, t3) in sd["rows"]:
        st = {}
        for (t, pid, tid, cpu, name, rest) in ev[bisect.bisect_left(ts, t0):
                                                 bisect.bisect_right(ts, woken)]:
            enter = name == "raw_syscalls:sys_enter"
            if "sent" not in st:
                if tid == A and enter and nr(rest) in (SENDTO, SENDMSG):
                    st["sent"] = t
            elif "read" not in st:
                if name == "sched:sched_waking" and re.search(r" pid=%d " % D, rest):
                    st["daemon_slept"] = True
                if tid == D and enter and nr(rest) == RECVMSG:
                    st["read"] = t
            elif "waking" not in st:
                if tid == D and enter and nr(rest) == SENDMSG:
                    st["frame"] = t
                if name == "sched:sched_waking" and re.search(r" pid=%d " % W, rest):
                    st["waking"] = t
            elif "run" not in st:
                m = re.search(r"prev_pid=(\d+) .*next_pid=(\d+)", rest) \
                    if name == "sched:sched_switch" else None
                if m and int(m.group(2)) == W:
                    st["run"] = t
                    st["from_idle"] = m.group(1) == "0"
                elif m:
                    st.setdefault("others", set()).add(int(m.group(2)))
            elif tid == W and name == "raw_syscalls:sys_exit" and nr(rest) == POLL:
                st["poll"] = t
                break
        if not all(k in st for k in ("sent", "read", "frame", "waking", "run", "poll")):
            notes["samples not matched (left out)"] += 1
            continue
        marks = (t0, st["sent"], st["read"], st["frame"], st["waking"], st["run"], st["poll"],
                 woken)
        for k, name in enumerate(PHASES):
            out[name].append(marks[k + 1] - marks[k])
        out["total: put() start -> event"].append(woken - t0)
        out["(put() start -> put() returned)"].append(t1 - t0)
        out["(attach round trip)"].append(t3 - t2)
        notes["the daemon slept when the request came"] += "daemon_slept" in st
        notes["the watcher woke on an idle CPU"] += st["from_idle"]
        # Its other threads (alive still: the watcher is stopped after this).
        helpers = {p for p in st.get("others", ()) if p != W and
                   os.path.exists("/proc/%d/task/%d" % (W, p))}
        notes["another thread of the watcher's process ran before its reader"] += \
            bool(helpers)
    return out, notes


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--vs", help="a second build directory (its tensord), alternated")
    ap.add_argument("--vs-python", help="PYTHONPATH of the second side's watcher")
    ap.add_argument("--keep", help="a directory to keep perf's text and the stamps in")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if platform.machine() != "x86_64":
        sys.exit("watch_phases: x86_64 only (system call numbers)")
    if not shutil.which("perf"):
        sys.exit("watch_phases: perf not found")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    builds = [os.environ.get("TENSORD_BUILD") or os.path.join(here, "build")]
    pythons = [None]
    if args.vs:
        builds.append(os.path.abspath(args.vs))
        pythons.append(os.path.abspath(args.vs_python) if args.vs_python else None)
    tmp = tempfile.mkdtemp()
    sides = [start_side(b, p, tempfile.mkdtemp(dir=tmp)) for b, p in zip(builds, pythons)]
    for sd in sides:
        for _ in range(50):  # warm-up
            sample(sd, False)
    pids = sorted({p for sd in sides for p in sd["pids"].values()})
    filt = " || ".join("common_pid == %d" % p for p in pids)
    ctl, ack = os.path.join(tmp, "ctl"), os.path.join(tmp, "ack")
    os.mkfifo(ctl)
    os.mkfifo(ack)
    data = os.path.join(tmp, "perf.data")
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-k", "mono", "-D", "-1", "--control",
         "fifo:%s,%s" % (ctl, ack), "-o", data, "-e", "sched:sched_waking", "-e",
         "sched:sched_switch", "-e", "raw_syscalls:sys_enter", "--filter", filt, "-e",
         "raw_syscalls:sys_exit", "--filter", filt], stderr=subprocess.PIPE)
    with open(ctl, "w") as cf, open(ack) as af:
        cf.write("enable\n")
        cf.flush()
        if af.readline().strip() != "ack":
            sys.exit("watch_phases: perf did not start: %s" % perf.stderr.read().decode())
        for _ in range(max(1, args.samples // 50)):
            for sd in sides:
                for _ in range(10):
                    sample(sd, False)
                for _ in range(50):
                    sample(sd, True)
        cf.write("disable\n")
        cf.flush()
        af.readline()
    perf.send_signal(2)
    perf.wait()
    text = subprocess.run(["perf", "script", "-i", data, "-F",
                           "comm,pid,tid,cpu,time,event,trace", "--ns"],
                          capture_output=True, text=True).stdout
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        with open(os.path.join(args.keep, "perf.txt"), "w") as f:
            f.write(text)
        for k, sd in enumerate(sides):
            with open(os.path.join(args.keep, "side%d.json" % k), "w") as f:
                json.dump({"name": sd["name"], "pids": sd["pids"], "rows": sd["rows"]}, f)
    ev = parse(text)
    ts = [e[0] for e in ev]
    for sd in sides:
        out, notes = phases(sd, ev, ts)
        print("watch_phases: %s: %d samples (p50 / p90 / p99 us)" % (sd["name"],
                                                                      len(sd["rows"])))
        for name, v in out.items():
            print("  %-40s %7.1f %7.1f %7.1f" % (name, pct(v, .5) / 1e3, pct(v, .9) / 1e3,
                                                  pct(v, .99) / 1e3))
        for k, v in sorted(notes.items()):
            print("  %s: %d" % (k, v))
    for sd in sides:
        sd["w"].kill()
        sd["w"].wait()
        sd["c"].close()
        sd["proc"].terminate()
        sd["proc"].wait()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
