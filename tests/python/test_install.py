"""`pip install ./client/python` builds a self-contained, working module."""
import glob
import os
import shutil
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_pip_wheel_builds_and_works(tmp_path, daemon):
    # Built from a copy, so pip's in-tree build leaves the checkout clean;
    # TENSORD_SOURCE_DIR points setup.py back at the library sources.
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "client", "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = dict(os.environ, TENSORD_SOURCE_DIR=ROOT)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "wheels"), str(src)],
                   check=True, env=env)
    (whl,) = glob.glob(str(tmp_path / "wheels" / "tensord-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(site)
    assert "tensord/py.typed" in names and "tensord/__init__.pyi" in names

    env = dict(os.environ, PYTHONPATH=str(site), TENSORD_SOCKET=daemon.socket)
    code = """
import numpy as np, tensord
assert tensord.__file__.startswith(%r), tensord.__file__
with tensord.connect() as c:
    c.put("w", np.arange(3.0))
    with c.attach("w") as t:
        print(np.from_dlpack(t).tolist())
""" % str(site)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0.0, 1.0, 2.0]"
