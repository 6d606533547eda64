#!/usr/bin/env bash
# Builds tensord and runs the whole GPU suite on a Linux machine with an
# NVIDIA GPU, the CUDA toolkit headers and python3 with torch (and cupy),
# but no package registry and no libuv / protobuf-c installed: those come
# from the .deb files that tests/gpu/fetch-debs.sh prepared in
# tests/gpu/debs/ (run it on a Debian 12 machine first; carry the folder).
#
#   bash tests/gpu/run.sh            build, then run everything
#
# What runs, each once with the default sharing path (cuda-vmm where the GPU
# has it) and once with TENSORD_CUDA_PATH=ipc (legacy CUDA IPC):
#   1. build/.../test_gpu_backends   the unit test, now with a real driver
#   2. gpu_suite (tests/gpu/*.c)     writer/reader processes, mutable
#                                    tensors, kill -9, death mid-import,
#                                    GPU memory back to baseline, latency
#   3. tests/python/test_gpu.py      torch / cupy from_dlpack, zero copy
# Exit: 0 all passed, 1 something failed, 77 no GPU (nothing was run).
# Knobs: B=build dir (default build/gpu), CUDA_HOME, USE_DEBS=1 (use the
# .debs even where the system has libuv/protobuf-c).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"
B=${B:-build/gpu}
debs=$here/debs
say() { echo "gpu-suite: $*" >&2; }
status=0
results=()
record() { results+=("$1 $2"); [ "$1" = PASS ] || [ "$1" = SKIP ] || status=1; }

# --- libuv / protobuf-c / cmocka: the system's, else the unpacked .debs ---
if [ "${USE_DEBS:-0}" != 1 ] && pkg-config --exists libuv libprotobuf-c 2>/dev/null &&
   command -v protoc-c >/dev/null; then
	say "using the system's libuv and protobuf-c"
else
	root=$debs/root
	lib=$root/usr/lib/x86_64-linux-gnu
	if [ ! -f "$root/usr/include/uv.h" ]; then
		say "no libuv here and no $root: run tests/gpu/fetch-debs.sh on a Debian 12 machine first"
		exit 1
	fi
	say "using libuv / protobuf-c from $root"
	# The Makefile appends its own flags to these (make's += on environment variables).
	export CPPFLAGS="-I$root/usr/include"
	export LDFLAGS="-L$lib -Wl,-rpath,$lib"
	export LDLIBS="-luv -lprotobuf-c"
	export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export PATH="$root/usr/bin:$PATH"
	if ! protoc-c --version >/dev/null 2>&1; then
		# Another glibc or libstdc++: use the sources generated on the Debian machine,
		# newer than the .proto so make keeps them.
		say "the packaged protoc-c does not run here; using $debs/pregen"
		mkdir -p "$B/proto"
		cp "$debs"/pregen/tensord.pb-c.[ch] "$B/proto/"
		touch "$B"/proto/tensord.pb-c.[ch]
	fi
fi

# --- CUDA toolkit headers (the daemon builds without them; the C suite needs cuda.h) ---
if [ -z "${CUDA_HOME:-}" ]; then
	for d in /usr/local/cuda /usr/local/cuda-* "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")"; do
		[ -f "$d/include/cuda.h" ] && { CUDA_HOME=$d; break; }
	done
fi
export CUDA_HOME=${CUDA_HOME:-}

# --- build ---------------------------------------------------------------------
say "building in $B (CUDA_HOME=${CUDA_HOME:-none})"
make -j"$(nproc)" B="$B" "$B/tensord" "$B/libtensord.a" || { say "build failed"; exit 1; }
if make -j"$(nproc)" B="$B" "$B/tests/unit/test_gpu_backends" >/dev/null; then
	have_unit=1
else
	have_unit=0
	record SKIP "unit-test (did not build: cmocka missing?)"
fi
py_inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
if [ -f "$py_inc/Python.h" ] && make -j"$(nproc)" B="$B" all >/dev/null; then
	have_py=1
else
	have_py=0
	record SKIP "python (no Python.h in '$py_inc' or the extension did not build)"
fi
# --- is there a GPU? ------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
	say "SKIPPED: no NVIDIA GPU here (nvidia-smi -L failed); the build above succeeded"
	exit 77
fi
nvidia-smi -L >&2

if [ -n "$CUDA_HOME" ]; then
	if [ -f "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
		culink=(-L"$CUDA_HOME/lib64/stubs" -lcuda)
	else
		culink=(-l:libcuda.so.1)
	fi
	${CC:-cc} -std=c11 -O2 -g -Wall -Wextra -Iinclude -isystem "$CUDA_HOME/include" \
		tests/gpu/gpu_suite.c "$B/libtensord.a" ${LDFLAGS:-} ${LDLIBS:--lprotobuf-c} \
		"${culink[@]}" -ldl -lpthread -o "$B/gpu_suite" || { say "gpu_suite did not build"; exit 1; }
fi

# pytest from the prepared wheels when the machine lacks it (pure Python: unzip is enough).
pylib=$top/$B/pylib
if [ "$have_py" = 1 ] && ! python3 -c 'import pytest' 2>/dev/null; then
	if ls "$debs"/wheels/*.whl >/dev/null 2>&1; then
		mkdir -p "$pylib"
		for w in "$debs"/wheels/*.whl; do python3 -m zipfile -e "$w" "$pylib"; done
	else
		have_py=0
		record SKIP "python (no pytest and no wheels in $debs/wheels)"
	fi
fi

for path in default ipc; do
	if [ "$path" = ipc ]; then export TENSORD_CUDA_PATH=ipc; else unset TENSORD_CUDA_PATH; fi
	say "=== sharing path: $path"
	if [ "$have_unit" = 1 ]; then
		if "$B/tests/unit/test_gpu_backends"; then record PASS "unit-test/$path"
		else record FAIL "unit-test/$path"; fi
	fi
	if [ -x "$B/gpu_suite" ]; then
		if "$B/gpu_suite" "$B/tensord"; then record PASS "gpu_suite/$path"
		else record FAIL "gpu_suite/$path"; fi
	else
		record SKIP "gpu_suite/$path (no CUDA toolkit headers: set CUDA_HOME)"
	fi
	if [ "$have_py" = 1 ]; then
		TENSORD_BUILD=$top/$B PYTHONPATH="$top/$B/python:$pylib${PYTHONPATH:+:$PYTHONPATH}" \
			python3 -m pytest -rs -v -p no:cacheprovider tests/python/test_gpu.py
		rc=$?
		if [ $rc = 0 ]; then record PASS "python/$path"
		elif [ $rc = 5 ]; then record SKIP "python/$path (nothing collected)"
		else record FAIL "python/$path"; fi
	fi
done

say "summary:"
for r in "${results[@]}"; do echo "  $r" >&2; done
exit $status
