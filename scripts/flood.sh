#!/usr/bin/env bash
# Floods the release-built demo (memory store) with distinct API keys on
# every keyed route (/api/ping, /api/window, /api/slow) for
# FLOOD_SECONDS (default 30) with wrk, while one hot key keeps calling
# /api/ping. Prints the demo's largest resident memory during the flood,
# its memory one minute (the longest window) after, and how many of the
# hot key's calls were admitted against what its limit allows.
# Needs wrk (apt-get install -y wrk). Extra environment goes to the demo
# (FLEETGATE_MEMORY_MAX_KEYS=...).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FLOOD_SECONDS:-30}"
command -v wrk >/dev/null 2>&1 || { echo "scripts/flood.sh: wrk is needed" >&2; exit 1; }
cargo build --quiet --release --example server
tmp=$(mktemp -d)
demo_pid=""
cleanup() {
  [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

FLEETGATE_ADDR=127.0.0.1:0 RUST_LOG=warn target/release/examples/server >"$tmp/demo.log" 2>&1 &
demo_pid=$!
url=""
for _ in $(seq 100); do
  url=$(grep -o 'http://[0-9.:]*' "$tmp/demo.log" 2>/dev/null | head -n 1) && [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "demo did not start" >&2; cat "$tmp/demo.log" >&2; exit 1; }
rss() { awk '/^VmRSS/ { print int($2 / 1024) }' "/proc/$demo_pid/status"; }
echo "demo at $url: ${seconds} s flood; RSS before: $(rss) MB"

cat >"$tmp/flood.lua" <<'LUA'
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
local n = 0
local paths = { "/api/ping", "/api/window", "/api/slow?ms=0" }
function request()
  n = n + 1
  return wrk.format("GET", paths[n % 3 + 1], { ["x-api-key"] = "flood-" .. id .. "-" .. n })
end
LUA

wrk -t2 -c64 -d"${seconds}s" -s "$tmp/flood.lua" "$url" >"$tmp/wrk.txt" 2>&1 &
wrk_pid=$!
# The hot key: one call every 50 ms on /api/ping (burst 5, 1/s).
hot_ok=0 hot_all=0 max=0
start=$(date +%s.%N)
while kill -0 "$wrk_pid" 2>/dev/null; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: hot-key' "$url/api/ping")
  hot_all=$((hot_all + 1))
  [ "$code" = 200 ] && hot_ok=$((hot_ok + 1))
  now=$(rss); [ "$now" -gt "$max" ] && max=$now
  sleep 0.05
done
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
wait "$wrk_pid" || true
requests=$(awk '/requests in/ { print $1 }' "$tmp/wrk.txt")
echo "flood: ${requests:-?} requests (distinct keys); largest RSS during it: $max MB"
allowed=$(awk -v t="$elapsed" 'BEGIN { printf "%d", 5 + t + 1 }')
echo "hot key: $hot_ok of $hot_all admitted in ${elapsed} s (its limit allows at most $allowed)"
echo "RSS at the end of the flood: $(rss) MB"
# Idle for one window (the longest, /api/window's minute) and a little.
for _ in $(seq 65); do sleep 1; done
curl -s -o /dev/null "$url/healthz"
echo "RSS 65 s after the flood: $(rss) MB"
if [ "$hot_ok" -gt "$allowed" ]; then
  echo "FAIL: the hot key got more than its limit during the flood" >&2
  exit 1
fi
