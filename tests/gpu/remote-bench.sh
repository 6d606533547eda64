#!/usr/bin/env bash
# Remote attach between two daemons on a GPU machine without a package
# registry (host tensors, UCX over TCP loopback), built with the Debian packages
# tests/gpu/fetch-debs.sh gathers (carry tests/gpu/debs), next to
# build/bench/ucx_get in the same run:
#   bash tests/gpu/remote-bench.sh        (B=build dir, default build/rb)
# docs/remote.md ("Measured") has what it printed on the lent H200 machine.
set -uo pipefail
top=$(pwd)
root=$top/tests/gpu/debs/root
for d in tests/gpu/debs/*.deb; do dpkg-deb -x "$d" "$root"; done
lib=$root/usr/lib/x86_64-linux-gnu
export CPPFLAGS="-I$root/usr/include -I$root/usr/include/x86_64-linux-gnu"
export LDFLAGS="-L$lib -Wl,-rpath,$lib"
export LDLIBS="-luv -lprotobuf-c -lzip -ljansson -lcrypto"
export LD_LIBRARY_PATH="$lib"
export PATH="$root/usr/bin:$PATH"
export PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
B=${B:-build/rb}
if ! protoc-c --version >/dev/null 2>&1; then
	mkdir -p "$B/proto"
	cp tests/gpu/debs/pregen/*.pb-c.[ch] "$B/proto/"
	touch "$B"/proto/*.pb-c.[ch]
fi
pkg-config --modversion ucx || echo "no ucx pkg-config"
make -j"$(nproc)" B="$B" "$B/tensord" "$B/bench/ucx_get" 2>&1 | tail -3
make -j"$(nproc)" B="$B" 2>&1 | grep -E "error|note" | head -5
ls "$B/python" >/dev/null 2>&1 || echo "no python module"
nproc
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n
for i in 1; do
	timeout 120 "$B/bench/ucx_get" 2>&1 | grep -E "UCX |4 KiB p50|1 GiB"
	TENSORD_BUILD=$top/$B PYTHONPATH=$top/$B/python timeout 150 python3 bench/py_remote.py --no-ray --small 300 --rounds 5 2>&1 | grep -E "py_remote: (4|10)|Error|error"
done
