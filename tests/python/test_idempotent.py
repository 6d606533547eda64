"""Writes retried once and never applied twice (docs/restart.md, section 5,
"Idempotence"; issue 33): a put, put_many or unlink whose daemon dies under
it reconnects, asks the restarted daemon (same lineage, through a service
manager's store) what became of it, and returns the recorded result or does
it again; never twice."""
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np

import tensord
from sdharness import ServiceManager


def test_a_put_applied_before_the_crash_answers_its_recorded_generation(tmp_path):
    # The daemon kills itself right after the second request's step is
    # recorded, before its reply: the put took effect, its reply was lost.
    m = ServiceManager(tmp_path)
    m.start(env={"TENSORD_TEST_KILL_AFTER_REQUEST": "2"})
    try:
        c = tensord.connect(m.socket)
        assert c.put("w", np.full(8, 1, np.int64)) == 1
        got = {}

        def put():
            try:
                got["gen"] = c.put("w", np.full(8, 2, np.int64), replace=True)
            except Exception as e:  # noqa: BLE001: the test reports it
                got["error"] = e

        t = threading.Thread(target=put)
        t.start()
        assert m.proc.wait(timeout=30) == -signal.SIGKILL
        m.log.close()
        m.start()                                   # without the hook
        t.join(60)
        assert not t.is_alive()
        assert got == {"gen": 2}, got               # its recorded generation, not 3
        assert c.stat("w").generation == 2          # applied once
        with c.attach("w") as a:
            assert list(np.from_dlpack(a)) == [2] * 8
        assert c.put("w", np.full(8, 3, np.int64), replace=True) == 3
        # It was asked, not guessed.
        assert "resolve of token" in m.read_log() and "took effect" in m.read_log()
    finally:
        m.close()


def test_an_unlink_applied_before_the_crash_is_not_sent_again(tmp_path):
    m = ServiceManager(tmp_path)
    m.start(env={"TENSORD_TEST_KILL_AFTER_REQUEST": "2"})
    try:
        c = tensord.connect(m.socket)
        c.put("u", np.ones(4))
        err = {}

        def unlink():
            try:
                c.unlink("u")                       # a second unlink would raise ENOENT
            except Exception as e:  # noqa: BLE001
                err["e"] = e

        t = threading.Thread(target=unlink)
        t.start()
        m.proc.wait(timeout=30)
        m.log.close()
        m.start()
        t.join(60)
        assert not t.is_alive() and err == {}, err
        assert "u" not in [i.name for i in c.list()]
        assert c.put("u", np.ones(4)) == 2         # its generations go on
    finally:
        m.close()


WRITER = r"""
import json, os, sys
import numpy as np
import tensord
c = tensord.connect(sys.argv[1])
out = open(sys.argv[2], "w")
big = np.arange(1 << 15, dtype=np.int64)          # 256 KiB: create, copy, publish
i = 0
while not os.path.exists(sys.argv[3]):
    i += 1
    rec = {"i": i}
    try:
        rec["small"] = c.put("small", np.full(16, i, np.int64), replace=True)
        rec["big"] = c.put("big", big + i, replace=True)
        rec["set"] = c.put_many({"set/a": np.full(8, i), "set/b": np.full(1 << 14, i)},
                                replace=True)
        rec["u"] = c.put("u", np.full(4, i))
        c.unlink("u")
        rec["unlinked"] = True
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    out.write(json.dumps(rec) + "\n")
    out.flush()
    if "error" in rec:
        break
"""


def test_kill_9_at_random_points_applies_every_write_exactly_once(tmp_path):
    import json

    m = ServiceManager(tmp_path)
    m.start()
    path, stop = tmp_path / "writes.jsonl", tmp_path / "stop"
    env = dict(os.environ, TENSORD_RECONNECT_MS="30000")
    w = subprocess.Popen([sys.executable, "-c", WRITER, m.socket, str(path), str(stop)],
                         env=env)
    try:
        rng = random.Random(33)
        kills = 0
        for k in range(8):
            if k % 2:
                # A random point of the loop: a few ms to a few tens.
                time.sleep(rng.uniform(0.005, 0.08))
                m.restart(signal.SIGKILL)
            else:
                # The next daemon dies right after recording its Nth
                # request's step, before its reply: applied, reply lost.
                n = rng.randint(1, 40)
                m.restart(signal.SIGKILL, env={"TENSORD_TEST_KILL_AFTER_REQUEST": str(n)})
                assert m.proc.wait(timeout=60) == -signal.SIGKILL
                m.log.close()
                m.start()
            kills += 1
            if w.poll() is not None:
                break                               # it failed: its record says how
        stop.touch()
        assert w.wait(timeout=120) == 0
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        rounds = len(recs)
        errors = [r for r in recs if "error" in r]
        assert not errors, errors
        assert kills == 8
        # Every call returned success once, and generations show each
        # version applied once: consecutive, no gap a second apply would leave.
        assert [r["small"] for r in recs] == list(range(1, rounds + 1))
        assert [r["big"] for r in recs] == list(range(1, rounds + 1))
        # u: put then unlink each round, so its generations go 1, 2, ...
        assert [r["u"] for r in recs] == list(range(1, rounds + 1))
        c = tensord.connect(m.socket)
        assert c.stat("small").generation == rounds
        assert c.stat("set/a").generation == rounds      # put_many applied once a round
        assert c.stat("set/b").generation == rounds
        assert "u" not in [i.name for i in c.list()]
        with c.attach("big") as a:
            assert np.array_equal(np.from_dlpack(a), np.arange(1 << 15) + rounds)
        log = m.read_log()
        applied = log.count("took effect")
        print(f"\n{kills} kills; {log.count('resolve of token')} writes resolved, "
              f"{applied} of them applied before their daemon died")
        assert applied >= 4    # each hooked daemon died after a step, before its reply
    finally:
        if w.poll() is None:
            w.kill()
        m.close()


# A raw client, frames built by hand (as tests/integration/hostile.py):
# the token and seq are libtensord's own otherwise.

def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def f_varint(field, v):
    return varint(field << 3) + varint(v)


def f_bytes(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_fixed64(field, v):
    return varint(field << 3 | 1) + struct.pack("<Q", v)


def decode(buf):
    """field -> [values]: ints for varints, bytes for the rest."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        wt = key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        out.setdefault(key >> 3, []).append(v)
    return out


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


class Raw:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.id = 0

    def call(self, field, body, seq=0):
        """(status, reply body fields) of one request."""
        self.id += 1
        req = f_varint(1, self.id) + f_bytes(field, body) + (f_varint(40, seq) if seq else b"")
        self.s.sendall(struct.pack("<IHH", len(req), 1, 0) + req)
        n = struct.unpack("<IHH", self._exact(8))[0]
        rep = decode(self._exact(n))
        z = rep.get(2, [0])[0]
        body_fields = [f for f in rep if f > 3]
        return (z >> 1) ^ -(z & 1), decode(rep[body_fields[0]][0]) if body_fields else {}

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def close(self):
        self.s.close()


HELLO, UNLINK, RESOLVE = 2, 7, 28


def test_a_rewritten_log_and_a_restart_keep_what_a_request_did(tmp_path):
    # A request's result survives the log being rewritten whole (its table
    # carried in the new log) and a kill -9 after: the restarted daemon, of
    # the same lineage, answers its Resolve as the one that applied it.
    tok = 0x0123456789abcdef
    hello = f_varint(1, 1) + f_fixed64(4, tok)
    m = ServiceManager(tmp_path, args=["--state-log-size", "4096"])
    m.start()
    try:
        c = tensord.connect(m.socket)
        c.put("x", np.ones(4))
        r = Raw(m.socket)
        status, hr = r.call(HELLO, hello)
        assert status == 0, status
        instance = struct.unpack("<Q", hr[4][0])[0]
        assert r.call(UNLINK, f_bytes(1, b"x"), seq=7)[0] == 0
        for i in range(80):                        # rewrites, each past 4 KiB
            c.put(f"n{i % 5}", np.full(64, i), replace=True)
        assert "wrote the whole state anew" in m.read_log()
        r.close()
        m.restart(signal.SIGKILL)
        r = Raw(m.socket)
        assert r.call(HELLO, hello)[0] == 0
        status, res = r.call(RESOLVE, f_fixed64(1, tok) + f_varint(2, 7) + f_fixed64(3, instance))
        assert status == 0 and res.get(1) == [1] and res.get(2) == [3], (status, res)  # an unlink
        # One it never sent: not applied (another instance: nothing of it under way).
        status, res = r.call(RESOLVE, f_fixed64(1, tok) + f_varint(2, 8) + f_fixed64(3, instance))
        assert status == 0 and not res.get(1), (status, res)
        r.close()
    finally:
        m.close()


def test_an_aio_put_lost_inline_is_asked_about_off_the_loop(tmp_path):
    # tensord.aio's small put runs inline on the loop; its daemon dies
    # after recording it, before the reply. The loop never connects (it
    # goes on running while no daemon serves: the daemon comes back only
    # once it did), and the put answers its recorded generation.
    import asyncio
    import tensord.aio

    m = ServiceManager(tmp_path)
    m.start(env={"TENSORD_TEST_KILL_AFTER_REQUEST": "2"})
    down, ticked = threading.Event(), threading.Event()

    def restart_later():
        m.proc.wait(timeout=30)
        m.log.close()
        down.set()
        # Back once the loop has run while no daemon served (a loop blocked
        # connecting never ticks: then back anyway, and the test fails).
        ticked.wait(timeout=20)
        m.start()

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                if down.is_set():
                    ticks += 1
                    if ticks == 5:
                        ticked.set()
                await asyncio.sleep(0.01)

        async with await tensord.aio.connect(m.socket) as ac:
            assert await ac.put("w", np.full(8, 1, np.int64)) == 1
            t = asyncio.ensure_future(tick())
            th = threading.Thread(target=restart_later)
            th.start()
            gen = await ac.put("w", np.full(8, 2, np.int64), replace=True)
            th.join()
            t.cancel()
            assert gen == 2                          # recorded, not applied again
            assert (await ac.stat("w")).generation == 2
            assert await ac.put("w", np.full(8, 3, np.int64), replace=True) == 3

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
        assert ticked.is_set(), "the loop stopped while no daemon served"
        assert "took effect" in m.read_log()
    finally:
        m.close()


def test_a_resolve_that_loses_its_daemon_is_asked_again_not_redone(tmp_path):
    # The put is recorded, its daemon dies; the next daemon dies with the
    # client's Resolve unanswered; the third answers it. Done again
    # unasked, the put would make generation 3.
    m = ServiceManager(tmp_path)
    m.start(env={"TENSORD_TEST_KILL_AFTER_REQUEST": "2"})
    try:
        c = tensord.connect(m.socket)
        assert c.put("w", np.full(8, 1, np.int64)) == 1
        got = {}

        def put():
            try:
                got["gen"] = c.put("w", np.full(8, 2, np.int64), replace=True)
            except Exception as e:  # noqa: BLE001: the test reports it
                got["error"] = e

        t = threading.Thread(target=put)
        t.start()
        for env in ({"TENSORD_TEST_KILL_AT_RESOLVE": "1"}, None):
            assert m.proc.wait(timeout=30) == -signal.SIGKILL
            m.log.close()
            m.start(env=env)
        t.join(60)
        assert not t.is_alive()
        assert got == {"gen": 2}, got
        assert c.stat("w").generation == 2
        assert m.read_log().count("resolve of token") == 1   # the one the third daemon answered
    finally:
        m.close()
