#!/usr/bin/env bash
# The dashboard over a million audit rows: fills a fresh database with 1,000,000 tool-call
# rows spread over the last five days (20 agents, 100 tools, 2 % failures), lets the rollup
# follower of a running `toolgate serve` catch up, then times GET /admin?range=hour|day|week
# (signed in), each several times, against GET /healthz in the same run as the reference.
#
# Usage: bash bench/dashboard_million.sh   (needs Postgres on 127.0.0.1:5432, a built binary)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${BIN:-./target/release/toolgate}
[[ -x $bin ]] || bin=./target/debug/toolgate
db=toolgate_bench_million
base=postgres://${PGUSER:-root}@127.0.0.1:5432
port=18777
dropdb -h 127.0.0.1 --if-exists "$db" >/dev/null 2>&1 || true
createdb -h 127.0.0.1 "$db"
"$bin" migrate --database-url "$base/$db" >/dev/null
start=$(date -u -d '-5 days' +%Y-%m-%dT%H:%M:%SZ)
psql -q -h 127.0.0.1 -d "$db" -v ON_ERROR_STOP=1 <<SQL
DO \$\$ DECLARE m date; BEGIN
  FOR m IN SELECT generate_series(date_trunc('month', '$start'::timestamptz), now(), interval '1 month')::date LOOP
    EXECUTE format('CREATE TABLE IF NOT EXISTS audit_events_y%sm%s PARTITION OF audit_events FOR VALUES FROM (%L) TO (%L)',
      to_char(m, 'YYYY'), to_char(m, 'MM'), m, (m + interval '1 month')::date);
  END LOOP;
END \$\$;
INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome, agent, tool, latency_us)
SELECT '$start'::timestamptz + (i * interval '432 milliseconds'), 'bench', i, '', '', 'bench', 'tool.result',
       CASE WHEN i % 50 = 0 THEN 'tool_error' ELSE 'success' END,
       'agent' || (i % 20), 'g__t' || (i % 100), (i % 997) * 150
FROM generate_series(1, 1000000) i;
SQL
echo "audit rows: $(psql -tA -h 127.0.0.1 -d "$db" -c 'SELECT count(*) FROM audit_events')"
token=bench-admin-token-0123456789abcdef
"$bin" serve --database-url "$base/$db" --bind 127.0.0.1:$port --tools-dir ./tools --policies-dir ./policies \
  --admin-token $token >/tmp/bench-million.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
until curl -fsS http://127.0.0.1:$port/readyz >/dev/null 2>&1; do sleep 0.5; done
echo bench-password-123 | "$bin" user create --url http://127.0.0.1:$port --admin-token $token --role admin bench >/dev/null
t0=$(date +%s)
until [[ $(psql -tA -h 127.0.0.1 -d "$db" -c "SELECT count(*) FROM audit_sink_cursors WHERE sink = 'internal:rollup' AND delivered >= 1000000") == 1 ]]; do sleep 1; done
echo "rollups caught up with 1,000,000 rows in $(( $(date +%s) - t0 )) s; rollup rows: $(psql -tA -h 127.0.0.1 -d "$db" -c 'SELECT count(*) FROM audit_rollup_totals')"
python3 - "$port" <<'PY'
import http.cookiejar, re, statistics, sys, time, urllib.parse, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
jar = http.cookiejar.CookieJar()
op = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
page = op.open(base + "/admin/login").read().decode()
csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
op.open(base + "/admin/login", urllib.parse.urlencode({"csrf": csrf, "username": "bench", "password": "bench-password-123"}).encode())
def timed(path, n=15):
    xs = []
    for _ in range(n):
        t = time.perf_counter(); body = op.open(base + path).read(); xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs), max(xs), body
ref, _, _ = timed("/healthz")
for r in ["hour", "day", "week"]:
    med, worst, body = timed(f"/admin?range={r}")
    total = re.search(rb'data-chart="calls" data-total="(\d+)"', body)
    print(f"GET /admin?range={r}: median {med:.1f} ms, worst {worst:.1f} ms (calls charted: {total.group(1).decode() if total else '?'}); /healthz {ref:.2f} ms")
PY
