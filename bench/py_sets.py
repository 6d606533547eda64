"""Sets, versions and watches from Python, each next to its baseline in one run.

Four measurements (sync in two forms); in each, one round runs every variant once, in turn
(A B A B ...), and the medians of the rounds are printed with their ratio:

  attach   attach_many of 256 names (+ the releases) vs 256 attach() +
           release(), 4 KiB and 64 KiB tensors             (target >= 10x)
  put      put_many of 256 tensors (replace=True: one commit) vs 256
           put(replace=True), 4 KiB and 64 KiB  (target >= 2x at 64 KiB)
  watch    a watcher in another process: from the writer's put() start to
           watch() returning the event there (and to the watcher holding
           the new tensor), p50/p99, each sample next to one attach round
           trip (attach(after=): always a request) and the floor under it
           (a byte to a process asleep in recv(), its wake-up), A B C A B C;
           unpinned and pinned to one CPU (the daemon, the watcher and this
           process, every thread, switched at run time by rounds), medians,
           p99 and the ratio woken / round trip        (target <= 2x)
  sync     weight sync: one writer republishes 256 x 4 MiB float32 (1 GiB)
           as one commit, 20 times; three reader processes wait for each
           next commit (attach_many(prefix, after=last)) and hold the new
           set, dropping the old. Reported: the commit returning -> all
           three holding it (p50/p99), and publish start -> all three
           holding it. Next to it, the same hand-off with Ray (ray.put of
           the dict of arrays; three actors given the ObjectRef), when ray
           imports (skipped with the reason if not)        (target >= 2x Ray)

  sync --sync-dict linear16   issue 32's hand-off: a state dict of 16 x
           nn.Linear(2048, 2048) float32 (32 tensors, 256 MiB), one version
           a step, put_many(dict, replace=True), to --readers processes that
           loop attach_many(names, after=last commit), check every member's
           marker (element [0], set to the step before the put; a set whose
           members disagree counts as mixed: must be 0) and hold the set until
           the next. Publish start -> all readers hold it, medians over
           --commits steps after --warmup, one step of each variant per round
           (order rotated): tensord (default env: recycled where the library
           recycles), the same with TENSORD_RECYCLE=0 in the writer (sealed),
           torch.multiprocessing (a fresh clone().share_memory_() of the
           state dict each step, through an mp.Queue to each reader; --no-mp)
           and Ray (ray.put of the dict of numpy arrays, actors given the
           ObjectRef). --pss then samples every 10 ms, over a few untimed
           steps per variant, the summed Pss (writer, readers, daemon or what
           ray started) and the memory the hand-off holds (the same without
           the writer's own memory, each shared file counted once, whole: a
           daemon's unmapped version shows in no Pss); peaks, next to Ray's,
           and where each summed peak was, by process. Twice: first with this
           process as every variant's writer (shared writer: its Pss holds
           torch, ray's client, the model and what every variant left
           behind), then with one writer process per variant, as a user's
           trainer: for each in turn a fresh process (--role writer16) with
           torch, the model and that variant alone (its readers; a fresh
           private daemon for tensord; a ray of its own, ray.init(address=
           "local"), shut down at its end), its warm-up steps, then the same
           untimed steps sampled: that writer, every process under it, and
           the daemon. Issue 32's target (peak Pss <= 0.7x Ray's) is judged
           on the second.

Timestamps cross processes as time.perf_counter_ns() values (CLOCK_MONOTONIC,
one clock for the machine). Pin with `taskset -c 0` to see round trips
without cross-CPU wake-ups (the daemon and the processes this starts inherit
the affinity).

Uses the daemon at --socket (or $TENSORD_SOCKET); with neither, starts its
own from $TENSORD_BUILD (default: build/) on a temporary socket.

    PYTHONPATH=build/python python3 bench/py_sets.py [--parts attach,cold,put,watch,sync]
        [--rounds 7] [--quick] [--no-ray]
    PYTHONPATH=build/python python3 bench/py_sets.py --parts sync --sync-dict linear16
        [--commits 20] [--warmup 3] [--readers 3] [--no-mp] [--pss]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import tensord
from benchutil import connect_env, daemon_socket, start_daemon

HERE = os.path.dirname(os.path.abspath(__file__))


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def interleaved(variants, rounds, reps):
    """Median seconds per call of each variant, A B A B ... by rounds."""
    for _, fn in variants:  # warm-up
        fn()
    times = {name: [] for name, _ in variants}
    for _ in range(rounds):
        for name, fn in variants:
            times[name].append(timed(fn, reps))
    return {name: statistics.median(ts) for name, ts in times.items()}


def verdict(ok):
    return "met" if ok else "MISSED"


# --- 1. attach_many vs single attaches ----------------------------------------------------

def bench_attach(c, n, size, rounds, reps):
    prefix = "bench/sets/attach/%d/" % size
    names = ["%s%04d" % (prefix, i) for i in range(n)]
    c.put_many({x: np.ones(size // 4, np.float32) for x in names}, replace=True)

    def many():
        s = c.attach_many(names)
        for t in s.values():
            t.release()

    def singles():
        for x in names:
            c.attach(x).release()

    m = interleaved([("many", many), ("single", singles)], rounds, reps)
    ratio = m["single"] / m["many"]
    print("py_sets: attach %d x %s: attach_many %8.1f us, %d attach+release %8.1f us: "
          "%5.1fx (target >= 10x: %s)" % (n, human(size), m["many"] * 1e6, n,
                                           m["single"] * 1e6, ratio, verdict(ratio >= 10)),
          flush=True)
    for x in names:
        c.unlink(x)


# --- 1b. a cold reader of a big set: one allocation vs one per member ---------------------

def bench_cold(c, sock, n, size, rounds):
    """Issue 32's set target, on the host: a reader that has mapped nothing
    of a set (a fresh client) attaching all n members, against one cold
    single attach. The set put by put_many lies in one allocation (one
    descriptor, one mapping); sealed=True gives each member its own (the
    layout before sets in one allocation)."""
    sets = {}
    for kind, sealed in (("one", False), ("per-member", True)):
        names = ["bench/sets/cold/%s/%04d" % (kind, i) for i in range(n)]
        c.put_many({x: np.ones(size // 4, np.float32) for x in names}, sealed=sealed)
        sets[kind] = names

    def cold(names):
        with tensord.connect(sock) as r:
            t0 = time.perf_counter()
            s = r.attach_many(names) if len(names) > 1 else {0: r.attach(names[0])}
            dt = time.perf_counter() - t0
            for t in s.values():
                t.release()
        return dt

    times = {k: [] for k in ("one", "per-member", "single")}
    for _ in range(max(rounds, 5)):   # A B C A B C
        times["one"].append(cold(sets["one"]))
        times["per-member"].append(cold(sets["per-member"]))
        times["single"].append(cold(sets["one"][n // 2:n // 2 + 1]))
    m = {k: statistics.median(v) for k, v in times.items()}
    ratio = m["one"] / m["single"]
    print("py_sets: cold attach_many of %d x %s: one allocation %8.1f us, one per member "
          "%8.1f us (%4.1fx faster); one cold single attach %6.1f us: set/single %4.1fx "
          "(target <= 3x: %s)" % (n, human(size), m["one"] * 1e6, m["per-member"] * 1e6,
                                  m["per-member"] / m["one"], m["single"] * 1e6, ratio,
                                  verdict(ratio <= 3)), flush=True)
    for names in sets.values():
        for x in names:
            c.unlink(x)


# --- 2. put_many vs puts ------------------------------------------------------------------

def bench_put(c, n, size, rounds, reps):
    a = {"bench/sets/putmany/%04d" % i: np.ones(size // 4, np.float32) for i in range(n)}
    b = {"bench/sets/puts/%04d" % i: np.ones(size // 4, np.float32) for i in range(n)}

    def many():
        c.put_many(a, replace=True)

    def singles():
        for x, arr in b.items():
            c.put(x, arr, replace=True)

    m = interleaved([("many", many), ("single", singles)], rounds, reps)
    ratio = m["single"] / m["many"]
    print("py_sets: put %d x %s: put_many %8.1f us, %d put %8.1f us: %5.1fx "
          "(target >= 2x: %s)" % (n, human(size), m["many"] * 1e6, n, m["single"] * 1e6,
                                  ratio, verdict(ratio >= 2)), flush=True)
    for x in list(a) + list(b):
        c.unlink(x)


# --- 3. publish -> watcher woken ----------------------------------------------------------

WATCHED = "bench/sets/watch/x"
RTT = "bench/sets/watch/rtt"


def role_watcher(sock):
    """Another process: for each event, stamps its arrival and the moment it
    holds the new tensor; answers "woken held" on stdout. A line "pin CPUS"
    on stdin (CPUS: a comma list) sets every thread's affinity and answers
    "pinned"."""
    import threading

    def pins():
        for line in sys.stdin:
            if line.startswith("pin "):
                set_affinity(os.getpid(), cpu_set(line.split()[1]))
                print("pinned", flush=True)

    with tensord.connect(sock) as c:
        with c.watch(WATCHED) as w:
            threading.Thread(target=pins, daemon=True).start()
            print("ready", flush=True)
            for ev in w:
                woken = time.perf_counter_ns()
                if ev.kind != "published":
                    continue
                with c.attach(WATCHED, after=ev.generation - 1):
                    held = time.perf_counter_ns()
                print(woken, held, flush=True)


def role_sleeper(fd):
    """Another process, the floor under the watcher: sleeps in recv() on a
    Unix socket; for each byte, stamps its arrival and answers on stdout
    (as the watcher does). "pin CPUS" on stdin as for the watcher."""
    import socket
    import threading

    def pins():
        for line in sys.stdin:
            if line.startswith("pin "):
                set_affinity(os.getpid(), cpu_set(line.split()[1]))
                print("pinned", flush=True)

    s = socket.socket(fileno=int(fd))
    threading.Thread(target=pins, daemon=True).start()
    print("ready", flush=True)
    while s.recv(1):
        print(time.perf_counter_ns(), 0, flush=True)


def cpu_set(spec):
    return {int(x) for x in spec.split(",")}


def set_affinity(pid, cpus):
    """Every thread of pid onto cpus (a thread's affinity is its own)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def peer_pid(c):
    """The daemon's pid, from the connection's peer credentials."""
    import socket
    import struct
    s = socket.socket(fileno=os.dup(c.fileno()))
    try:
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     12))
    finally:
        s.close()
    return pid


def spawn(role, sock, *extra, pass_fds=()):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                             "--socket", sock] + [str(x) for x in extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            pass_fds=pass_fds)


def bench_watch(c, sock, rounds, samples, modes):
    """put() start in this process -> the event returned by watch() in another,
    each sample next to one attach round trip (attach(after=) always asks the
    daemon: no binding serves it), A B A B. modes: "unpinned" and/or "pinned"
    (the daemon, the watcher and this process on CPU 0, every thread, switched
    at run time, so that the two alternate round by round in one run)."""
    arr = np.zeros(1024, np.int64)  # 8 KiB: an inline put
    c.put(WATCHED, arr, replace=True)
    c.put(RTT, np.zeros(1024, np.int64), replace=True)
    g_rtt = c.put(RTT, np.zeros(1024, np.int64), replace=True)  # after= >= 1: a round trip
    import socket
    w = spawn("watcher", sock)
    near, far = socket.socketpair()
    z = spawn("sleeper", sock, far.fileno(), pass_fds=(far.fileno(),))
    far.close()
    for p in (w, z):
        assert p.stdout.readline().strip() == "ready"
    pids = {"daemon": peer_pid(c), "writer": os.getpid()}
    every = os.sched_getaffinity(0)  # "unpinned": what this process was given

    def pin(cpus):
        for who in ("daemon", "writer"):
            set_affinity(pids[who], cpus)
        for p in (w, z):
            p.stdin.write("pin %s\n" % ",".join(map(str, sorted(cpus))))
            p.stdin.flush()
            assert p.stdout.readline().strip() == "pinned"

    daemon_cpus = os.sched_getaffinity(pids["daemon"])  # given back at the end
    if "pinned" in modes:
        try:
            set_affinity(pids["daemon"], daemon_cpus)
        except PermissionError as e:
            print("py_sets: watch pinned: skipped (%s)" % e)
            modes = [m for m in modes if m != "pinned"]
    keys = ("woken", "held", "returned", "rtt", "bare")
    res = {m: dict({k: [] for k in keys}, ratio=[]) for m in modes}

    def wake_once(r):
        t0 = time.perf_counter_ns()
        c.put(WATCHED, arr, replace=True)
        t1 = time.perf_counter_ns()
        a, b = map(int, w.stdout.readline().split())
        r["returned"].append(t1 - t0)
        r["woken"].append(a - t0)
        r["held"].append(b - t0)

    def rtt_once(r):
        t0 = time.perf_counter_ns()
        c.attach(RTT, after=g_rtt - 1).release()
        r["rtt"].append(time.perf_counter_ns() - t0)

    def bare_once(r):
        t0 = time.perf_counter_ns()
        near.send(b"x")
        r["bare"].append(int(z.stdout.readline().split()[0]) - t0)

    scratch = {k: [] for k in keys}
    for _ in range(rounds):
        for m in modes:
            pin({min(every)} if m == "pinned" else every)
            for _ in range(20):  # warm-up: the polling budgets see the new affinity
                wake_once(scratch)
                rtt_once(scratch)
                bare_once(scratch)
            r = res[m]
            n0 = len(r["woken"])
            for _ in range(samples):
                wake_once(r)
                rtt_once(r)
                bare_once(r)
            r["ratio"].append(statistics.median(r["woken"][n0:]) /
                              statistics.median(r["rtt"][n0:]))
    pin(every)
    if "pinned" in modes:
        set_affinity(pids["daemon"], daemon_cpus)
    near.close()
    for p in (w, z):
        p.stdin.close()
        p.kill()
        p.wait()

    def us(r, k, q):
        return pct(r[k], q) / 1e3

    for m in modes:
        r = res[m]
        ratio = pct(r["woken"], 0.5) / pct(r["rtt"], 0.5)
        print("py_sets: watch %s: put() start -> watcher woken: p50 %6.1f us  p99 %7.1f us; "
              "-> watcher holds it: p50 %6.1f us  p99 %7.1f us; put() returned: p50 %6.1f us"
              % (m, us(r, "woken", .5), us(r, "woken", .99), us(r, "held", .5),
                 us(r, "held", .99), us(r, "returned", .5)), flush=True)
        print("py_sets: watch %s: attach round trip: p50 %6.1f us  p99 %7.1f us; woken p50 = "
              "%.2fx attach (rounds: %s) (target <= 2x: %s) (%d samples each)" %
              (m, us(r, "rtt", .5), us(r, "rtt", .99), ratio,
               " ".join("%.2f" % x for x in r["ratio"]), verdict(ratio <= 2), len(r["rtt"])),
              flush=True)
        print("py_sets: watch %s: floor: a byte to a process asleep in recv() -> it wakes: "
              "p50 %6.1f us  p99 %7.1f us; woken p50 - floor p50 = %6.1f us" %
              (m, us(r, "bare", .5), us(r, "bare", .99), us(r, "woken", .5) - us(r, "bare", .5)),
              flush=True)
    c.unlink(WATCHED)
    c.unlink(RTT)


# --- 4. weight sync -----------------------------------------------------------------------

SYNC = "bench/sets/sync/"


def role_reader(sock, n):
    """Another process: waits for each next commit of the set, holds it (the old
    set released at once), answers "commit held_ns" on stdout."""
    n = int(n)
    last, cur = 0, {}
    with tensord.connect(sock) as c:
        print("ready", flush=True)
        while True:
            try:
                s = c.attach_many(SYNC, after=last, timeout=1)
            except tensord.TimedOutError:
                continue
            held = time.perf_counter_ns()
            for t in cur.values():   # promptly: each set is 1 GiB
                t.release()
            cur = s
            commits = {t.commit for t in s.values()}
            assert len(s) == n and len(commits) == 1, (len(s), commits)
            last = commits.pop()
            print(last, held, flush=True)


def ray_reader_class():
    import ray

    @ray.remote(num_cpus=0)
    class Reader:
        def __init__(self):
            self.cur = None

        def take(self, state):  # the ObjectRef is resolved before the call runs
            held = time.perf_counter_ns()
            self.cur = state    # holds the new set; the old one goes
            assert len(state) > 0
            return held

        def drop(self):
            self.cur = None

    return Reader


def bench_sync(c, sock, n, size, commits, readers, use_ray):
    names = ["%s%04d" % (SYNC, i) for i in range(n)]
    src = {x: np.ones(size // 4, np.float32) for x in names}
    total = n * size
    procs = [spawn("reader", sock, n) for _ in range(readers)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    actors = []
    if use_ray:
        import ray
        Reader = ray_reader_class()
        actors = [Reader.remote() for _ in range(readers)]
        ray.get([a.drop.remote() for a in actors])
    res = {"td_pub": [], "td_hand": [], "td_e2e": [], "ray_pub": [], "ray_hand": [],
           "ray_e2e": []}

    def td_once(k):
        for a in src.values():
            a[0] = k  # marks the version (untimed)
        # Staged in a transaction (the copies), then the commit alone: the readers
        # may hold the set before commit() returns, so the hand-off is timed from
        # the commit request, as Ray's from ray.put() returning.
        t0 = time.perf_counter_ns()
        tx = c.transaction()
        for x, a in src.items():
            tx.put(x, a, replace=True)
        t1 = time.perf_counter_ns()
        commit = tx.commit()
        held = []
        for p in procs:
            got, ns = map(int, p.stdout.readline().split())
            assert got == commit, (got, commit)
            held.append(ns)
        return t1 - t0, max(held) - t1, max(held) - t0

    def ray_once(k):
        import ray
        for a in src.values():
            a[0] = k
        t0 = time.perf_counter_ns()
        ref = ray.put(src)
        t1 = time.perf_counter_ns()
        held = ray.get([a.take.remote(ref) for a in actors])
        del ref
        return t1 - t0, max(held) - t1, max(held) - t0

    td_once(-1)  # warm-up: first-touch costs of the pool, the store, the actors
    if use_ray:
        ray_once(-1)
    for k in range(commits):
        for key, v in zip(("td_pub", "td_hand", "td_e2e"), td_once(k)):
            res[key].append(v)
        if use_ray:
            for key, v in zip(("ray_pub", "ray_hand", "ray_e2e"), ray_once(k)):
                res[key].append(v)
    for p in procs:
        p.kill()
        p.wait()
    if use_ray:
        import ray
        ray.get([a.drop.remote() for a in actors])
        for a in actors:
            ray.kill(a)

    def ms(key, q):
        return pct(res[key], q) / 1e6

    print("py_sets: weight sync %d x %s (%s), %d commits, %d readers (p50 / p99):" %
          (n, human(size), human(total), commits, readers))
    print("  tensord  tx.put   %8.2f / %8.2f ms; commit -> %d hold it %8.3f / %8.3f ms; "
          "tx.put start   -> held %8.2f / %8.2f ms" %
          (ms("td_pub", .5), ms("td_pub", .99), readers, ms("td_hand", .5),
           ms("td_hand", .99), ms("td_e2e", .5), ms("td_e2e", .99)))
    if use_ray:
        print("  ray      ray.put  %8.2f / %8.2f ms; put    -> %d hold it %8.3f / %8.3f ms; "
              "ray.put start  -> held %8.2f / %8.2f ms" %
              (ms("ray_pub", .5), ms("ray_pub", .99), readers, ms("ray_hand", .5),
               ms("ray_hand", .99), ms("ray_e2e", .5), ms("ray_e2e", .99)))
        hand = ms("ray_hand", .5) / ms("td_hand", .5)
        e2e = ms("ray_e2e", .5) / ms("td_e2e", .5)
        print("  ratio    hand-off p50 %.1fx Ray (target >= 2x: %s); publish start -> held "
              "p50 %.2fx Ray (target >= 2x: %s)" % (hand, verdict(hand >= 2), e2e,
                                                     verdict(e2e >= 2)), flush=True)
    for x in names:
        c.unlink(x)


# --- 4b. weight sync of a model's state dict (--sync-dict linear16) ----------------------

SYNC16 = "bench/sets/sync16/"
LINEAR16_BYTES = 16 * (2048 * 2048 + 2048) * 4
MEM_STEPS = 3  # --pss: untimed steps per variant, sampled


def linear16_names(prefix, layers):
    """The state dict's names of nn.Sequential(layers x Linear), under prefix."""
    return ["%s%d.%s" % (prefix, i, w) for i in range(layers) for w in ("weight", "bias")]


def marks_of(arrays):
    """The markers (element [0], flattened) of every member, as a set of floats."""
    return {float(a.reshape(-1)[0]) for a in arrays}


def role_reader16(sock, prefix, layers):
    """Another process: waits for each next commit of the state dict
    (attach_many(names, after=last)), holds it (the previous one released),
    reads every member's marker; answers "commit held_ns marker mixed" on
    stdout (mixed: 1 when the members' markers disagree)."""
    names = linear16_names(prefix, int(layers))
    last, cur = 0, {}
    with tensord.connect(sock) as c:
        print("ready", flush=True)
        while True:
            try:
                s = c.attach_many(names, after=last, timeout=1)
            except tensord.TimedOutError:
                continue
            held = time.perf_counter_ns()
            marks = marks_of(np.frombuffer(t, np.float32, count=1) for t in s.values())
            for t in cur.values():
                t.release()
            cur = s
            commits = {t.commit for t in s.values()}
            mixed = int(len(marks) > 1 or len(commits) > 1 or len(s) != len(names))
            last = max(commits)
            print(last, held, min(marks), mixed, flush=True)


def mp_reader(inq, outq, idx):
    """A torch.multiprocessing reader: takes each state dict of shared tensors
    from its queue, holds it (the previous one dropped), answers (idx, held_ns,
    marker, mixed)."""
    cur = None
    while True:
        sd = inq.get()
        if sd is None:
            return
        held = time.perf_counter_ns()
        marks = marks_of(v for v in sd.values())
        cur = sd  # noqa: F841 - held until the next one, as a user's model would
        outq.put((idx, held, min(marks), int(len(marks) > 1)))


def ray_reader16_class():
    import ray

    @ray.remote(num_cpus=0)
    class Reader16:
        def __init__(self):
            self.cur = None

        def take(self, state):  # the ObjectRef is resolved before the call runs
            held = time.perf_counter_ns()
            marks = marks_of(state.values())
            self.cur = state
            return held, min(marks), int(len(marks) > 1)

        def drop(self):
            self.cur = None

        def pid(self):
            return os.getpid()

    return Reader16


def rollup(pid):
    """Pss and Pss_Shmem of pid, in KiB (smaps_rollup); zeros when it is gone."""
    out = {"Pss": 0, "Pss_Shmem": 0}
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in out:
                    out[k] = int(line.split()[1])
    except OSError:
        pass
    return out


SHARED_FILES = ("/memfd:", "/dev/shm/")


def shared_files(pid, seen, kinds=SHARED_FILES):
    """The shared-memory files (memfds, /dev/shm) whose names start with one
    of kinds that pid holds open or mapped, into seen: {(dev, ino): allocated
    KiB}. A file held but mapped nowhere (a daemon's version between leases)
    is memory that Pss does not show."""
    paths = []
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            p = "/proc/%d/fd/%s" % (pid, fd)
            try:
                if os.readlink(p).startswith(kinds):
                    paths.append(p)
            except OSError:
                continue
        with open("/proc/%d/maps" % pid) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith(kinds):
                    paths.append("/proc/%d/map_files/%s" % (pid, parts[0]))
    except OSError:
        return
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        seen[(st.st_dev, st.st_ino)] = st.st_blocks // 2


def descendants(root):
    """Every process under root (by parent links in /proc), root excluded."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), ()):
            out.append(k)
            todo.append(k)
    return out


class MemPeak:
    """Samples a set of processes every 10 ms in a thread, two figures whose
    peaks since the set was chosen (select()) peak() returns, in KiB: the
    summed Pss (smaps_rollup) of the set and the writer (this process, or the
    writer process select() names), and the memory the hand-off holds: the
    set's summed Pss less its shared-memory part, plus every shared-memory
    file the set holds open or mapped counted once, whole (allocated pages),
    mapped or not, with those of the writer whose names start with kinds (its
    own memory is not counted: it holds the model, and in the shared writer
    what every variant left behind)."""

    def __init__(self):
        import threading
        self.pids, self.kinds, self.top, self.stop = (), (), (0, 0), False
        self.writer = os.getpid()
        self.parts = {}  # at the summed Pss's peak: process name -> (Pss, Pss_Shmem) KiB
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def select(self, pids, kinds, writer=None):
        with self.lock:
            self.pids, self.kinds, self.top, self.parts = tuple(pids), kinds, (0, 0), {}
            self.writer = writer or os.getpid()

    def peak(self):
        with self.lock:
            return self.top

    def breakdown(self):
        """Where the summed Pss's peak was: {process name: (Pss, of which shared memory)}
        in KiB, the writer as "writer"."""
        with self.lock:
            return dict(self.parts)

    @staticmethod
    def name(pid):
        try:
            with open("/proc/%d/comm" % pid) as f:
                return f.read().strip()
        except OSError:
            return "gone"

    def sample(self, pids, kinds, writer):
        files = {}
        r = rollup(writer)
        pss = r["Pss"]
        parts = {"writer": (pss, r["Pss_Shmem"])}
        shared_files(writer, files, kinds)
        held = 0
        for p in pids:
            r = rollup(p)
            pss += r["Pss"]
            held += r["Pss"] - r["Pss_Shmem"]
            n = self.name(p)
            was = parts.get(n, (0, 0))
            parts[n] = (was[0] + r["Pss"], was[1] + r["Pss_Shmem"])
            shared_files(p, files)
        return pss, held + sum(files.values()), parts

    def run(self):
        while not self.stop:
            with self.lock:
                pids, kinds, writer = self.pids, self.kinds, self.writer
            if not pids:
                time.sleep(0.01)
                continue
            pss, held, parts = self.sample(pids, kinds, writer)
            with self.lock:
                if pids == self.pids:
                    if pss > self.top[0]:
                        self.parts = parts
                    self.top = (max(self.top[0], pss), max(self.top[1], held))
            time.sleep(0.01)


# The writer's shared files that belong to each variant's hand-off (MemPeak's kinds).
SYNC16_KINDS = {"recycled": ("/memfd:tensord",), "sealed": ("/memfd:tensord",),
                "torch.mp": ("/dev/shm/torch_",), "ray": ("/dev/shm/plasma",)}


def linear16_params(layers):
    """The state dict of nn.Sequential(layers x Linear(2048, 2048)), seed 0:
    the same model in every writer."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(layers)])
    return {k: v.detach() for k, v in model.state_dict().items()}


def mark(params, k):
    """Marks version k: element [0] of every member (the readers check it)."""
    for v in params.values():
        v.view(-1)[0] = k


def sync16_tensord(client, sock, prefix, params, layers, readers):
    """tensord's hand-off of params under prefix from client to readers
    reader16 processes. Returns (step, the readers' pids, done): step(k)
    publishes version k and returns (publish ns, publish start -> all held
    ns, mixed sets seen)."""
    procs = [spawn("reader16", sock, prefix, layers) for _ in range(readers)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    sd = {prefix + k: v for k, v in params.items()}

    def step(k):
        mark(params, k)
        t0 = time.perf_counter_ns()
        commit = client.put_many(sd, replace=True)
        t1 = time.perf_counter_ns()
        held, mixed = [], 0
        for p in procs:
            got, ns, m, mx = p.stdout.readline().split()
            assert int(got) == commit, (got, commit)
            assert float(m) == k or int(mx), (m, k)
            held.append(int(ns))
            mixed += int(mx)
        return t1 - t0, max(held) - t0, mixed

    def done():
        for p in procs:
            p.kill()
            p.wait()
        for x in sd:
            client.unlink(x)

    return step, [p.pid for p in procs], done


def sync16_mp(params, readers):
    """torch.multiprocessing's hand-off to readers spawned processes, as
    sync16_tensord: (step, the readers' pids, done)."""
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    outq = ctx.Queue()
    inqs = [ctx.Queue() for _ in range(readers)]
    mps = [ctx.Process(target=mp_reader, args=(q, outq, i), daemon=True)
           for i, q in enumerate(inqs)]
    for p in mps:
        p.start()
    live = {}

    def step(k):
        mark(params, k)
        t0 = time.perf_counter_ns()
        # A fresh copy each step, in shared memory: the readers hold the
        # previous one meanwhile (no version torn in their hands).
        shared = {x: v.clone().share_memory_() for x, v in params.items()}
        for q in inqs:
            q.put(shared)
        t1 = time.perf_counter_ns()
        held, mixed = [], 0
        for _ in inqs:
            _, ns, m, mx = outq.get()
            assert m == k or mx, (m, k)
            held.append(ns)
            mixed += mx
        live["sd"] = shared  # the previous one goes: the readers dropped it
        return t1 - t0, max(held) - t0, mixed

    def done():
        for q in inqs:
            q.put(None)
        for p in mps:
            p.join(5)
            if p.is_alive():
                p.kill()
        live.clear()

    return step, [p.pid for p in mps], done


def sync16_ray(params, readers):
    """Ray's hand-off (ray.put of the dict of numpy arrays, readers actors
    given the ObjectRef) in the ray this process initialised, as
    sync16_tensord less the pids (the actors are ray's workers): (step, done)."""
    import ray
    Reader16 = ray_reader16_class()
    actors = [Reader16.remote() for _ in range(readers)]
    ray.get([a.drop.remote() for a in actors])
    np_sd = {k: v.numpy() for k, v in params.items()}

    def step(k):
        mark(params, k)
        t0 = time.perf_counter_ns()
        ref = ray.put(np_sd)
        t1 = time.perf_counter_ns()
        got = ray.get([a.take.remote(ref) for a in actors])
        del ref
        for _, m, mx in got:
            assert m == k or mx, (m, k)
        return t1 - t0, max(g[0] for g in got) - t0, sum(g[2] for g in got)

    def done():
        ray.get([a.drop.remote() for a in actors])
        for a in actors:
            ray.kill(a)

    return step, done


def mem_steps(step, first):
    """MEM_STEPS untimed steps from version first, with a pause after each (a
    few samples after the hand-off); the mixed sets seen."""
    mixed = 0
    for k in range(MEM_STEPS):
        mixed += step(first + k)[2]
        time.sleep(0.03)
    return mixed


def role_writer16(sock, name, layers, readers, warmups):
    """Another process: variant name's writer alone, as a user's trainer:
    torch, the model and that variant (tensord at sock, torch.mp, or a ray of
    its own), its readers started, warmups steps; then "ready" on stdout, and
    after a line on stdin, MEM_STEPS steps (the parent samples meanwhile);
    "done MIXED" (mixed sets seen in all its steps); after a line (or the
    end) of stdin, it stops its readers (and its ray) and exits."""
    layers, readers, warmups = int(layers), int(readers), int(warmups)
    params = linear16_params(layers)
    if name == "ray":
        import ray
        ray_start(readers, LINEAR16_BYTES, address="local")  # never the parent's
        step, done = sync16_ray(params, readers)
    elif name == "torch.mp":
        step, _, done = sync16_mp(params, readers)
    else:
        client = (connect_env(sock, TENSORD_RECYCLE="0") if name == "sealed"
                  else tensord.connect(sock))
        step, _, done = sync16_tensord(client, sock, SYNC16 + name + "/", params, layers,
                                       readers)
    mixed = sum(step(-1 - w)[2] for w in range(warmups))
    print("ready", flush=True)
    sys.stdin.readline()
    mixed += mem_steps(step, 0)
    print("done", mixed, flush=True)
    sys.stdin.readline()
    done()
    if name == "ray":
        ray.shutdown()
    elif name in ("recycled", "sealed"):
        client.close()


def alive(pid):
    """pid exists and is no zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sync16_apart(sock, names, layers, warmups, readers, daemon_args, res):
    """--pss, one writer process per variant: for each of names in turn, a
    fresh writer (role_writer16) and, for tensord, a fresh private daemon
    (nothing the shared writer's run left in one counts); MEM_STEPS steps
    sampled: the writer, everything under it (readers; ray's raylet, store,
    GCS, agents and workers) and the daemon. Into res[name]: "pss", "held",
    "parts" and "mixed" (added)."""
    import tempfile
    sampler = MemPeak()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            daemon, dsock = None, sock
            if name in ("recycled", "sealed"):
                daemon, dsock = start_daemon(tmp, daemon_args)
            w = spawn("writer16", dsock, name, layers, readers, warmups)
            assert w.stdout.readline().strip() == "ready", name
            tree = descendants(w.pid)
            # Its own ray: a GCS under the writer, not the parent's ray joined.
            assert name != "ray" or "gcs_server" in map(MemPeak.name, tree), tree
            sampler.select(tree + ([daemon.pid] if daemon else []), SYNC16_KINDS[name],
                           writer=w.pid)
            w.stdin.write("go\n")
            w.stdin.flush()
            said, mixed = w.stdout.readline().split()
            assert said == "done", said
            res[name]["pss"], res[name]["held"] = sampler.peak()
            res[name]["parts"] = sampler.breakdown()
            res[name]["mixed"] += int(mixed)
            sampler.select((), ())
            w.stdin.close()
            rc = w.wait(120)
            time.sleep(1)  # ray.shutdown() signals; its processes take a moment
            left = [p for p in tree if alive(p)]
            if rc or left:
                print("py_sets: %s's writer exited %d; still running after it: %s" %
                      (name, rc, ", ".join("%d %s" % (p, MemPeak.name(p)) for p in left)))
            res[name]["procs"] = len(tree)
            if daemon:
                daemon.terminate()
                daemon.wait()
    sampler.stop = True


def print_peaks(res, how, apart):
    """The peaks in res (KiB) next to ray's, then where each summed Pss's peak was."""
    for key, what in (("pss", "summed Pss, writer included"),
                      ("held", "memory the hand-off holds")):
        line = ", ".join("%s %.0f MiB" % (n, v[key] / 1024) for n, v in res.items())
        if res.get("ray", {}).get(key):
            line += "; " + ", ".join("%s %.2fx ray" % (n, v[key] / res["ray"][key])
                                     for n, v in res.items() if n != "ray")
        print("  %s: peak %s: %s" % (how, what, line))

    def mib(name, kib, shm):
        return "%s %.0f" % (name, kib / 1024) + (" (%.0f shm)" % (shm / 1024) if shm >= 1024
                                                 else "")

    for n, v in res.items():
        parts = sorted(v["parts"].items(), key=lambda kv: -kv[1][0])
        print("  %s: at the peak of %s, Pss by process (MiB; of it shared memory): %s%s" % (
            how, n, ", ".join(mib(k, *kib) for k, kib in parts),
            "  (%d processes under the writer)" % v["procs"] if apart else ""))


def bench_sync16(c, sock, layers, commits, warmups, readers, use_ray, use_mp, pss,
                 daemon_args):
    try:
        import torch  # noqa: F401 - only whether it imports
    except ImportError as e:
        print("py_sets: weight sync linear16: skipped (%s)" % e)
        return
    params = linear16_params(layers)
    total = sum(v.nbytes for v in params.values())
    if "TENSORD_RECYCLE" in os.environ:  # "recycled" then measures that setting
        print("note: TENSORD_RECYCLE=%s in this environment: recycled is not the default" %
              os.environ["TENSORD_RECYCLE"])
    sealed = connect_env(sock, TENSORD_RECYCLE="0")
    variants = []  # (name, step(k) -> (publish ns, publish start -> all held ns), pids)
    cleanup = []
    daemon = peer_pid(c)
    me = os.getpid()
    for name, client in (("recycled", c), ("sealed", sealed)):
        step, pids, done = sync16_tensord(client, sock, SYNC16 + name + "/", params, layers,
                                          readers)
        variants.append((name, step, [daemon] + pids))
        cleanup.append(done)
    if use_mp:
        step, pids, done = sync16_mp(params, readers)
        variants.append(("torch.mp", step, pids))
        cleanup.append(done)
    if use_ray:
        ours = set(p for _, _, ps in variants for p in ps)
        step, done = sync16_ray(params, readers)
        cleanup.append(done)
        # The raylet, the object store, the workers: what ray started under this process.
        variants.append(("ray", step, [p for p in descendants(me) if p not in ours]))

    res = {name: {"pub": [], "e2e": [], "mixed": 0, "pss": 0, "held": 0, "parts": {}}
           for name, _, _ in variants}
    for name, step, _ in variants:  # warm-up: first touches, the pool, the store, imports
        for w in range(warmups):
            res[name]["mixed"] += step(-1 - w)[2]
    for r in range(commits):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, step, _ in order:
            pub, e2e, mixed = step(r)
            res[name]["pub"].append(pub)
            res[name]["e2e"].append(e2e)
            res[name]["mixed"] += mixed
    if pss:
        # Apart from the timed steps: the sampler is no light load (a 2-CPU
        # machine slows 2-4x under it), so these steps' times are not kept.
        sampler = MemPeak()
        for name, step, pids in variants:
            sampler.select(pids, SYNC16_KINDS[name])
            res[name]["mixed"] += mem_steps(step, commits)
            res[name]["pss"], res[name]["held"] = sampler.peak()
            res[name]["parts"] = sampler.breakdown()
        sampler.stop = True
    for done in cleanup:
        done()
    sealed.close()
    apart = {name: {"pss": 0, "held": 0, "parts": {}, "mixed": 0} for name, _, _ in variants}
    if pss:
        sync16_apart(sock, list(apart), layers, warmups, readers, daemon_args, apart)

    def ms(name, key, q):
        return pct(res[name][key], q) / 1e6

    print("py_sets: weight sync, state dict of %d x Linear(2048, 2048) float32 (%d tensors, "
          "%s), %d steps after %d warm-up, %d readers, interleaved by step (p50 / p99):" %
          (layers, len(params), "%.1f MiB" % (total / (1 << 20)), commits, warmups, readers))
    what = {"recycled": "put_many(replace=True), default env",
            "sealed": "put_many(replace=True), writer TENSORD_RECYCLE=0",
            "torch.mp": "clone().share_memory_() + mp.Queue to each reader",
            "ray": "ray.put(dict of numpy) + actors ray.get"}
    for name, _, _ in variants:
        print("  %-9s publish %8.2f / %8.2f ms; publish start -> %d hold it %8.2f / %8.2f ms"
              "  (%s)" % (name, ms(name, "pub", .5), ms(name, "pub", .99), readers,
                          ms(name, "e2e", .5), ms(name, "e2e", .99), what[name]))
    td = ms("recycled", "e2e", .5)
    rel = ["sealed / recycled %.2fx" % (ms("sealed", "e2e", .5) / td)]
    for name in ("ray", "torch.mp"):
        if name in res:
            rel.append("%s / tensord %.2fx" % (name, ms(name, "e2e", .5) / td))
    print("  ratio    publish start -> held p50 (tensord: recycled): " + ", ".join(rel))
    mixed = {n: v["mixed"] + apart[n]["mixed"] for n, v in res.items()}
    print("  mixed versions seen by readers%s: %d (%s) (must be 0: %s)" % (
        ", one writer process per variant included" if pss else "", sum(mixed.values()),
        ", ".join("%s %d" % kv for kv in mixed.items()), verdict(sum(mixed.values()) == 0)))
    if pss:
        print("  memory (%d untimed steps each, 10 ms samples); Pss: the writer, the readers, "
              "and the daemon for tensord or what ray started (raylet and store, GCS, agents, "
              "workers); held: the same less the writer's own memory, Pss less shmem plus "
              "each shared file held or mapped counted once, whole" % MEM_STEPS)
        print("  shared writer: this process ran every variant, so its Pss holds torch, "
              "ray's client, the model and what each variant left behind:")
        print_peaks(res, "shared writer", False)
        print("  one writer process per variant: a fresh process each, as a user's trainer "
              "(torch, the model and that variant alone: its readers, a fresh daemon for "
              "tensord, a ray of its own for ray), %d warm-up steps first:" % warmups)
        print_peaks(apart, "one writer per variant", True)
        if "ray" in apart:
            r = apart["recycled"]["pss"] / apart["ray"]["pss"]
            print("  issue 32: peak Pss, one writer per variant: recycled %.2fx ray "
                  "(target <= 0.7x: %s)" % (r, verdict(r <= 0.7)), flush=True)


def ray_start(readers, per_set, **kw):
    """ray.init for the sync parts: readers CPUs, a store of six sets."""
    import ray
    ray.init(num_cpus=readers, include_dashboard=False, log_to_driver=False,
             object_store_memory=min(8 << 30, max(1 << 30, 6 * per_set)), **kw)


def init_ray(args):
    if args.no_ray:
        print("ray: skipped (--no-ray)")
        return False
    try:
        ray_start(args.readers, LINEAR16_BYTES if args.sync_dict == "linear16"
                  else args.sync_tensors * args.sync_size)
        return True
    except Exception as e:  # noqa: BLE001 - any failure means: no ray here
        print("ray: skipped (%s: %s)" % (type(e).__name__, e))
        return False


UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORD_SOCKET"))
    ap.add_argument("--parts", default="attach,cold,put,watch,sync")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--names", type=int, default=256)
    ap.add_argument("--sync-tensors", type=int, default=256)
    ap.add_argument("--sync-size", type=parse_size, default=4 << 20)
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: few names, small sets, 2 rounds (figures meaningless)")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--sync-dict", default="flat", choices=("flat", "linear16"),
                    help="sync: flat (--sync-tensors x --sync-size as one transaction) or "
                         "linear16 (a state dict of 16 x nn.Linear(2048, 2048) by put_many, "
                         "next to sealed, torch.multiprocessing and Ray)")
    ap.add_argument("--layers", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=3, help="linear16: warm-up steps per variant")
    ap.add_argument("--no-mp", action="store_true", help="linear16: leave torch.mp out")
    ap.add_argument("--pss", action="store_true",
                    help="linear16: then a few untimed steps per variant, sampling the "
                         "summed Pss (and the memory held) every 10 ms: the peaks, with "
                         "this process as every variant's writer, then with one fresh "
                         "writer process per variant (and a fresh daemon for tensord)")
    ap.add_argument("--watch-modes", default="unpinned,pinned",
                    help="the watch figure's variants, alternated by rounds")
    ap.add_argument("--daemon-args", default="", help="extra tensord arguments")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "watcher":
        return role_watcher(args.socket)
    if args.role == "sleeper":
        return role_sleeper(*args.rest)
    if args.role == "reader":
        return role_reader(args.socket, *args.rest)
    if args.role == "reader16":
        return role_reader16(args.socket, *args.rest)
    if args.role == "writer16":
        return role_writer16(args.socket, *args.rest)
    reps, samples = 10, 200
    if args.quick:
        args.rounds, args.names, args.sync_tensors, args.sync_size = 2, 16, 8, 64 << 10
        args.commits, reps, samples = 3, 2, 20
    parts = args.parts.split(",")
    use_ray = "sync" in parts and init_ray(args)
    with daemon_socket(args.socket, args.daemon_args.split()) as sock:
        with tensord.connect(sock) as c:
            if "attach" in parts:
                for size in (4 << 10, 64 << 10):
                    bench_attach(c, args.names, size, args.rounds, reps)
            if "cold" in parts:
                bench_cold(c, sock, 300 if not args.quick else 8,
                           (1 << 20) if not args.quick else (128 << 10), args.rounds)
            if "put" in parts:
                for size in (4 << 10, 64 << 10):
                    bench_put(c, args.names, size, args.rounds, max(1, reps // 2))
            if "watch" in parts:
                bench_watch(c, sock, args.rounds, samples, args.watch_modes.split(","))
            if "sync" in parts and args.sync_dict == "linear16":
                bench_sync16(c, sock, args.layers, args.commits, args.warmup, args.readers,
                             use_ray, not args.no_mp, args.pss, args.daemon_args.split())
            elif "sync" in parts:
                bench_sync(c, sock, args.sync_tensors, args.sync_size, args.commits,
                           args.readers, use_ray)


if __name__ == "__main__":
    sys.exit(main())
