"""Builds tensord._tensord from this directory's C files together with the
C client library (the files client/lib/sources.txt lists) and the protobuf-c code generated
from proto/tensord.proto, so the wheel needs no libtensord installed.

The library sources live two directories up, so this builds from a checkout
of the tensord repository (pip builds in place); TENSORD_SOURCE_DIR points
elsewhere when needed. setup() wants source paths relative to this file;
build_ext gets them absolute, so that objects of ../../client/*.c land
inside the build directory rather than next to the sources.
"""
import glob
import os
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("TENSORD_SOURCE_DIR") or os.path.join(HERE, "..", ".."))


def sources():
    """This directory's C files plus libtensord's, as client/lib/sources.txt lists them."""
    with open(os.path.join(ROOT, "client", "lib", "sources.txt")) as f:
        lib = [os.path.join(ROOT, line.strip()) for line in f
               if line.strip() and not line.startswith("#")]
    own = sorted(glob.glob(os.path.join(HERE, "*.c")))
    return [os.path.relpath(p, HERE) for p in own + lib]


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "libprotobuf-c"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


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


class BuildExt(build_ext):
    """Runs protoc-c into the build directory before compiling."""

    def run(self):
        gen = os.path.join(os.path.abspath(self.build_temp), "proto")
        os.makedirs(gen, exist_ok=True)
        subprocess.check_call(["protoc-c", "--proto_path=" + os.path.join(ROOT, "proto"),
                               "--c_out=" + gen, os.path.join(ROOT, "proto", "tensord.proto")])
        for ext in self.extensions:
            ext.sources = [os.path.join(HERE, p) for p in ext.sources]
            ext.sources.append(os.path.join(gen, "tensord.pb-c.c"))
            ext.include_dirs.append(os.path.dirname(gen))
        super().run()


ext = Extension(
    "tensord._tensord",
    sources=sources(),
    include_dirs=[os.path.join(ROOT, "include"), ROOT],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-fvisibility=hidden", "-Wno-cast-function-type",
                        "-Wno-unused-parameter"] + pkg_config("--cflags") + gpu_flags(),
    extra_link_args=pkg_config("--libs"),
    libraries=["protobuf-c", "dl", "pthread"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
