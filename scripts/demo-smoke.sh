#!/usr/bin/env bash
# Runs the demo the way README.md tells users to, and checks what it
# promises: a curl loop on /api/ping sees 429 within a few requests, two
# instances pointed at one Redis share their counts, and /api/slow lets at
# most 2 calls per key be in flight at once (fleet-wide with Redis).
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

slow() { # url, api key, ms
  curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $2" "$1/api/slow?ms=$3"
}

# Two slow calls of one key in flight (on $1 and $2); a third of that key
# (on $3) is refused, another key's call passes.
check_slow() { # label, url of 1st call, url of 2nd, url of 3rd
  local key="slow-$RANDOM"
  slow "$2" "$key" 4000 >"$tmp/slow1" &
  local p1=$!
  slow "$3" "$key" 4000 >"$tmp/slow2" &
  local p2=$!
  # Give both calls time to be admitted (they then hold their slots 4 s).
  sleep 1
  local third other
  third=$(slow "$4" "$key" 0)
  other=$(slow "$4" "other-$key" 0)
  wait "$p1" "$p2"
  local got
  got="$(cat "$tmp/slow1") $(cat "$tmp/slow2") third=$third other=$other"
  echo "$1: $got"
  case "$got" in
    "200 200 third=429 other=200") ;;
    *) echo "FAIL: expected 2 in flight per key, a third refused, another key unaffected" >&2; exit 1 ;;
  esac
}
check_slow "memory store /api/slow" "$url" "$url" "$url"

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
check_slow "two instances, one redis, /api/slow" "$a" "$b" "$a"
echo "demo smoke test passed"
