#!/usr/bin/env bash
# Runs the demo the way README.md tells users to, and checks what it
# promises: a curl loop on /api/ping sees 429 within a few requests, the
# 26th quick call to /api/window gets a 429 naming the 5 s window, and two
# instances pointed at one Redis share their counts.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --example server
demo=target/debug/examples/server
tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Starts the demo on a free port; prints its base URL.
start_demo() {
  local log="$tmp/demo-$#-$RANDOM.log"
  FLEETGATE_ADDR=127.0.0.1:0 "$@" "$demo" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    if url=$(grep -o 'listening on http://[0-9.:]*' "$log" 2>/dev/null); then
      echo "${url#listening on }"
      return 0
    fi
    sleep 0.1
  done
  echo "demo did not start:" >&2
  cat "$log" >&2
  return 1
}

codes() { # url, count, [api key]
  for _ in $(seq "$2"); do
    curl -s -o /dev/null -w '%{http_code} ' ${3:+-H "x-api-key: $3"} "$1/api/ping"
  done
}

url=$(start_demo env)
got=$(codes "$url" 8)
echo "memory store: $got"
case "$got" in
  "200 200 200 200 200 429 429 429 ") ;;
  *) echo "FAIL: expected five 200 then 429s" >&2; exit 1 ;;
esac

# /api/window: 25 per 5 s (and 300 per minute). The 26th quick call is
# refused, and the body names the short window.
window_check() { # url, api key
  local got status body
  got=$(for _ in $(seq 25); do
    curl -s -o /dev/null -w '%{http_code} ' -H "x-api-key: $2" "$1/api/window"
  done)
  if [ "$got" != "$(printf '200 %.0s' $(seq 25))" ]; then
    echo "FAIL: /api/window: expected 25 x 200, got $got" >&2
    exit 1
  fi
  status=$(curl -s -o "$tmp/window-body" -w '%{http_code}' -H "x-api-key: $2" "$1/api/window")
  body=$(cat "$tmp/window-body")
  echo "/api/window: 25 x 200, then $status: $body"
  if [ "$status" != 429 ] || [[ "$body" != *"25/5s"* ]]; then
    echo "FAIL: expected the 26th call to be 429 naming 25/5s" >&2
    exit 1
  fi
}
window_check "$url" smoke-window

redis_bin="${REDIS_SERVER:-redis-server}"
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  "$redis_bin" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" &
  rpid=$!
  for _ in $(seq 50); do
    grep -q "Ready to accept connections" "$tmp/redis.log" 2>/dev/null && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$rpid" 2>/dev/null; then pids+=("$rpid"); break; fi
done
a=$(start_demo env REDIS_URL="redis://127.0.0.1:$port")
b=$(start_demo env REDIS_URL="redis://127.0.0.1:$port")
got=""
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) -eq 1 ]; then u=$a; else u=$b; fi
  got+=$(codes "$u" 1 smoke-key)
done
echo "two instances, one redis: $got"
case "$got" in
  "200 200 200 200 200 429 ") ;;
  *) echo "FAIL: two instances did not share one limit" >&2; exit 1 ;;
esac
window_check "$a" smoke-window-redis
echo "demo smoke test passed"
