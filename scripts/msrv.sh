#!/usr/bin/env bash
# Checks that Cargo.toml's rust-version is true for the committed
# Cargo.lock: no crate the library builds (every feature on) declares a
# newer rust-version. Only one toolchain can be installed here, so this
# reads the locked crates' own manifests; clippy's incompatible_msrv lint
# (denied in CI) checks our own use of std against the same version.
set -euo pipefail
cd "$(dirname "$0")/.."

declared=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
cargo fetch --locked --quiet
newest=$(cargo metadata --locked --format-version 1 --all-features | python3 -c '
import json, sys
meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]
seen, todo = set(), [root]
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        # Normal and build dependencies: what a user of the library builds.
        if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
            seen.add(dep["pkg"])
            todo.append(dep["pkg"])
key = lambda v: tuple(int(x) for x in v.split("."))
found = [(packages[i]["rust_version"], packages[i]["name"]) for i in seen if packages[i].get("rust_version")]
version, name = max(found, key=lambda f: key(f[0]))
print(version, name)
')
read -r needed by <<<"$newest"
older() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ] && [ "$1" != "$2" ]; }
if older "$declared" "$needed"; then
  echo "FAIL: Cargo.toml says rust-version $declared, but $by in Cargo.lock needs $needed" >&2
  exit 1
fi
echo "rust-version $declared: the locked dependencies need at most $needed ($by)"
