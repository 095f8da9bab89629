#!/usr/bin/env bash
# Runs the demo the way README.md tells users to, and checks what it
# promises: a curl loop on /api/ping sees 429 within a few requests, the
# 26th quick call to /api/window gets a 429 naming the 5 s window, two
# instances pointed at one Redis share their counts, /api/slow lets at
# most 2 calls per key be in flight at once (fleet-wide with Redis), the
# fleet load shedder answers 503 to reports beyond 2 in flight while a
# charge still passes (fleet-wide with Redis), /metrics counts the
# decisions, FLEETGATE_POLICIES loads limits from a file (and re-reads it
# when edited, keeping the previous limits when it breaks), and with Redis
# killed and restarted each FLEETGATE_FAILURE_POLICY does what it says and
# Redis decides again once it is back, and two instances given different
# seed nodes of one Redis Cluster (3 masters, 3 replicas) share their
# counts, as do two instances that find one master through Redis Sentinel.
# /api/complete, /api/login and /api/flaky charge, count and refund by the
# response, on the memory store and through Redis.
# The admin API (FLEETGATE_ADMIN_TOKEN) is 404 without the variable and 401
# without the token; on two instances sharing one Redis, a policy changed
# through one is enforced by the other within a second, a broken text
# changes nothing, an override and a plan apply to their identity only, a
# reset unblocks, a restarted instance keeps the change, and both
# instances are listed. A deny entry added through one refuses that
# identity with 403 on the other within a poll (and no one else), shows in
# /admin/lists and is lifted by DELETE; a deny-net of a network shows too
# and refuses its IPs; hostile list input (a /33, %0A in an identity, a
# bad duration) is 400 and changes nothing.
# Connections: a request head left unfinished is closed after the header
# timeout, and past FLEETGATE_MAX_CONNECTIONS a new connection waits until
# one closes. On SIGTERM, calls that outlast the drain are cut off and no
# lease of theirs is left in Redis.
set -euo pipefail
cd "$(dirname "$0")/.."

# The demo reaches every Redis topology: its dev-dependency on the crate
# turns on `cluster` and `sentinel`. Built where cargo builds, the
# CARGO_TARGET_DIR of a worktree sharing the machine included.
cargo build --quiet --example server
demo=${CARGO_TARGET_DIR:-target}/debug/examples/server
tmp=$(mktemp -d)
pids=()
cleanup() {
  local status=$? left
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
  # Every demo this run started (each carries its mark) stops with it.
  left=$(grep -lzx "FLEETGATE_SMOKE_RUN=$$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' ' || true)
  if [ -n "$left" ]; then
    echo "FAIL: demos still running after the smoke test: $left" >&2
    kill $left 2>/dev/null || true
    exit 1
  fi
  exit "$status"
}
trap cleanup EXIT

# Starts the demo on a free port and sets the variable named $1 to its base
# URL, demo_pid to its process and demo_log to its output. Runs in this
# shell, not in $(...), so that cleanup knows every process it started.
start_demo() { # variable, env assignments...
  local var=$1 found
  shift
  demo_log="$tmp/demo-$#-$RANDOM.log"
  FLEETGATE_ADDR=127.0.0.1:0 FLEETGATE_SMOKE_RUN=$$ "$@" "$demo" >"$demo_log" 2>&1 &
  demo_pid=$!
  pids+=("$demo_pid")
  for _ in $(seq 100); do
    if found=$(grep -o 'listening on http://[0-9.:]*' "$demo_log" 2>/dev/null); then
      printf -v "$var" '%s' "${found#listening on }"
      return 0
    fi
    sleep 0.1
  done
  echo "demo did not start:" >&2
  cat "$demo_log" >&2
  return 1
}

codes() { # url, count, [api key]
  for _ in $(seq "$2"); do
    curl -s -o /dev/null -w '%{http_code} ' ${3:+-H "x-api-key: $3"} "$1/api/ping"
  done
}

# Whether the /api/ping codes $1 of a run that started at $2 (ms, `date
# +%s%3N`) spent one budget: a burst of 5 and then 429s, but for the 1 a
# second it refilled meanwhile (a loaded machine's curls take a while).
one_budget() { # codes, start ms
  local took=$(( $(date +%s%3N) - $2 )) passed=0 refused=0 i=0 code
  for code in $1; do
    i=$((i + 1))
    case "$code" in
      200) passed=$((passed + 1)) ;;
      429) refused=$((refused + 1)) ;;
      *) return 1 ;;
    esac
    # The burst comes first, untouched by any refill.
    if [ "$i" -le 5 ] && [ "$code" != 200 ]; then return 1; fi
  done
  # Refills start with the first call, after $2: one per whole second.
  [ "$passed" -le $((5 + took / 1000)) ] && [ "$refused" -ge $((i - 5 - took / 1000)) ]
}

# Bad settings: the demo refuses to start, naming the variable.
for bad in FLEETGATE_SHED_WORKERS=0 FLEETGATE_FAILURE_POLICY=local:1e-300 \
  FLEETGATE_MEMORY_MAX_KEYS=0 FLEETGATE_MEMORY_MAX_KEYS=18446744073709551615 \
  FLEETGATE_MEMORY_MAX_KEYS=100000001 FLEETGATE_ADDR=nowhere FLEETGATE_HEADER_TIMEOUT_SECS=0 \
  FLEETGATE_MAX_CONNECTIONS=0 FLEETGATE_DRAIN_SECS=3601; do
  if out=$(env FLEETGATE_SMOKE_RUN=$$ "$bad" timeout 10 "$demo" 2>&1); then
    echo "FAIL: the demo started with $bad" >&2; exit 1
  fi
  case "$out" in
    *"Error: ${bad%%=*}"*) echo "refused $bad: ${out##*Error: }" ;;
    *) echo "FAIL: $bad: expected an error naming ${bad%%=*}, got: $out" >&2; exit 1 ;;
  esac
done

# Opens $2 connections to the demo at $1 that each send part of a request
# head and never finish it, then reads each until the demo closes it,
# giving up $3 s after the first was opened. Prints "<closed> <first ms>
# <last ms>": how many were closed, and when the first and the last were,
# counted from the first connect.
partial_heads() { # url, count, give up after (s)
  local hostport=${1#http://} fds=() fd rc start now left closed=0 first="" last=0 line
  start=$(date +%s%3N)
  for _ in $(seq "$2"); do
    exec {fd}<>"/dev/tcp/${hostport%:*}/${hostport##*:}"
    printf 'GET /api/ping HTTP/1.1\r\nHost: x\r\n' >&"$fd"
    fds+=("$fd")
  done
  for fd in "${fds[@]}"; do
    # Whatever the demo sends, until it closes (1) or the time is up (>128).
    rc=0
    while true; do
      now=$(date +%s%3N)
      left=$(($3 * 1000 - (now - start)))
      if [ "$left" -le 0 ]; then rc=142; break; fi
      read -r -t "$((left / 1000)).$(printf '%03d' $((left % 1000)))" -u "$fd" line || { rc=$?; break; }
    done
    now=$(($(date +%s%3N) - start))
    if [ "$rc" -le 128 ]; then
      closed=$((closed + 1)) last=$now
      [ -n "$first" ] || first=$now
    fi
    exec {fd}<&-
  done
  echo "$closed ${first:-none} $last"
}

start_demo url env
url_log=$demo_log
# The default header timeout (10 s), checked while the checks below run.
partial_heads "$url" 20 20 >"$tmp/partial" &
partial_pid=$!
pids+=("$partial_pid")
start=$(date +%s%3N)
got=$(codes "$url" 8)
echo "memory store: $got"
one_budget "$got" "$start" || { echo "FAIL: expected five 200 then 429s" >&2; exit 1; }
ping_got=$got

if ! grep -q "FLEETGATE_API_KEYS is not set: any x-api-key value is trusted" "$demo_log"; then
  echo "FAIL: without FLEETGATE_API_KEYS the demo must say that any key is trusted" >&2
  exit 1
fi

# FLEETGATE_API_KEYS: only those keys are identities. Twenty made-up keys
# from one address share that address's budget (burst 5), a known key has
# its own, and on /api/slow a third made-up key in flight is refused.
start_demo keyed env FLEETGATE_API_KEYS="known-1, known-2"
got="" start=$(date +%s%3N)
for i in $(seq 20); do got+=$(codes "$keyed" 1 "made-up-$i-$RANDOM"); done
echo "FLEETGATE_API_KEYS, 20 made-up keys: $got"
if ! one_budget "$got" "$start"; then
  echo "FAIL: made-up keys must share their address's budget" >&2; exit 1
fi
start=$(date +%s%3N)
got=$(codes "$keyed" 6 known-1)
echo "FLEETGATE_API_KEYS, a known key: $got"
case "$got" in
  "200 200 200 200 200 "*) one_budget "$got" "$start" ;;
  *) false ;;
esac || { echo "FAIL: a known key has a budget of its own" >&2; exit 1; }

# /metrics: the burst above shows as counters, in Prometheus' format.
metric() { # url, outcome
  curl -s "$1/metrics" | awk -v o="outcome=\"$2\"" '$1 ~ /^fleetgate_decisions_total/ && index($1, "policy=\"ping\"") && index($1, o) { print $2 }'
}
allowed=$(metric "$url" allowed) denied=$(metric "$url" denied)
echo "metrics: ping allowed=$allowed denied=$denied"
# What the memory store's run above answered (5 and 3 unless it refilled).
want_allowed=$(grep -o 200 <<<"$ping_got" | wc -l) want_denied=$(grep -o 429 <<<"$ping_got" | wc -l)
if [ "$allowed" != "$want_allowed" ] || [ "$denied" != "$want_denied" ]; then
  echo "FAIL: expected fleetgate_decisions_total allowed=$want_allowed denied=$want_denied" >&2
  exit 1
fi

# Policies from a file (FLEETGATE_POLICIES) replace the built-in limits.
sed 's/ping = "1\/s burst 5"/ping = "1\/min burst 2"/' examples/policies.toml >"$tmp/policies.toml"
start_demo filed env FLEETGATE_POLICIES="$tmp/policies.toml"
filed_log=$demo_log
got=$(codes "$filed" 4)
echo "policies from a file (ping = 1/min burst 2): $got"
case "$got" in
  "200 200 429 429 ") ;;
  *) echo "FAIL: expected the file's burst of 2" >&2; exit 1 ;;
esac
# The file is watched: an edit applies within 2 s, a broken one changes
# nothing (the demo logs that it kept the previous policies).
sed -i 's/ping = "1\/min burst 2"/ping = "1\/min burst 3"/' "$tmp/policies.toml"
start_ms=$(date +%s%3N) i=0
until [ "$(codes "$filed" 4 "edited-$i")" = "200 200 200 429 " ]; do
  i=$((i + 1))
  if [ $(($(date +%s%3N) - start_ms)) -gt 2000 ]; then
    echo "FAIL: the edited policy file did not apply within 2 s" >&2; exit 1
  fi
  sleep 0.05
done
echo "policy file edited (burst 3): applied after $(($(date +%s%3N) - start_ms)) ms"
sed -i 's/ping = "1\/min burst 3"/ping = "1\/min burst"/' "$tmp/policies.toml"
for _ in $(seq 60); do grep -q "policy file refused" "$filed_log" && break; sleep 0.05; done
grep -q "policy file refused" "$filed_log" || { echo "FAIL: a broken policy file was not refused" >&2; exit 1; }
# A calendar quota (ping = "3/day"): three calls a UTC day, the fourth
# told to come back at midnight.
sed -i 's/ping = "1\/min burst"/ping = "3\/day"/' "$tmp/policies.toml"
start_ms=$(date +%s%3N) i=0
# Applied once the policy header advertises a day's window.
until curl -s -o /dev/null -D - -H "x-api-key: probe-$i" "$filed/api/ping" | grep -qi '^ratelimit-policy: "3/day";q=3;w=86400'; do
  i=$((i + 1))
  if [ $(($(date +%s%3N) - start_ms)) -gt 2000 ]; then
    echo "FAIL: the calendar quota ping = \"3/day\" did not apply within 2 s" >&2; exit 1
  fi
  sleep 0.05
done
got=$(codes "$filed" 4 "daily-$i")
[ "$got" = "200 200 200 429 " ] || { echo "FAIL: ping = \"3/day\" answered $got" >&2; exit 1; }
retry=$(curl -s -o /dev/null -D - -H "x-api-key: daily-$i" "$filed/api/ping" | tr -d '\r' | sed -n 's/^retry-after: //Ip')
midnight=$(( $(date -u -d 'tomorrow 00:00' +%s) - $(date -u +%s) ))
echo "policies from a file (ping = 3/day): 200 200 200 429, Retry-After $retry s (midnight UTC in $midnight s)"
if [ -z "$retry" ] || [ $((retry - midnight)) -gt 2 ] || [ $((midnight - retry)) -gt 2 ]; then
  echo "FAIL: expected Retry-After to count down to midnight UTC" >&2; exit 1
fi
expect_codes() { # label, expected, url, count, api key
  local got
  got=$(codes "$3" "$4" "$5")
  if [ "$got" != "$2" ]; then echo "FAIL: $1: got $got, expected $2" >&2; exit 1; fi
}
expect_codes "a broken policy file" "200 200 200 429 " "$filed" 4 after-broken-file
echo "policy file broken: refused, burst 3 kept"

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
slow() { # url, api key, ms
  curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $2" "$1/api/slow?ms=$3"
}

# /api/slow calls an instance has admitted so far, from /metrics.
slow_admitted() { # url
  curl -s "$1/metrics" | awk '$1 ~ /^fleetgate_decisions_total/ && index($1, "layer=\"concurrency\"") && index($1, "policy=\"slow\"") && index($1, "outcome=\"allowed\"") { n += $2 } END { print n + 0 }'
}
wait_admitted() { # url, count
  for _ in $(seq 200); do
    if [ "$(slow_admitted "$1")" -ge "$2" ]; then return 0; fi
    sleep 0.02
  done
  echo "FAIL: $1 never admitted /api/slow call number $2 (admitted: $(slow_admitted "$1"); first call: $(cat "$tmp/slow1" 2>/dev/null))" >&2
  exit 1
}

# Two slow calls of one key in flight (on $1 and $2); a third of that key
# (on $3) is refused, another key's call passes.
# The three calls use one key, or keys 1 to 3 of $5 (a space-separated
# list, whose 4th is the other key).
check_slow() { # label, url of 1st call, url of 2nd, url of 3rd, [keys]
  local key="slow-$RANDOM"
  local keys=("$key" "$key" "$key" "other-$key")
  if [ $# -ge 5 ]; then read -r -a keys <<<"$5"; fi
  local before
  before=$(slow_admitted "$2")
  slow "$2" "${keys[0]}" 4000 >"$tmp/slow1" &
  local p1=$!
  # Each call is admitted (and holds its slot 4 s) before the next starts.
  wait_admitted "$2" $((before + 1))
  before=$(slow_admitted "$3")
  slow "$3" "${keys[1]}" 4000 >"$tmp/slow2" &
  local p2=$!
  wait_admitted "$3" $((before + 1))
  local third other
  third=$(slow "$4" "${keys[2]}" 0)
  other=$(slow "$4" "${keys[3]}" 0)
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
check_slow "FLEETGATE_API_KEYS /api/slow, 3 made-up keys" "$keyed" "$keyed" "$keyed" \
  "made-up-a made-up-b made-up-c known-2"

# Reports this instance has in flight, from /metrics (the fleet shedder's
# per-tier gauge); waits until there are $2, so that the probes below run
# while the held reports certainly hold their slots.
wait_reports() { # url, count
  local now=""
  for _ in $(seq 100); do
    now=$(curl -s "$1/metrics" | awk '$1 ~ /^fleetgate_shed_in_flight/ && index($1, "layer=\"fleet_shed\"") && index($1, "tier=\"low\"") { print $2 }')
    if [ "${now:-0}" = "$2" ]; then return 0; fi
    sleep 0.05
  done
  echo "FAIL: $1 never had $2 reports in flight (last: ${now:-none})" >&2
  exit 1
}

# Two reports held (on $2 and $3) fill the low tier's share of the fleet's
# 4; three more at once (on $3) get 503 with Retry-After, while a
# concurrent charge (critical) gets 200. The probes start once both are
# seen in flight, and must land within the hold: 5 s leaves a loaded
# machine room.
hold_ms=5000
check_shed() { # label, url of 1st held report, url of 2nd and of the probes
  curl -s -o /dev/null -w '%{http_code}' "$2/api/report?ms=$hold_ms" >"$tmp/rep1" &
  local p1=$!
  wait_reports "$2" 1
  curl -s -o /dev/null -w '%{http_code}' "$3/api/report?ms=$hold_ms" >"$tmp/rep2" &
  local p2=$!
  if [ "$2" = "$3" ]; then wait_reports "$3" 2; else wait_reports "$3" 1; fi
  local probes=()
  for i in 1 2 3; do
    curl -s -o /dev/null -w '%{http_code} %header{retry-after}' "$3/api/report?ms=0" >"$tmp/probe$i" &
    probes+=($!)
  done
  curl -s -o /dev/null -w '%{http_code}' -X POST "$3/api/charge?ms=0" >"$tmp/charge" &
  local pc=$!
  wait "${probes[@]}" "$pc" "$p1" "$p2"
  local got
  got="held=$(cat "$tmp/rep1") $(cat "$tmp/rep2") probes=$(cat "$tmp/probe1"),$(cat "$tmp/probe2"),$(cat "$tmp/probe3") charge=$(cat "$tmp/charge")"
  echo "$1: $got"
  case "$got" in
    "held=200 200 probes=503 1,503 1,503 1 charge=200") ;;
    *) echo "FAIL: expected 2 reports held, 3 more shed with Retry-After: 1, the charge passing" >&2; exit 1 ;;
  esac
}
check_shed "memory store /api/report + /api/charge" "$url" "$url"

# Routes charged once the response is known, each with fresh API keys:
# /api/complete charges its x-tokens-used (1000/min), /api/login counts
# only its 401s (5/15min block 1h), /api/flaky refunds its 500s (3/min burst 3).
after_check() { # label, url
  local key="after-$RANDOM$RANDOM" got ra i
  got=""
  for i in 1 2 3; do
    got+=$(curl -s -o /dev/null -w '%{http_code} ' -X POST -H "x-api-key: complete-$key" "$2/api/complete?tokens=400")
  done
  got+=$(curl -s -o /dev/null -w '%{http_code}/%header{retry-after}' -X POST -H "x-api-key: complete-$key" "$2/api/complete?tokens=400")
  echo "$1 /api/complete, tokens=400 x 4: $got"
  ra=${got##*/}
  if [ "${got%/*}" != "200 200 200 429" ] || { [ "$ra" != 12 ] && [ "$ra" != 13 ]; }; then
    echo "FAIL: expected three 200s, then 429 with Retry-After 12 or 13" >&2; exit 1
  fi
  got=""
  for i in $(seq 20); do
    got+=$(curl -s -o /dev/null -w '%{http_code} ' -X POST -H "x-api-key: login-$key" "$2/api/login?ok=1")
  done
  [ "$got" = "$(printf '200 %.0s' $(seq 20))" ] ||
    { echo "FAIL: $1 /api/login: twenty ok=1 must pass, got $got" >&2; exit 1; }
  got=""
  for i in $(seq 5); do
    got+=$(curl -s -o /dev/null -w '%{http_code} ' -X POST -H "x-api-key: login-$key" "$2/api/login?ok=0")
  done
  got+=$(curl -s -o /dev/null -w '%{http_code}/%header{retry-after}' -X POST -H "x-api-key: login-$key" "$2/api/login?ok=1")
  echo "$1 /api/login: 20 x ok=1 200, then 5 x ok=0 and ok=1: $got"
  case "$got" in
    "401 401 401 401 401 429/3600" | "401 401 401 401 401 429/3599") ;;
    *) echo "FAIL: expected five 401s, then 429 with ok=1, blocked for an hour (Retry-After 3600)" >&2; exit 1 ;;
  esac
  got=""
  for i in $(seq 10); do
    got+=$(curl -s -o /dev/null -w '%{http_code} ' -H "x-api-key: flaky-$key" "$2/api/flaky?fail=1")
  done
  got+="/ "
  for i in $(seq 4); do
    got+=$(curl -s -o /dev/null -w '%{http_code} ' -H "x-api-key: flaky-$key" "$2/api/flaky?fail=0")
  done
  echo "$1 /api/flaky, 10 x fail=1 / 4 x fail=0: $got"
  [ "$got" = "$(printf '500 %.0s' $(seq 10))/ 200 200 200 429 " ] ||
    { echo "FAIL: expected ten 500s (refunded), then three 200s and a 429" >&2; exit 1; }
  got="$(curl -s -o /dev/null -w '%{http_code}' -X POST "$2/api/complete?tokens=lots")"
  got+=" $(curl -s -o /dev/null -w '%{http_code}' -X POST "$2/api/complete?ms=-1")"
  [ "$got" = "400 400" ] || { echo "FAIL: $1 /api/complete with bad numbers: $got, expected 400 400" >&2; exit 1; }
}
after_check "memory store" "$url"
listed=$(curl -s "$url/" | grep -c -e '^POST /api/complete' -e '^POST /api/login' -e '^GET /api/flaky' || true)
[ "$listed" = 3 ] || { echo "FAIL: GET / must list /api/complete, /api/login and /api/flaky" >&2; exit 1; }

# The 20 unfinished request heads sent at the start: each closed by the
# demo after its 10 s header timeout, not before; at most 10 s later
# allows for a loaded machine.
wait "$partial_pid" || true
read -r closed first last <"$tmp/partial" || true
closed=${closed:-0} first=${first:-0} last=${last:-0}
echo "20 unfinished request heads: $closed closed, after $first to $last ms"
if [ "$closed" != 20 ] || [ "$first" -lt 9500 ] || [ "$last" -gt 20000 ]; then
  echo "FAIL: expected all 20 closed by the 10 s header timeout (from 10 s to 20 s)" >&2
  exit 1
fi
grep -q "^connections: at most 10000 at once (more wait to be accepted), a request head within 10 s, 10 s to drain on SIGTERM$" "$url_log" ||
  { echo "FAIL: the startup line must name the connection bounds" >&2; exit 1; }

# FLEETGATE_MAX_CONNECTIONS=2: with two connections open (idle, within
# the header timeout), a third waits in the accept queue unanswered; it
# is served once one of the two closes.
start_demo capped env FLEETGATE_MAX_CONNECTIONS=2 FLEETGATE_HEADER_TIMEOUT_SECS=30
exec {fd_a}<>"/dev/tcp/127.0.0.1/${capped##*:}"
exec {fd_b}<>"/dev/tcp/127.0.0.1/${capped##*:}"
waiting=$(curl -s -o /dev/null --max-time 1 -w '%{http_code}' "$capped/healthz" || true)
exec {fd_a}<&-
served=$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$capped/healthz" || true)
exec {fd_b}<&-
echo "FLEETGATE_MAX_CONNECTIONS=2, two open: a third gets $waiting within 1 s; $served once one closes"
[ "$waiting $served" = "000 200" ] ||
  { echo "FAIL: expected the third connection to wait (000), then 200" >&2; exit 1; }

# The admin API. Without FLEETGATE_ADMIN_TOKEN, /admin does not exist.
admin_token="smoke-$RANDOM$RANDOM"
admin() { # url, method, path, [body]: prints the status; the body is in $tmp/admin-body
  curl -s -o "$tmp/admin-body" -w '%{http_code}' -X "$2" -H "Authorization: Bearer $admin_token" \
    ${4+--data-binary "$4"} "$1/admin$3"
}
expect_admin() { # label, expected status, url, method, path, [body]
  local got
  got=$(admin "${@:3}")
  if [ "$got" != "$2" ]; then
    echo "FAIL: $1: $4 $5 answered $got, expected $2: $(cat "$tmp/admin-body")" >&2
    exit 1
  fi
}
got="$(admin "$url" GET /policies) $(admin "$url" PUT /policies/ping '1/min')"
echo "admin API without FLEETGATE_ADMIN_TOKEN: $got"
[ "$got" = "404 404" ] || { echo "FAIL: /admin must be 404 without FLEETGATE_ADMIN_TOKEN" >&2; exit 1; }
start_demo adm env FLEETGATE_ADMIN_TOKEN="$admin_token"
got="$(curl -s -o /dev/null -w '%{http_code}' "$adm/admin/policies")"
got+=" $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong" "$adm/admin/policies")"
got+=" $(curl -s -o /dev/null -w '%{http_code}' -X PUT --data-binary 1/min "$adm/admin/policies/ping")"
echo "admin API without or with a wrong token: $got"
[ "$got" = "401 401 401" ] || { echo "FAIL: /admin must be 401 without the bearer token" >&2; exit 1; }
expect_admin "memory admin" 200 "$adm" PUT /policies/ping '1/min burst 2'
expect_codes "memory admin, ping = 1/min burst 2" "200 200 429 " "$adm" 3 mem-a
expect_admin "memory admin, broken text" 400 "$adm" PUT /policies/ping '1/min burst'
expect_admin "memory admin" 200 "$adm" PUT /overrides/ping/mem-vip '1/min burst 3'
expect_codes "memory admin, override" "200 200 200 429 " "$adm" 4 mem-vip
expect_codes "memory admin, another key" "200 200 429 " "$adm" 3 mem-b
expect_admin "memory admin, reset" 204 "$adm" POST /reset/ping/mem-b
expect_codes "memory admin, after reset" "200 " "$adm" 1 mem-b
echo "memory admin API: policy, broken text (400), override and reset as expected"

redis_bin="${REDIS_SERVER:-redis-server}"
# Starts redis-server on $1 (with the extra arguments that follow) and
# waits until it accepts connections; sets rpid. Fails if it does not come
# up.
start_redis() { # port, extra arguments...
  local log="$tmp/redis-$1-$RANDOM.log"
  "$redis_bin" --port "$1" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$log" "${@:2}" &
  rpid=$!
  for _ in $(seq 50); do
    grep -q "Ready to accept connections" "$log" 2>/dev/null && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$rpid" 2>/dev/null && grep -q "Ready to accept connections" "$log"; then
    pids+=("$rpid")
    return 0
  fi
  return 1
}
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  if start_redis "$port"; then break; fi
done
start_demo a env REDIS_URL="redis://127.0.0.1:$port"
a_pid=$demo_pid
start_demo b env REDIS_URL="redis://127.0.0.1:$port"
got="" start=$(date +%s%3N)
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) -eq 1 ]; then u=$a; else u=$b; fi
  got+=$(codes "$u" 1 smoke-key)
done
echo "two instances, one redis: $got"
one_budget "$got" "$start" || { echo "FAIL: two instances did not share one limit" >&2; exit 1; }
check_slow "two instances, one redis, /api/slow" "$a" "$b" "$a"
check_shed "two instances, one redis, /api/report + /api/charge" "$a" "$b"
window_check "$a" smoke-window-redis
after_check "one redis" "$a"

# Redis killed: the demo keeps answering within its 50 ms timeout, failing
# open by default (pong, no rate-limit headers), 503 when told to fail
# closed, and with half the limit (burst 2) of its own when told to fall
# back locally. A demo started while Redis is down starts all the same.
{ kill -9 "$rpid" && wait "$rpid"; } 2>/dev/null || true
start_demo closed env REDIS_URL="redis://127.0.0.1:$port" FLEETGATE_FAILURE_POLICY=closed
start_demo local_demo env REDIS_URL="redis://127.0.0.1:$port" FLEETGATE_FAILURE_POLICY=local
timed() { # url, key: prints "<status> <seconds>"
  curl -s -o /dev/null --max-time 5 -w '%{http_code} %{time_total}' -H "x-api-key: $2" "$1/api/ping"
}
slow_check() { # "<status> <seconds>", expected status
  local status=${1% *} secs=${1#* }
  if [ "$status" != "$2" ]; then echo "FAIL: got $status, expected $2" >&2; exit 1; fi
  # 50 ms timeout plus a generous margin for a loaded machine.
  if awk -v s="$secs" 'BEGIN { exit !(s > 0.5) }'; then
    echo "FAIL: a request took ${secs}s with Redis down" >&2; exit 1
  fi
}
open_codes="" closed_codes=""
for i in 1 2 3 4 5 6 7 8; do
  r=$(timed "$a" "down-$i"); slow_check "$r" 200; open_codes+="${r% *} "
  r=$(timed "$closed" "down-$i"); slow_check "$r" 503; closed_codes+="${r% *} "
done
echo "redis killed: fail open: $open_codes; fail closed: $closed_codes"
local_codes=""
for expected in 200 200 429 429; do
  r=$(timed "$local_demo" down-local); slow_check "$r" "$expected"; local_codes+="${r% *} "
done
echo "redis killed: local fallback (half of burst 5): $local_codes"

# Redis back on the same port: 429s return by themselves, within a few
# seconds, with nothing restarted but Redis.
start_redis "$port" || { echo "FAIL: could not restart redis on $port" >&2; exit 1; }
# Tries the demo at $1 (30 times, 0.1 s apart, a fresh key each) until it
# enforces the limit through Redis again: five 200s, then a 429. The first
# call after a failed reconnect fails too (and starts the next one). Sets
# back (the attempt that did) and got (its codes).
enforcing_again() { # url, key prefix
  for back in $(seq 30); do
    got=$(codes "$1" 6 "$2-$back")
    if [ "$got" = "200 200 200 200 200 429 " ]; then return 0; fi
    sleep 0.1
  done
  return 1
}
enforcing_again "$a" back || { echo "FAIL: 429s did not return after Redis came back" >&2; exit 1; }
open_back=$back
enforcing_again "$closed" closed-back || { echo "FAIL: the fail-closed demo did not recover" >&2; exit 1; }
echo "redis back: fail-open demo enforcing again (attempt $open_back); fail-closed demo: $got"
# Five 200s: the fleet's burst from Redis, not the local 2.
enforcing_again "$local_demo" local-back ||
  { echo "FAIL: the local-fallback demo did not return to Redis" >&2; exit 1; }
echo "redis back: local-fallback demo decided by Redis again (attempt $back)"
# Redis stopped (SIGSTOP: the connection stays open and nothing answers).
# Failing closed, every limited route answers 503 with Retry-After (the
# critical /api/charge is never shed); each recovers once Redis resumes.
closed_routes() { # url
  local route
  for route in "GET /api/ping" "GET /api/window" "GET /api/slow?ms=0" "GET /api/report?ms=0" "POST /api/charge?ms=0"; do
    printf '%s=%s ' "${route#* }" "$(curl -s -o /dev/null --max-time 5 -X "${route%% *}" \
      -w '%{http_code}/%header{retry-after}' -H "x-api-key: stopped-$RANDOM" "$1${route#* }")"
  done
}
kill -STOP "$rpid"
got=$(closed_routes "$closed")
kill -CONT "$rpid"
echo "redis stopped, fail closed: $got"
if ! [[ "$got" =~ ^/api/ping=503/[1-9][0-9]*\ /api/window=503/[1-9][0-9]*\ /api/slow\?ms=0=503/[1-9][0-9]*\ /api/report\?ms=0=503/[1-9][0-9]*\ /api/charge\?ms=0=200/\ $ ]]; then
  echo "FAIL: expected 503 with Retry-After on every limited route, the charge passing" >&2
  exit 1
fi
enforcing_again "$closed" stop-back || { echo "FAIL: the fail-closed demo did not recover from SIGSTOP" >&2; exit 1; }
got=$(closed_routes "$closed")
echo "redis resumed, fail closed: $got"
case "$got" in
  "/api/ping=200/ /api/window=200/ /api/slow?ms=0=200/ /api/report?ms=0=200/ /api/charge?ms=0=200/ ") ;;
  *) echo "FAIL: every route must answer again once Redis resumes" >&2; exit 1 ;;
esac

leases_held() { # redis port: leases in every lease set (not tombstones)
  local n=0 k c
  for k in $("${REDIS_CLI:-redis-cli}" -p "$1" --scan --pattern '*:lease'); do
    c=$("${REDIS_CLI:-redis-cli}" -p "$1" zcount "$k" '(0' +inf)
    n=$((n + c))
  done
  echo "$n"
}
# Starts two /api/slow?ms=$4 calls keyed $3 on the demo at $1 (pid $2),
# sends it SIGTERM once both are admitted and waits (at most 15 s) for it
# to exit. Sets held (leases in Redis just before the signal), took (ms
# from the signal to the exit), status (its exit status) and calls (the
# two calls' codes).
term_with_two_calls() { # url, pid, key, ms
  local before t1 t2 start_ms
  before=$(slow_admitted "$1")
  slow "$1" "$3" "$4" >"$tmp/$3.1" &
  t1=$!
  slow "$1" "$3" "$4" >"$tmp/$3.2" &
  t2=$!
  wait_admitted "$1" $((before + 2))
  held=$(leases_held "$port")
  start_ms=$(date +%s%3N)
  kill -TERM "$2"
  for _ in $(seq 150); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
  took=$(($(date +%s%3N) - start_ms))
  status=0
  wait "$2" || status=$?
  wait "$t1" "$t2" || true
  calls="$(cat "$tmp/$3.1") $(cat "$tmp/$3.2")"
}

# SIGTERM, as orchestrators send on every deploy: the demo stops
# accepting, lets its two /api/slow calls in flight finish, gives their
# leases back to Redis and exits 0. Instance b then has both slots of
# that key at once.
enforcing_again "$b" b-back || { echo "FAIL: instance b did not return to Redis" >&2; exit 1; }
key="term-$RANDOM"
term_with_two_calls "$a" "$a_pid" "$key" 1500
got="exit=$status calls=$calls"
echo "SIGTERM with two calls in flight: $got"
if [ "$got" != "exit=0 calls=200 200" ]; then
  echo "FAIL: expected the in-flight calls to finish and the demo to exit 0" >&2
  exit 1
fi
check_slow "after SIGTERM, the same key on another instance" "$b" "$b" "$b" "$key $key $key other-$key"

# SIGTERM while two calls outlast the drain (FLEETGATE_DRAIN_SECS=1): the
# demo cuts them off, gives their leases back to Redis and exits 0 within
# the drain and a few seconds; no lease is left in Redis, and instance b
# has both slots of that key at once.
# The releases of the calls above are answered after the exit: let them land.
for _ in $(seq 50); do [ "$(leases_held "$port")" = 0 ] && break; sleep 0.05; done
start_demo cut env REDIS_URL="redis://127.0.0.1:$port" FLEETGATE_DRAIN_SECS=1
cut_pid=$demo_pid cut_log=$demo_log
key="cut-$RANDOM"
term_with_two_calls "$cut" "$cut_pid" "$key" 20000
left=$(leases_held "$port")
echo "SIGTERM with two 20 s calls, drain 1 s: exit=$status after $took ms; leases held before $held, after $left; $(grep -o 'cut off .*' "$cut_log")"
if [ "$status $held $left" != "0 2 0" ] || [ "$took" -gt 9000 ]; then
  echo "FAIL: expected exit 0 within 9 s, and the 2 leases held given back" >&2
  exit 1
fi
grep -q "requests still in flight after 1 s; stopping anyway" "$cut_log" ||
  { echo "FAIL: the demo must say it stopped with requests in flight" >&2; exit 1; }
check_slow "after SIGTERM cut off two calls, the same key on another instance" "$b" "$b" "$b" "$key $key $key other-$key"

# Redis answers reads but refuses writes (demoted to a replica of a port
# where nothing listens: READONLY). Routes charged after the response must
# not turn unlimited: failing closed, the first call's charge fails and
# the calls after it get 503; falling back locally, the local limiter that
# took the charges refuses; /api/login reaches its handler no more than
# its 5 failures allow. Healthy, /api/complete gives 200 200 200 429.
# (Port 1: nothing listens there, nor will, so it never syncs.)
"${REDIS_CLI:-redis-cli}" -p "$port" replicaof 127.0.0.1 1 >/dev/null
count() { grep -o "$1" <<<"$2" | wc -l; }
posts() { # url, key, path, count
  for _ in $(seq "$4"); do
    curl -s -o /dev/null -w '%{http_code} ' -X POST -H "x-api-key: $2" "$1$3"
  done
}
ro_key="read-only-$RANDOM"
got_closed=$(posts "$closed" "$ro_key" "/api/complete?tokens=400" 8)
got_local=$(posts "$local_demo" "$ro_key" "/api/complete?tokens=400" 8)
got_login=$(posts "$closed" "$ro_key" "/api/login?ok=0" 10)
echo "redis read-only: /api/complete x 8 fail closed: $got_closed; local: $got_local; /api/login?ok=0 x 10 fail closed: $got_login"
if [ "$(count 200 "$got_closed")" -gt 3 ] || [ "$(count 503 "$got_closed")" -lt 5 ] ||
  [ "$(count 200 "$got_local")" -gt 3 ] || [ "$(count 429 "$got_local")" -lt 5 ] ||
  [ "$(count 401 "$got_login")" -gt 5 ]; then
  echo "FAIL: a read-only Redis must not lift the limits charged after the response" >&2
  exit 1
fi
"${REDIS_CLI:-redis-cli}" -p "$port" replicaof no one >/dev/null

# A Redis Cluster of 3 masters and 3 replicas (FLEETGATE_REDIS_CLUSTER):
# two demos given different seed nodes share one limit, and say which
# topology they use.
cli_bin="${REDIS_CLI:-redis-cli}"
cluster_nodes=()
while [ "${#cluster_nodes[@]}" -lt 6 ]; do
  # The cluster bus listens on port + 10000.
  port=$((20000 + RANDOM % 25000))
  if start_redis "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
    --cluster-node-timeout 500 --cluster-require-full-coverage no; then
    cluster_nodes+=("127.0.0.1:$port")
  fi
done
"$cli_bin" --cluster create "${cluster_nodes[@]}" --cluster-replicas 1 --cluster-yes >"$tmp/cluster-create.log" 2>&1 ||
  { cat "$tmp/cluster-create.log" >&2; echo "FAIL: redis-cli --cluster create" >&2; exit 1; }
for node in "${cluster_nodes[@]}"; do
  for _ in $(seq 100); do
    "$cli_bin" -p "${node#*:}" cluster info 2>/dev/null | grep -q "cluster_state:ok" && break
    sleep 0.1
  done
  "$cli_bin" -p "${node#*:}" cluster info | grep -q "cluster_state:ok" ||
    { echo "FAIL: cluster node $node never reported cluster_state:ok" >&2; exit 1; }
done
start_demo c1 env FLEETGATE_REDIS_CLUSTER="${cluster_nodes[0]},${cluster_nodes[1]}"
c1_log=$demo_log
start_demo c2 env FLEETGATE_REDIS_CLUSTER="${cluster_nodes[5]}"
got=$(grep -o 'store: redis cluster, [^)]*)' "$c1_log")
echo "cluster demo startup: $got"
case "$got" in
  "store: redis cluster, 2 seed nodes (${cluster_nodes[0]},${cluster_nodes[1]})") ;;
  *) echo "FAIL: the startup line must name the cluster and its seed nodes" >&2; exit 1 ;;
esac
got="" start=$(date +%s%3N)
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) -eq 1 ]; then u=$c1; else u=$c2; fi
  got+=$(codes "$u" 1 smoke-cluster-key)
done
echo "two instances, one redis cluster: $got"
one_budget "$got" "$start" || { echo "FAIL: two instances did not share one limit through the cluster" >&2; exit 1; }
if out=$(env FLEETGATE_SMOKE_RUN=$$ FLEETGATE_REDIS_CLUSTER="${cluster_nodes[0]}" \
  REDIS_URL="redis://${cluster_nodes[0]}" timeout 10 "$demo" 2>&1); then
  echo "FAIL: the demo started with both FLEETGATE_REDIS_CLUSTER and REDIS_URL" >&2; exit 1
fi
echo "refused both FLEETGATE_REDIS_CLUSTER and REDIS_URL: ${out##*Error: }"

# Redis Sentinel: a master and one sentinel watching it; two instances
# that know only the sentinel find the master and share its counts.
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  if start_redis "$port"; then break; fi
done
master_port=$port
sentinel_port=""
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  # Sentinel rewrites its configuration file, which comes first.
  printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %s 1\n' \
    "$port" "$tmp" "$master_port" >"$tmp/sentinel-$port.conf"
  "$redis_bin" "$tmp/sentinel-$port.conf" --sentinel --logfile "$tmp/sentinel-$port.log" &
  spid=$!
  for _ in $(seq 50); do
    if "$cli_bin" -p "$port" sentinel get-master-addr-by-name mymaster 2>/dev/null |
      grep -qx "$master_port"; then
      sentinel_port=$port
      break
    fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$sentinel_port" ]; then pids+=("$spid"); break; fi
  kill "$spid" 2>/dev/null || true
done
[ -n "$sentinel_port" ] || { echo "FAIL: no sentinel started" >&2; exit 1; }
start_demo s1 env FLEETGATE_REDIS_SENTINELS="127.0.0.1:$sentinel_port"
start_demo s2 env FLEETGATE_REDIS_SENTINELS="127.0.0.1:$sentinel_port" FLEETGATE_REDIS_MASTER=mymaster
got=$(grep -o 'store: redis sentinel, [^)]*)' "$demo_log")
echo "sentinel demo startup: $got"
case "$got" in
  "store: redis sentinel, master mymaster named by 1 sentinel (127.0.0.1:$sentinel_port)") ;;
  *) echo "FAIL: the startup line must name the sentinel topology" >&2; exit 1 ;;
esac
# The master is found in the background: wait until each instance
# enforces, then check that they share one count.
enforcing_again "$s1" sentinel-1 && enforcing_again "$s2" sentinel-2 ||
  { echo "FAIL: the sentinel demos never enforced the limit" >&2; exit 1; }
got="" start=$(date +%s%3N)
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) -eq 1 ]; then u=$s1; else u=$s2; fi
  got+=$(codes "$u" 1 smoke-sentinel-key)
done
echo "two instances, one master through sentinel: $got"
one_budget "$got" "$start" || { echo "FAIL: two instances did not share one limit through sentinel" >&2; exit 1; }

# The admin API on two instances sharing a Redis of their own (the others
# above must not see these changes). The plan `pro` of the policy file
# allows ping a burst of 3.
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  if start_redis "$port"; then break; fi
done
sed 's/^ping = "10\/s burst 50"/ping = "1\/min burst 3"/' examples/policies.toml >"$tmp/plans.toml"
grep -q '^ping = "1/min burst 3"' "$tmp/plans.toml" || { echo "FAIL: no [plans.pro] ping in examples/policies.toml" >&2; exit 1; }
admin_env=(env REDIS_URL="redis://127.0.0.1:$port" FLEETGATE_ADMIN_TOKEN="$admin_token"
  FLEETGATE_POLICIES="$tmp/plans.toml" FLEETGATE_FAILURE_POLICY=local:auto)
start_demo ra "${admin_env[@]}"
ra_pid=$demo_pid
start_demo rb "${admin_env[@]}"
got="$(curl -s -o /dev/null -w '%{http_code}' "$rb/admin/instances")"
got+=" $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $admin_token-" "$rb/admin/instances")"
[ "$got" = "401 401" ] || { echo "FAIL: redis /admin without or with a wrong token: $got" >&2; exit 1; }
expect_admin "redis admin, override" 200 "$ra" PUT /overrides/ping/vip '1/min burst 4'
expect_admin "redis admin, plan" 200 "$ra" PUT /plans/pro-user pro
expect_admin "redis admin, unknown plan" 400 "$ra" PUT /plans/pro-user gold
expect_admin "redis admin, unknown policy" 404 "$ra" PUT /policies/nope '1/min'
# The policy change goes last: once instance b enforces it, it has read
# the override and the plan too (each poll reads every change at once).
start_ms=$(date +%s%3N)
expect_admin "redis admin, policy" 200 "$ra" PUT /policies/ping '1/min burst 2'
i=0
until [ "$(codes "$rb" 3 "propagate-$i")" = "200 200 429 " ]; do
  i=$((i + 1))
  if [ $(($(date +%s%3N) - start_ms)) -gt 2000 ]; then
    echo "FAIL: instance b did not enforce the policy changed through a within 2 s" >&2; exit 1
  fi
done
took=$(($(date +%s%3N) - start_ms))
echo "redis admin: ping changed through a, enforced by b after ${took} ms ($i earlier probes)"
if [ "$took" -gt 1000 ]; then echo "FAIL: a change must reach every instance within 1 s" >&2; exit 1; fi
expect_codes "redis admin, override on b" "200 200 200 200 429 " "$rb" 5 vip
expect_codes "redis admin, plan on b" "200 200 200 429 " "$rb" 4 pro-user
expect_codes "redis admin, another key on b" "200 200 429 " "$rb" 3 plain-user
echo "redis admin: override (burst 4), plan pro (burst 3), another key (burst 2) as expected on b"
expect_admin "redis admin, broken text" 400 "$rb" PUT /policies/ping '2/lightyear'
broken=$(cat "$tmp/admin-body")
expect_admin "redis admin" 200 "$ra" GET /policies
grep -q '"ping": "1/min burst 2"' "$tmp/admin-body" ||
  { echo "FAIL: a broken text changed ping: $(cat "$tmp/admin-body")" >&2; exit 1; }
expect_codes "redis admin, after the broken text" "200 200 429 " "$ra" 3 after-broken
echo "redis admin: broken text refused (400: $broken), ping unchanged"
expect_admin "redis admin, reset" 204 "$rb" POST /reset/ping/vip
expect_admin "redis admin, reset everything" 204 "$rb" POST /reset/pro-user
got="$(codes "$rb" 1 vip)$(codes "$rb" 1 pro-user)$(codes "$rb" 1 plain-user)"
echo "redis admin: after resetting vip and pro-user: $got(plain-user not reset)"
[ "$got" = "200 200 429 " ] || { echo "FAIL: a reset must unblock that identity only" >&2; exit 1; }
# The penalty box across the fleet: five failed logins through a block
# the identity for an hour, even for a good login, through b as through
# a; a reset through b lifts it on a within a poll.
login() { # url, key, ok: prints "<status>/<retry-after>"
  curl -s -o /dev/null -w '%{http_code}/%header{retry-after}' -X POST -H "x-api-key: $2" "$1/api/login?ok=$3"
}
got=""
for i in 1 2 3 4 5; do got+="$(login "$ra" lockout 0) "; done
got+="| $(login "$rb" lockout 1) $(login "$ra" lockout 1)"
echo "redis admin: 5 bad logins on a, then good ones on b and a: $got"
case "$got" in
  "401/ 401/ 401/ 401/ 401/ | 429/3"[56][0-9][0-9]" 429/3"[56][0-9][0-9]) ;;
  *) echo "FAIL: five 401s, then blocked on both instances with Retry-After ~3600" >&2; exit 1 ;;
esac
expect_admin "redis admin, reset the lockout" 204 "$rb" POST /reset/login/lockout
start_ms=$(date +%s%3N)
until [ "$(login "$ra" lockout 1)" = "200/" ]; do
  if [ $(($(date +%s%3N) - start_ms)) -gt 2000 ]; then
    echo "FAIL: a reset through b did not lift the block on a within 2 s" >&2; exit 1
  fi
done
echo "redis admin: the reset through b lifted the block on a after $(($(date +%s%3N) - start_ms)) ms"
# Deny and allow lists across the fleet: a deny entry added through b
# refuses that identity with 403 on a within a poll, other identities
# pass, /admin/lists shows it, and a DELETE through b lifts it on a. A
# denied call asks no store, so once its budget is reset (the probes
# before the entry landed spent it) the first call after the lift is 200.
# Polls are bounded: 40 probes 50 ms apart.
ping_code() { # url, api key: prints the status of one /api/ping
  curl -s -o /dev/null -w '%{http_code}' ${2:+-H "x-api-key: $2"} "$1/api/ping"
}
await_code() { # label, expected status, url, api key: probes until it answers that
  # A poll is 250 ms; a loaded machine gets 10 s.
  local i=0 deadline=$(($(date +%s%3N) + 10000))
  while [ "$(date +%s%3N)" -lt "$deadline" ]; do
    i=$((i + 1))
    [ "$(ping_code "$3" "$4")" = "$2" ] && { echo "$i"; return 0; }
    sleep 0.05
  done
  echo "FAIL: $1: /api/ping never answered $2 ($(ping_code "$3" "$4") after $i probes, 10 s)" >&2
  return 1
}
expect_admin "redis admin, lists empty" 200 "$rb" GET /lists
[ "$(tr -d ' \n' <"$tmp/admin-body")" = "[]" ] ||
  { echo "FAIL: /admin/lists before any entry: $(cat "$tmp/admin-body")" >&2; exit 1; }
expect_admin "redis admin, deny" 204 "$rb" PUT /deny/denied-key 10m
start_ms=$(date +%s%3N)
probes=$(await_code "a deny through b, on a" 403 "$ra" denied-key)
echo "redis admin: denied-key denied through b, refused (403) on a after $(($(date +%s%3N) - start_ms)) ms ($probes probes)"
got="$(ping_code "$ra" denied-key) $(ping_code "$rb" denied-key) $(ping_code "$ra" not-denied) $(ping_code "$rb" not-denied-b)"
echo "redis admin: denied-key on a and b, other keys on a and b: $got"
[ "$got" = "403 403 200 200" ] || { echo "FAIL: the deny must refuse denied-key only" >&2; exit 1; }
expect_admin "redis admin, lists" 200 "$ra" GET /lists
grep -q '"list": "deny"' "$tmp/admin-body" && grep -q '"identity": "h:' "$tmp/admin-body" &&
  grep -q '"policy": null' "$tmp/admin-body" && grep -q '"expires": "20[0-9-]*T' "$tmp/admin-body" &&
  [ "$(grep -c '"list"' "$tmp/admin-body")" = 1 ] ||
  { echo "FAIL: /admin/lists on a must show the deny of denied-key for 10m: $(cat "$tmp/admin-body")" >&2; exit 1; }
echo "redis admin: /admin/lists on a: $(tr -d '\n' <"$tmp/admin-body" | tr -s ' ')"
expect_admin "redis admin, reset the denied key" 204 "$rb" POST /reset/denied-key
expect_admin "redis admin, lift the deny" 204 "$rb" DELETE /deny/denied-key
start_ms=$(date +%s%3N)
probes=$(await_code "a deny lifted through b, on a" 200 "$ra" denied-key)
echo "redis admin: the DELETE through b lifted the deny on a after $(($(date +%s%3N) - start_ms)) ms ($probes probes)"
# A network: one no client here comes from shows in the lists; one this
# machine's calls come from (127.0.0.1, keyed by IP without an API key)
# refuses them on ping, and DELETE lifts it.
expect_admin "redis admin, deny-net" 204 "$rb" PUT /deny-net/203.0.113.0%2F24 1h
expect_admin "redis admin, deny-net on ping" 204 "$rb" PUT /deny-net/ping/127.0.0.1
probes=$(await_code "a deny-net through b, on a" 403 "$ra" "")
got="$(ping_code "$ra" "") $(ping_code "$ra" keyed-caller)"
echo "redis admin: 127.0.0.1 denied on ping through b: without and with an API key on a: $got ($probes probes)"
[ "$got" = "403 200" ] || { echo "FAIL: a deny-net must refuse the client IP's key only" >&2; exit 1; }
expect_admin "redis admin, lists with networks" 200 "$ra" GET /lists
grep -q '"network": "203.0.113.0/24"' "$tmp/admin-body" && grep -q '"network": "127.0.0.1/32"' "$tmp/admin-body" &&
  grep -q '"policy": "ping"' "$tmp/admin-body" ||
  { echo "FAIL: /admin/lists must show both networks: $(cat "$tmp/admin-body")" >&2; exit 1; }
expect_admin "redis admin, reset 127.0.0.1" 204 "$rb" POST /reset/ping/127.0.0.1
expect_admin "redis admin, lift the deny-net" 204 "$rb" DELETE /deny-net/ping/127.0.0.1%2F32
probes=$(await_code "a deny-net lifted through b, on a" 200 "$ra" "")
# Hostile input: 400, and the lists as they were.
expect_admin "redis admin, lists before hostile input" 200 "$rb" GET /lists
cp "$tmp/admin-body" "$tmp/lists-before"
expect_admin "redis admin, a /33" 400 "$rb" PUT /deny-net/10.0.0.0%2F33
expect_admin "redis admin, a network's slash as is" 400 "$rb" PUT /deny-net/10.0.0.0/8
expect_admin "redis admin, a newline in an identity" 400 "$rb" PUT /deny/evil%0Akey
expect_admin "redis admin, a newline in an identity" 400 "$rb" DELETE /allow/ping/evil%0D%0Akey
expect_admin "redis admin, not a duration" 400 "$rb" PUT /deny/denied-key 'ten minutes'
expect_admin "redis admin, a zero duration" 400 "$rb" PUT /allow/denied-key 0s
expect_admin "redis admin, unknown policy" 404 "$rb" PUT /allow/nope/denied-key
expect_admin "redis admin, lists after hostile input" 200 "$rb" GET /lists
# Compared line by line, whatever order the entries come in.
[ "$(sort "$tmp/admin-body")" = "$(sort "$tmp/lists-before")" ] ||
  { echo "FAIL: refused list changes changed the lists: $(cat "$tmp/admin-body")" >&2; exit 1; }
echo "redis admin: deny-net on ping lifted; a /33, an unencoded slash, %0A, bad durations: 400; unknown policy: 404; lists unchanged"
# Restart: the change lives in Redis, and a new instance starts with it.
kill -TERM "$ra_pid"
wait "$ra_pid" || true
start_demo ra "${admin_env[@]}"
expect_admin "redis admin, restarted" 200 "$ra" GET /policies
grep -q '"ping": "1/min burst 2"' "$tmp/admin-body" ||
  { echo "FAIL: a restarted instance lost the change: $(cat "$tmp/admin-body")" >&2; exit 1; }
expect_codes "redis admin, restarted instance" "200 200 429 " "$ra" 3 after-restart
expect_admin "redis admin, restarted lists" 200 "$ra" GET /lists
grep -q '"network": "203.0.113.0/24"' "$tmp/admin-body" ||
  { echo "FAIL: a restarted instance lost the deny-net: $(cat "$tmp/admin-body")" >&2; exit 1; }
echo "redis admin: a restarted instance keeps ping = 1/min burst 2 and the deny-net"
for _ in $(seq 40); do
  expect_admin "redis admin, instances" 200 "$rb" GET /instances
  if grep -q "\"address\": \"${ra#http://}\"" "$tmp/admin-body" &&
    grep -q "\"address\": \"${rb#http://}\"" "$tmp/admin-body"; then break; fi
  sleep 0.05
done
grep -q "\"address\": \"${ra#http://}\"" "$tmp/admin-body" ||
  { echo "FAIL: /admin/instances does not list the restarted instance: $(cat "$tmp/admin-body")" >&2; exit 1; }
echo "redis admin: /admin/instances lists both: $(grep -c '"id"' "$tmp/admin-body") entries"

# FLEETGATE_FAILURE_POLICY=local:auto: once instance a's heartbeat counts
# two instances (the stopped one ages out after 3 s), Redis killed, it
# enforces half of ping's burst of 5 on its own.
expect_admin "redis admin, restore" 200 "$ra" DELETE /policies/ping
grep -q "falls back to 1/<instances seen> of each limit" "$demo_log" ||
  { echo "FAIL: the local:auto startup line" >&2; exit 1; }
for _ in $(seq 100); do
  expect_admin "redis admin, instances" 200 "$ra" GET /instances
  [ "$(grep -c '"id"' "$tmp/admin-body")" = 2 ] && break
  sleep 0.1
done
[ "$(grep -c '"id"' "$tmp/admin-body")" = 2 ] ||
  { echo "FAIL: the stopped instance never aged out: $(cat "$tmp/admin-body")" >&2; exit 1; }
{ kill -9 "$rpid" && wait "$rpid"; } 2>/dev/null || true
got=""
for expected in 200 200 429 429; do
  r=$(timed "$ra" auto-down); slow_check "$r" "$expected"; got+="${r% *} "
done
echo "redis killed: local:auto with 2 instances (half of burst 5): $got"

echo "demo smoke test passed"
