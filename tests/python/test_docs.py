"""The README's and docs/python.md's Python snippets run (issue 34), so
they cannot drift from the module: every ```python block is run as a
script, in a fresh interpreter, against a test daemon ($TENSORD_SOCKET, so
`tensord.connect()` finds it), and must exit 0.

A block that is not a whole program says so in an HTML comment on the line
before its fence, which renders as nothing:

    <!-- doc-test: with-client -->     runs after `import numpy as np, tensord`
                                       and `c = tensord.connect()`
    <!-- doc-test: skip: REASON -->    not run (a sketch: undefined names, an
                                       endless loop, a GPU); REASON is required

An unmarked block that fails fails this test, naming the file and line."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", "docs/python.md"]
MARK = re.compile(r"^<!-- doc-test: (with-client|skip: (?P<why>\S.*\S)) -->$")
PRELUDE = "import numpy as np, tensord\nc = tensord.connect()\n"


def python_blocks():
    """(file, line, marker or None, code) of every ```python block."""
    out = []
    for f in DOCS:
        lines = open(os.path.join(ROOT, f)).read().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                start = i
                i += 1
                while not lines[i].startswith("```"):
                    i += 1
                prev = lines[start - 1].strip() if start else ""
                mark = MARK.match(prev)
                assert mark or not prev.startswith("<!-- doc-test"), \
                    f"{f}:{start}: {prev!r}: a doc-test mark is with-client or skip: REASON"
                out.append((f, start + 1, mark.group(1) if mark else None,
                            "\n".join(lines[start + 1:i]) + "\n"))
            i += 1
    return out


BLOCKS = python_blocks()


def test_every_doc_has_python_blocks_and_most_run():
    assert {f for f, *_ in BLOCKS} == set(DOCS)
    run = [b for b in BLOCKS if not (b[2] or "").startswith("skip")]
    assert len(run) >= 5, [(f, line) for f, line, *_ in run]


@pytest.mark.parametrize("f,line,mark,code", BLOCKS, ids=[f"{f}:{l}" for f, l, *_ in BLOCKS])
def test_python_snippet_runs(daemon, tmp_path, f, line, mark, code):
    if mark and mark.startswith("skip"):
        pytest.skip(f"{f}:{line} is marked {mark!r}")
    if mark == "with-client":
        code = PRELUDE + code
    env = dict(os.environ, TENSORD_SOCKET=daemon.socket)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{f}:{line}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
