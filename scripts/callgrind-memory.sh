#!/usr/bin/env bash
# Instructions per decision of the memory store and of governor's keyed
# limiter, counted by callgrind (repeatable whatever else the machine is
# doing): the memory bench's fixed loop (FLEETGATE_BENCH_LOOP) run for N and
# for 3N decisions on one thread, (Ir(3N) - Ir(N)) / 2N, so that start-up
# and the first call per key drop out. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "callgrind-memory.sh: needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
n="${FLEETGATE_CALLGRIND_CALLS:-100000}"
bin="$(cargo bench --bench memory --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)"
[ -x "$bin" ] || { echo "callgrind-memory.sh: could not build the memory bench" >&2; exit 1; }
count() {
  FLEETGATE_BENCH_LOOP="$1:$2:$3:$4" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
echo "| case | fleetgate | governor | ratio |"
echo "|---|---:|---:|---:|"
for keys in 1 10k; do
  for load in admit deny; do
    row=()
    for who in fleetgate governor; do
      a="$(count "$who" "$keys" "$load" "$n")"
      b="$(count "$who" "$keys" "$load" $((3 * n)))"
      row+=($(( (b - a) / (2 * n) )))
    done
    ratio="$(awk -v a="${row[0]}" -v b="${row[1]}" 'BEGIN { printf "%.2f", a / b }')"
    echo "| $keys key(s), $load | ${row[0]} | ${row[1]} | $ratio |"
  done
done
