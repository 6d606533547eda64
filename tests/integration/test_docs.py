"""The README's tensorctl session prints what the README shows: the same
commands against a real daemon give the sample's `ls` table, cell for cell
(the owner is the running user's name, as in the sample when run as root)."""
import os
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
