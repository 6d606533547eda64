"""Frame stream: one camera at ~1 kHz, a fast and a slow consumer.

Start a daemon first (`tensord &`), then run `python3 frame_stream.py`.
The producer republishes "cam/frame" (640x480x3 uint8) with
put(..., replace=True) for about 2 s; each put is the name's next
generation, and the frame's first 8 bytes hold that generation (the rest
holds its low byte). Two consumer processes follow it with
attach(name, after=g), which answers with the newest generation after g
(or waits for one):

  fast   attaches each frame as soon as it is there: it sees nearly all;
  slow   spends ~20 ms on each frame: after= hands it the newest, so it
         skips the ones it had no time for, never falling behind.

Both check that generations strictly increase and that each frame's
contents match its generation, and print a line:

    fast: 1890 frames, 12 skipped, generations 5..1906 strictly increasing, contents ok

The fast consumer learns of new frames from a watch (Client.watch), the
slow one just attaches after the last generation it had. The producer
ends with a "cam/done" marker that holds the last generation.
Options: --seconds S --hz F --slow-ms MS.
"""
import argparse
import subprocess
import sys
import time

import numpy as np

import tensord

NAME = "cam/frame"
DONE = "cam/done"
SHAPE = (480, 640, 3)


def check(frame, gen):
    """The frame's first 8 bytes are its generation, the rest its low byte."""
    a = np.from_dlpack(frame)
    head = int(a.reshape(-1)[:8].view(np.int64)[0])
    body = a.reshape(-1)[8::4097]      # a sample across the whole frame
    return head == gen and bool((body == (gen & 0xFF)).all())


def consumer(kind, slow_ms):
    seen = skipped = bad = 0
    first = last = 0
    final = None
    increasing = True
    with tensord.connect() as c:
        watch = c.watch(NAME) if kind == "fast" else None
        last = int(sys.stdin.readline())   # the producer's blank first frame
        print("ready", flush=True)
        while final is None or last < final:
            if watch is not None:
                # Woken by the publish itself; then attach the newest.
                try:
                    ev = watch.next(timeout=0.2)
                except tensord.TimedOutError:
                    ev = None
                if ev is None or ev.name != NAME or ev.kind == "unlinked" or (
                        ev.kind == "published" and ev.generation <= last):
                    if ev is None and final is None:
                        final = done_marker(c)
                    continue
            try:
                t = c.attach(NAME, after=last, timeout=0.2)
            except tensord.TimedOutError:
                if final is None:
                    final = done_marker(c)
                continue
            with t:
                g = t.generation
                if g <= last:
                    increasing = False
                if not check(t, g):
                    bad += 1
                skipped += g - last - 1
                first = first or g
                last = g
                seen += 1
                if slow_ms:
                    time.sleep(slow_ms / 1000)   # "processing" the frame, lease held
        if watch is not None:
            watch.close()
    print("%s: %d frames, %d skipped, generations %d..%d %s, %s" %
          (kind, seen, skipped, first, last,
           "strictly increasing" if increasing else "NOT increasing",
           "contents ok" if not bad else "%d frames with wrong contents" % bad), flush=True)
    return 0 if increasing and not bad and seen else 1


def done_marker(c):
    try:
        with c.attach(DONE, timeout=0) as t:
            return int(np.from_dlpack(t)[0])
    except tensord.NotFoundError:
        return None


def producer(args):
    procs = [subprocess.Popen([sys.executable, __file__, "--consumer", kind,
                               "--slow-ms", str(ms)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for kind, ms in (("fast", 0), ("slow", args.slow_ms))]
    frame = np.empty(SHAPE, np.uint8)
    flat = frame.reshape(-1)
    with tensord.connect() as c:
        # A first, blank frame tells the name's generation (it may have had
        # earlier, unlinked ones: generations are never reused); the consumers
        # start after it, and from then on this only writer knows each next one.
        gen = c.put(NAME, frame, replace=True, lifetime="connection")
        for p in procs:       # both consumers wait before the first real frame
            p.stdin.write("%d\n" % gen)
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ready"
        period = 1.0 / args.hz
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < args.seconds:
            nxt = gen + 1     # the generation this put will get
            flat[:] = nxt & 0xFF
            flat[:8].view(np.int64)[0] = nxt
            gen = c.put(NAME, frame, replace=True, lifetime="connection")
            assert gen == nxt, (gen, nxt)   # the only writer: generations go one by one
            n += 1
            # Pace to ~hz: sleep off what is left of this frame's period.
            left = t0 + n * period - time.perf_counter()
            if left > 0:
                time.sleep(left)
        took = time.perf_counter() - t0
        c.put(DONE, np.array([gen], np.int64), lifetime="connection")
        print("producer: %d frames in %.2f s (%.0f Hz), last generation %d" %
              (n, took, n / took, gen), flush=True)
        rc = 0
        for p in procs:
            out, _ = p.communicate(timeout=120)
            print(out.strip().splitlines()[-1] if out.strip() else "consumer: no output",
                  flush=True)
            rc |= p.returncode
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--hz", type=float, default=1000.0)
    ap.add_argument("--slow-ms", type=float, default=20.0)
    ap.add_argument("--consumer", choices=("fast", "slow"), default=None,
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer:
        return consumer(args.consumer, args.slow_ms if args.consumer == "slow" else 0)
    return producer(args)


if __name__ == "__main__":
    sys.exit(main())
