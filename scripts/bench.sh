#!/usr/bin/env bash
# The benchmark run behind BENCHMARKS.md, in one go: builds the benches,
# runs them one after the other (each starts its own private redis-server
# on a free loopback port and never touches one already running), and
# writes one report: machine, versions, load average, commands, the target
# summary (every PASS/MISS row the benches computed from their own run)
# and every table. About 7 minutes on 2 cores once built.
#
#   scripts/bench.sh                       # everything
#   FLEETGATE_BENCHES="http memory" scripts/bench.sh
#
# Knobs (environment):
#   FLEETGATE_BENCHES          which benches, in order (default:
#                              "http decisions memory redis_memory grpc observe adaptive";
#                              `adaptive` is not a cargo bench: the release
#                              demo's /api/adaptive under 64 callers
#                              (scripts/adaptive-demo.sh --release);
#                              nor is `observe`: what feeding
#                              fleetgate::observe costs a call through the
#                              layer, by callgrind, on vs off; needs valgrind)
#   (the decisions bench also runs the peers scripts/peers-install.sh puts
#   in target/peers, each on its own private redis-server)
#   FLEETGATE_BENCH_SECS       measured seconds per round of a case (http: 2,
#                              decisions: 0.5)
#   FLEETGATE_BENCH_WARMUP     warm-up seconds per round (http: 1, decisions: 0.2)
#   FLEETGATE_BENCH_ROUNDS     rounds of every case; rows are medians (default 3)
#   FLEETGATE_BENCH_LOADGEN    http load: wrk (default when installed) or rust
#   FLEETGATE_BENCH_CONNS      http connections (default 64)
#   FLEETGATE_BENCH_GRPC_CONNS, FLEETGATE_BENCH_GRPC_STREAMS
#                              grpc: HTTP/2 connections (default 4) and calls
#                              in flight on each (default 16)
#   FLEETGATE_BENCH_ONLY       http cases whose name contains one of these
#                              comma-separated texts (default: all)
#   FLEETGATE_BENCH_KEYS       identities for Redis memory per key (default 100000)
#   FLEETGATE_CRITERION_WARMUP, FLEETGATE_CRITERION_SECS
#                              criterion warm-up and measurement per case of
#                              the memory bench (default 0.5 and 1.5)
#   FLEETGATE_BENCH_IDLE_WAIT  wait up to this many seconds for the 1-minute
#                              load average to fall below
#   FLEETGATE_BENCH_IDLE_LOAD  (default 0.5) before starting (default 0: no wait)
#   FLEETGATE_BENCH_STRICT=1   exit 1 when any target is missed
#   FLEETGATE_BENCH_OUT        report directory (default target/bench/<time>)
set -euo pipefail
cd "$(dirname "$0")/.."

benches="${FLEETGATE_BENCHES:-http decisions memory redis_memory grpc observe adaptive}"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="${FLEETGATE_BENCH_OUT:-target/bench/$stamp}"
mkdir -p "$out"
report="$out/report.md"

redis_bin="${REDIS_SERVER:-redis-server}"
if ! command -v "$redis_bin" >/dev/null 2>&1; then
  echo "scripts/bench.sh: redis-server not found. Install it (Debian/Ubuntu:" \
    "apt-get install -y redis-server; macOS: brew install redis), run" \
    "scripts/test.sh (which installs it), or set REDIS_SERVER." >&2
  exit 1
fi
if ! command -v wrk >/dev/null 2>&1 && [ "${FLEETGATE_BENCH_LOADGEN:-}" != "rust" ]; then
  echo "scripts/bench.sh: wrk not found; the http bench uses its own load generator" \
    "(install wrk, e.g. apt-get install -y wrk, to measure with it)." >&2
fi

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime; }

idle_wait="${FLEETGATE_BENCH_IDLE_WAIT:-0}"
idle_load="${FLEETGATE_BENCH_IDLE_LOAD:-0.5}"
if [ "$idle_wait" != "0" ]; then
  echo "scripts/bench.sh: waiting up to ${idle_wait}s for load < $idle_load" >&2
  end=$((SECONDS + idle_wait))
  while [ "$SECONDS" -lt "$end" ] &&
    awk -v max="$idle_load" '{ exit !($1 >= max) }' /proc/loadavg; do
    sleep 5
  done
fi

# The peers the decisions bench sets beside Limiter::check (node
# rate-limiter-flexible, Python limits), into target/peers; each is skipped
# with its reason where it cannot be installed.
case " $benches " in
  *" decisions "*) scripts/peers-install.sh ;;
esac

bench_args() {
  for b in $benches; do
    case "$b" in observe | adaptive) ;; *) printf -- '--bench %s ' "$b" ;; esac
  done
}

# What fleetgate::observe costs a call through the layer (memory store):
# scripts/callgrind-layer.sh on the default build and on one built with
# `--cfg fleetgate_observe_off` (the layers then feed observe nothing), in
# a target directory of its own, as other RUSTFLAGS rebuild everything.
# Instructions are repeatable whatever else the machine does; the noise
# between two builds is about 25 a call (BENCHMARKS.md).
observe_cost() {
  local cases="bare:admitted memory:admitted memory:rejected" noise=25
  if ! command -v valgrind >/dev/null 2>&1; then
    echo "### observe: skipped (needs valgrind)"
    return
  fi
  FLEETGATE_CALLGRIND_CASES="$cases" scripts/callgrind-layer.sh >"$out/observe-on.txt"
  CARGO_TARGET_DIR="${FLEETGATE_OBSERVE_OFF_DIR:-target/observe-off}" \
    RUSTFLAGS="${RUSTFLAGS:-} --cfg fleetgate_observe_off" \
    FLEETGATE_CALLGRIND_CASES="$cases" scripts/callgrind-layer.sh >"$out/observe-off.txt"
  echo "### observe: instructions per call through the layer, on vs off"
  echo
  echo "| case | on | off | on - off |"
  echo "|---|---:|---:|---:|"
  awk -F' *[|] *' 'NR == FNR { if ($4 ~ /^[0-9]+$/) off[$2 ":" $3] = $4; next }
    $4 ~ /^[0-9]+$/ && ($2 ":" $3) in off { printf "| %s %s | %d | %d | %+d |\n", $2, $3, $4, off[$2 ":" $3], $4 - off[$2 ":" $3] }' \
    "$out/observe-off.txt" "$out/observe-on.txt"
  echo
  echo "| target | required | measured | result |"
  echo "|---|---|---:|---|"
  awk -F' *[|] *' -v noise="$noise" 'NR == FNR { if ($4 ~ /^[0-9]+$/) off[$2 ":" $3] = $4; next }
    $2 == "memory" && ($2 ":" $3) in off { d = $4 - off[$2 ":" $3];
      printf "| observe: cost of a call %s | within the noise (%d instructions) | %+d | %s |\n", $3, noise, d, (d <= noise ? "PASS" : "MISS") }' \
    "$out/observe-off.txt" "$out/observe-on.txt"
}
# The demo's adaptive limit in front of a backend of 8 workers taking
# 20 ms a call (400 calls/s), 64 callers retrying at once for 10 s.
adaptive_demo() {
  local line status=0
  line=$(scripts/adaptive-demo.sh --release 2>"$out/adaptive.err") || status=$?
  field() { grep -oE "(^| )$1=[0-9.]+" <<<"$line" | cut -d= -f2; }
  echo "### adaptive: the demo's GET /api/adaptive, 64 callers for 10 s (release)"
  echo
  echo '```text'
  echo "$line"
  echo '```'
  echo
  echo "| target | required | measured | result |"
  echo "|---|---|---:|---|"
  awk -v rate="$(field rate)" -v p99="$(field p99_ms)" -v refused="$(field refused_p99_ms)" 'BEGIN {
    printf "| adaptive demo: calls admitted a second | >= 360 (backend: 400) | %s | %s |\n", rate, (rate + 0 >= 360 ? "PASS" : "MISS")
    printf "| adaptive demo: admitted p99 | < 60 ms | %s ms | %s |\n", p99, (p99 + 0 < 60 ? "PASS" : "MISS")
    printf "| adaptive demo: refused p99 | < 60 ms | %s ms | %s |\n", refused, (refused + 0 < 60 ? "PASS" : "MISS") }'
  [ "$status" = 0 ] || { echo; echo "adaptive-demo.sh failed:"; echo; sed 's/^/    /' "$out/adaptive.err"; }
}
echo "scripts/bench.sh: building" >&2
if [ -n "$(bench_args)" ]; then
  # shellcheck disable=SC2046
  cargo bench --no-run $(bench_args) 2>"$out/build.log" ||
    { cat "$out/build.log" >&2; exit 1; }
fi

wrk_version() {
  if command -v wrk >/dev/null 2>&1; then
    # wrk prints its version with its usage and exits 1.
    wrk --version 2>&1 | head -1 | cut -d' ' -f1-2 || true
  else
    echo "not installed"
  fi
}

crate_version() {
  awk -v name="$1" '$0 == "name = \"" name "\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock
}

loads=""
for b in $benches; do
  echo "scripts/bench.sh: running $b (load average $(load))" >&2
  before="$(load)"
  started=$SECONDS
  case "$b" in
    observe)
      observe_cost >"$out/observe.md" 2>"$out/observe.log"
      ;;
    adaptive)
      adaptive_demo >"$out/adaptive.md" 2>"$out/adaptive.log"
      ;;
    memory)
      cargo bench --bench memory -- \
        --warm-up-time "${FLEETGATE_CRITERION_WARMUP:-0.5}" \
        --measurement-time "${FLEETGATE_CRITERION_SECS:-1.5}" \
        >"$out/memory.full" 2>"$out/memory.log"
      # criterion's own progress stays in memory.full; the tables follow it.
      sed -n '/^### /,$p' "$out/memory.full" >"$out/memory.md"
      ;;
    *)
      cargo bench --bench "$b" >"$out/$b.md" 2>"$out/$b.log"
      ;;
  esac
  loads="$loads| $b | $before | $(load) | $((SECONDS - started)) s |"$'\n'
done

targets="$(cat "$out"/*.md | grep -E '\| (PASS|MISS) \|$' || true)"
passed="$(grep -c '| PASS |$' <<<"$targets" || true)"
missed="$(grep -c '| MISS |$' <<<"$targets" || true)"

{
  echo "# fleetgate benchmark run, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "## Machine and versions"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| CPU | $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || uname -m), $(nproc) CPUs |"
  echo "| Memory | $(awk '/MemTotal/ { printf "%.0f GB", $2 / 1048576 }' /proc/meminfo 2>/dev/null) |"
  echo "| OS | $(uname -sr) |"
  echo "| Rust | $(rustc --version) |"
  echo "| Redis | $("$redis_bin" --version | cut -d' ' -f1-3,5) |"
  echo "| wrk | $(wrk_version) |"
  echo "| Crates | $(for c in axum tower_governor governor redis tokio hyper tonic criterion; do printf '%s %s, ' "$c" "$(crate_version "$c")"; done | sed 's/, $//') |"
  echo "| Code | $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes') |"
  echo
  echo "## Load average (1, 5, 15 min) around each bench"
  echo
  echo "| bench | before | after | took |"
  echo "|---|---|---|---:|"
  printf '%s' "$loads"
  echo
  echo "## Commands"
  echo
  echo '```sh'
  echo "scripts/bench.sh   # FLEETGATE_BENCHES=\"$benches\""
  for b in $benches; do
    case "$b" in
      adaptive) echo "scripts/adaptive-demo.sh --release" ;;
      observe) echo "scripts/callgrind-layer.sh   # twice: as built, and with RUSTFLAGS=\"--cfg fleetgate_observe_off\" CARGO_TARGET_DIR=target/observe-off" ;;
      memory) echo "cargo bench --bench memory -- --warm-up-time ${FLEETGATE_CRITERION_WARMUP:-0.5} --measurement-time ${FLEETGATE_CRITERION_SECS:-1.5}" ;;
      *) echo "cargo bench --bench $b" ;;
    esac
  done
  echo '```'
  echo
  echo "## Targets: $passed passed, $missed missed"
  echo
  echo "| target | required | measured | result |"
  echo "|---|---|---:|---|"
  printf '%s\n' "$targets"
  for b in $benches; do
    echo
    cat "$out/$b.md"
  done
} >"$report"

mkdir -p target/bench
cp "$report" target/bench/latest.md
cat "$report"
echo >&2
echo "scripts/bench.sh: report in $report (and target/bench/latest.md)" >&2
if [ "${FLEETGATE_BENCH_STRICT:-0}" = "1" ] && [ "$missed" != "0" ]; then
  exit 1
fi
