"""Two processes share one tensor through tensord, zero copy.

Start a daemon first (`tensord &`), then run `python3 two_process.py`.
The writer publishes a tensor; a reader process, started before the
publish, waits for the name, maps the same memory and sums it. The writer
then changes a mutable tensor in place and the reader sees the change.
"""
import subprocess
import sys

import numpy as np

import tensord

READER = r"""
import sys
import numpy as np
import tensord

with tensord.connect() as c:
    with c.attach("demo/weights", timeout=10) as t:
        w = np.from_dlpack(t)                      # a view of the writer's bytes
        print("reader: weights", t.shape, t.dtype, "sum", w.sum(),
              "writable", w.flags.writeable, flush=True)
    with c.attach("demo/counter", timeout=10) as t:
        n = np.from_dlpack(t)
        print("reader: counter", int(n[0]), flush=True)
        sys.stdin.readline()                       # the writer bumps it meanwhile
        print("reader: counter", int(n[0]), flush=True)
"""


def main():
    with tensord.connect() as c:
        reader = subprocess.Popen([sys.executable, "-c", READER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        # Immutable: copied in once, then read-only for everyone.
        c.put("demo/weights", np.arange(12, dtype=np.float32).reshape(3, 4),
              lifetime="connection")
        # Mutable: written in place, even after publish, through a zero-copy view.
        with c.create("demo/counter", (1,), "int64", mutable=True,
                      lifetime="connection") as t:
            counter = np.from_dlpack(t)
            counter[0] = 1
            t.publish()
            print(reader.stdout.readline(), end="")   # the weights
            print(reader.stdout.readline(), end="")   # counter 1
            counter[0] = 2
            out, _ = reader.communicate("go\n", timeout=30)
            print(out, end="")                        # counter 2
    # lifetime="connection": both names went away with the connection.
    return reader.returncode


if __name__ == "__main__":
    sys.exit(main())
