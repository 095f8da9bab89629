#!/usr/bin/env bash
# Runs the Redis suites (the conformance suites, exactness, leases, the
# deny cache) against Valkey, the open-source fork of Redis, as the test
# harness runs them against redis-server: each test starts its own
# valkey-server on a free loopback port. Installs Valkey from Debian's
# bookworm-backports when it is missing and apt can. Extra arguments go to
# `cargo test`; those after a `--` go to the test binaries, after the
# filters that pick the Redis suites.
set -euo pipefail
cd "$(dirname "$0")/.."

server="${VALKEY_SERVER:-valkey-server}"
if ! command -v "$server" >/dev/null 2>&1; then
  echo "scripts/valkey.sh: $server not found; installing valkey-server" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  installed=false
  if command -v apt-get >/dev/null 2>&1; then
    if ! apt-cache policy valkey-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      . /etc/os-release
      echo "deb http://deb.debian.org/debian ${VERSION_CODENAME:-bookworm}-backports main" |
        $sudo tee /etc/apt/sources.list.d/fleetgate-backports.list >/dev/null
      $sudo apt-get update -qq || true
    fi
    # The package would start a Valkey on 6379 (taken by Redis here):
    # policy-rc.d keeps it from starting any service.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
      $sudo chmod +x /usr/sbin/policy-rc.d
      trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    if $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      valkey-server >/dev/null; then
      installed=true
    fi
  fi
  if ! $installed || ! command -v "$server" >/dev/null 2>&1; then
    echo "scripts/valkey.sh: could not install valkey-server; set VALKEY_SERVER to one" >&2
    exit 1
  fi
fi
echo "scripts/valkey.sh: $("$server" --version | cut -d' ' -f1-3)" >&2
cargo_args=()
test_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    test_args=("$@")
    break
  fi
  cargo_args+=("$1")
  shift
done
# The suites' modules in the `decisions` and `redis` test binaries
# (`conformance` takes `conformance_windows` too).
REDIS_SERVER="$server" exec cargo test --all-features \
  --test decisions --test redis ${cargo_args[@]+"${cargo_args[@]}"} -- \
  conformance exactness:: leases:: deny_cache:: ${test_args[@]+"${test_args[@]}"}
