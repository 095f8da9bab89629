#!/usr/bin/env bash
# The demo's dashboard, checked as a person would look at it: starts the
# demo (memory store), sends traffic to /api/ping, /api/slow and
# /api/report, reads /dashboard/events directly (curl) until an event
# counts that traffic, then opens /dashboard in headless Chromium and
# checks that the page shows, for `ping`, exactly the admitted and denied
# counts the traffic got. Saves target/dashboard.png for review.
# Installs Debian's chromium when missing (as scripts/test.sh installs
# redis-server). Waits on conditions with generous bounds: CI runs it on
# a busy 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

browser=""
for candidate in "${CHROMIUM:-}" chromium chromium-browser; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    browser=$candidate
    break
  fi
done
if [ -z "$browser" ]; then
  echo "scripts/dashboard-check.sh: chromium not found; installing it" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  if command -v apt-get >/dev/null 2>&1 \
    && $sudo apt-get update -qq \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
    browser=chromium
  else
    echo "scripts/dashboard-check.sh: could not install chromium (Debian: apt-get install chromium), or set CHROMIUM to a Chromium binary" >&2
    exit 1
  fi
fi

cargo build --quiet --example server
tmp=$(mktemp -d)
demo_pid=""
cleanup() {
  local status=$?
  if [ -n "$demo_pid" ]; then
    kill "$demo_pid" 2>/dev/null || true
    wait "$demo_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT

# The demo on its memory store, whatever this shell has set: no REDIS_URL
# nor any FLEETGATE_* variable (a Redis, API keys, a policy file) reaches
# it, so that the counts are the ones below.
unset_env=(-u REDIS_URL)
while read -r name; do unset_env+=(-u "$name"); done < <(compgen -e | grep '^FLEETGATE_' || true)
env "${unset_env[@]}" FLEETGATE_ADDR=127.0.0.1:0 target/debug/examples/server >"$tmp/demo.log" 2>&1 &
demo_pid=$!
url=""
for _ in $(seq 600); do
  if found=$(grep -o 'listening on http://[0-9.:]*' "$tmp/demo.log" 2>/dev/null); then
    url=${found#listening on }
    break
  fi
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "FAIL: the demo did not start within 60 s:" >&2
  cat "$tmp/demo.log" >&2
  exit 1
fi

# ping: burst 5 then 1/s per client, so some of these are denied; the
# counts sent are what the page must show.
admitted=0 denied=0
for _ in $(seq 12); do
  case $(curl -s -o /dev/null -w '%{http_code}' "$url/api/ping") in
    200) admitted=$((admitted + 1)) ;;
    429) denied=$((denied + 1)) ;;
    *) echo "FAIL: /api/ping answered neither 200 nor 429" >&2; exit 1 ;;
  esac
done
# slow (2 in flight per client) and report (low priority, shed beyond 2 of
# the fleet's 4), a few at once each.
calls=()
for _ in 1 2 3; do
  curl -s -o /dev/null --max-time 60 "$url/api/slow?ms=300" &
  calls+=($!)
  curl -s -o /dev/null --max-time 60 "$url/api/report?ms=300" &
  calls+=($!)
done
for call in "${calls[@]}"; do wait "$call" || true; done
# outbound: an upstream that fails every call, behind a throttle that
# soon refuses most of them locally (503).
throttled=0
for _ in $(seq 10); do
  case $(curl -s -o /dev/null -w '%{http_code}' "$url/api/outbound?fail=1") in
    503) throttled=$((throttled + 1)) ;;
    500) ;;
    *) echo "FAIL: /api/outbound?fail=1 answered neither 500 nor 503" >&2; exit 1 ;;
  esac
done
echo "sent: ping $admitted admitted, $denied denied; 3 slow; 3 reports; 10 outbound, $throttled throttled"

# Events are parsed as JSON (python3), whatever the order of their keys.
events_py() { # python code run with `events`, the complete events of $1 -> its output
  python3 - "$1" "$2" <<'PY'
import json, sys
events = []
with open(sys.argv[1]) as f:
    for line in f:
        if line.startswith("data: ") and line.endswith("\n"):
            try:
                events.append(json.loads(line[6:]))
            except ValueError:
                sys.exit("not JSON: " + line[:200])
exec(sys.argv[2])
PY
}
ping_counts() { # file with events -> "allowed denied" of ping in the last one
  events_py "$1" '
for e in events[-1:]:
    for p in e["policies"]:
        if p["layer"] == "rate_limit" and p["policy"] == "ping":
            print(p["decisions"]["allowed"], p["decisions"]["denied"])'
}

# The events stream itself: one JSON object per event, at least one a
# second; read until one counts every ping sent (60 s at most).
curl -sN --max-time 60 "$url/dashboard/events" >"$tmp/events" &
curl_pid=$!
seen=""
for _ in $(seq 600); do
  seen=$(ping_counts "$tmp/events" || true)
  [ "$seen" = "$admitted $denied" ] && break
  sleep 0.1
done
if [ "$seen" != "$admitted $denied" ]; then
  kill "$curl_pid" 2>/dev/null || true
  echo "FAIL: /dashboard/events never counted ping $admitted $denied (last: ${seen:-none})" >&2
  exit 1
fi
# Three more events must follow within 10 s (one a second, with room).
before=$(grep -c '^data: ' "$tmp/events")
for _ in $(seq 100); do
  [ "$(grep -c '^data: ' "$tmp/events")" -ge $((before + 3)) ] && break
  sleep 0.1
done
kill "$curl_pid" 2>/dev/null || true
wait "$curl_pid" 2>/dev/null || true
events=$(grep -c '^data: ' "$tmp/events")
if [ "$events" -lt $((before + 3)) ]; then
  echo "FAIL: expected an event a second; got $((events - before)) in 10 s" >&2
  exit 1
fi
# Every event has the store and (memory store, no heartbeats) unknown
# instances; slow and fleet are listed; ping lists who it denied.
problems=$(events_py "$tmp/events" '
last = events[-1]
if any("store" not in e or e.get("instances", 0) is not None for e in events):
    print("an event without store, or with instances counted")
names = {p["policy"] for p in last["policies"]}
for name in ("slow", "fleet"):
    if name not in names:
        print("no policy " + name)
ping = [p for p in last["policies"] if p["policy"] == "ping"]
if not ping or not ping[0]["top_denied"] or ping[0]["top_denied"][0]["denials"] < 1:
    print("no identity denied by ping")') || problems="events: $problems"
if [ -n "$problems" ]; then
  echo "FAIL: $problems" >&2
  exit 1
fi
largest=$(awk '/^data: / { if (length($0) > n) n = length($0) } END { print n + 0 }' "$tmp/events")
if [ "$largest" -gt 65536 ]; then
  echo "FAIL: an event of $largest bytes" >&2
  exit 1
fi
echo "events: $events in all, the largest $largest bytes, ping counted"

# The page as rendered: `?events=2` stops its stream after two events, so
# that the headless browser sees the network go quiet and dumps the page.
page="$url/dashboard?events=2"
chrome=("$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars
  --user-data-dir="$tmp/profile" --virtual-time-budget=20000)
timeout 120 "${chrome[@]}" --dump-dom "$page" >"$tmp/page.html" 2>"$tmp/chromium.log" || {
  echo "FAIL: chromium could not render $page:" >&2
  tail -n 20 "$tmp/chromium.log" >&2
  exit 1
}
shown() { # field -> the number the page shows for ping
  grep -oE "id=\"total-rate_limit-ping-$1\">[0-9]+" "$tmp/page.html" | grep -oE '[0-9]+$' || true
}
if ! grep -q 'data-events="2"' "$tmp/page.html"; then
  echo "FAIL: the page did not render two events" >&2
  exit 1
fi
if [ "$(shown allowed) $(shown denied)" != "$admitted $denied" ]; then
  echo "FAIL: the page shows ping $(shown allowed) admitted, $(shown denied) denied; sent $admitted and $denied" >&2
  exit 1
fi
echo "page: ping $(shown allowed) admitted, $(shown denied) denied, as sent"
# /api/adaptive's limit is shown where it is now, with its algorithm.
limit=$(grep -oE 'id="limit-adaptive">[0-9]+ \(gradient2' "$tmp/page.html" || true)
if [ -z "$limit" ]; then
  echo "FAIL: the page does not show the adaptive limit of /api/adaptive" >&2
  exit 1
fi
echo "page: adaptive limit ${limit#*>})"
# The outbound throttle, with the calls it refused locally.
refused=$(grep -oE 'id="throttle-flaky-upstream-refused">[0-9]+' "$tmp/page.html" | grep -oE '[0-9]+$' || true)
if [ "$refused" != "$throttled" ]; then
  echo "FAIL: the page shows ${refused:-no} calls refused by the flaky-upstream throttle; $throttled were" >&2
  exit 1
fi
echo "page: throttle flaky-upstream refused $refused"
mkdir -p target
timeout 120 "${chrome[@]}" --window-size=1200,900 --screenshot="$PWD/target/dashboard.png" "$page" \
  >/dev/null 2>>"$tmp/chromium.log" || {
  echo "FAIL: chromium could not take a screenshot:" >&2
  tail -n 20 "$tmp/chromium.log" >&2
  exit 1
}
echo "dashboard check passed; screenshot: target/dashboard.png"
