"""The request-sequence fuzzer (reqfuzz.c) against a real daemon, for a
short while: many connections, every request kind mutated, values learnt
from the replies, abrupt closes right after requests whose replies the
daemon sends from inside a commit, hostile use of the descriptors handed
out. Run as root, a second fuzzer runs at the same time as uid 65534 over
the same names, so that the permission checks meet it too. The daemon must
answer at the end (each fuzzer checks), and exit 0 on SIGTERM with no
sanitizer report in its log (the daemon fixture checks).

Under ASan (make test-asan) this is the suite's short fuzzing pass; `make
fuzz` runs the same fuzzer for FUZZ_TIME seconds (tests/fuzz/reqfuzz.sh).
The seed is drawn anew each run and printed in a failure; to replay one:
TENSORD_REQFUZZ_SEED=N (and TENSORD_REQFUZZ_SECONDS=S for the length)."""
import os
import random
import shutil
import subprocess

import pytest

from conftest import build_path
import testlib

SANITIZED = os.environ.get("TENSORD_SANITIZED") == "1"
NOBODY = 65534
KINDS = ("create", "publish", "attach", "release", "unlink", "put", "commit", "abort",
         "attach_many", "cancel", "watch", "unwatch", "reserve", "unreserve", "bind_page", "stat",
         "list", "stats", "lease_list", "client_list", "metrics", "peer_list")
# Kinds that must have succeeded at least once: the fuzzer got past the
# checks into the states it is meant to stir (a set, a transaction, a
# wait, a watch, a binding page). Not reserve: most are EAGAIN, the pool's
# memory of that size not ready yet, and a loaded machine may serve none.
DEEP = ("create", "publish", "attach", "put", "commit", "attach_many", "watch", "bind_page",
        "stat", "list")


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def line(out, head):
    for ln in out.splitlines():
        if ln.startswith("reqfuzz: " + head):
            return ln + " "
    return ""


@pytest.fixture
def open_dir():
    """A directory every uid may enter, for the daemon's socket and a copy of
    the fuzzer that uid 65534 can run (the checkout may be under 0700)."""
    d = testlib.open_dir(prefix="tensord-reqfuzz-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.other_uid
def test_request_sequence_fuzzer_leaves_the_daemon_answering(daemon_factory, open_dir):
    seconds = float(os.environ.get("TENSORD_REQFUZZ_SECONDS") or (20 if SANITIZED else 8))
    seed = int(os.environ.get("TENSORD_REQFUZZ_SEED") or random.randrange(1, 1 << 62))
    d = daemon_factory("--capacity", "256Mi", "--pool", "32Mi", "--log-level", "info",
                       "--mode", "0666", sub=open_dir)
    [exe] = testlib.copies_for_all(open_dir, build_path("tests", "helpers", "reqfuzz"))
    runs = [("own uid", seed, None)]
    if os.geteuid() == 0:
        runs.append((f"uid {NOBODY}", seed + 1, as_nobody))
    # A sanitized fuzzer's own quarantine kept small: it grew by 400 MB a minute.
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") +
               ":quarantine_size_mb=16")
    procs = [(who, s, subprocess.Popen([exe, "--socket", d.socket, "--seed", str(s),
                                        "--seconds", str(seconds)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       preexec_fn=pre, cwd="/", env=env))
             for who, s, pre in runs]
    results = []
    for who, s, p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        results.append((who, s, p.returncode, out, err))
    log = d.read_log()
    report = log[log.find("ERROR: AddressSanitizer"):] if "ERROR: AddressSanitizer" in log \
        else log[-4000:]
    for who, s, rc, out, err in results:
        print(f"== {who}\n{out}{err}")
    for who, s, rc, out, err in results:
        assert rc == 0, (
            f"reqfuzz as {who}, seed {s} ({seconds} s; replay with TENSORD_REQFUZZ_SEED={seed}) "
            f"exited {rc}:\n{out}{err}\ntensord's log:\n{report[:8000]}")
        assert "the daemon answers" in out, out
        sent, ok = line(out, "sent:"), line(out, "answered ok:")
        for kind in KINDS:
            assert f" {kind} " in sent, (who, kind, out)
        for kind in DEEP:
            assert f" {kind} " in ok, (who, f"no {kind} succeeded", out)
    assert d.alive()
