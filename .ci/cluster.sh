#!/usr/bin/env bash
# Two `toolgate serve` instances on one fresh database, sharing Redis, behind nginx on one
# public URL (the balancer's), and tests/clients/cluster_test.py through it: both MCP eras,
# propagation of a grant change, a shared rate limit, a replayed client assertion, and one
# instance killed with -9 under load.
#
# Usage (from .ci/run, after `cargo build` and the Python client step, whose venv it reuses):
#   PYTHON=venv/bin/python RESULTS=.ci-results PG_BASE=postgres://root@127.0.0.1:5432 bash .ci/cluster.sh
# Needs ./target/debug/toolgate, PostgreSQL at PG_BASE, Redis on 127.0.0.1:6379 (started here
# if it is installed and not running), nginx (installed from apt if missing).
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:?set PYTHON to the client venv python}
results=${RESULTS:-.ci-results}
pg_base=${PG_BASE:-postgres://root@127.0.0.1:5432}
redis_url=redis://127.0.0.1:6379
bin=./target/debug/toolgate
run=$$
out=$(realpath -m "$results/cluster")
rm -rf "$out"
mkdir -p "$out"
db="toolgate_ci_${run}_cluster"
database_url="$pg_base/$db"
declare -a pids=()

cleanup() {
  local rc=$?
  set +e
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  dropdb --if-exists --force --maintenance-db="$pg_base/postgres" "$db" >/dev/null 2>&1
  exit $rc
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_ready() { # name, url, pid, log
  for _ in $(seq 1 120); do
    if curl -fsS "$2/readyz" >/dev/null 2>&1; then
      echo "$1 ready at $2 (pid $3, log $4)"
      return 0
    fi
    if ! kill -0 "$3" 2>/dev/null; then
      echo "$1 exited before it was ready; its log:" >&2
      cat "$4" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "$1 not ready after 60s; its log:" >&2
  cat "$4" >&2
  return 1
}

# --- what is installed ---------------------------------------------------------------------

if ! command -v nginx >/dev/null; then
  echo "installing nginx"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
fi
if ! redis-cli -u "$redis_url" ping >/dev/null 2>&1; then
  if ! command -v redis-server >/dev/null; then
    echo "installing redis-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
  fi
  echo "starting redis-server on 127.0.0.1:6379"
  redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize no \
    >"$out/redis.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 40); do
    redis-cli -u "$redis_url" ping >/dev/null 2>&1 && break
    sleep 0.25
  done
fi
redis-cli -u "$redis_url" ping >/dev/null

# Features built in parallel with this test: used when the binary has them, reported as SKIP
# by the test when it does not.
help=$("$bin" serve --help)
declare -a shared=()
redis_limits=0
if grep -q -- '--redis-url' <<<"$help"; then
  redis_limits=1
  shared+=(--redis-url "$redis_url")
  prefix_flag=$(grep -oE -- '--redis-[a-z-]*prefix' <<<"$help" | head -n 1 || true)
  if [[ -n $prefix_flag ]]; then
    shared+=("$prefix_flag" "toolgate-ci-$run:")
  fi
fi
# Shared single-use assertion ids live in a table of their own.
shared_replay=0
if grep -qiE 'create table[^(;]*assertion' migrations/*.sql; then
  shared_replay=1
fi
shared_replay=${CLUSTER_SHARED_REPLAY:-$shared_replay}
# A call that waits for approval is held this long: long enough for the test to approve it
# through the other instance while it is held, short enough to keep the step quick.
if grep -q -- '--approval-hold-secs' <<<"$help"; then
  shared+=(--approval-hold-secs 5)
fi
echo "redis rate limits in this binary: $redis_limits; shared assertion ids: $shared_replay"

# --- one database, two instances, one balancer ---------------------------------------------

port_a=$(free_port)
port_b=$(free_port)
port_lb=$(free_port)
public_url="http://127.0.0.1:$port_lb"
admin_token="ci-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"

# `serve` migrates when it must (under an advisory lock), but the schema is the migration
# step's job: neither instance then changes it.
"$bin" migrate --database-url "$database_url"

start() { # name, port
  local log="$out/server-$1.log"
  "$bin" serve --database-url "$database_url" --bind "127.0.0.1:$2" --public-url "$public_url" \
    --admin-token "$admin_token" --tools-dir ./tools --policies-dir ./policies \
    --trusted-proxy 127.0.0.1 --token-rate-per-ip 200 --token-burst-per-ip 2000 "${shared[@]}" >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_ready "instance $1" "http://127.0.0.1:$2" "$pid" "$log"
  eval "pid_$1=$pid"
}
# One after the other: on an empty database the first start loads policies/.
start a "$port_a"
start b "$port_b"

# The proxying is deploy/nginx/proxy.conf, as in compose; only the frame differs: ports here,
# files in $out, one worker (so that round robin alternates request by request), and a
# header naming the upstream that answered, for the test to see where requests went.
mkdir -p "$out/nginx/tmp"
chmod 0777 "$out/nginx/tmp"
cat >"$out/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $out/nginx/nginx.pid;
error_log $out/nginx/error.log info;
events { worker_connections 256; }
http {
  access_log $out/nginx/access.log;
  client_body_temp_path $out/nginx/tmp/body;
  proxy_temp_path $out/nginx/tmp/proxy;
  fastcgi_temp_path $out/nginx/tmp/fastcgi;
  uwsgi_temp_path $out/nginx/tmp/uwsgi;
  scgi_temp_path $out/nginx/tmp/scgi;
  upstream toolgate {
    server 127.0.0.1:$port_a max_fails=1 fail_timeout=5s;
    server 127.0.0.1:$port_b max_fails=1 fail_timeout=5s;
    keepalive 32;
  }
  server {
    listen 127.0.0.1:$port_lb;
    add_header X-Toolgate-Upstream \$upstream_addr always;
    include $(pwd)/deploy/nginx/proxy.conf;
  }
}
EOF
nginx -t -p "$out/nginx" -c "$out/nginx/nginx.conf" -e "$out/nginx/error.log"
nginx -p "$out/nginx" -c "$out/nginx/nginx.conf" -e "$out/nginx/error.log" &
pids+=($!)
wait_ready "nginx" "$public_url" "$!" "$out/nginx/error.log"

"$python" tests/clients/cluster_test.py \
  --lb-url "$public_url" --a-url "http://127.0.0.1:$port_a" --b-url "http://127.0.0.1:$port_b" \
  --admin-token "$admin_token" --database-url "$database_url" --toolgate "$bin" \
  --kill-pid "$pid_b" --redis-limits "$redis_limits" --shared-replay "$shared_replay"
