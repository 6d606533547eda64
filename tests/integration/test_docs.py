"""The README's tensorctl session prints what the README shows: the same
commands against a real daemon give the sample's `ls` table, cell for cell
(the owner is the running user's name, as in the sample when run as root)."""
import json
import os
import sys
import pwd
import re
import subprocess

import numpy as np

from conftest import build_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_ls_sample():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"\$ tensorctl ls\n((?:[^$\n].*\n)+)", text)
    assert m, "README has a `$ tensorctl ls` sample"
    return m.group(1).splitlines()


def test_readme_ls_sample_is_what_tensorctl_prints(daemon, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))   # the README's python3 -c line
    ctl = [build_path("tensorctl"), "--socket", daemon.socket]
    subprocess.run(ctl + ["put", "model/inputs/0", str(tmp_path / "x.npy")], check=True)
    out = subprocess.run(ctl + ["ls"], check=True, capture_output=True, text=True).stdout
    sample = readme_ls_sample()
    got = out.splitlines()
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert got[0] == sample[0]
    assert len(got) == len(sample) == 2
    # The owner column: the sample was made as root; compare the rest exactly.
    assert got[1].split()[:-1] == sample[1].split()[:-1]
    assert got[1].split()[-1] == me
    if me == "root":
        assert got[1] == sample[1], "README's ls line, byte for byte"


# --- docs/tensorctl.md's samples against what tensorctl prints (issue 34) ---

TENSORCTL_MD = os.path.join(ROOT, "docs", "tensorctl.md")
SAMPLE_HEADER = re.compile(r"^ *(NAME|CONN|PREFIX|COMMIT|DEVICE|UID)  ")


def doc_blocks(path, lang=""):
    """(line, text) of every fenced block of that language ("" for none) in the file."""
    blocks, cur = [], None
    for n, line in enumerate(open(path).read().splitlines(), 1):
        if cur is None and line.startswith("```"):
            cur = (n, line[3:].strip(), [])
        elif cur is not None and line.startswith("```"):
            if cur[1] == lang:
                blocks.append((cur[0], "\n".join(cur[2]) + "\n"))
            cur = None
        elif cur is not None:
            cur[2].append(line)
    return blocks


def words(line):
    return " ".join(line.split())


def real_output(daemon, tmp_path):
    """Every table and key tensorctl prints, for a daemon with a tensor."""
    ctl = [build_path("tensorctl"), "--socket", daemon.socket]
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    subprocess.run(ctl + ["put", "model/inputs/0", str(tmp_path / "x.npy")], check=True)
    out = {}
    for args in [("ls",), ("leases",), ("clients",), ("stats",), ("ls", "--group", "prefix"),
                 ("ls", "--group", "commit"), ("leases", "--group", "prefix"),
                 ("leases", "--group", "commit"), ("stat", "model/inputs/0"),
                 ("stat", "model/inputs/0", "--json"), ("clients", "--json")]:
        out[args] = subprocess.run(ctl + list(args), check=True, capture_output=True,
                                   text=True).stdout
    return out


def test_tensorctl_md_table_headers_are_what_tensorctl_prints(daemon, tmp_path):
    out = real_output(daemon, tmp_path)
    printed = {words(l) for text in out.values() for l in text.splitlines()
               if SAMPLE_HEADER.match(l)}
    shown = [(line, words(l)) for line, block in doc_blocks(TENSORCTL_MD)
             for l in block.splitlines() if SAMPLE_HEADER.match(l)]
    assert len(shown) >= 8, shown
    for line, header in shown:
        assert header in printed, f"docs/tensorctl.md:{line}: {header!r} is not printed"


def test_tensorctl_md_stats_and_stat_samples_have_the_real_keys(daemon, tmp_path):
    out = real_output(daemon, tmp_path)
    keys = lambda text: [l.split(":", 1)[0] for l in text.split("\n\n")[0].splitlines()]
    blocks = {b.splitlines()[0].split(":")[0]: b for _, b in doc_blocks(TENSORCTL_MD)
              if re.match(r"^[a-z]+: ", b)}
    assert keys(blocks["tensors"]) == keys(out[("stats",)]), out[("stats",)]
    assert keys(blocks["name"]) == keys(out[("stat", "model/inputs/0")])


def test_tensorctl_md_json_samples_have_the_real_keys(daemon, tmp_path):
    out = real_output(daemon, tmp_path)
    samples = [json.loads(b) for _, b in doc_blocks(TENSORCTL_MD, "json") if "..." not in b]
    tensor = json.loads(out[("stat", "model/inputs/0", "--json")])
    client = json.loads(out[("clients", "--json")])[0]
    objects = {next(iter(s)): s for s in samples if isinstance(s, dict)}
    lists = {next(iter(s[0])): s[0] for s in samples if isinstance(s, list)}
    assert set(objects["name"]) == set(tensor)
    assert set(lists["conn_id"]) == set(client)
    assert set(objects["error"]) == {"error", "errno", "message"}
    if "tensord" in sys.modules or _module():
        import tensord
        with tensord.connect(daemon.socket, name="doc") as c, c.attach("model/inputs/0"):
            ctl = [build_path("tensorctl"), "--socket", daemon.socket]
            held = json.loads(subprocess.run(ctl + ["leases", "--json"], check=True,
                                             capture_output=True, text=True).stdout)
        assert set(lists["name"]) == set(held[0])


def _module():
    sys.path.insert(0, build_path("python"))
    try:
        import tensord  # noqa: F401
        return True
    except ImportError:
        return False


def test_readme_tensorctl_session_runs(daemon, tmp_path):
    """Every `$ ...` line of the README's session, in order, in a shell with
    build/ on PATH and the test daemon as the default socket; its `tensord &`
    is the fixture's daemon."""
    text = open(os.path.join(ROOT, "README.md")).read()
    start = text.index("$ tensord &")
    session = text[start:text.index("```", start)]
    cmds = [l[2:].split("  #")[0].strip() for l in session.splitlines() if l.startswith("$ ")]
    assert cmds[0].startswith("tensord &") and len(cmds) >= 8, cmds
    # python3: this interpreter's, which has numpy.
    pydir = tmp_path / "py"
    pydir.mkdir()
    os.symlink(sys.executable, pydir / "python3")
    env = dict(os.environ, PATH=f"{os.path.dirname(build_path('tensorctl'))}:{pydir}:"
               + os.environ["PATH"], TENSORD_SOCKET=daemon.socket)
    for cmd in cmds[1:]:
        r = subprocess.run(["sh", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"README: $ {cmd}: exit {r.returncode}: {r.stderr}"
    assert (tmp_path / "y.npy").exists()
