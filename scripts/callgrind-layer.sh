#!/usr/bin/env bash
# Instructions per call of each layer on its own, counted by callgrind
# (repeatable whatever else the machine is doing): the routers of
# benches/http.rs called in process as a tower Service, each future polled
# once, with no server, socket or runtime (benches/http_instructions.rs
# `layer`), for N and 2N calls: (Ir(2N) - Ir(N)) / N, less the clock's
# one-off calibration. A case's figure minus bare axum's is what its layer
# costs per request. Quicker than scripts/callgrind-http.sh (about 30 s)
# and without hyper's and the kernel's share. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/callgrind-common.sh
n="${FLEETGATE_CALLGRIND_CALLS:-20000}"
cases="${FLEETGATE_CALLGRIND_CASES:-$http_cases}"
callgrind_setup http_instructions
count() { # variant load calls -> instructions of the whole run, less the calibration
  local out="$work/callgrind.out" total clockless=0
  total="$(valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" layer "$1" "$2" "$3" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')"
  [ -n "$total" ] || { echo "callgrind-layer.sh: $1 $2 did not run" >&2; exit 1; }
  [ "$1" = bare ] && clockless=1
  without_calibration "$total" "$out" "$clockless"
}
echo "| case | load | instructions / call | over bare axum |"
echo "|---|---|---:|---:|"
bare=""
for case in $cases; do
  variant="${case%%:*}" load="${case##*:}"
  a="$(count "$variant" "$load" "$n")"
  b="$(count "$variant" "$load" $((2 * n)))"
  per=$(( (b - a) / n ))
  [ "$variant" = bare ] && bare="$per"
  if [ -n "$bare" ] && [ "$variant" != bare ]; then
    echo "| $variant | $load | $per | +$(( per - bare )) |"
  else
    echo "| $variant | $load | $per | - |"
  fi
done
