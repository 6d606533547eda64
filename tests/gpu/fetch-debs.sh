#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with its package archive, what
# tests/gpu/run.sh needs on a GPU machine that has no package registry:
#
#   tests/gpu/debs/*.deb      libuv, protobuf-c (library, headers, compiler
#                             and the compiler's C++ libraries), cmocka,
#                             libzip and jansson (tensorctl's checkpoints),
#                             libssl-dev and libssl3 (the daemon's libcrypto),
#                             UCX 1.13 and its libraries (remote-bench.sh)
#   tests/gpu/debs/root/      the same, unpacked with dpkg -x
#   tests/gpu/debs/pregen/    tensord.pb-c.[ch], peer.pb-c.[ch] made here, for when the
#                             packaged protoc-c cannot run there (another
#                             glibc or libstdc++)
#   tests/gpu/debs/wheels/    pytest and its pure-Python dependencies
#
# tests/gpu/debs/ is git-ignored (about 12 MiB); carry it to the GPU machine
# with the tree: with the device tool, carry ["tests/gpu/debs"] and run
# `bash tests/gpu/run.sh` (docs/gpu.md, "Hardware runs"). Re-running
# replaces what was there.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=$here/debs
pkgs=(libuv1 libuv1-dev libprotobuf-c1 libprotobuf-c-dev protobuf-c-compiler
      libprotoc32 libprotobuf32 libcmocka0 libcmocka-dev libzip4 libzip-dev libjansson4
      libjansson-dev libssl-dev libssl3
      libucx0 libucx-dev libibverbs1 librdmacm1 libnuma1 libnl-3-200 libnl-route-3-200)

rm -rf "$out"
mkdir -p "$out/root" "$out/pregen" "$out/wheels"
cd "$out"
# apt-get download fetches exactly these packages, no dependency resolution:
# the list above is the closure beyond libc, libstdc++ and zlib (and
# libzip's libbz2, which GPU machines' distributions carry).
apt-get download "${pkgs[@]}"
for d in ./*.deb; do
	dpkg -x "$d" root
done

protoc-c --proto_path="$top/proto" --c_out=pregen "$top/proto/tensord.proto" \
	"$top/proto/peer.proto"

# Pure-Python wheels (py3-none-any), which run.sh unzips when the GPU
# machine lacks pytest. pip evaluates dependency markers for the Python it
# runs on, so the backports Python 3.10 needs (exceptiongroup, tomli) are
# named here; newer Pythons ignore them.
if python3 -m pip --version >/dev/null 2>&1; then
	python3 -m pip download -q --only-binary=:all: --python-version 3.10 -d wheels \
		pytest exceptiongroup tomli
else
	echo "fetch-debs: no pip here; run.sh will need pytest installed on the GPU machine" >&2
fi

du -sh "$out"
ls "$out"/*.deb "$out"/wheels
