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

FLEETGATE_ADDR=127.0.0.1:0 target/debug/examples/server >"$tmp/demo.log" 2>&1 &
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
echo "sent: ping $admitted admitted, $denied denied; 3 slow; 3 reports"

# The ping entry of an event: serde_json writes keys in order, so the
# decisions come first and the policy's name last.
ping_counts() { # file with events -> "allowed denied" of the last one
  grep -oE '"decisions":\{"allowed":[0-9]+,"denied":[0-9]+,[^}]*\},"layer":"rate_limit","leases_in_use":null,"near_limit":[0-9]+,"per_second":\{[^}]*\},"point":\[[^]]*\],"policy":"ping"' "$1" \
    | tail -n 1 | sed -E 's/^"decisions":\{"allowed":([0-9]+),"denied":([0-9]+),.*/\1 \2/'
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
for field in '"store":' '"instances":1' '"policy":"slow"' '"policy":"fleet"' '"top_denied":[{"denials":'; do
  if ! grep -qF "$field" "$tmp/events"; then
    echo "FAIL: no $field in the events" >&2
    exit 1
  fi
done
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
mkdir -p target
timeout 120 "${chrome[@]}" --window-size=1200,900 --screenshot="$PWD/target/dashboard.png" "$page" \
  >/dev/null 2>>"$tmp/chromium.log" || {
  echo "FAIL: chromium could not take a screenshot:" >&2
  tail -n 20 "$tmp/chromium.log" >&2
  exit 1
}
echo "dashboard check passed; screenshot: target/dashboard.png"
