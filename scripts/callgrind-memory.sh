#!/usr/bin/env bash
# Instructions per decision of the memory store and of governor's keyed
# limiter, counted by callgrind (repeatable whatever else the machine is
# doing): the memory bench's fixed loop (FLEETGATE_BENCH_LOOP) run for N and
# for 3N decisions on one thread, (Ir(3N) - Ir(N)) / 2N, so that start-up
# and the first call per key drop out. "fleetgate" is Limiter::check_now
# (what the memory bench times), "check + poll" Limiter::check and its
# ready future. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/callgrind-common.sh
n="${FLEETGATE_CALLGRIND_CALLS:-100000}"
callgrind_setup memory
count() {
  local out="$work/callgrind.out" total
  total="$(FLEETGATE_BENCH_LOOP="$1:$2:$3:$4" valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')"
  # Both limiters read quanta's clock.
  without_calibration "$total" "$out" 0
}
echo "| case | fleetgate | governor | ratio | fleetgate, check + poll |"
echo "|---|---:|---:|---:|---:|"
for keys in 1 10k; do
  for load in admit deny; do
    row=()
    for who in fleetgate governor fleetgate-check; do
      a="$(count "$who" "$keys" "$load" "$n")"
      b="$(count "$who" "$keys" "$load" $((3 * n)))"
      row+=($(( (b - a) / (2 * n) )))
    done
    ratio="$(awk -v a="${row[0]}" -v b="${row[1]}" 'BEGIN { printf "%.2f", a / b }')"
    echo "| $keys key(s), $load | ${row[0]} | ${row[1]} | $ratio | ${row[2]} |"
  done
done
