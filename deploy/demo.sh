#!/usr/bin/env bash
# `make run`: start tensord in the foreground with its built-in defaults and
# show a put / ls / get round trip against it. Ctrl-C stops the daemon.
set -euo pipefail
B=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The daemon's default path, by the library's own rule (common/paths.c).
sock=$(PYTHONPATH="$B/python" python3 -c 'import tensord; print(tensord.default_socket_path())')

exec 3> >(cat)   # keep the daemon's log on our stdout
"$B/tensord" --ready-fd 4 4>"$work/ready" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon; rm -rf "$work"' EXIT INT TERM
for _ in $(seq 100); do [ -s "$work/ready" ] && break; sleep 0.05; done
[ -s "$work/ready" ] || { echo "tensord did not start" >&2; exit 1; }

echo "== tensord is serving $sock (pid $daemon)"
python3 - "$work/in.npy" <<'PY'
import sys, numpy as np
np.save(sys.argv[1], np.arange(12, dtype=np.float32).reshape(3, 4))
PY
echo "== tensorctl put demo/inputs/0 in.npy"
"$B/tensorctl" put demo/inputs/0 "$work/in.npy"
echo "== tensorctl ls"
"$B/tensorctl" ls
echo "== tensorctl stat demo/inputs/0"
"$B/tensorctl" stat demo/inputs/0
echo "== tensorctl get demo/inputs/0 out.npy"
"$B/tensorctl" get demo/inputs/0 "$work/out.npy"
python3 - "$work/in.npy" "$work/out.npy" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.dtype == b.dtype and (a == b).all()
print("== round trip ok: %s %s, identical bytes" % (b.dtype, b.shape))
PY
if [ -f "$B/python/tensord/__init__.py" ]; then
	echo "== the same tensor from Python, zero copy"
	PYTHONPATH="$B/python" python3 -c '
import numpy as np, tensord
c = tensord.connect()
with c.attach("demo/inputs/0") as t:
    a = np.from_dlpack(t)
    print(a, "read-only:", not a.flags.writeable)
'
fi
echo "== tensorctl stats"
"$B/tensorctl" stats
if [ -t 0 ] && [ "${TENSORD_DEMO_EXIT:-0}" != 1 ]; then
	echo "== tensord keeps running in the foreground; Ctrl-C stops it"
	wait $daemon
fi
