#!/usr/bin/env bash
# Legit calls that fail while an outsider sends NUL bytes: for 10 s, 4 clients call a tool and
# list tools while 4 others send NUL-laden token requests (rate-limited after their burst) and
# an agent of our own sends NUL in a tool name and in argument keys and values.
#
# Run: bash bench/audit_nul_flood.sh   (needs PostgreSQL with trust auth on 127.0.0.1:5432,
# curl, and a release build: cargo build --release)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
db=toolgate_bench_nul_$$
url=postgres://root@127.0.0.1:5432/$db
bin=${TOOLGATE_BIN:-./target/release/toolgate}
work=$(mktemp -d)
port=$((20000 + $$ % 20000))
base=http://127.0.0.1:$port
trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null; dropdb --if-exists -f -h 127.0.0.1 -U root "$db" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

mkdir -p "$work/tools/bulk"
printf '#!/bin/sh\ncat\n' >"$work/tools/bulk/echo.sh"
chmod +x "$work/tools/bulk/echo.sh"
cat >"$work/tools/bulk/openapi.json" <<'JSON'
{"openapi": "3.1.0", "info": {"title": "bulk", "version": "1"}, "paths": {"/echo": {"post": {
  "operationId": "echo", "summary": "Echo", "x-toolgate-timeout-ms": 60000,
  "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": true}}}},
  "responses": {"200": {"description": "ok"}}}}}}
JSON
TOOLGATE_LOG=warn $bin serve --database-url "$url" --bind "127.0.0.1:$port" --admin-token bench \
  --tools-dir "$work/tools" --policies-dir /nonexistent --max-concurrency-per-tool 64 2>"$work/server.log" &
server=$!
until curl -sf "$base/readyz" >/dev/null; do sleep 0.2; done

token_for() {
  curl -sf -H 'authorization: Bearer bench' -H 'content-type: application/json' -d "{\"name\": \"$1\"}" "$base/api/v1/agents" >/dev/null
  curl -sf -H 'authorization: Bearer bench' -H 'content-type: application/json' -d '{"target": "bulk"}' "$base/api/v1/agents/$1/grants" >/dev/null
  local c
  c=$(curl -sf -X POST -H 'authorization: Bearer bench' "$base/api/v1/agents/$1/clients")
  curl -sf -u "$(jq -r .client_id <<<"$c"):$(jq -r .client_secret <<<"$c")" -d grant_type=client_credentials "$base/oauth/token" | jq -r .access_token
}
alice=$(token_for alice)
mallory=$(token_for mallory)
mcp=(-H 'content-type: application/json' -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2025-11-25')
end=$((SECONDS + 10))

legit() {
  while ((SECONDS < end)); do
    curl -s -o /dev/null -w '%{http_code}\n' -H "authorization: Bearer $alice" -H 'content-type: application/json' -d '{"n": 1}' "$base/tools/bulk/echo"
    curl -s -w '\n' -H "authorization: Bearer $alice" "${mcp[@]}" -d '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}' "$base/mcp" | grep -q '"tools"' && echo 200 || echo list-failed
  done >>"$work/legit.$1"
}
hostile() {
  while ((SECONDS < end)); do
    curl -s -o /dev/null -d 'grant_type=client_credentials&client_id=a%00b&client_secret=x%00y' "$base/oauth/token"
    curl -s -o /dev/null -H "authorization: Bearer $mallory" "${mcp[@]}" -d '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "bulk__echo\u0000", "arguments": {}}}' "$base/mcp"
    curl -s -o /dev/null -H "authorization: Bearer $mallory" "${mcp[@]}" -d '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "bulk__echo", "arguments": {"k\u0000": "v\u0000"}}}' "$base/mcp"
    echo sent
  done >>"$work/hostile.$1"
}
for i in 1 2 3 4; do legit "$i" & hostile "$i" & done
wait $(jobs -p | grep -v "^$server$")
total=$(cat "$work"/legit.* | wc -l)
failed=$(cat "$work"/legit.* | grep -vc '^200$' || true)
rounds=$(cat "$work"/hostile.* | wc -l)
stored=$(psql -Atq -h 127.0.0.1 -U root -d "$db" -c "SELECT count(*) FROM audit_events WHERE flags IS NOT NULL")
echo "legit requests failed while an outsider sent NUL bytes: $failed of $total (10 s; $rounds hostile rounds of 3 requests; $stored flagged rows stored)"
$bin audit verify --database-url "$url" | sed -n 1p
