"""Builds the tensord wheel: the tensord._tensord extension (this
directory's C files with the C client library, client/lib/sources.txt, and
the protobuf-c code generated from proto/tensord.proto), and the tensord
daemon and tensorctl programs, shipped inside the package (tensord/bin/)
and run by the console entry points of the same names (tensord/_bin.py).

Where the C sources are: in a checkout, two directories up; in an sdist,
in _src/, which `setup.py sdist` fills with the repository files the build
needs (TREE); TENSORD_SOURCE_DIR points elsewhere.

The programs link protobuf-c and libuv statically when their static
libraries are installed (Debian's libprotobuf-c-dev and libuv1-dev ship
them; TENSORD_STATIC=0 links them dynamically); tensorctl also needs
libzip-dev (linked dynamically: Debian ships no archive) and
libjansson-dev (static when its archive is there). The extension cannot:
Debian's libprotobuf-c.a is not position-independent, so it links
libprotobuf-c.so.1, which `auditwheel repair` copies into the wheel for a
manylinux tag (docs/python.md).
"""
import glob
import os
import shlex
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.join(HERE, "_src")
ROOT = os.path.abspath(os.environ.get("TENSORD_SOURCE_DIR") or
                       (BUNDLED if os.path.isdir(BUNDLED) else os.path.join(HERE, "..", "..")))

# The repository files an sdist carries in _src/, relative to the root.
TREE = ["include/tensord/*.h", "proto/tensord.proto", "proto/peer.proto", "proto/frame.[ch]", "common/*.[ch]",
        "gpu/*.[ch]", "gpu/*/*.[ch]", "client/lib/*.[ch]", "client/lib/sources.txt",
        "daemon/*.[ch]", "daemon/*.def", "daemon/*/*.[ch]", "daemon/*/*.def",
        "daemon/remote/xport/*.c", "client/tensorctl/*.[ch]",
        "VERSION"]


def tree(*patterns):
    """Absolute paths under ROOT matching the patterns, sorted."""
    return sorted(p for pat in patterns for p in glob.glob(os.path.join(ROOT, pat)))


def lib_sources():
    """libtensord's C files, as client/lib/sources.txt lists them (a line may be a pattern)."""
    with open(os.path.join(ROOT, "client", "lib", "sources.txt")) as f:
        return tree(*[line.strip() for line in f if line.strip() and not line.startswith("#")])


def version():
    """The one version string (VERSION at the root), as the Makefile passes it."""
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


def daemon_sources():
    """What the Makefile links into tensord: daemon/, the shared common code, and of
    each GPU vendor's folder everything but its importers (libtensord's)."""
    common = ["common/%s.c" % m for m in ("desc", "names", "errors", "paths", "sys", "vendor")]
    gpu = [p for p in tree("gpu/*.c", "gpu/*/*.c")
           if not os.path.basename(p).startswith("import_")]
    # The data path between daemons (daemon/remote/xport.h): UCX where pkg-config finds it.
    xport = "daemon/remote/xport/ucx.c" if UCX_LIBS else "daemon/remote/xport/none.c"
    return tree("daemon/*.c", "daemon/*/*.c", "proto/frame.c", xport, *common) + gpu


def pkg_config(pkg, *args):
    try:
        out = subprocess.run(["pkg-config", *args, pkg], check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


def link_args(pkg, archives, fallback):
    """The static archive of pkg when one is installed, else its shared library."""
    if os.environ.get("TENSORD_STATIC", "1") != "0":
        libdir = (pkg_config(pkg, "--variable=libdir") or ["/usr/lib"])[0]
        for a in archives:
            if os.path.exists(os.path.join(libdir, a)):
                return [os.path.join(libdir, a)]
    return pkg_config(pkg, "--libs") or [fallback]


def gpu_flags():
    """The same optional GPU headers the Makefile uses; the code builds without them."""
    flags = []
    cuda = os.environ.get("CUDA_HOME") or next(
        iter(sorted(glob.glob("/usr/local/cuda")) + sorted(glob.glob("/usr/local/cuda-*"))), "")
    if cuda and os.path.exists(os.path.join(cuda, "include", "cuda.h")):
        flags += ["-DTENSORD_HAVE_CUDA_H", "-isystem", os.path.join(cuda, "include")]
    if os.path.exists("/usr/include/hip/hip_runtime_api.h"):
        flags += ["-DTENSORD_HAVE_HIP_H", "-D__HIP_PLATFORM_AMD__"]
    return flags


CFLAGS = ["-std=c11", "-fvisibility=hidden", "-Wno-cast-function-type",
          "-Wno-unused-parameter"] + pkg_config("libprotobuf-c", "--cflags") + \
    pkg_config("libuv", "--cflags") + gpu_flags()
PROTOBUF_C = link_args("libprotobuf-c", ["libprotobuf-c.a"], "-lprotobuf-c")
LIBUV = link_args("libuv", ["libuv_a.a", "libuv.a"], "-luv")
# libtensord (so tensorctl and the extension) reads and writes .npz
# checkpoints with libzip (Debian ships no archive of it: libzip.so.4) and
# .safetensors headers with jansson.
CTL_CFLAGS = pkg_config("libzip", "--cflags") + pkg_config("jansson", "--cflags")
CTL_LIBS = (pkg_config("libzip", "--libs") or ["-lzip"]) + \
    link_args("jansson", ["libjansson.a"], "-ljansson")
# The extension links both shared: Debian's libjansson.a is not position-independent.
EXT_FILE_LIBS = (pkg_config("libzip", "--libs") or ["-lzip"]) + \
    (pkg_config("jansson", "--libs") or ["-ljansson"])
# The daemon's peering (docs/remote.md) authenticates with libcrypto's HMAC.
CRYPTO = pkg_config("libcrypto", "--libs") or ["-lcrypto"]
# Its state log (docs/restart.md) checks each record with zlib's CRC-32.
ZLIB = pkg_config("zlib", "--libs") or ["-lz"]
# Remote attach moves bytes with UCX (libucx-dev); without it the daemon says why.
UCX_LIBS = pkg_config("ucx", "--libs")
UCX_CFLAGS = pkg_config("ucx", "--cflags") if UCX_LIBS else []
SYSLIBS = ["-ldl", "-lpthread", "-lrt", "-lm"]


class BuildExt(build_ext):
    """Runs protoc-c into the build directory, builds the extension, then
    the two programs into the package's bin/."""

    def run(self):
        self.gen = os.path.join(os.path.abspath(self.build_temp), "proto")
        os.makedirs(self.gen, exist_ok=True)
        for proto in ("tensord.proto", "peer.proto"):
            subprocess.check_call(["protoc-c", "--proto_path=" + os.path.join(ROOT, "proto"),
                                   "--c_out=" + self.gen, os.path.join(ROOT, "proto", proto)])
        for ext in self.extensions:
            ext.sources = [os.path.join(HERE, p) for p in ext.sources] + lib_sources() + \
                [os.path.join(self.gen, "tensord.pb-c.c")]
            ext.include_dirs += [os.path.join(ROOT, "include"), ROOT, os.path.dirname(self.gen)]
        super().run()
        self.build_programs()

    def build_programs(self):
        out = os.path.join(os.path.abspath(self.build_lib), "tensord", "bin")
        pb = os.path.join(self.gen, "tensord.pb-c.c")
        peer_pb = os.path.join(self.gen, "peer.pb-c.c")
        programs = [("tensord", daemon_sources() + [pb, peer_pb],
                     PROTOBUF_C + LIBUV + CRYPTO + ZLIB + UCX_LIBS, UCX_CFLAGS),
                    ("tensorctl", tree("client/tensorctl/*.c") + lib_sources() + [pb],
                     PROTOBUF_C + CTL_LIBS, CTL_CFLAGS)]
        for name, srcs, libs, cflags in programs:
            objs = self.compiler.compile(
                srcs, output_dir=os.path.join(self.build_temp, name),
                include_dirs=[os.path.join(ROOT, "include"), ROOT, os.path.dirname(self.gen)],
                macros=[("_GNU_SOURCE", None), ("TENSORD_VERSION", '"%s"' % version())],
                extra_postargs=CFLAGS + cflags + ["-O2"])
            self.compiler.link_executable(objs, name, output_dir=out,
                                          extra_postargs=libs + SYSLIBS)
            if self.inplace:   # pip install -e: next to the package sources
                os.makedirs(os.path.join(HERE, "tensord", "bin"), exist_ok=True)
                shutil.copy2(os.path.join(out, name), os.path.join(HERE, "tensord", "bin"))


class SDist(sdist):
    """Carries the repository's C sources in _src/, so the sdist builds anywhere."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for pattern in TREE:
            for path in tree(pattern):
                dst = os.path.join(base_dir, "_src", os.path.relpath(path, ROOT))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(path, dst)


ext = Extension(
    "tensord._tensord",
    sources=sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "*.c"))),
    define_macros=[("_GNU_SOURCE", None), ("TENSORD_VERSION", '"%s"' % version())],
    extra_compile_args=CFLAGS + CTL_CFLAGS,
    extra_link_args=(pkg_config("libprotobuf-c", "--libs") or ["-lprotobuf-c"]) + EXT_FILE_LIBS +
    ["-ldl", "-lpthread"],
)

setup(version=version(), ext_modules=[ext], cmdclass={"build_ext": BuildExt, "sdist": SDist})
