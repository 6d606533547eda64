#!/usr/bin/env bash
# Installs what tensord needs to build and test, only when it is missing.
# Idempotent: a second run on a ready machine installs nothing and takes
# about a second. Called by `make run` (`setup.sh run`: the demo's needs)
# and `make test` (`setup.sh test`: the test suites' too).
set -euo pipefail

need_deb=()
have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }

# libzip-dev, libjansson-dev: libtensord (so tensorctl and the Python module)
# reads and writes .npz (zip) and .safetensors (a JSON header) checkpoints with them.
# libamdhip64-dev: HIP headers, so the ROCm backend is compiled against the
# real API (about 80 MB installed with its 7 dependencies; the runtime is
# only dlopen'ed, and only where /dev/kfd exists).
# libucx-dev: UCX (libucp), the transport between daemons on different
# nodes (docs/remote.md); bench/ucx_get.c measures it. Debian's 1.13 build
# has TCP, shared memory and verbs (RDMA), not CUDA.
# libssl-dev: libcrypto's HMAC-SHA256, with which daemons authenticate
# each other (daemon/remote/peer_auth.c).
# zlib1g-dev: the CRC-32 that checks each record of the daemon's state log
# (daemon/persist/record.c, docs/restart.md).
for p in libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcmocka-dev libzip-dev libjansson-dev \
         pkg-config clang clang-format libclang-rt-14-dev util-linux libamdhip64-dev libucx-dev \
         libssl-dev zlib1g-dev; do
	have_deb "$p" || need_deb+=("$p")
done

want=${1:-test}   # run: what the demo needs; test: the test suites too

# The service tests: systemd-analyze and systemd-sysusers check the units,
# groff renders the man pages, readelf reads sonames (already there on a
# Debian build host; listed so a bare one gets them). iproute2: `ip`, with
# which test_peers_netns.py makes network namespaces and a veth pair.
if [ "$want" = test ]; then
	for p in systemd groff-base binutils iproute2; do
		have_deb "$p" || need_deb+=("$p")
	done
fi

apt_install() {
	echo "setup: installing $*" >&2
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
[ "${#need_deb[@]}" -eq 0 ] || apt_install "${need_deb[@]}"

# Python: a project virtual environment, always. A distribution's python3
# is "externally managed" (PEP 668: pip refuses to install into it), and a
# venv sidesteps that without touching the system. --system-site-packages
# lets it reuse what the machine already has (numpy, torch, jax), so pip
# installs only what is missing. PYTHON_BASE makes the venv from another
# interpreter; VENV puts it elsewhere (tests use both).
BASE=${PYTHON_BASE:-python3}
VENV=${VENV:-.venv}

make_venv() { "$BASE" -m venv --system-site-packages "$VENV"; }
if ! "$VENV/bin/python" -c '' 2>/dev/null; then
	rm -rf "$VENV"
	if ! make_venv >/dev/null 2>&1; then
		# Debian and Ubuntu ship venv's ensurepip in a separate package.
		rm -rf "$VENV"
		apt_install python3-venv
		make_venv
	fi
	echo "setup: created $VENV (python: $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'))" >&2
fi

PY=$VENV/bin/python
py_need=()
# find_spec, not import: importing tensorflow alone takes seconds.
has() { "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" 2>/dev/null; }
has numpy || py_need+=("numpy>=2")
if [ "$want" = test ]; then
	has pytest || py_need+=(pytest)
	# prometheus_client: its parser reads the daemon's metrics in the tests.
	has prometheus_client || py_need+=(prometheus_client)
	has yaml || py_need+=(pyyaml) # deploy/k8s manifests
	if [ "${TENSORD_SKIP_FRAMEWORKS:-0}" != 1 ]; then
		has torch || py_need+=("torch==2.13.0")
		has jax || py_need+=(jax jaxlib)
	fi
fi
if [ "${#py_need[@]}" -gt 0 ]; then
	echo "setup: pip installing into $VENV: ${py_need[*]}" >&2
	"$PY" -m pip install -q "${py_need[@]}"
fi

# More DLPack consumers for tests/python/test_frameworks.py, and Ray for
# the cross-node baseline of bench/py_remote.py (tests/python/test_bench.py),
# each on its own: one without a wheel for this Python must not stop the
# rest (its tests then skip and say so).
if [ "$want" = test ] && [ "${TENSORD_SKIP_FRAMEWORKS:-0}" != 1 ]; then
	for pair in tensorflow:tensorflow-cpu paddle:paddlepaddle tvm_ffi:apache-tvm-ffi \
		    array_api_strict:array-api-strict ray:ray; do
		has "${pair%%:*}" && continue
		echo "setup: pip installing into $VENV: ${pair#*:}" >&2
		"$PY" -m pip install -q "${pair#*:}" ||
			echo "setup: ${pair#*:} did not install (no wheel for this Python?); its tests will skip" >&2
	done
fi
