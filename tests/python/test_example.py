"""The example in docs/python.md runs as written."""
import os
import subprocess
import sys

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "client", "python", "examples", "two_process.py")


def test_two_process_example(daemon):
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    r = subprocess.run([sys.executable, EXAMPLE], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["reader: weights (3, 4) float32 sum 66.0 writable False",
                     "reader: counter 1", "reader: counter 2"]
    with tensord.connect(daemon.socket) as c:
        assert c.list("demo/") == []


def readme_block(lang):
    """The first ```lang block of the README that the reader would copy."""
    with open(os.path.join(HERE, "..", "..", "README.md")) as f:
        text = f.read()
    start = text.index("```%s\n" % lang) + len(lang) + 4
    return text[start:text.index("```", start)]


def test_readme_c_example_runs_twice(daemon, tmp_path):
    """The README's C program, compiled as a user would, runs and runs again."""
    build = os.environ.get("TENSORD_BUILD") or os.path.join(HERE, "..", "..", "build")
    src = tmp_path / "app.c"
    src.write_text(readme_block("c"))
    libs = subprocess.run(["pkg-config", "--libs", "libprotobuf-c"], capture_output=True,
                          text=True).stdout.split()
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I",
                    os.path.join(HERE, "..", "..", "include"), str(src),
                    os.path.join(build, "libtensord.a")] + libs
                   + ["-ldl", "-lpthread", "-o", str(tmp_path / "app")], check=True)
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    for _ in range(2):
        r = subprocess.run([str(tmp_path / "app")], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "2"


def test_readme_python_example_runs_twice(daemon):
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", readme_block("python")], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "32.0"
