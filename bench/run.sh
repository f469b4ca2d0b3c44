#!/usr/bin/env bash
# The whole side-by-side harness, one command: P1–P4 from `cargo bench --bench gateway` (each
# against its reference, in one run) and P6 from bench/scale.sh at three sizes, then one table.
#
# Run: bash bench/run.sh            # release build; about 10 minutes on 2 cores (and, the first
#                                   # time, about 10 more to build the peer, mcp-proxy 0.6.0)
#      bash bench/run.sh --smoke    # debug build, tiny pools, few samples: checks the harness
#                                   # works (CI runs it); its figures mean nothing
# Env: SCALE_GROUPS / SCALE_PER_GROUP / SCALE_AGENTS for the large pool (default 5000 × 20
#      tools, 10,000 agents). Needs PostgreSQL with trust auth on 127.0.0.1:5432 (DATABASE_URL
#      to change the server), curl, python3, node and npm (the P3 upstream).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://root@127.0.0.1:5432/postgres}
smoke=false
[[ ${1:-} == --smoke ]] && smoke=true
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The peer, pinned: mcp-proxy from the Rust package registry, its minimal build (bearer check),
# installed once into a cache and reused. The smoke run uses it only if it is already there
# (building it takes minutes); the full run builds it.
peer_root=${TOOLGATE_PEER_ROOT:-$HOME/.cache/toolgate-peer/mcp-proxy-0.6.0}
if ! $smoke || [[ -x $peer_root/bin/mcp-proxy ]]; then
  cargo install --quiet mcp-proxy --version 0.6.0 --locked --no-default-features --root "$peer_root"
  export TOOLGATE_PEER_BIN=$peer_root/bin/mcp-proxy
fi

if $smoke; then
  cargo build --bin toolgate
  export TOOLGATE_BIN=./target/debug/toolgate
  cargo test --bench gateway -- --smoke | tee "$out/gateway"
  sizes=("small 5 20 10" "one 10 20 1" "large 20 20 100")
else
  cargo build --release --bin toolgate
  export TOOLGATE_BIN=./target/release/toolgate
  cargo bench --bench gateway | tee "$out/gateway"
  sizes=("small 5 20 10" "one 500 20 1"
    "large ${SCALE_GROUPS:-5000} ${SCALE_PER_GROUP:-20} ${SCALE_AGENTS:-10000}")
fi

for size in "${sizes[@]}"; do
  read -r name groups per agents <<<"$size"
  echo "--- P6 $name: $((groups * per)) tools, $agents agents"
  TOOL_GROUPS=$groups PER_GROUP=$per AGENTS=$agents bash bench/scale.sh | tee "$out/scale-$name"
done

# The figures of scale.sh's output, by the words it prints them with.
figure() { # file pattern-before-number
  grep -oE "$2 [0-9.]+" "$1" | head -1 | grep -oE '[0-9.]+$'
}
echo
grep '^| ' "$out/gateway"
for name in small one large; do
  f=$out/scale-$name
  tools=$(grep -oE 'generated [0-9]+ tools' "$f" | grep -oE '[0-9]+')
  agents=$(grep -oE 'groups and [0-9]+ agents' "$f" | grep -oE '[0-9]+ agents' | grep -oE '[0-9]+')
  echo "| P6 first start, $tools tools, $agents agents: ready / RSS / a new client's token accepted | $(figure "$f" 'ready after') ms / $(figure "$f" 'RSS') MB / $(figure "$f" 'accepted') ms | - | - | ready ≤ 10 s, RSS ≤ 150 MB (10,000 tools, 1 agent: ≤ 1 s, ≤ 80 MB), token ≤ 1 s |"
  echo "| P6 the same after a listing load ($(grep -oE 'listing load: [0-9]+ agents' "$f" | grep -oE '[0-9]+') agents, 3 lists each) | RSS $(figure "$f" 'listing load: RSS') MB | - | - | ≤ 150 MB |"
done
small=$(figure "$out/scale-small" 'p50')
large=$(figure "$out/scale-large" 'p50')
echo "| P6 one agent's tools/list p50, large pool vs 100-tool pool | $large ms | $small ms | $(python3 -c "print(f'{$large / $small:.2f}×')") | ≤ 1.2× |"
