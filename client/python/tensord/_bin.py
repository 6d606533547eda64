"""The wheel's console entry points `tensord` and `tensorctl`: they run the
programs built into the package (tensord/bin/), replacing this process, so
signals, exit status and --ready-fd descriptors are the program's own."""
import os
import sys


def _run(name):
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if not os.access(exe, os.X_OK):
        sys.exit(f"{name}: {exe} is missing: this tensord package was not built with its "
                 "programs (build the repository with make, or pip install the sdist)")
    os.execv(exe, [name] + sys.argv[1:])


def tensord():
    _run("tensord")


def tensorctl():
    _run("tensorctl")
