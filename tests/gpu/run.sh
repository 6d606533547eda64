#!/usr/bin/env bash
# The GPU suite in one command, for a Linux machine with an NVIDIA GPU, its
# driver, the CUDA toolkit (nvcc, cuda.h), python3 with torch and cupy, and
# no package registry. libuv, protobuf-c, cmocka and pytest come from
# tests/gpu/debs/ when the machine lacks them: tests/gpu/fetch-debs.sh fills
# that folder on a Debian 12 machine (it is git-ignored: carry it with the
# tree; docs/gpu.md, "Hardware runs", has the exact carry list and command).
#
#   bash tests/gpu/run.sh            build, then run everything
#   bash tests/gpu/run.sh probe      (or PROBE=1) no build: print what the full
#                                    run needs and what this machine has (driver,
#                                    GPU, toolkit, Python.h, gcc, libcuda.so.1,
#                                    torch, cupy, ...); exit 0 when all is there,
#                                    1 when something is missing; a few seconds
#   bash tests/gpu/run.sh double     the full run without a GPU, over the driver
#                                    double (tests/gpudouble/, docs/gpu.md): the
#                                    same build and steps, gpu_suite linked
#                                    against the double, test_gpu_driver.py for
#                                    Python (torch and cupy need hardware); the
#                                    double's report must hold no violation. A
#                                    dry run of the carry list on any machine
#   bash tests/gpu/run.sh selftest   build the daemon and library, then
#                                    tests/gpu/selftest.sh (no GPU needed: the
#                                    suite's timeouts and cleanup)
#
# What runs, each once with the default sharing path (cuda-vmm where the GPU
# has it) and once with TENSORD_CUDA_PATH=ipc (legacy CUDA IPC):
#   1. the GPU unit tests (build/gpu/tests/unit/test_*gpu*), fake drivers
#   2. gpu_suite (tests/gpu/gpu_suite.c)   C processes sharing cuda:0 both
#      ways, another CUDA_VISIBLE_DEVICES, read-only readers, kill -9 and
#      death mid-import, close with live imports, GPU memory back to
#      baseline, cold/warm attach latency next to host attach
#   3. tests/python/test_gpu.py and test_gpu_args.py   torch and cupy
#      from_dlpack across processes, put() from a side stream, latency next
#      to a torch.multiprocessing CUDA hand-off; test_gpu_driver.py, the
#      Python paths with the driver API (what CI runs over the double);
#      test_gpu_sets.py, a put_many set in one allocation;
#      test_gpu_recycle.py and test_gpu_set_recycle.py, GPU rings (single
#      puts and sets recycled across versions; bytes and figures on
#      hardware, the driver call counts over the double)
# On a machine with a GPU nothing may be skipped: a missing Python.h,
# cmocka, pytest, torch, cupy or cuda.h, or any test pytest skips, is a
# failure with its reason. Exit: 0 all passed, 1 something failed or could
# not run, 77 no GPU here (then only the build was checked).
# Knobs: B=build dir (default build/gpu), CUDA_HOME, USE_DEBS=1 (use the
# .debs even where the system has the libraries), PATHS="default ipc" (the
# sharing paths to run, each on its own: PATHS=ipc runs legacy IPC only),
# STEP_TIMEOUT=240 (seconds for each step of a path: each unit test binary,
# gpu_suite, the pytest run; a step past it is killed with its process group
# and fails), GPU_SUITE_CHILD_TIMEOUT (s, each child gpu_suite starts),
# PYTESTS="tests/python/test_gpu_remote.py" (run those Python files only;
# UNITS=none skips the unit tests and gpu_suite).
# Without a GPU the build check also runs tests/gpu/selftest.sh.
set -uo pipefail
mode=${1:-all}
[ "${PROBE:-0}" = 1 ] && mode=probe
case $mode in all | probe | selftest | double) ;; *)
	echo "usage: $0 [probe|selftest|double]" >&2
	exit 2
	;;
esac
STEP_TIMEOUT=${STEP_TIMEOUT:-240}

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"
B=${B:-build/gpu}
debs=$here/debs
root=$debs/root
say() { echo "gpu-suite: $*" >&2; }
status=0
results=()
pass() { results+=("PASS $1"); }
fail() { results+=("FAIL $1"); status=1; say "FAIL: $1"; }

summary() {
	say "summary:"
	for r in "${results[@]}"; do echo "  $r" >&2; done
	exit "$1"
}

# step NAME CMD...: runs CMD bounded by STEP_TIMEOUT (the whole process
# group, then SIGKILL 10 s later), recording PASS or FAIL with the reason.
step() {
	local name=$1 rc
	shift
	timeout -k 10 "$STEP_TIMEOUT" "$@"
	rc=$?
	if [ "$rc" = 0 ]; then
		pass "$name"
	elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		fail "$name (ran past STEP_TIMEOUT=${STEP_TIMEOUT}s: killed)"
	else
		fail "$name (exit $rc)"
	fi
}

# --- probe: what the full run needs, and what is here; no build -----------------
probe() {
	local miss=0 v d cu
	have() { printf '  %-22s %s\n' "$1" "$2" >&2; }
	missing() { printf '  %-22s MISSING: %s\n' "$1" "$2" >&2; miss=1; }
	say "probe: $(uname -srm), $(nproc) CPUs, $(df -h . | awk 'NR == 2 { print $4 }') free here"
	if command -v nvidia-smi >/dev/null && v=$(nvidia-smi -L 2>&1); then
		have "GPU" "$(echo "$v" | head -4 | tr '\n' ';')"
		have "driver" "$(nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
	else
		missing "GPU" "nvidia-smi -L failed (${v:-no nvidia-smi}): the run only builds (exit 77)"
	fi
	cu=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')
	for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
		[ -z "$cu" ] && [ -e "$d/libcuda.so.1" ] && cu=$d/libcuda.so.1
	done
	if [ -n "$cu" ]; then
		have "libcuda.so.1" "$cu -> $(readlink -f "$cu")"
		if echo 'int main(void) { return 0; }' |
			${CC:-cc} -x c - -l:libcuda.so.1 -L"$(dirname "$cu")" -o /tmp/td-probe-$$ 2>/dev/null; then
			have "-l:libcuda.so.1" "links"
		else
			missing "-l:libcuda.so.1" "does not link (run.sh falls back to the toolkit's stubs)"
		fi
		rm -f /tmp/td-probe-$$
	else
		missing "libcuda.so.1" "not in ldconfig -p nor the usual folders"
	fi
	d=${CUDA_HOME:-}
	if [ -z "$d" ]; then
		for d in /usr/local/cuda /usr/local/cuda-* "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")"; do
			[ -f "$d/include/cuda.h" ] && break
		done
	fi
	if [ -f "$d/include/cuda.h" ]; then
		have "toolkit (cuda.h)" "$d, CUDA_VERSION $(awk '/#define CUDA_VERSION / { print $3 }' "$d/include/cuda.h")"
	else
		missing "toolkit (cuda.h)" "none in /usr/local/cuda*, nvcc's prefix or CUDA_HOME"
	fi
	have "nvcc" "$( (command -v nvcc || ls "$d/bin/nvcc" 2>/dev/null) | head -1) $("${d}/bin/nvcc" --version 2>/dev/null | awk '/release/ { print $5 $6 }')"
	have "cc" "$(${CC:-cc} --version 2>&1 | head -1) (the build uses -Werror)"
	have "python3" "$(command -v python3) $(python3 -V 2>&1)"
	v=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
	if [ -f "$v/Python.h" ]; then have "Python.h" "$v"; else missing "Python.h" "not in '$v'"; fi
	v=$(python3 -c 'import pytest; print(pytest.__version__)' 2>/dev/null)
	if [ -n "$v" ]; then have "pytest" "$v"
	elif ls "$debs"/wheels/*.whl >/dev/null 2>&1; then have "pytest" "from $debs/wheels"
	else missing "pytest" "not importable and no $debs/wheels"; fi
	v=$(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)
	case $v in *"available True"*) have "torch" "$v" ;; *) missing "torch" "$v" ;; esac
	v=$(timeout 60 python3 -c 'import cupy; print(cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())' 2>&1 | tail -1)
	case $v in *devices*) have "cupy" "$v" ;; *) missing "cupy" "$v" ;; esac
	if pkg-config --exists libuv libprotobuf-c cmocka libcrypto 2>/dev/null && command -v protoc-c >/dev/null; then
		have "libuv/protobuf-c/cmocka" "the system's"
	elif [ -f "$root/usr/include/uv.h" ] && [ -f "$root/usr/include/cmocka.h" ]; then
		have "libuv/protobuf-c/cmocka" "from $root"
	else
		missing "libuv/protobuf-c/cmocka" "neither the system's nor $root (carry tests/gpu/debs)"
	fi
	have "paths" "PATHS='${PATHS:-default ipc}', STEP_TIMEOUT=${STEP_TIMEOUT}s per step"
	if [ "$miss" = 0 ]; then say "probe: everything the full run needs is here"
	else say "probe: something is missing (above): the full run would fail or only build"; fi
	exit "$miss"
}
[ "$mode" = probe ] && probe

# --- is there a GPU? Without one, build only, and say so (exit 77). ---------
have_gpu=0
use_double=0
if [ "$mode" = double ]; then
	use_double=1
	say "over the driver double (tests/gpudouble/): no GPU is used"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
	have_gpu=1
	nvidia-smi -L >&2
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >&2 || true
else
	say "no NVIDIA GPU here (nvidia-smi -L failed): checking the build only"
fi

# --- libuv / protobuf-c / cmocka: the system's, else the unpacked .debs ------
if [ "${USE_DEBS:-0}" != 1 ] && pkg-config --exists libuv libprotobuf-c cmocka libzip jansson libcrypto 2>/dev/null &&
   command -v protoc-c >/dev/null; then
	say "using the system's libuv, protobuf-c, cmocka, libzip, jansson and libcrypto"
elif [ -f "$root/usr/include/uv.h" ] && [ -f "$root/usr/include/cmocka.h" ]; then
	lib=$root/usr/lib/x86_64-linux-gnu
	say "using libuv / protobuf-c / cmocka from $root"
	# The Makefile appends its own flags to these (make's += on environment variables).
	# OpenSSL's headers (peering's libcrypto) keep their configuration under the multiarch path.
	export CPPFLAGS="-I$root/usr/include -I$root/usr/include/x86_64-linux-gnu"
	export LDFLAGS="-L$lib -Wl,-rpath,$lib"
	export LDLIBS="-luv -lprotobuf-c -lzip -ljansson -lcrypto"
	export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export PATH="$root/usr/bin:$PATH"
	# UCX (remote attach, test_gpu_remote.py) is found by pkg-config: its .pc from there.
	if [ -f "$lib/pkgconfig/ucx.pc" ]; then
		export PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
	fi
	if ! protoc-c --version >/dev/null 2>&1; then
		# Another glibc or libstdc++: use the sources generated on the Debian machine,
		# newer than the .proto so make keeps them.
		say "the packaged protoc-c does not run here; using $debs/pregen"
		mkdir -p "$B/proto"
		cp "$debs"/pregen/tensord.pb-c.[ch] "$debs"/pregen/peer.pb-c.[ch] "$B/proto/"
		touch "$B"/proto/tensord.pb-c.[ch] "$B"/proto/peer.pb-c.[ch]
	fi
else
	fail "prerequisites: no libuv/protobuf-c/cmocka on this machine and no $root (run tests/gpu/fetch-debs.sh on a Debian 12 machine and carry tests/gpu/debs)"
	summary 1
fi

# --- CUDA toolkit headers: the C suite is a CUDA program ---------------------
if [ -z "${CUDA_HOME:-}" ]; then
	for d in /usr/local/cuda /usr/local/cuda-* "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")"; do
		[ -f "$d/include/cuda.h" ] && { CUDA_HOME=$d; break; }
	done
fi
if [ -z "${CUDA_HOME:-}" ] || [ ! -f "$CUDA_HOME/include/cuda.h" ]; then
	fail "prerequisites: no cuda.h (CUDA_HOME='${CUDA_HOME:-}'; set CUDA_HOME to the toolkit)"
	CUDA_HOME=
fi
export CUDA_HOME

# --- Python: headers for the extension, pytest (from the wheels if need be) --
py_inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
have_py=1
if [ ! -f "$py_inc/Python.h" ]; then
	fail "prerequisites: no Python.h in '$py_inc' (install the python3 headers matching $(python3 -V 2>&1))"
	have_py=0
fi
pylib=$top/$B/pylib
if ! python3 -c 'import pytest' 2>/dev/null; then
	if ls "$debs"/wheels/*.whl >/dev/null 2>&1; then
		mkdir -p "$pylib"
		for w in "$debs"/wheels/*.whl; do python3 -m zipfile -e "$w" "$pylib"; done
		PYTHONPATH="$pylib" python3 -c 'import pytest' ||
			{ fail "prerequisites: pytest from $debs/wheels does not import"; have_py=0; }
	else
		fail "prerequisites: no pytest and no wheels in $debs/wheels"
		have_py=0
	fi
fi
if [ "$have_gpu" = 1 ]; then
	python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
		fail "prerequisites: torch with CUDA does not import or sees no GPU"
	python3 -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' 2>/dev/null ||
		fail "prerequisites: cupy does not import or sees no GPU"
fi

# --- build ---------------------------------------------------------------------
units=(test_client_gpu test_backend_gpu test_import_gpu test_gpu_util)
say "building in $B (CUDA_HOME=${CUDA_HOME:-none})"
dbl=("$B/gpudouble/libcuda.so.1" "$B/gpudouble/libnvidia-ml.so.1")
[ "$use_double" = 1 ] || dbl=()
targets=("$B/tensord" "$B/libtensord.a" "${units[@]/#/$B/tests/unit/}" "${dbl[@]}")
werror=
if ! make -j"$(nproc)" B="$B" "${targets[@]}"; then
	# A compiler newer than ours may warn where ours does not (-Werror):
	# build again with warnings as warnings, and say so in the summary.
	say "the build failed; trying again with WERROR= (warnings not errors)"
	werror="WERROR="
	if ! make -j"$(nproc)" B="$B" WERROR= "${targets[@]}"; then
		fail "build (daemon, library or GPU unit tests)"
		summary 1
	fi
	fail "build only without -Werror (see the warnings above; the run goes on)"
fi
# shellcheck disable=SC2086 # $werror is empty or one word
if [ "$have_py" = 1 ] && ! make -j"$(nproc)" B="$B" $werror all >/dev/null; then
	fail "build of the Python extension"
	have_py=0
fi
if [ -n "$CUDA_HOME" ]; then
	suite_werror=-Werror
	[ -n "$werror" ] && suite_werror=-Wno-error
	suite_cc=(${CC:-cc} -std=c11 -O2 -g -Wall -Wextra "$suite_werror" -Iinclude -isystem "$CUDA_HOME/include")
	if [ "$use_double" = 1 ]; then
		rm -f "$B/gpu_suite"
		# shellcheck disable=SC2086 # word splitting of the flags is wanted
		"${suite_cc[@]}" tests/gpu/gpu_suite.c "$B/libtensord.a" ${LDFLAGS:-} \
			${LDLIBS:--luv -lprotobuf-c} -L"$B/gpudouble" -l:libcuda.so.1 -ldl -lpthread \
			-o "$B/gpu_suite" || fail "gpu_suite did not build against the double"
	elif [ "$have_gpu" = 0 ]; then
		# No driver to link against here: prove that it compiles.
		"${suite_cc[@]}" -c tests/gpu/gpu_suite.c -o "$B/gpu_suite.o" ||
			fail "gpu_suite did not compile"
	else
		# The driver's libcuda.so.1, else the toolkit's stub (same symbols).
		rm -f "$B/gpu_suite"
		for culink in "-l:libcuda.so.1" "-L$CUDA_HOME/lib64/stubs -lcuda"; do
			# shellcheck disable=SC2086 # word splitting of the flags is wanted
			"${suite_cc[@]}" tests/gpu/gpu_suite.c "$B/libtensord.a" ${LDFLAGS:-} \
				${LDLIBS:--luv -lprotobuf-c} $culink -ldl -lpthread -o "$B/gpu_suite" && break
		done
		[ -x "$B/gpu_suite" ] || fail "gpu_suite did not build"
	fi
fi
if [ "$mode" = selftest ] || { [ "$have_gpu" = 0 ] && [ -n "$CUDA_HOME" ]; }; then
	# The suite's timeouts and cleanup, without a GPU (tests/gpu/selftest.sh).
	step "gpu_suite selftest (no GPU)" env CUDA_HOME="$CUDA_HOME" bash "$here/selftest.sh" "$B"
	[ "$mode" = selftest ] && summary "$status"
fi
if [ "$use_double" = 1 ]; then
	export LD_LIBRARY_PATH="$top/$B/gpudouble${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export TD_GPU_DOUBLE_DIR="$top/$B/double" TD_GPU_DOUBLE_LEAKS=tensord
	rm -rf "$TD_GPU_DOUBLE_DIR"
elif [ "$have_gpu" = 0 ]; then
	say "SKIPPED: no GPU here; the build and the self-test above are all that was checked"
	[ "$status" = 0 ] && exit 77
	summary 1
fi

# --- run, on both sharing paths ------------------------------------------------
pytests=(tests/python/test_gpu.py tests/python/test_gpu_args.py tests/python/test_gpu_driver.py
	tests/python/test_gpu_sets.py tests/python/test_gpu_remote.py
	tests/python/test_gpu_recycle.py tests/python/test_gpu_set_recycle.py)
[ "$use_double" = 1 ] && pytests=(tests/python/test_gpu_args.py tests/python/test_gpu_driver.py
	tests/python/test_gpu_sets.py tests/python/test_gpu_remote.py
	tests/python/test_gpu_recycle.py tests/python/test_gpu_set_recycle.py)
# PYTESTS="tests/python/x.py ..." runs those instead (a short run of one part).
# shellcheck disable=SC2206 # word splitting of the list is wanted
[ -n "${PYTESTS:-}" ] && pytests=($PYTESTS)
for path in ${PATHS:-default ipc}; do
	if [ "$path" = ipc ]; then export TENSORD_CUDA_PATH=ipc; else unset TENSORD_CUDA_PATH; fi
	say "=== sharing path: $path"
	for u in "${units[@]}"; do
		[ "${UNITS:-}" = none ] && break
		step "unit/$u/$path" "$B/tests/unit/$u"
	done
	if [ -x "$B/gpu_suite" ] && [ "${UNITS:-}" != none ]; then
		step "gpu_suite/$path" env GPU_SUITE_TIMEOUT=$((STEP_TIMEOUT - 20)) \
			"$B/gpu_suite" "$B/tensord"
	fi
	if [ "$have_py" = 1 ]; then
		log=$B/pytest-$path.log
		TENSORD_BUILD=$top/$B PYTHONPATH="$top/$B/python:$pylib${PYTHONPATH:+:$PYTHONPATH}" \
			TENSORD_GPU_DRIVER=$([ "$use_double" = 1 ] && echo double || echo system) \
			timeout -k 10 "$STEP_TIMEOUT" python3 -m pytest -rs -v -s -p no:cacheprovider \
			"${pytests[@]}" 2>&1 | tee "$log"
		rc=${PIPESTATUS[0]}
		if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
			fail "python/$path (ran past STEP_TIMEOUT=${STEP_TIMEOUT}s: killed)"
		elif [ "$rc" != 0 ]; then
			fail "python/$path (pytest exit $rc)"
		elif grep -Eq '^SKIPPED|[0-9]+ skipped' "$log"; then
			fail "python/$path: tests were skipped on a GPU machine (see SKIPPED lines above)"
		else
			pass "python/$path"
		fi
	fi
done
if [ "$use_double" = 1 ]; then
	if grep -E ' violation: | leak at exit' "$TD_GPU_DOUBLE_DIR/report" 2>/dev/null; then
		fail "the double reported the violations or leaks above ($TD_GPU_DOUBLE_DIR/report)"
	else
		pass "double report: no violation, no daemon leak"
	fi
fi
summary "$status"
