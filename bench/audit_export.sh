#!/usr/bin/env bash
# Peak memory of `toolgate audit export` over 100k and 1M generated audit rows: the export
# streams, so its peak RSS should not grow with the number of rows.
#
# Run: bash bench/audit_export.sh   (needs PostgreSQL with trust auth on 127.0.0.1:5432,
# /usr/bin/time, and a release build: cargo build --release)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
db=toolgate_bench_export_$$
url=postgres://root@127.0.0.1:5432/$db
bin=./target/release/toolgate
trap 'dropdb --if-exists -h 127.0.0.1 -U root "$db" >/dev/null 2>&1 || true' EXIT
$bin migrate --database-url "$url" >/dev/null

for rows in 100000 1000000; do
  psql -q -h 127.0.0.1 -U root -d "$db" -c "CREATE TABLE IF NOT EXISTS audit_events_y2026m11 PARTITION OF audit_events FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')"
  psql -q -h 127.0.0.1 -U root -d "$db" -c "INSERT INTO audit_events (at, chain, chain_seq, prev_hash, hash, instance, event_type, outcome, agent, client_id, jti, tool, resource, remote_addr, user_agent, request_id, call_id, latency_us, bytes_in, bytes_out, arguments, result_sha256, details)
    SELECT timestamptz '2026-11-15' + make_interval(secs => g / 1000.0), 'bench', g, md5(g::text) || md5(g::text), md5((g+1)::text) || md5(g::text),
       'bench:1', 'tool.result', 'success', 'meteo', 'tgc_bench', gen_random_uuid()::text, 'weather__current', 'tool:weather__current',
       '127.0.0.1', 'bench/1.0', gen_random_uuid()::text, gen_random_uuid()::text, 1200 + g % 500, 18, 240,
       '{\"city\":\"Paris\",\"units\":\"metric\"}', md5(g::text) || md5(g::text), '{\"surface\":\"mcp\"}'
    FROM generate_series((SELECT coalesce(max(chain_seq), 0) + 1 FROM audit_events), $rows) g"
  for format in jsonl csv; do
    bytes=$(/usr/bin/time -f '%M %e' -o "/tmp/toolgate-export-time.$$" $bin audit export --database-url "$url" --format $format | wc -c)
    read -r rss secs <"/tmp/toolgate-export-time.$$"
    printf '%8d rows  %-5s  %10d bytes  %6.1f s  peak RSS %6d KiB\n' "$rows" "$format" "$bytes" "$secs" "$rss"
  done
done
