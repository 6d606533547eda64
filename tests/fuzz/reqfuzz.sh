#!/usr/bin/env bash
# The request-sequence fuzzer (tests/integration/reqfuzz.c) against a daemon
# of its own, for `make fuzz`: starts BUILD/tensord (the ASan+UBSan build
# there), runs BUILD/tests/helpers/reqfuzz for SECONDS, stops the daemon and
# fails when the fuzzer failed, the daemon did not exit 0, or its log holds
# a sanitizer report (printed).
#
#   tests/fuzz/reqfuzz.sh BUILD SECONDS [SEED]
set -u
build=$1 seconds=$2 seed=${3:-}
dir=$(mktemp -d "${TMPDIR:-/tmp}/reqfuzz.XXXXXX")
log=$dir/tensord.log
"$build/tensord" --socket "$dir/tensord.sock" --capacity 256Mi --pool 32Mi --log-level info \
	>"$log" 2>&1 &
pid=$!
for _ in $(seq 600); do
	[ -S "$dir/tensord.sock" ] && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.05
done
ASAN_OPTIONS=${ASAN_OPTIONS:-}:quarantine_size_mb=16 "$build/tests/helpers/reqfuzz" --socket "$dir/tensord.sock" --seconds "$seconds" \
	${seed:+--seed "$seed"}
frc=$?
kill -TERM $pid 2>/dev/null
wait $pid
drc=$?
report=$(grep -E -A40 "ERROR: AddressSanitizer|runtime error:|Caught signal" "$log" | head -60)
if [ $frc -ne 0 ] || [ $drc -ne 0 ] || [ -n "$report" ]; then
	echo "reqfuzz: FAIL (fuzzer exit $frc, tensord exit $drc); the daemon's log: $log"
	echo "$report"
	exit 1
fi
rm -rf "$dir"
echo "reqfuzz: the daemon survived and exited 0"
