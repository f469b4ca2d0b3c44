#!/usr/bin/env bash
# RSS growth of `toolgate serve` while 12 outsiders, each from its own loopback address,
# send wrong client secrets for 5 s (each guessing a different real client id, as fast as
# answers come). Prints the server's RSS before, its peak (VmHWM) and after, and the answers.
#
# Run: bash bench/wrong_secrets.sh [path/to/toolgate]   (default ./target/release/toolgate;
# needs PostgreSQL with trust auth on 127.0.0.1:5432 and python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:-./target/release/toolgate}
outsiders=${OUTSIDERS:-12}
seconds=${SECONDS_OF_LOAD:-5}
port=${PORT:-18787}
db=toolgate_bench_secrets_$$
url=postgres://root@127.0.0.1:5432/$db
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  dropdb --if-exists -h 127.0.0.1 -U root "$db" >/dev/null 2>&1 || true
}
trap cleanup EXIT
$bin migrate --database-url "$url" >/dev/null 2>&1
$bin policy apply --database-url "$url" --dir policies --tools-dir tools >/dev/null
ids=()
for _ in $(seq "$outsiders"); do
  ids+=("$($bin client create --database-url "$url" --agent assistant | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')")
done
$bin serve --database-url "$url" --bind "127.0.0.1:$port" --tools-dir tools --policies-dir policies >/dev/null 2>&1 &
server=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done
python3 - "$server" "$port" "$seconds" "${ids[@]}" <<'PY'
import base64, collections, http.client, sys, threading, time

pid, port, seconds, ids = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]

def status(field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])

answers = collections.Counter()
lock = threading.Lock()

def outsider(i, client_id):
    conn = http.client.HTTPConnection("127.0.0.1", port, source_address=(f"127.0.9.{i + 2}", 0))
    auth = base64.b64encode(f"{client_id}:tgs_wrong".encode()).decode()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            conn.request("POST", "/oauth/token", "grant_type=client_credentials",
                         {"Authorization": f"Basic {auth}",
                          "Content-Type": "application/x-www-form-urlencoded"})
            r = conn.getresponse()
            r.read()
            code = r.status
        except Exception as e:
            code = type(e).__name__
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, source_address=(f"127.0.9.{i + 2}", 0))
        with lock:
            answers[code] += 1

# Peak RSS counts from here: writing 5 to clear_refs resets VmHWM.
with open(f"/proc/{pid}/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
threads = [threading.Thread(target=outsider, args=(i, c)) for i, c in enumerate(ids)]
for t in threads: t.start()
for t in threads: t.join()
peak, after = status("VmHWM:"), status("VmRSS:")
print(f"{len(ids)} outsiders x {seconds:.0f} s: answers {dict(answers)}")
print(f"RSS before {before / 1024:.1f} MB, peak {peak / 1024:.1f} MB, after {after / 1024:.1f} MB; "
      f"growth {(peak - before) / 1024:.1f} MB (peak - before)")
PY
