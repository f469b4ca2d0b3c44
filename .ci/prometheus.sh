#!/usr/bin/env bash
# A real Prometheus (Debian's package) scrapes a running gateway; then one query per metric
# family the gateway exports must answer with data, and every expression of the Grafana
# dashboard (deploy/grafana/toolgate-dashboard.json) must be valid PromQL that Prometheus runs.
#
# Usage: SERVER_URL=http://127.0.0.1:PORT RESULTS=dir bash .ci/prometheus.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${SERVER_URL:?}" "${RESULTS:?}"

if ! command -v prometheus >/dev/null; then
  echo "installing prometheus from the distribution's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
target=${SERVER_URL#http://}
cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: toolgate
    static_configs:
      - targets: ["$target"]
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$port" >"$RESULTS/prometheus.log" 2>&1 &
prom_pid=$!
trap 'kill $prom_pid 2>/dev/null; wait $prom_pid 2>/dev/null; rm -rf "$work"' EXIT
api="http://127.0.0.1:$port/api/v1"

query() { # promql -> number of series in the answer
  curl -fsS --get "$api/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["status"]=="success", d; print(len(d["data"]["result"]))'
}

# Ready when a scrape of the gateway has succeeded twice (rates need two samples).
for _ in $(seq 1 120); do
  if n=$(query 'count_over_time(up{job="toolgate"}[1m]) >= 2 and up{job="toolgate"} == 1' 2>/dev/null) && ((n > 0)); then
    break
  fi
  sleep 0.5
done
n=$(query 'up{job="toolgate"} == 1')
((n == 1)) || { echo "Prometheus never scraped the gateway; its log:" >&2; cat "$RESULTS/prometheus.log" >&2; exit 1; }

fail=0
for family in \
  'mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call"}' \
  'mcp_server_operation_duration_seconds_bucket{mcp_method_name="tools/list"}' \
  'toolgate_calls_by_agent_total' \
  'toolgate_refusals_total{reason="not granted"}' \
  'toolgate_refusals_total{reason="argument rule"}' \
  'toolgate_tool_calls_total' \
  'toolgate_build_info' \
  'process_resident_memory_bytes' \
  'process_cpu_seconds_total' \
  'toolgate_audit_commit_seconds_count' \
  'toolgate_audit_rows_written_total' \
  'toolgate_audit_queue_events' \
  'toolgate_db_pool_connections{state="in_use"}' \
  'toolgate_zero_match_grants' \
  'toolgate_tools_held'; do
  n=$(query "$family")
  if ((n > 0)); then
    echo "ok    $n series  $family"
  else
    echo "EMPTY          $family" >&2
    fail=1
  fi
done

# Every dashboard expression is valid PromQL and runs (an empty answer is fine for a rate
# over a quiet window; an error is not).
python3 - "$api" <<'PY'
import json, sys, urllib.parse, urllib.request
api = sys.argv[1]
dash = json.load(open("deploy/grafana/toolgate-dashboard.json"))
bad = 0
for p in dash["panels"]:
    for t in p["targets"]:
        url = f"{api}/query?" + urllib.parse.urlencode({"query": t["expr"]})
        try:
            d = json.load(urllib.request.urlopen(url, timeout=10))
        except urllib.error.HTTPError as e:
            d = json.load(e)
        if d.get("status") != "success":
            bad += 1
            print(f"BAD panel {p['title']!r}: {d.get('error')}")
        else:
            print(f"ok    panel {p['title']!r}: {len(d['data']['result'])} series")
sys.exit(1 if bad else 0)
PY
exit $fail
