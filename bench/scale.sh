#!/usr/bin/env bash
# A large pool, from nothing: TOOL_GROUPS tool groups of PER_GROUP tools each and AGENTS agents
# (one group each) generated into a scratch folder, then one `toolgate serve` started on an
# empty database with those folders. Prints how long until /readyz answers 200, the server's
# RSS then (and its peak), how long a client created afterwards waits until its token is
# accepted, and the p50 of one agent's tools/list.
#
# Run: cargo build --release && bash bench/scale.sh
#      TOOL_GROUPS=500 PER_GROUP=20 AGENTS=1000 bash bench/scale.sh     # a smaller pool
# Needs PostgreSQL with trust auth on 127.0.0.1:5432, curl and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
groups=${TOOL_GROUPS:-5000}
per_group=${PER_GROUP:-20}
agents=${AGENTS:-10000}
bin=${TOOLGATE_BIN:-./target/release/toolgate}
db=toolgate_bench_scale_$$
url=postgres://root@127.0.0.1:5432/$db
work=$(mktemp -d)
port=$((20000 + $$ % 20000))
base=http://127.0.0.1:$port
server=""
trap 'cp "$work/server.log" "${SERVER_LOG:-/dev/null}" 2>/dev/null || true; if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; dropdb --if-exists -f -h 127.0.0.1 -U root "$db" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

python3 - "$work" "$groups" "$per_group" "$agents" <<'PY'
import json, os, sys
work, groups, per_group, agents = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for g in range(groups):
    d = os.path.join(work, "tools", f"g{g:05}")
    os.makedirs(d)
    paths = {}
    for o in range(per_group):
        op = f"op{o:02}"
        paths[f"/{op}"] = {"post": {
            "operationId": op,
            "summary": f"Operation {o} of group {g}",
            "description": f"Does thing number {o} for group {g}: a generated tool of the scale benchmark.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"q": {"type": "string", "maxLength": 100}}}}}},
            "responses": {"200": {"description": "ok"}}}}
        path = os.path.join(d, f"{op}.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\ncat\n")
        os.chmod(path, 0o755)
    with open(os.path.join(d, "openapi.json"), "w") as f:
        json.dump({"openapi": "3.1.0", "info": {"title": f"g{g:05}", "version": "1"}, "paths": paths}, f)
for a in range(agents):
    d = os.path.join(work, "policies", "agents", f"agent{a:05}")
    os.makedirs(d)
    with open(os.path.join(d, "agent.md"), "w") as f:
        f.write(f"---\ntools: [g{a % groups:05}]\n---\n")
PY
echo "generated $((groups * per_group)) tools in $groups groups and $agents agents"

ms() { date +%s%3N; }
start=$(ms)
# The listing load below asks for a token per agent from one address: the per-address token
# limit (against secret guessing) is raised for it.
TOOLGATE_LOG=${TOOLGATE_LOG:-warn} "$bin" serve --database-url "$url" --bind "127.0.0.1:$port" --admin-token bench \
  --token-rate-per-ip 10000 --token-burst-per-ip 10000 \
  --tools-dir "$work/tools" --policies-dir "$work/policies" 2>"$work/server.log" &
server=$!
until curl -sf "$base/readyz" >/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then
    cat "$work/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
ready=$(($(ms) - start))
rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$server/status")
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$server/status")
echo "ready after ${ready} ms; RSS ${rss} MB (peak ${hwm} MB)"

# A client created now: how long until its token is accepted. Only curl runs in between (JSON
# fields are cut out with sed), so the interval is the gateway's.
admin=(-H "Authorization: Bearer bench")
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
created=$(ms)
cred=$(curl -sf "${admin[@]}" -X POST "$base/api/v1/agents/agent00000/clients")
answered=$(ms)
id=$(field client_id <<<"$cred")
secret=$(field client_secret <<<"$cred")
token=$(curl -sf -u "$id:$secret" -d grant_type=client_credentials -d "resource=$base/mcp" "$base/oauth/token" | field access_token)
issued=$(ms)
until [[ $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "$base/openapi.json") == 200 ]]; do
  sleep 0.01
done
echo "a new client's token accepted $(($(ms) - created)) ms after the client was created (creation answered in $((answered - created)) ms, token issued after $((issued - created)) ms)"

# One agent's tools/list (it sees one group of $per_group tools), 200 sequential requests.
body='{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'
python3 - "$base/mcp" "$token" "$body" <<'PY'
import statistics, sys, time, urllib.request
url, token, body = sys.argv[1], sys.argv[2], sys.argv[3].encode()
headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
           "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
times = []
for i in range(220):
    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as r:
        r.read()
    if i >= 20:
        times.append((time.perf_counter() - t) * 1000)
times.sort()
print(f"tools/list of one agent: p50 {statistics.median(times):.2f} ms, p99 {times[int(len(times) * 0.99)]:.2f} ms")
PY

# A listing load across many agents: LIST_AGENTS agents (default 1,000, a fifth of the pool's
# groups), each with a client of its own, each listing its tools three times, 4 at once. Then
# the RSS again: what lists leave behind (definitions serialized for them, parsed schemas, the
# sessions and buffers of the requests) shows here.
list_agents=${LIST_AGENTS:-1000}
(( list_agents > agents )) && list_agents=$agents
python3 - "$base" "$list_agents" "$body" <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, n, body = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
def load(a):
    req = urllib.request.Request(f"{base}/api/v1/agents/agent{a:05}/clients", b"", {"Authorization": "Bearer bench"})
    cred = json.load(urllib.request.urlopen(req))
    form = f"grant_type=client_credentials&client_id={cred['client_id']}&client_secret={cred['client_secret']}&resource={base}/mcp".encode()
    token = json.load(urllib.request.urlopen(urllib.request.Request(f"{base}/oauth/token", form)))["access_token"]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    listed = 0
    for _ in range(3):
        with urllib.request.urlopen(urllib.request.Request(f"{base}/mcp", body, headers)) as r:
            listed = len(json.load(r)["result"]["tools"])
    return listed
with ThreadPoolExecutor(4) as pool:
    seen = list(pool.map(load, range(n)))
assert all(seen), "an agent listed no tools"
print(f"listing load: {n} agents listed {sum(seen)} tools in all")
PY
rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$server/status")
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$server/status")
echo "after the listing load: RSS ${rss} MB (peak ${hwm} MB)"
