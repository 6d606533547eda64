"""deploy/setup.sh on a machine whose python3 is "externally managed"
(PEP 668, as Debian 12's): pip refuses the system interpreter, so setup
makes a project virtual environment and installs into that.

Such an interpreter is arranged here from the running one: a copy of its
executable in a temporary prefix whose stdlib is the real one, file by file
(symlinks), plus an EXTERNALLY-MANAGED marker. numpy is linked into its
site-packages as a distribution's python3-numpy would be, so setup has
nothing to download; that pip does install into the venv is shown with a
wheel written here.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def managed_python(prefix):
    """An interpreter in prefix that PEP 668 marks as externally managed."""
    ver = "python%d.%d" % sys.version_info[:2]
    real_exe = os.path.realpath(sys._base_executable)
    libdir = sysconfig.get_config_var("LIBDIR")
    stdlib = sysconfig.get_path("stdlib")
    import numpy
    import pip
    purelibs = {os.path.dirname(os.path.dirname(m.__file__)) for m in (numpy, pip)}
    os.makedirs(prefix / "bin")
    lib = prefix / "lib" / ver
    os.makedirs(lib / "site-packages")
    exe = prefix / "bin" / ver
    shutil.copy2(real_exe, exe)
    ldlib = sysconfig.get_config_var("LDLIBRARY")
    if ldlib and os.path.exists(os.path.join(libdir, ldlib)):
        os.symlink(os.path.join(libdir, ldlib), prefix / "lib" / ldlib)
        os.symlink(os.path.join(libdir, ldlib), prefix / "lib" / (ldlib + ".1.0"))
    for e in os.listdir(stdlib):
        if e not in ("site-packages", "EXTERNALLY-MANAGED"):
            os.symlink(os.path.join(stdlib, e), lib / e)
    for purelib in purelibs:
        for pkg in ("pip", "numpy", "numpy.libs"):
            dst = lib / "site-packages" / pkg
            if os.path.exists(os.path.join(purelib, pkg)) and not os.path.lexists(dst):
                os.symlink(os.path.join(purelib, pkg), dst)
    (lib / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=managed by the test's pretend distribution\n")
    r = subprocess.run([str(exe), "-c", "import sys, numpy; print(sys.prefix)"],
                       capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.strip() != str(prefix):
        pytest.skip(f"a copy of {real_exe} does not run from {prefix}: {r.stderr.strip()}")
    return exe


def tiny_wheel(where):
    """A pure-Python wheel with one module, written by hand (no build backend)."""
    name = "tdsetupprobe-1.0-py3-none-any.whl"
    files = {
        "tdsetupprobe.py": "OK = 1\n",
        "tdsetupprobe-1.0.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: tdsetupprobe\nVersion: 1.0\n",
        "tdsetupprobe-1.0.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + "tdsetupprobe-1.0.dist-info/RECORD,,\n"
    files["tdsetupprobe-1.0.dist-info/RECORD"] = record
    with zipfile.ZipFile(where / name, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return str(where / name)


def test_setup_makes_a_venv_when_python3_is_externally_managed(tmp_path):
    base = managed_python(tmp_path / "usr")
    wheel = tiny_wheel(tmp_path)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)

    refused = subprocess.run([str(base), "-m", "pip", "install", wheel],
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0
    assert "externally-managed-environment" in refused.stderr, refused.stderr

    venv = tmp_path / "venv"
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "setup.sh"), "run"], cwd=ROOT,
                       env=dict(env, PYTHON_BASE=str(base), VENV=str(venv)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"created {venv}" in r.stderr
    assert "pip installing" not in r.stderr, "numpy came with the base, nothing to fetch"

    py = str(venv / "bin" / "python")
    out = subprocess.check_output(
        [py, "-c", "import sys, numpy; print(sys.prefix, sys.base_prefix)"], text=True, env=env)
    assert out.split() == [str(venv), str(tmp_path / "usr")]
    subprocess.run([py, "-m", "pip", "install", "-q", wheel], check=True, env=env, timeout=120)
    assert subprocess.check_output([py, "-c", "import tdsetupprobe; print(tdsetupprobe.OK)"],
                                   text=True, env=env).strip() == "1"

    # A second run finds the venv ready and changes nothing.
    again = subprocess.run(["bash", os.path.join(ROOT, "deploy", "setup.sh"), "run"], cwd=ROOT,
                           env=dict(env, PYTHON_BASE=str(base), VENV=str(venv)),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stderr == "", again.stderr
