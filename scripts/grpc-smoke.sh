#!/usr/bin/env bash
# Runs the gRPC demo the way README.md tells users to, and checks what it
# promises: with the memory store, the client's sixth quick call gets
# RESOURCE_EXHAUSTED with grpc-retry-pushback-ms > 0, another API key has
# a budget of its own, and so has a caller without one (its peer IP); two
# demos pointed at one Redis share their counts; on SIGTERM the demo exits
# 0. Needs redis-server (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --example grpc --example grpc_client
demo=target/debug/examples/grpc
client=target/debug/examples/grpc_client
redis_bin="${REDIS_SERVER:-redis-server}"
tmp=$(mktemp -d)
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT

# Starts the demo on a free port and sets the variable named $1 to its
# address and demo_pid to its process. Runs in this shell, not in $(...),
# so that cleanup knows every process it started.
start_demo() { # variable, env assignments...
  local var=$1 log found
  shift
  log="$tmp/demo-$RANDOM.log"
  FLEETGATE_GRPC_ADDR=127.0.0.1:0 "$@" "$demo" >"$log" 2>&1 &
  demo_pid=$!
  pids+=("$demo_pid")
  for _ in $(seq 100); do
    if found=$(grep -o 'listening on [0-9.:]*' "$log" 2>/dev/null); then
      printf -v "$var" '%s' "${found#listening on }"
      return 0
    fi
    sleep 0.1
  done
  echo "FAIL: the gRPC demo did not start:" >&2
  cat "$log" >&2
  return 1
}

# The client's summary line, after checking that each refused call said
# how long to wait.
calls() { # address, count, api key
  local out
  out=$("$client" --addr "$1" --calls "$2" --api-key "$3")
  if grep ResourceExhausted <<<"$out" | grep -qv 'pushback_ms=[1-9][0-9]*$'; then
    echo "FAIL: a RESOURCE_EXHAUSTED without grpc-retry-pushback-ms > 0:" >&2
    echo "$out" >&2
    exit 1
  fi
  tail -n 1 <<<"$out"
}

expect() { # label, got, expected
  echo "$1: $2"
  if [ "$2" != "$3" ]; then echo "FAIL: $1: expected $3" >&2; exit 1; fi
}

start_demo mem env
"$client" --addr "$mem" --calls 6 --api-key smoke-a >"$tmp/client.out"
sed 's/^/  /' "$tmp/client.out"
expect "grpc memory store, key a" "$(tail -n 1 "$tmp/client.out")" \
  "calls=6 ok=5 resource_exhausted=1 other=0"
grep -q '^call 6: ResourceExhausted .* pushback_ms=[1-9][0-9]*$' "$tmp/client.out" ||
  { echo "FAIL: the sixth call must be RESOURCE_EXHAUSTED with grpc-retry-pushback-ms > 0" >&2; exit 1; }
expect "grpc memory store, key b" "$(calls "$mem" 6 smoke-b)" \
  "calls=6 ok=5 resource_exhausted=1 other=0"
expect "grpc memory store, no key (peer IP)" "$(calls "$mem" 6 "")" \
  "calls=6 ok=5 resource_exhausted=1 other=0"

kill -TERM "$demo_pid"
status=0
wait "$demo_pid" || status=$?
expect "grpc demo on SIGTERM" "exit=$status" "exit=0"

# Two demos sharing one private Redis: three calls on each, one key.
rport=""
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  "$redis_bin" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis-$port.log" &
  rpid=$!
  for _ in $(seq 50); do
    grep -q "Ready to accept connections" "$tmp/redis-$port.log" 2>/dev/null && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$rpid" 2>/dev/null && grep -q "Ready to accept connections" "$tmp/redis-$port.log"; then
    pids+=("$rpid")
    rport=$port
    break
  fi
done
[ -n "$rport" ] || { echo "FAIL: no redis-server started" >&2; exit 1; }
start_demo ra env REDIS_URL="redis://127.0.0.1:$rport"
start_demo rb env REDIS_URL="redis://127.0.0.1:$rport"
# The demos connect in the background: a call that passed before the
# connection was up would not have counted, so wait until one refuses.
for demo_addr in "$ra" "$rb"; do
  for i in $(seq 50); do
    [ "$(calls "$demo_addr" 6 "warm-$demo_addr-$i")" = "calls=6 ok=5 resource_exhausted=1 other=0" ] && break
    sleep 0.1
  done
done
got="$(calls "$ra" 3 smoke-shared) / $(calls "$rb" 3 smoke-shared)"
expect "grpc two demos, one redis" "$got" \
  "calls=3 ok=3 resource_exhausted=0 other=0 / calls=3 ok=2 resource_exhausted=1 other=0"

echo "grpc smoke test passed"
