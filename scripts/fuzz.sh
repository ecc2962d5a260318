#!/usr/bin/env bash
# Runs every Go fuzz target of the bridge for FUZZTIME each (default 8s: the
# short run `make test` does, about a minute in all; `make fuzz` runs longer).
# Each target's seeds are checked in next to it (f.Add), and a failure is
# written to the package's testdata/fuzz/ by go test, to be committed with
# the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${FUZZTIME:-8s}
targets=(
	"FuzzCheckAddr ./internal/delivery"
	"FuzzParseRetryAfter ./internal/delivery"
	"FuzzDecode ./internal/contract"
	"FuzzParseEnvelope ./internal/contract"
	"FuzzTraceparent ./internal/tracing"
	"FuzzDecodeBody ./internal/adminapi"
	"FuzzCursor ./internal/adminapi"
	"FuzzLoad ./internal/config"
)
# fuzz_once runs one target; its output goes to the terminal and to $log.
fuzz_once() {
	go test -run '^$' -fuzz "^${1}\$" -fuzztime "$time" "$2" 2>&1 | tee "$log"
	return "${PIPESTATUS[0]}"
}
# A run that fails with nothing but "context deadline exceeded" found
# nothing: Go's fuzz coordinator (before Go 1.27, go.dev/issue/75804)
# reports its own -fuzztime deadline as a failure when a worker on a loaded
# machine has not stopped yet. Such a run is repeated once; any other
# failure, a written input or a second bare deadline fails the script.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	echo "fuzz $name ($pkg) for $time"
	if fuzz_once "$name" "$pkg"; then
		continue
	fi
	if grep -q 'context deadline exceeded' "$log" && ! grep -qiE 'failing input|panic:|_test\.go:[0-9]+:' "$log"; then
		echo "fuzz $name: the coordinator's deadline, no input found; once more"
		fuzz_once "$name" "$pkg"
	else
		exit 1
	fi
done
