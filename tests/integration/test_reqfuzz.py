"""The request-sequence fuzzer (reqfuzz.c) against a real daemon, for a
short while: many connections, every request kind mutated, values learnt
from the replies, abrupt closes right after requests whose replies the
daemon sends from inside a commit, hostile use of the descriptors handed
out. The daemon must answer at the end (the fuzzer checks), and exit 0 on
SIGTERM with no sanitizer report in its log (the daemon fixture checks).

Under ASan (make test-asan) this is the suite's short fuzzing pass; `make
fuzz` runs the same fuzzer for FUZZ_TIME seconds (tests/fuzz/reqfuzz.sh).
The seed is drawn anew each run and printed in a failure; to replay one:
TENSORD_REQFUZZ_SEED=N (and TENSORD_REQFUZZ_SECONDS=S for the length)."""
import os
import random
import subprocess

from conftest import build_path

SANITIZED = os.environ.get("TENSORD_SANITIZED") == "1"


def test_request_sequence_fuzzer_leaves_the_daemon_answering(daemon_factory):
    seconds = float(os.environ.get("TENSORD_REQFUZZ_SECONDS") or (20 if SANITIZED else 8))
    seed = int(os.environ.get("TENSORD_REQFUZZ_SEED") or random.randrange(1, 1 << 63))
    d = daemon_factory("--capacity", "512Mi", "--pool", "0", "--log-level", "info")
    r = subprocess.run([build_path("tests", "helpers", "reqfuzz"), "--socket", d.socket,
                        "--seed", str(seed), "--seconds", str(seconds)],
                       capture_output=True, text=True, timeout=seconds + 120)
    print(r.stdout)
    log = d.read_log()
    report = log[log.find("ERROR: AddressSanitizer"):] if "ERROR: AddressSanitizer" in log \
        else log[-4000:]
    assert r.returncode == 0, (
        f"reqfuzz seed {seed} ({seconds} s; replay with TENSORD_REQFUZZ_SEED={seed}) exited "
        f"{r.returncode}:\n{r.stdout}{r.stderr}\ntensord's log:\n{report[:8000]}")
    assert "the daemon answers" in r.stdout, r.stdout
    # Every kind of request went out, and the daemon answered some of each sort.
    for kind in ("create", "publish", "attach", "release", "unlink", "put", "commit", "abort",
                 "attach_many", "cancel", "watch", "unwatch", "reserve", "unreserve",
                 "bind_page", "stat", "list", "stats", "lease_list", "client_list", "metrics",
                 "peer_list"):
        assert f" {kind} " in r.stdout.split("sent:")[1].split("\n")[0], (kind, r.stdout)
    assert d.alive()
