"""Polling never hurts: attach and 4 KiB put cycles, adaptive polling next to none.

For each condition, a daemon and a client process per variant are started
unconfined: "adaptive" (TENSORD_SPIN_US unset), "off" (TENSORD_SPIN_US=0),
and "off'" again, whose distance to "off" shows the noise of the machine;
with --fixed, "fixed50" polls a fixed 50 us (TENSORD_SPIN_US=50: what
polling did before it adapted, for a process confined after start-up).
Then the condition is applied to every one of them, and the cycles are
timed in interleaved rounds (A B C, C B A, ...); the figures are medians of
the rounds, in microseconds per cycle.

  unpinned  nothing changes
  pinned    every thread of each client and daemon confined to one CPU
            (sched_setaffinity, the first this script may use) after they
            started
  cpuset    each client and daemon moved into a new cgroup cpuset, whose
            CPUs are then narrowed to that CPU (only as root, with a
            writable cpuset hierarchy: v2, or v1 at /sys/fs/cgroup/cpuset;
            else skipped, saying why)
  hogs      a busy-looping process on every CPU (each confined to its own)

The attach cycle is attach + numpy.from_dlpack + release of a 4 KiB
tensor, each attach a round trip (TENSORD_BIND=0: a repeat attach is
otherwise served in the process, docs/design.md "Attach without a round
trip", and polls nothing); the put cycle is put(replace=True) of 4 KiB. Beside them, the
kernel floor: a bare Unix-socket round trip (16 bytes) between two Python
processes that sleep in recv(), under the same condition. The ratio
adaptive/off above 1 would mean polling hurt (beyond the noise off'/off).
Then what the adaptive daemon's polls did (its poll_* figures). Prints
figures, asserts nothing about time.

    PYTHONPATH=build/python python3 bench/py_spin.py [--rounds 21] [--seconds 0.1]
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

# Polling is what is measured: every attach a round trip (see above).
os.environ["TENSORD_BIND"] = "0"

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "bench/py_spin"
SIZE = 4096


# --- the processes measured ---------------------------------------------------------

def worker(sock):
    """A client process: answers "attach S" / "put S" on stdin with the mean
    seconds per cycle over about S seconds."""
    import numpy as np
    import tensord

    c = tensord.connect(sock)
    src = np.ones(SIZE // 4, np.float32)
    c.put(NAME, src, lifetime="connection")

    def attach():
        t = c.attach(NAME)
        np.from_dlpack(t)
        t.release()

    def put():
        c.put(NAME, src, replace=True, lifetime="connection")

    cycles = {"attach": attach, "put": put}
    print("ready", flush=True)
    for line in sys.stdin:
        what, secs = line.split()
        fn = cycles[what]
        n, t0 = 0, time.perf_counter()
        end = t0 + float(secs)
        while True:
            for _ in range(64):
                fn()
            n += 64
            now = time.perf_counter()
            if now >= end:
                break
        print((now - t0) / n, flush=True)
    c.close()


def floor():
    """The kernel floor: answers "floor S" with the seconds per bare round trip
    to an echo child over a Unix stream socket. First line: the child's pid."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        while True:
            m = b.recv(16)
            if not m:
                os._exit(0)
            b.sendall(m)
    b.close()
    print(pid, flush=True)
    msg = b"x" * 16
    for line in sys.stdin:
        secs = float(line.split()[1])
        n, t0 = 0, time.perf_counter()
        end = t0 + secs
        while True:
            for _ in range(64):
                a.sendall(msg)
                a.recv(16)
            n += 64
            now = time.perf_counter()
            if now >= end:
                break
        print((now - t0) / n, flush=True)
    a.close()
    os.waitpid(pid, 0)


class Proc:
    """One measured process that takes commands on stdin and answers a line each."""

    def __init__(self, args, env):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.first = self.p.stdout.readline().strip()
        if not self.first:
            sys.exit("py_spin: a measured process did not start")

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def stop(self):
        self.p.stdin.close()
        self.p.wait()


# The second "off" measures the noise: the same variant, its own daemon and client.
VARIANTS = [("adaptive", None), ("off", "0"), ("off'", "0")]


def start_variant(tmp, spin):
    """A daemon and a client process, both with TENSORD_SPIN_US=spin (None: unset)."""
    sys.path.insert(0, HERE)
    from benchutil import start_daemon

    env = dict(os.environ)
    env.pop("TENSORD_SPIN_US", None)
    if spin is not None:
        env["TENSORD_SPIN_US"] = spin
    d = tempfile.mkdtemp(dir=tmp)
    saved = os.environ.get("TENSORD_SPIN_US")
    os.environ.pop("TENSORD_SPIN_US", None)
    if spin is not None:
        os.environ["TENSORD_SPIN_US"] = spin
    try:
        daemon, sock = start_daemon(d)
    finally:
        os.environ.pop("TENSORD_SPIN_US", None)
        if saved is not None:
            os.environ["TENSORD_SPIN_US"] = saved
    client = Proc(["--worker", sock], env)
    return daemon, sock, client


# --- conditions -------------------------------------------------------------------------

def tids(pid):
    try:
        return [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return [pid]


def confine(pids, cpus):
    """Every thread of each process onto cpus (taskset -a -p)."""
    for pid in pids:
        for t in tids(pid):
            try:
                os.sched_setaffinity(t, cpus)
            except OSError:
                pass


def all_cpus():
    """The CPUs this script may use: what it confines to, hogs and counts."""
    return set(os.sched_getaffinity(0))


def first_cpu():
    return min(all_cpus())


def read(path):
    with open(path) as f:
        return f.read().strip()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Cpuset:
    """A cgroup cpuset of our own: v2 where the unified hierarchy offers the
    controller, else v1. Raises OSError (with the reason) where neither can
    be made."""

    def __init__(self):
        if os.geteuid() != 0:
            raise OSError("not root")
        errors = []
        for make in (self._v2, self._v1):
            try:
                make()
                return
            except OSError as e:
                errors.append(str(e))
        raise OSError("; ".join(errors))

    def _v2(self):
        root = None
        for line in open("/proc/self/mounts"):
            f = line.split()
            if f[2] == "cgroup2":
                root = f[1]
                break
        if not root:
            raise OSError("no cgroup v2 mount")
        if "cpuset" not in read(os.path.join(root, "cgroup.controllers")).split():
            raise OSError("cgroup v2 at %s offers no cpuset controller" % root)
        if "cpuset" not in read(os.path.join(root, "cgroup.subtree_control")).split():
            write(os.path.join(root, "cgroup.subtree_control"), "+cpuset")
        self.parent = root
        self.path = os.path.join(root, "tensord-bench-%d" % os.getpid())
        os.mkdir(self.path)
        self.kind = "cgroup v2"

    def _v1(self):
        root = "/sys/fs/cgroup/cpuset"
        if not os.path.exists(os.path.join(root, "cpuset.cpus")):
            raise OSError("no cgroup v1 cpuset hierarchy at %s" % root)
        self.parent = root
        self.path = os.path.join(root, "tensord-bench-%d" % os.getpid())
        os.mkdir(self.path)
        try:
            write(os.path.join(self.path, "cpuset.mems"), read(os.path.join(root, "cpuset.mems")))
            write(os.path.join(self.path, "cpuset.cpus"), read(os.path.join(root, "cpuset.cpus")))
        except OSError:
            os.rmdir(self.path)
            raise
        self.kind = "cgroup v1"

    def enter(self, pids):
        """Moves pids in (unconfined), then narrows the set to one CPU: a
        cpuset change after start-up."""
        for pid in pids:
            write(os.path.join(self.path, "cgroup.procs"), str(pid))
        write(os.path.join(self.path, "cpuset.cpus"), str(first_cpu()))

    def leave(self, pids):
        for pid in pids:
            try:
                write(os.path.join(self.parent, "cgroup.procs"), str(pid))
            except OSError:
                pass  # gone
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def hogs():
    out = []
    for cpu in sorted(all_cpus()):
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(p.pid, {cpu})
        out.append(p)
    return out


# --- the run ----------------------------------------------------------------------

def measure(cond, args, tmp):
    """Runs one condition; returns {(workload, variant): median seconds}, the
    adaptive daemon's poll figures over the condition, and a note. Raises
    OSError for a cpuset that cannot be made, before starting anything."""
    import tensord

    cs = Cpuset() if cond == "cpuset" else None
    started, hs, pids, fl = [], [], [], None
    try:
        for name, spin in VARIANTS:
            started.append((name,) + start_variant(tmp, spin))
        fl = Proc(["--floor"], dict(os.environ))
        pids = [fl.p.pid, int(fl.first)]
        for _, daemon, _, client in started:
            pids += [daemon.pid, client.p.pid]
        for _, _, _, client in started:  # warm up, unconfined
            client.ask("attach 0.1")
            client.ask("put 0.1")
        adaptive_sock = started[0][2]
        with tensord.connect(adaptive_sock) as c:
            before = c.stats()
        note = ""
        if cond == "pinned":
            confine(pids, {first_cpu()})
        elif cond == "cpuset":
            cs.enter(pids)
            note = cs.kind
        elif cond == "hogs":
            hs = hogs()
            note = "%d hogs" % len(hs)
        times = {}
        for r in range(args.rounds):
            times.setdefault(("floor", ""), []).append(fl.ask("floor %g" % args.seconds))
            # A B C, then C B A: a drift in the machine's load favours none.
            for work in ("attach", "put"):
                for name, _, _, client in started[::-1] if r % 2 else started:
                    times.setdefault((work, name), []).append(
                        client.ask("%s %g" % (work, args.seconds)))
        with tensord.connect(adaptive_sock) as c:
            after = c.stats()
    finally:
        for h in hs:
            h.kill()
            h.wait()
        if cs:
            cs.leave(pids)
        if fl:
            fl.stop()
        for _, daemon, _, client in started:
            client.stop()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
    polls = {k: after.get(k, 0) - before.get(k, 0)
             for k in ("poll_hits_total", "poll_misses_total", "poll_lost_total",
                       "poll_backoffs_total")}
    polls["budget"] = after.get("poll_budget_seconds")
    polls["cpus"] = after.get("poll_cpus")
    return {k: statistics.median(v) for k, v in times.items()}, polls, note


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--seconds", type=float, default=0.1, help="per round and variant")
    ap.add_argument("--fixed", action="store_true",
                    help="add a daemon and client polling a fixed 50 us (TENSORD_SPIN_US=50)")
    ap.add_argument("--conditions", default="unpinned,pinned,cpuset,hogs")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.floor:
        return floor()
    if args.fixed:
        VARIANTS.append(("fixed50", "50"))

    names = [n for n, _ in VARIANTS]
    print("py_spin: us per cycle, medians of %d interleaved rounds of %g s; %d CPUs. "
          "adaptive/off above 1: polling hurt; off'/off: the same variant twice, the noise" %
          (args.rounds, args.seconds, len(all_cpus())))
    print("  %-9s %-7s %6s" % ("condition", "cycle", "floor") +
          "".join(" %8s" % n for n in names) + " %12s %8s" % ("adaptive/off", "off'/off"))
    with tempfile.TemporaryDirectory() as tmp:
        for cond in args.conditions.split(","):
            try:
                med, polls, note = measure(cond, args, tmp)
            except OSError as e:
                if cond != "cpuset":
                    raise
                print("  %-9s skipped: no cgroup cpuset could be made (%s)" % (cond, e))
                continue
            for work, label in (("attach", "attach"), ("put", "put 4K")):
                off = med[(work, "off")]
                print("  %-9s %-7s %6.1f" % (cond, label, med[("floor", "")] * 1e6) +
                      "".join(" %8.1f" % (med[(work, n)] * 1e6) for n in names) +
                      " %11.2fx %7.2fx" % (med[(work, "adaptive")] / off,
                                           med[(work, "off'")] / off))
            budget = polls["budget"]
            print("  %-9s the adaptive daemon polled: %d hit, %d missed, %d lost the CPU, "
                  "%d back-offs; at the end %s CPUs, budget %s us%s" % (
                      "", polls["poll_hits_total"], polls["poll_misses_total"],
                      polls["poll_lost_total"], polls["poll_backoffs_total"],
                      polls["cpus"], "?" if budget is None else "%g" % (budget * 1e6),
                      " (%s)" % note if note else ""))


if __name__ == "__main__":
    main()
