"""The tree's boundaries, checked: tensorctl and the Python extension are
clients of libtensord's public API (<tensord/tensord.h>) and of their own
files, nothing else, so that a change inside the library or the daemon
cannot reach them unseen."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OWN = {"client/python": {"tdpy.h"},
       "client/tensorctl": {"tensorctl.h", "npy.h"}}


def test_front_ends_include_only_the_public_api_and_their_own_headers():
    bad = []
    for folder, own in OWN.items():
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not name.endswith((".c", ".h")):
                continue
            with open(os.path.join(ROOT, folder, name)) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if m and m.group(1) not in own:
                        bad.append(f"{folder}/{name}:{n}: {m.group(1)}")
    assert not bad, "front ends must use <tensord/tensord.h> only:\n" + "\n".join(bad)


def test_front_ends_call_no_internal_library_function():
    """The library's internal functions are td_*; so are the front ends' own
    helpers, but those are defined (or #defined) in the front end's folder."""
    bad = []
    for folder in OWN:
        files = [os.path.join(ROOT, folder, n) for n in os.listdir(os.path.join(ROOT, folder))
                 if n.endswith((".c", ".h"))]
        text = "".join(open(p).read() for p in files)
        called = set(re.findall(r"\b(td_[a-z0-9_]+)\s*\(", text))
        for fn in sorted(called):
            defined = re.search(r"\b" + fn + r"\s*\([^;]*\)\s*\{", text) or \
                re.search(r"#define\s+" + fn + r"\b", text)
            if not defined:
                bad.append(f"{folder}: {fn}")
    assert not bad, "front ends call library internals:\n" + "\n".join(bad)
