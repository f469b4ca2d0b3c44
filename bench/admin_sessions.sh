#!/usr/bin/env bash
# Latency of a signed-in admin page (the session check on every request): signs in once, then
# 1,000 sequential GET /admin/limits over one keep-alive connection; prints the status codes
# and p50/p99 as curl measures them. Run it against two builds to compare the session check.
#
# Run: bash bench/admin_sessions.sh [path/to/toolgate]   (default ./target/debug/toolgate;
# needs PostgreSQL with trust auth on 127.0.0.1:5432 and curl)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:-./target/debug/toolgate}
port=${PORT:-18797}
db=toolgate_bench_sessions_$$
url=postgres://root@127.0.0.1:5432/$db
work=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  dropdb --if-exists -h 127.0.0.1 -U root "$db" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
for v in $(env | grep -o '^TOOLGATE_[A-Z_]*' || true); do unset "$v"; done
"$bin" serve --database-url "$url" --bind "127.0.0.1:$port" --tools-dir tools --policies-dir policies \
  >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.25; done
password='a long bench password here'
echo "$password" | "$bin" admin create-user --database-url "$url" --username bench --role admin >/dev/null
jar=$work/jar
csrf=$(curl -s -c "$jar" -b "$jar" "http://127.0.0.1:$port/admin/login" \
  | grep -o 'name="csrf" value="[^"]*"' | sed 's/.*value="//;s/"//')
curl -s -o /dev/null -c "$jar" -b "$jar" --data-urlencode "csrf=$csrf" --data-urlencode username=bench \
  --data-urlencode "password=$password" --data-urlencode next=/admin "http://127.0.0.1:$port/admin/login"
for _ in $(seq 1 1000); do
  echo "url = \"http://127.0.0.1:$port/admin/limits\""
  echo "output = /dev/null"
done >"$work/curl.cfg"
curl -s -b "$jar" -K "$work/curl.cfg" -w '%{http_code} %{time_total}\n' >"$work/times"
echo "status codes: $(cut -d' ' -f1 "$work/times" | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
sort -n -k2 "$work/times" | awk '{t[NR]=$2} END {printf "p50 %.2f ms, p99 %.2f ms over %d requests\n", t[int(NR*0.5)]*1000, t[int(NR*0.99)]*1000, NR}'
