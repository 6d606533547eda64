"""Small helpers shared by the Python client tests."""
import os
import time

from testlib import wait_until  # noqa: F401 (kept once in tests/testlib.py)


def refcount(client, name):
    """Live leases on name, as the daemon counts them."""
    return client.stat(name).refcount


def wait_refcount(client, name, want, timeout=20.0):
    """Polls until name has want leases (other processes release asynchronously)."""
    end = time.monotonic() + timeout
    while True:
        n = refcount(client, name)
        if n == want or time.monotonic() > end:
            return n
        time.sleep(0.01)


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# CONTRACT §3 dtypes, with the numpy name of each (None: numpy has none).
DTYPES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "bfloat16": None, "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128",
}
