#!/usr/bin/env bash
# Checks that every PromQL query of dashboards/grafana.json (panels and
# variables) parses, with Prometheus' own parser: promtool, from Debian's
# `prometheus` package, installed when missing and apt can. Which metrics
# and labels the queries may read is checked by
# tests/observability/dashboard.rs; this checks their syntax.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
rules="$(mktemp --suffix=.yml)"
policy_rc=""
cleanup() {
  rm -f "$rules"
  if [ -n "$policy_rc" ]; then $sudo rm -f "$policy_rc"; fi
}
trap cleanup EXIT

if ! command -v promtool >/dev/null 2>&1; then
  echo "scripts/dashboard-promql.sh: promtool not found; installing prometheus" >&2
  # Only its promtool is wanted: policy-rc.d keeps the package from
  # starting a Prometheus server.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    policy_rc=/usr/sbin/policy-rc.d
  fi
  if ! { command -v apt-get >/dev/null 2>&1 &&
    $sudo apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null; }; then
    echo "scripts/dashboard-promql.sh: could not install prometheus (for promtool);" \
      "install it and re-run" >&2
    exit 1
  fi
fi

# Each query becomes a recording rule (JSON is YAML), with Grafana's
# variables replaced as Grafana would: the rate interval by a duration,
# the others (used in regex matchers only) by "match all".
python3 - dashboards/grafana.json >"$rules" <<'PY'
import json, re, sys

dashboard = json.load(open(sys.argv[1]))
queries = []
for panel in dashboard["panels"]:
    for target in panel.get("targets", []):
        queries.append((f"panel_{panel['id']}_{target['refId']}", target["expr"]))
for var in dashboard["templating"]["list"]:
    if var["type"] == "query":
        # label_values(selector, label): the selector is the query.
        query = var["query"]
        selector = re.fullmatch(r"label_values\((.*), *\w+\)", query, re.S)
        if not selector:
            sys.exit(f"${var['name']}: not label_values(selector, label): {query}")
        queries.append((f"variable_{var['name']}", selector.group(1)))

def grafana(expr):
    expr = expr.replace("$__rate_interval", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)

rules = [{"record": f"fleetgate:dashboard:{name}", "expr": grafana(expr)} for name, expr in queries]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, sys.stdout, indent=1)
PY
promtool check rules "$rules"
