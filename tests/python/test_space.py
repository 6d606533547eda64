"""ENOSPC names what holds the space (issue 34): a device full because an
unlinked tensor is still leased says how many bytes such tensors hold, who
holds them (pid, command, label) and where to look (`tensorctl leases`)."""
import errno
import os
import re
import subprocess

import numpy as np
import pytest

import tensord

from tdutil import wait_until

BUILD = os.environ.get("TENSORD_BUILD", os.path.join(os.path.dirname(__file__), "..", "..",
                                                     "build"))


def test_enospc_names_unlinked_leased_tensors_and_their_holders(daemon_factory):
    d = daemon_factory("--capacity", "1Mi")
    n = 600_000
    with tensord.connect(d.socket, name="reader-1") as reader, \
            tensord.connect(d.socket, name="trainer") as writer:
        writer.put("w/0", np.ones(n, np.uint8))
        held = reader.attach("w/0")
        writer.unlink("w/0")      # gone by name; the reader's lease keeps its bytes
        with pytest.raises(tensord.Error) as e:
            writer.put("w/1", np.ones(n, np.uint8))
        msg = str(e.value)
        assert e.value.errno == errno.ENOSPC, msg
        print(msg)
        assert "'w/1'" in msg and "are free on" in msg, msg
        m = re.search(r"; (\d+) bytes of the device are held by 1 unlinked tensor still leased: "
                      r"pid (\d+) \((\S+), reader-1\) (\d+) bytes; see tensorctl leases", msg)
        assert m, msg
        assert int(m.group(1)) >= n and int(m.group(4)) == int(m.group(1)), msg
        assert int(m.group(2)) == os.getpid()
        # What the message points to shows the same holder.
        out = subprocess.run([os.path.join(BUILD, "tensorctl"), "--socket", d.socket, "leases",
                              "--group", "prefix"], capture_output=True, text=True, check=True)
        assert "unlinked" in out.stdout and "reader-1" in out.stdout, out.stdout
        # Full for another reason (nothing unlinked is leased): the plain message.
        held.release()
        assert wait_until(lambda: writer.stats()["tensors"] == 0)
        writer.put("big", np.ones(n, np.uint8))
        with pytest.raises(tensord.Error) as e:
            writer.put("w/2", np.ones(n, np.uint8))
        assert "are free on" in str(e.value) and "unlinked" not in str(e.value), str(e.value)
