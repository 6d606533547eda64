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


# --- the daemon's rooms (docs/design.md, "The map") ---------------------------
# Each folder of daemon/ may include the headers of its own folder and of the
# folders listed here, nothing else; the top (wire, dispatch, observability,
# start-up: daemon/*.c) may include any. Listed in the order they stack.
ROOMS = {
    "base": set(),                                  # logging, rate limits, per-uid shares
    "memory": {"base"},                             # backends, pool, slabs, GPU worker
    "registry": {"base", "memory"},                 # names, versions, transactions
    "remote": {"base", "memory", "registry"},       # peers, remote attach, transport
    "persist": {"base", "memory", "registry"},      # the state kept across restarts
}
# Includes that still break those rules, each with what it is for. The list
# only shrinks: an entry no longer needed fails the test too.
KNOWN = {
    ("registry", "daemon/figures.h"): "figure_count() of the registry's counters",
    ("remote", "daemon/figures.h"): "figure_count() of remote attach's counters",
    ("remote", "daemon/conn.h"): "CONN_OUT_HIGH/MAX, the bounds a peer's queue shares",
}


def daemon_includes():
    """(file, its room or 'top', header path from the root) for every daemon include."""
    out = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "daemon")):
        for name in sorted(names):
            if not name.endswith((".c", ".h", ".def")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)
            parts = rel.split("/")
            room = parts[1] if len(parts) > 2 else "top"
            with open(path) as f:
                for line in f:
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if "/" not in inc:  # same folder
                        inc = os.path.relpath(os.path.join(os.path.dirname(path), inc), ROOT)
                    if inc.startswith("daemon/"):
                        out.append((rel, room, inc))
    return out


def room_of(header):
    parts = header.split("/")
    return parts[1] if len(parts) > 2 else "top"


def test_daemon_rooms_include_only_the_rooms_below():
    bad, used = [], set()
    for rel, room, inc in daemon_includes():
        target = room_of(inc)
        if room == "top" or target == room or target in ROOMS[room]:
            continue
        if (room, inc) in KNOWN:
            used.add((room, inc))
            continue
        bad.append(f"{rel}: {inc} ({room} may include {sorted(ROOMS[room]) or 'nothing'} only)")
    stale = [f"{k}: {v}" for k, v in KNOWN.items() if k not in used]
    assert not bad, "a room includes above itself:\n" + "\n".join(bad)
    assert not stale, "listed as known but no longer included (drop them):\n" + "\n".join(stale)


def test_private_headers_stay_in_their_folder():
    """A *_int.h is its folder's: no file of another folder includes it."""
    bad = []
    for rel, room, inc in daemon_includes():
        if not inc.endswith("_int.h") or os.path.dirname(inc) == os.path.dirname(rel):
            continue
        if (room, inc) in KNOWN:
            continue
        bad.append(f"{rel}: {inc}")
    assert not bad, "private headers included from another folder:\n" + "\n".join(bad)


def test_every_daemon_folder_is_a_room():
    folders = {d for d in os.listdir(os.path.join(ROOT, "daemon"))
               if os.path.isdir(os.path.join(ROOT, "daemon", d))}
    assert folders == set(ROOMS), f"daemon/ folders {sorted(folders)} against the rooms {sorted(ROOMS)}"


def test_common_includes_only_itself_the_api_and_the_wire():
    """common/ is what the daemon and the clients share: it includes its own
    headers, the public API and the generated wire schema, nothing of the
    daemon, the library or the GPU vendors' folders."""
    bad = []
    folder = os.path.join(ROOT, "common")
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".c", ".h")):
            continue
        with open(os.path.join(folder, name)) as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m and "/" in m.group(1) and not m.group(1).startswith(("common/", "proto/")):
                    bad.append(f"common/{name}:{n}: {m.group(1)}")
    assert not bad, "common/ includes outside itself:\n" + "\n".join(bad)
