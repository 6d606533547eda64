"""Weight sync: one trainer, three rollout workers, whole sets only.

Start a daemon first (`tensord &`), then run `python3 weight_sync.py`.
The trainer publishes a state dict of 64 tensors (64 KiB to 1 MiB each)
as ONE commit per step (put_many(..., replace=True)); every tensor of step
s holds the value s everywhere. Each rollout process loops
attach_many(prefix, after=last_commit): it gets the newest complete set,
all members from one commit, or waits for the next commit. It checks that
no set is ever mixed (two steps, two commits) or missing a member, and
prints a summary line:

    rollout 0: 20 sets, 20 commits, steps 1..20, 0 mixed, 0 missing

A slow rollout skips steps (it gets the newest set), never half of one.
The trainer ends with a "done" marker that holds its last commit id.
Options: --steps S --tensors N --rollouts R --step-ms MS.
"""
import argparse
import subprocess
import sys
import time

import numpy as np

import tensord

PREFIX = "ws/weights/"
DONE = "ws/done"
SIZES = [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]  # bytes, cycled


def rollout(idx):
    """One rollout worker: follows the trainer's commits, set by set."""
    sets = mixed = missing = 0
    commits, steps = set(), []
    last = 0          # the newest commit held so far (0: none)
    final = None      # the trainer's last commit, once "done" is there
    expected = None   # the set's size, from the trainer's first line
    with tensord.connect() as c:
        expected = int(sys.stdin.readline())
        print("ready", flush=True)
        while final is None or last < final:
            try:
                s = c.attach_many(PREFIX, after=last, timeout=0.2)
            except tensord.TimedOutError:
                if final is None:
                    try:
                        with c.attach(DONE, timeout=0) as t:
                            final = int(np.from_dlpack(t)[0])
                    except tensord.NotFoundError:
                        pass
                continue
            try:
                values, set_commits = set(), set()
                for t in s.values():
                    a = np.from_dlpack(t)
                    lo, hi = int(a.min()), int(a.max())
                    values.add(lo)
                    values.add(hi)
                    set_commits.add(t.commit)
                sets += 1
                if len(s) != expected:
                    missing += 1
                    print("rollout %d: a set of %d tensors, not %d" % (idx, len(s), expected),
                          file=sys.stderr)
                if len(values) != 1 or len(set_commits) != 1:
                    mixed += 1
                    print("rollout %d: a mixed set: values %s commits %s" %
                          (idx, sorted(values), sorted(set_commits)), file=sys.stderr)
                commit = max(set_commits)
                if commit <= last:
                    mixed += 1
                    print("rollout %d: commit %d after %d" % (idx, commit, last),
                          file=sys.stderr)
                last = commit
                commits.add(commit)
                steps.append(min(values))
            finally:
                for t in s.values():   # old sets go back at once: the trainer's
                    t.release()        # replaced versions are freed with them
    print("rollout %d: %d sets, %d commits, steps %d..%d, %d mixed, %d missing" %
          (idx, sets, len(commits), steps[0] if steps else 0, steps[-1] if steps else 0,
           mixed, missing), flush=True)
    return 1 if mixed or missing or len(commits) < 1 else 0


def trainer(args):
    names = ["%s%03d" % (PREFIX, i) for i in range(args.tensors)]
    sizes = [SIZES[i % len(SIZES)] // 4 for i in range(args.tensors)]  # float32 elements
    procs = [subprocess.Popen([sys.executable, __file__, "--rollout", str(i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(args.rollouts)]
    with tensord.connect() as c:
        for p in procs:           # every rollout waits before the first commit
            p.stdin.write("%d\n" % args.tensors)
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        commit = 0
        for step in range(1, args.steps + 1):
            # One commit: the rollouts see all 64 new tensors or none of them.
            commit = c.put_many({n: np.full(k, step, np.float32) for n, k in zip(names, sizes)},
                                replace=True, lifetime="connection")
            time.sleep(args.step_ms / 1000)
        c.put(DONE, np.array([commit], np.int64), lifetime="connection")
        took = time.perf_counter() - t0
        print("trainer: %d steps of %d tensors (%.1f MiB a step) in %.2f s, last commit %d" %
              (args.steps, args.tensors, sum(sizes) * 4 / (1 << 20), took, commit), flush=True)
        rc = 0
        for p in procs:
            out, _ = p.communicate(timeout=120)
            print(out.strip().splitlines()[-1] if out.strip() else "rollout: no output",
                  flush=True)
            rc |= p.returncode
    # lifetime="connection": the weights and the marker went with the connection.
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=20, help="the trainer's pause per step")
    ap.add_argument("--rollout", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rollout is not None:
        return rollout(args.rollout)
    return trainer(args)


if __name__ == "__main__":
    sys.exit(main())
