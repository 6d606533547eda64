#!/usr/bin/env bash
# `make run`: start tensord in the foreground with its built-in defaults and
# show a put / ls / get round trip against it. Ctrl-C stops the daemon. When
# a daemon already serves the socket, the demo uses it and leaves it running.
# TENSORD_DEMO_EXIT=1: do not wait for Ctrl-C even on a terminal.
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
PY=${PYTHON:-python3}
work=$(mktemp -d)
daemon=

# Ctrl-C (or TERM) ends the demo with status 0: stopping it is the way out,
# not a failure, so make prints no "*** Error".
finish() {
	trap - EXIT INT TERM
	if [ -n "$daemon" ]; then
		kill -TERM "$daemon" 2>/dev/null || true
		wait "$daemon" 2>/dev/null || true
		echo "== tensord stopped"
	fi
	rm -rf "$work"
	exit "${1:-0}"
}
trap 'finish $?' EXIT
trap 'finish 0' INT TERM

# $TENSORD_SOCKET, else the daemon's default path by the library's own rule
# (common/paths.c).
sock=${TENSORD_SOCKET:-$(PYTHONPATH="$B/python" "$PY" -c 'import tensord; print(tensord.default_socket_path())')}
export TENSORD_SOCKET=$sock

if "$B/tensorctl" stats >/dev/null 2>&1; then
	echo "== a tensord already serves $sock: using it (this demo leaves it running)"
else
	"$B/tensord" --ready-fd 4 4>"$work/ready" 2>&1 &
	daemon=$!
	for _ in $(seq 100); do [ -s "$work/ready" ] && break; sleep 0.05; done
	if ! [ -s "$work/ready" ]; then
		daemon=
		echo "tensord did not start (its messages are above)" >&2
		exit 1
	fi
	echo "== tensord is serving $sock (pid $daemon)"
fi

"$PY" - "$work/in.npy" <<'PY'
import sys, numpy as np
np.save(sys.argv[1], np.arange(12, dtype=np.float32).reshape(3, 4))
PY
echo "== tensorctl put demo/inputs/0 in.npy --force   (--force: replace an earlier run's)"
"$B/tensorctl" put demo/inputs/0 "$work/in.npy" --force
echo "== tensorctl ls"
"$B/tensorctl" ls
echo "== tensorctl stat demo/inputs/0"
"$B/tensorctl" stat demo/inputs/0
echo "== tensorctl get demo/inputs/0 out.npy"
"$B/tensorctl" get demo/inputs/0 "$work/out.npy"
"$PY" - "$work/in.npy" "$work/out.npy" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.dtype == b.dtype and (a == b).all()
print("== round trip ok: %s %s, identical bytes" % (b.dtype, b.shape))
PY
if [ -f "$B/python/tensord/__init__.py" ]; then
	echo "== the same tensor from Python, zero copy"
	PYTHONPATH="$B/python" "$PY" -c '
import numpy as np, tensord
c = tensord.connect()
with c.attach("demo/inputs/0") as t:
    a = np.from_dlpack(t)
    print(a, "read-only:", not a.flags.writeable)
'
fi
echo "== tensorctl stats"
"$B/tensorctl" stats
echo "== to run tensord and tensorctl from any shell (the README's commands):"
echo "     export PATH=$B:\$PATH      # or: make install (PREFIX=/usr/local)"
if [ -n "$daemon" ] && [ -t 0 ] && [ "${TENSORD_DEMO_EXIT:-0}" != 1 ]; then
	echo "== tensord keeps running in the foreground; Ctrl-C stops it"
	# Ctrl-C reaches the daemon and this shell together: whichever ends the
	# wait, finish (the trap's or this call) says the daemon stopped.
	wait "$daemon" || true
	finish 0
elif [ -n "$daemon" ]; then
	# No terminal to press Ctrl-C in (a pipe, CI), or TENSORD_DEMO_EXIT=1.
	echo "== no terminal (or TENSORD_DEMO_EXIT=1): the demo ends and stops the tensord it"
	echo "   started; to keep one serving, run: $B/tensord &"
fi
