#!/usr/bin/env bash
# Installs the peers benches/decisions.rs measures beside Limiter::check,
# into target/peers (never into the repository, never globally):
# node rate-limiter-flexible 11 with ioredis 5 (target/peers/node), and
# Python `limits` with redis-py in a virtualenv (target/peers/py). Each is
# skipped, with the reason printed, where its runtime or registry is not
# reachable; the bench then skips it too and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=target/peers
mkdir -p "$dir"

if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
  if [ ! -d "$dir/node/node_modules/rate-limiter-flexible" ]; then
    mkdir -p "$dir/node"
    npm install --no-audit --no-fund --prefix "$dir/node" \
      'rate-limiter-flexible@^11' 'ioredis@^5' >"$dir/npm.log" 2>&1 ||
      echo "scripts/peers-install.sh: npm install failed (see $dir/npm.log); rate-limiter-flexible skipped" >&2
  fi
else
  echo "scripts/peers-install.sh: node/npm not found; rate-limiter-flexible skipped" >&2
fi

if command -v python3 >/dev/null 2>&1; then
  if [ ! -x "$dir/py/bin/python" ] || ! "$dir/py/bin/python" -c 'import limits, redis' 2>/dev/null; then
    { python3 -m venv "$dir/py" && "$dir/py/bin/pip" install -q 'limits[redis]>=5,<6'; } \
      >"$dir/pip.log" 2>&1 ||
      echo "scripts/peers-install.sh: pip install failed (see $dir/pip.log); Python limits skipped" >&2
  fi
else
  echo "scripts/peers-install.sh: python3 not found; Python limits skipped" >&2
fi
