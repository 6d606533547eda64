"""`make install` / `make uninstall` as an operator runs them: into a
temporary PREFIX, and staged under DESTDIR. The README's C program is built
against the installed tensord.pc and run against the installed daemon; the
systemd units are checked by systemd-analyze, the sysusers file by
systemd-sysusers, the man pages by groff."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import BUILD

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    os.environ.get("TENSORD_SANITIZED") == "1",
    reason="installs the plain build; the sanitizer run would rebuild its tree without ASan")


def make(*args, check=True):
    r = subprocess.run(["make", "-C", ROOT, "--no-print-directory", "B=" + BUILD] + list(args),
                       capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs)


def version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


def readme_c_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("```c\n") + len("```c\n")
    return text[start:text.index("```", start)]


@pytest.fixture
def prefix(tmp_path):
    p = tmp_path / "prefix"
    make("install", "PREFIX=" + str(p))
    yield p
    make("uninstall", "PREFIX=" + str(p))


def test_install_layout(prefix):
    v = version()
    have = set(files_under(prefix))
    for f in ["bin/tensord", "bin/tensorctl", "lib/libtensord.a", "lib/libtensord.so.%s" % v,
              "include/tensord/tensord.h", "include/tensord/dlpack.h",
              "lib/pkgconfig/tensord.pc", "lib/systemd/system/tensord.service",
              "lib/systemd/system/tensord.socket", "lib/sysusers.d/tensord.conf",
              "share/man/man8/tensord.8", "share/man/man1/tensorctl.1",
              "share/man/man3/libtensord.3", "share/doc/tensord/README.md",
              "share/doc/tensord/operating.md", "share/doc/tensord/gpu.conf"]:
        assert f in have, f
    lib = prefix / "lib"
    assert os.readlink(lib / "libtensord.so") == "libtensord.so.2"
    assert os.readlink(lib / "libtensord.so.2") == "libtensord.so.%s" % v
    dyn = subprocess.run(["readelf", "-d", str(lib / ("libtensord.so.%s" % v))],
                         capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libtensord.so.2]" in dyn
    pc = (lib / "pkgconfig" / "tensord.pc").read_text()
    assert "prefix=%s\n" % prefix in pc and "Version: %s\n" % v in pc
    unit = (prefix / "lib/systemd/system/tensord.service").read_text()
    assert "ExecStart=%s/bin/tensord " % prefix in unit
    assert "file://%s/share/doc/tensord/operating.md" % prefix in unit
    assert not re.search(r"@[A-Z]+@", unit + pc)     # every template field filled


def readme_build_lines():
    """The README's sh block right after its C example: the build line, then the run line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    after = text[text.index("```c\n"):]
    start = after.index("```sh\n") + len("```sh\n")
    return after[start:after.index("```", start)].strip().splitlines()


def test_readme_c_example_against_the_installed_pc(prefix, tmp_path):
    """The README's C program built with exactly its line (pkg-config, and
    the rpath it adds) against the installed tensord.pc, then run as the
    README runs it, with no LD_LIBRARY_PATH, against the installed daemon."""
    (tmp_path / "app.c").write_text(readme_c_example())
    build, run = readme_build_lines()
    assert build.startswith("cc -o app app.c $(pkg-config --cflags --libs tensord)"), build
    assert run == "./app", run
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    env.pop("LD_LIBRARY_PATH", None)
    r = subprocess.run(["sh", "-c", build], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run_env = dict(env, TENSORD_SOCKET=str(tmp_path / "s"))
    ldd = subprocess.run(["ldd", str(tmp_path / "app")], env=run_env, capture_output=True,
                         text=True).stdout
    assert "libtensord.so.2 => %s/lib/libtensord.so.2" % prefix in ldd, ldd
    # The README's line without its rpath: the program builds and then cannot
    # start, as the README warns; LD_LIBRARY_PATH is the other way.
    bare = build[:build.index(" -Wl,-rpath")] + " -o bare"
    subprocess.run(["sh", "-c", bare], cwd=tmp_path, env=env, check=True, timeout=120)
    r = subprocess.run([str(tmp_path / "bare")], env=run_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "libtensord.so.2: cannot open shared object file" in r.stderr

    rfd, wfd = os.pipe()
    daemon = subprocess.Popen([str(prefix / "bin" / "tensord"), "--socket", str(tmp_path / "s"),
                               "--ready-fd", str(wfd)], pass_fds=(wfd,),
                              stderr=subprocess.DEVNULL)
    os.close(wfd)
    try:
        with os.fdopen(rfd, "rb") as f:
            assert f.read(1) == b"R"
        for _ in range(2):
            r = subprocess.run(["sh", "-c", run], cwd=tmp_path, env=run_env,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip() == "2"
        r = subprocess.run([str(tmp_path / "bare")], cwd=tmp_path,
                           env=dict(run_env, LD_LIBRARY_PATH=str(prefix / "lib")),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
        r = subprocess.run([str(prefix / "bin" / "tensorctl"), "--version"],
                           capture_output=True, text=True)
        assert r.stdout.startswith("tensorctl %s " % version())
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0


def test_uninstall_leaves_nothing(tmp_path):
    p = tmp_path / "prefix"
    make("install", "PREFIX=" + str(p))
    assert len(files_under(p)) > 15
    make("uninstall", "PREFIX=" + str(p))
    assert files_under(p) == []
    assert not any("tensord" in d for d, _, _ in os.walk(p))


def test_destdir_stages_a_usr_install(tmp_path):
    stage = tmp_path / "stage"
    make("install", "PREFIX=/usr", "DESTDIR=" + str(stage))
    files = files_under(stage)
    assert all(f.startswith("usr/") for f in files), files
    assert "prefix=/usr\n" in (stage / "usr/lib/pkgconfig/tensord.pc").read_text()
    unit = (stage / "usr/lib/systemd/system/tensord.service").read_text()
    assert "ExecStart=/usr/bin/tensord " in unit
    assert str(stage) not in unit
    make("uninstall", "PREFIX=/usr", "DESTDIR=" + str(stage))
    assert files_under(stage) == []


def test_python_package_installs_on_request(tmp_path):
    p = tmp_path / "prefix"
    make("install", "PREFIX=" + str(p), "PYTHON_INSTALL=1")
    try:
        (init,) = [f for f in files_under(p) if f.endswith("tensord/__init__.py")]
        site = os.path.dirname(os.path.dirname(p / init))
        r = subprocess.run([sys.executable, "-c", "import tensord; print(tensord.__file__)"],
                           env=dict(os.environ, PYTHONPATH=site), capture_output=True,
                           text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(site)
    finally:
        make("uninstall", "PREFIX=" + str(p), "PYTHON_INSTALL=1")
    assert files_under(p) == []


def need(tool):
    if not shutil.which(tool):
        pytest.skip("%s is not installed (deploy/setup.sh installs systemd)" % tool)


def test_units_pass_systemd_analyze_verify(prefix):
    need("systemd-analyze")
    units = prefix / "lib/systemd/system"
    # MANPATH: verify checks that Documentation=man:tensord(8) resolves.
    r = subprocess.run(["systemd-analyze", "verify", str(units / "tensord.service"),
                        str(units / "tensord.socket")], capture_output=True, text=True,
                       env=dict(os.environ, MANPATH=str(prefix / "share/man") + ":"),
                       timeout=120)
    err = r.stderr
    # FileDescriptorStorePreserve= (the store kept across a stop,
    # docs/restart.md) is systemd 254's; an older systemd warns and ignores
    # it, and keeps the store across crashes and Restart= only.
    v = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True)
    m = re.match(r"systemd (\d+)", v.stdout)
    if m and int(m.group(1)) < 254:
        err = "\n".join(line for line in err.splitlines()
                        if "Unknown key 'FileDescriptorStorePreserve'" not in line)
    assert r.returncode == 0 and "tensord" not in err, r.stderr


def test_service_security_exposure_is_at_most_4(prefix):
    need("systemd-analyze")
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager",
                        str(prefix / "lib/systemd/system/tensord.service")],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for tensord.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    print("systemd-analyze security: %s" % m.group(1))
    assert float(m.group(1)) <= 4.0, r.stdout


def test_sysusers_creates_the_user_and_group(prefix, tmp_path):
    need("systemd-sysusers")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    r = subprocess.run(["systemd-sysusers", "--root=%s" % root,
                        str(prefix / "lib/sysusers.d/tensord.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    user = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines()
            if line.startswith("tensord:")]
    group = [line.split(":") for line in (root / "etc/group").read_text().splitlines()
             if line.startswith("tensord:")]
    assert len(user) == 1 and len(group) == 1
    assert user[0][3] == group[0][2]                 # primary group tensord
    assert user[0][6] == "/usr/sbin/nologin"


@pytest.mark.parametrize("page", ["man8/tensord.8", "man1/tensorctl.1",
                                  "man3/libtensord.3"])
def test_man_pages_render_without_warnings(prefix, page):
    need("groff")
    path = prefix / "share/man" / page
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(path)],
                       capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    head = path.read_text().splitlines()[0]
    assert '"tensord %s"' % version() in head, head
