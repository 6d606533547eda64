"""Weight sync: one trainer, three rollout workers, whole versions only.

Start a daemon first (`tensord &`), then run `python3 weight_sync.py`.
The trainer's model has 64 parameters (64 KiB to 1 MiB each); each step it
sets every one to the step number and publishes the model's state dict as
ONE commit (tensord.torch.put_state_dict(..., replace=True); the
parameters require grad and are detached on the way). Each rollout process
builds the same model on the meta device (no memory of its own) and loops
tensord.torch.load_state_dict(c, prefix, model, after=last): the newest
complete version, zero copy, every tensor from one commit, or a wait for
the next commit. It checks that no version it loads is ever mixed (two
steps), that none misses a member (a strict load refuses that), that the
loaded parameters are not trainable, and prints a summary line:

    rollout 0: 20 sets, 20 commits, steps 1..20, 0 mixed, 0 missing

A slow rollout skips steps (it gets the newest version), never half of one.
The trainer ends with a "done" marker that holds its last commit id.
Options: --steps S --tensors N --rollouts R --step-ms MS, and --numpy for
the same with numpy arrays (tensord.state_dict), also used without torch.
"""
import argparse
import subprocess
import sys
import time

import numpy as np

import tensord
from tensord.state_dict import attach_state_dict, put_state_dict

try:
    import torch
    import tensord.torch
    torch.set_num_threads(1)   # four processes of small ops: threads would only contend
except ImportError:
    torch = None

PREFIX = "ws/weights/"
DONE = "ws/done"
SIZES = [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]  # bytes, cycled


def sizes_of(n):
    """float32 elements of each of the n tensors."""
    return [SIZES[i % len(SIZES)] // 4 for i in range(n)]


def make_model(n):
    """The torch model: n parameters, one flat float32 vector each."""
    model = torch.nn.Module()
    model.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(k)) for k in sizes_of(n))
    return model


def load_next(c, args, model, last):
    """The next version after commit `last`: (commit, {key: array}); TimedOutError if none
    comes within 0.2 s."""
    if model is not None:
        commit = tensord.torch.load_state_dict(c, PREFIX, model, after=last, timeout=0.2)
        if any(p.requires_grad for p in model.parameters()):
            raise AssertionError("loaded parameters must not be trainable")
        return commit, dict(model.state_dict())
    sd = attach_state_dict(c, PREFIX, after=last, timeout=0.2)
    if len(sd) != args.tensors:       # no strict load to refuse a missing member
        raise KeyError("a set of %d tensors, not %d" % (len(sd), args.tensors))
    return sd.commit, sd


def rollout(idx, args):
    """One rollout worker: follows the trainer's commits, version by version."""
    sets = mixed = missing = 0
    commits, steps = set(), []
    last = 0          # the newest commit held so far (0: none)
    final = None      # the trainer's last commit, once "done" is there
    model = None
    if not args.numpy:
        with torch.device("meta"):
            model = make_model(args.tensors)     # no memory: the daemon's is loaded
    with tensord.connect() as c:
        print("ready", flush=True)
        while final is None or last < final:
            try:
                commit, weights = load_next(c, args, model, last)
            except tensord.TimedOutError:
                if final is None:
                    try:
                        with c.attach(DONE, timeout=0) as t:
                            final = int(np.from_dlpack(t)[0])
                    except tensord.NotFoundError:
                        pass
                continue
            except (KeyError, ValueError) as e:      # a member missing, or one too many
                missing += 1
                print("rollout %d: %s" % (idx, e), file=sys.stderr)
                break
            values = set()
            for a in weights.values():
                values.add(float(a.min()))
                values.add(float(a.max()))
            sets += 1
            if len(values) != 1:
                mixed += 1
                print("rollout %d: a mixed set: values %s" % (idx, sorted(values)),
                      file=sys.stderr)
            if commit <= last:
                mixed += 1
                print("rollout %d: commit %d after %d" % (idx, commit, last), file=sys.stderr)
            last = commit
            commits.add(commit)
            steps.append(int(min(values)))
            # The next load replaces these tensors: this version's memory goes back
            # to the daemon once every rollout has moved on.
            del weights
    print("rollout %d: %d sets, %d commits, steps %d..%d, %d mixed, %d missing" %
          (idx, sets, len(commits), steps[0] if steps else 0, steps[-1] if steps else 0,
           mixed, missing), flush=True)
    return 1 if mixed or missing or len(commits) < 1 else 0


def trainer(args):
    flags = ["--numpy"] if args.numpy else []
    procs = [subprocess.Popen([sys.executable, __file__, "--tensors", str(args.tensors),
                               "--rollout", str(i)] + flags,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(args.rollouts)]
    sizes = sizes_of(args.tensors)
    model = None if args.numpy else make_model(args.tensors)
    with tensord.connect() as c:
        for p in procs:           # every rollout waits before the first commit
            assert p.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        commit = 0
        for step in range(1, args.steps + 1):
            # One commit: the rollouts see all 64 new tensors or none of them.
            if model is not None:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(step)          # stands for an optimizer step
                commit = tensord.torch.put_state_dict(c, PREFIX, model.state_dict(),
                                                      replace=True, lifetime="connection")
            else:
                commit = put_state_dict(c, PREFIX,
                                        {"%03d" % i: np.full(k, step, np.float32)
                                         for i, k in enumerate(sizes)},
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
    ap.add_argument("--numpy", action="store_true",
                    help="numpy arrays through tensord.state_dict instead of a torch model")
    ap.add_argument("--rollout", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if torch is None:
        args.numpy = True
    if args.rollout is not None:
        return rollout(args.rollout, args)
    return trainer(args)


if __name__ == "__main__":
    sys.exit(main())
