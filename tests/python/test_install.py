"""`pip install ./client/python` builds a self-contained, working module;
the sdist installs it and the tensord and tensorctl commands anywhere."""
import glob
import os
import shutil
import subprocess
import sys
import tarfile
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
    assert "tensord/torch.py" in names and "tensord/state_dict.py" in names

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


def test_sdist_installs_tensord_tensorctl_and_the_module_in_a_fresh_venv(tmp_path):
    """The sdist carries every C source it needs; pip installs it into a new
    virtual environment (no system site-packages, build isolation as a user
    gets it) with the module and the tensord and tensorctl commands."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "client", "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_src",
                                                  "bin"))
    env = dict(os.environ, TENSORD_SOURCE_DIR=ROOT)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
                   cwd=src, env=env, check=True, capture_output=True)
    (sdist,) = glob.glob(str(tmp_path / "dist" / "tensord-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for need in ("tdpy.h", "module.c", "tensord/_bin.py", "_src/include/tensord/tensord.h",
                 "_src/proto/tensord.proto", "_src/client/lib/sources.txt",
                 "_src/daemon/main.c", "_src/client/tensorctl/tensorctl.c"):
        assert need in names, f"sdist lacks {need}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "TENSORD_SOURCE_DIR", "VIRTUAL_ENV")}
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", sdist], env=clean,
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    bindir = venv / "bin"
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    for prog in ("tensorctl", "tensord"):
        out = subprocess.run([str(bindir / prog), "--version"], capture_output=True,
                             text=True, env=clean)
        assert out.returncode == 0 and out.stdout.startswith("%s %s " % (prog, version)), out

    # The daemon from the wheel serves the module and tensorctl from the wheel.
    sock = str(tmp_path / "s.sock")
    rfd, wfd = os.pipe()
    d = subprocess.Popen([str(bindir / "tensord"), "--socket", sock, "--ready-fd", str(wfd)],
                         pass_fds=(wfd,), stderr=subprocess.DEVNULL, env=clean)
    os.close(wfd)
    try:
        assert os.read(rfd, 1) == b"R"
        code = ("import tensord; c = tensord.connect(%r); c.put('w', b'wheel'); "
                "print(bytes(memoryview(c.attach('w'))), tensord.__file__)" % sock)
        r = subprocess.run([str(bindir / "python"), "-c", code], capture_output=True,
                           text=True, cwd=str(tmp_path), env=clean)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("b'wheel' " + str(venv)), r.stdout
        ls = subprocess.run([str(bindir / "tensorctl"), "--socket", sock, "ls"],
                            capture_output=True, text=True, env=clean)
        assert ls.returncode == 0 and "\nw " in ls.stdout, ls
    finally:
        d.terminate()
        assert d.wait(timeout=20) == 0
        os.close(rfd)
    # The programs carry protobuf-c and libuv when static archives exist.
    if os.path.exists("/usr/lib/x86_64-linux-gnu/libprotobuf-c.a"):
        (daemon_exe,) = glob.glob(str(venv / "lib" / "python*" / "site-packages" / "tensord"
                                      / "bin" / "tensord"))
        deps = subprocess.run(["ldd", daemon_exe], capture_output=True, text=True).stdout
        assert "libprotobuf-c" not in deps and "libuv" not in deps, deps
