#!/usr/bin/env bash
# The test command: makes sure redis-server is installed (the Redis tests
# start their own private server on a free loopback port; they never touch
# one already running), then runs the whole suite: unit, integration and doc
# tests. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

redis_bin="${REDIS_SERVER:-redis-server}"
# The cluster tests (cargo feature `cluster`) also need redis-cli, which
# Debian ships in redis-tools, a dependency of redis-server.
cli_bin="${REDIS_CLI:-redis-cli}"
if ! command -v "$redis_bin" >/dev/null 2>&1 || ! command -v "$cli_bin" >/dev/null 2>&1; then
  echo "scripts/test.sh: redis-server or redis-cli not found; installing them" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  fi
  if command -v apt-get >/dev/null 2>&1 \
    && $sudo apt-get update -qq \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; then
    echo "scripts/test.sh: installed $(redis-server --version | cut -d' ' -f1-3)" >&2
  else
    cat >&2 <<'MSG'
scripts/test.sh: could not install redis-server automatically.
Install it yourself, then re-run this script:
  Debian/Ubuntu:  sudo apt-get install -y redis-server
  Fedora/RHEL:    sudo dnf install -y redis
  macOS:          brew install redis
or point REDIS_SERVER at a redis-server binary (version 6.2 or newer) and
REDIS_CLI at the redis-cli beside it.
MSG
    exit 1
  fi
fi

# The scripts need Redis 6.2 or newer (INFO commandstats failed_calls and
# effect replication of scripts that read TIME).
version="$("$redis_bin" --version | sed -n 's/.* v=\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')"
read -r major minor <<<"${version:-0 0}"
if [ "$major" -lt 6 ] || { [ "$major" -eq 6 ] && [ "$minor" -lt 2 ]; }; then
  echo "scripts/test.sh: $("$redis_bin" --version | cut -d' ' -f1-3) is too old; Redis 6.2 or newer is needed" >&2
  echo "(set REDIS_SERVER to the path of a newer redis-server)" >&2
  exit 1
fi
# The TLS tests (feature `tls-rustls`) make their certificates with the
# openssl CLI.
if ! command -v openssl >/dev/null 2>&1; then
  echo "scripts/test.sh: openssl not found; installing it" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  if ! { command -v apt-get >/dev/null 2>&1 \
    && $sudo apt-get update -qq \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }; then
    echo "scripts/test.sh: could not install openssl; install it (Debian: apt-get install openssl) and re-run" >&2
    exit 1
  fi
fi
# A Redis already listening on 6379 (a system service) is left alone: each
# test starts its own server on a free loopback port.

exec cargo test --all-features "$@"
