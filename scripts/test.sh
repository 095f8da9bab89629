#!/usr/bin/env bash
# The test command: makes sure redis-server is installed (the Redis tests
# start their own private server on a free loopback port; they never touch
# one already running), then runs the whole suite: unit, integration and doc
# tests. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

redis_bin="${REDIS_SERVER:-redis-server}"
if ! command -v "$redis_bin" >/dev/null 2>&1; then
  echo "scripts/test.sh: redis-server not found; installing it" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  fi
  if command -v apt-get >/dev/null 2>&1 \
    && $sudo apt-get update -qq \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; then
    echo "scripts/test.sh: installed $(redis-server --version | cut -d' ' -f1-3)" >&2
  else
    cat >&2 <<'MSG'
scripts/test.sh: could not install redis-server automatically.
Install it yourself, then re-run this script:
  Debian/Ubuntu:  sudo apt-get install -y redis-server
  Fedora/RHEL:    sudo dnf install -y redis
  macOS:          brew install redis
or point REDIS_SERVER at a redis-server binary (version 6.2 or newer).
MSG
    exit 1
  fi
fi

exec cargo test --all-features "$@"
