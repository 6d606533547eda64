#!/usr/bin/env bash
# Installs what tensord needs to build and test, only when it is missing.
# Idempotent: a second run on a ready machine installs nothing and takes
# about a second. Called by `make run` and `make test`.
set -euo pipefail

need_deb=()
have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }

# libamdhip64-dev: HIP headers, so the ROCm backend is compiled against the
# real API (about 80 MB installed with its 7 dependencies; the runtime is
# only dlopen'ed, and only where /dev/kfd exists).
for p in libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcmocka-dev \
         pkg-config clang libclang-rt-14-dev util-linux libamdhip64-dev; do
	have_deb "$p" || need_deb+=("$p")
done

# The service tests: systemd-analyze and systemd-sysusers check the units,
# groff renders the man pages, readelf reads sonames (already there on a
# Debian build host; listed so a bare one gets them).
for p in systemd groff-base binutils; do
	have_deb "$p" || need_deb+=("$p")
done

if [ "${#need_deb[@]}" -gt 0 ]; then
	echo "setup: installing ${need_deb[*]}" >&2
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_deb[@]}" >/dev/null
fi

# Python test dependencies. torch comes from the local 2.13.0 CPU wheel.
PY=${PYTHON:-python3}
py_need=()
$PY -c 'import numpy' 2>/dev/null || py_need+=("numpy>=2")
$PY -c 'import pytest' 2>/dev/null || py_need+=(pytest)
$PY -c 'import yaml' 2>/dev/null || py_need+=(pyyaml)   # deploy/k8s manifests
if [ "${TENSORD_SKIP_FRAMEWORKS:-0}" != 1 ]; then
	$PY -c 'import torch' 2>/dev/null || py_need+=("torch==2.13.0")
	$PY -c 'import jax' 2>/dev/null || py_need+=(jax jaxlib)
fi
if [ "${#py_need[@]}" -gt 0 ]; then
	echo "setup: pip installing ${py_need[*]}" >&2
	$PY -m pip install -q "${py_need[@]}"
fi
