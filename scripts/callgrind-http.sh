#!/usr/bin/env bash
# Instructions per HTTP request in the server, counted by callgrind
# (repeatable whatever else the machine is doing): benches/http_instructions.rs
# serves one case under callgrind while its loader sends N, then 2N,
# requests; (Ir(2N) - Ir(N)) / N. Needs valgrind. Cases: bare, memory,
# memory-no-headers, governor, governor-headers; loads: admitted, rejected.
# FLEETGATE_CALLGRIND_CACHE=1 also simulates the caches (--cache-sim=yes,
# the host's sizes) and adds first-level instruction-cache misses per
# request: on a server, what a request's code costs beyond its
# instructions. Slower.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/callgrind-common.sh
n="${FLEETGATE_CALLGRIND_REQUESTS:-8000}"
cases="${FLEETGATE_CALLGRIND_CASES:-$http_cases}"
callgrind_setup http_instructions
cache="${FLEETGATE_CALLGRIND_CACHE:-0}"
sim=--cache-sim=no
[ "$cache" = 1 ] && sim=--cache-sim=yes
count() { # variant load requests -> "instructions i1-misses" of the whole server run
  local port_file="$work/port" out="$work/callgrind.out"
  rm -f "$port_file"
  valgrind --tool=callgrind "$sim" --callgrind-out-file="$out" "$bin" serve "$1" "$2" "$port_file" >/dev/null 2>"$work/valgrind.err" &
  local server=$!
  for _ in $(seq 600); do [ -s "$port_file" ] && break; sleep 0.1; done
  [ -s "$port_file" ] || { echo "callgrind-http.sh: the server did not start" >&2; kill "$server"; exit 1; }
  "$bin" load "$(cat "$port_file")" "$3" 2>"$work/load.err"
  wait "$server"
  local total i1 clockless=0
  # The run's totals: Ir, and with --cache-sim then Dr Dw I1mr ...
  read -r total _ _ i1 _ <<<"$(sed -n 's/^summary: //p; s/^totals: //p' "$out" | head -1)"
  [ "$1" = bare ] && clockless=1
  echo "$(without_calibration "$total" "$out" "$clockless") ${i1:-0}"
}
if [ "$cache" = 1 ]; then
  echo "| case | load | instructions / request | I1 misses / request (simulated) |"
  echo "|---|---|---:|---:|"
else
  echo "| case | load | instructions / request |"
  echo "|---|---|---:|"
fi
for case in $cases; do
  variant="${case%%:*}" load="${case##*:}"
  # Through variables, so that a failed count stops the script (set -e).
  first="$(count "$variant" "$load" "$n")"
  second="$(count "$variant" "$load" $((2 * n)))"
  read -r a a_i1 <<<"$first"
  read -r b b_i1 <<<"$second"
  if [ "$cache" = 1 ]; then
    echo "| $variant | $load | $(( (b - a) / n )) | $(( (b_i1 - a_i1) / n )) |"
  else
    echo "| $variant | $load | $(( (b - a) / n )) |"
  fi
done
