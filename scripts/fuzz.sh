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
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	echo "fuzz $name ($pkg) for $time"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" "$pkg"
done
