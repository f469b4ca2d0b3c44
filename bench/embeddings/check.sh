#!/usr/bin/env bash
# Checks the optional embedding table end to end, as a user makes it: setup.sh builds it from
# PyPI, the gateway's reader loads it (the bench uses the same loader as
# `--search-embeddings`), and the search fused with it is no worse than the words alone on the
# public dev split (recall@1 and recall@5), which is what its default weight was chosen on.
#   bench/embeddings/check.sh        (VENV=DIR reuses a virtualenv)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
VENV=${VENV:-$dir/venv} bash "$here/setup.sh" "$dir/wordllama.bin"
dev() { cargo run --quiet --example search_bench -- --dev --quick "$@" | tee -a "$dir/out" | awk '$1 == "dev" { print $3, $4 }'; }
words=$(dev)
fused=$(dev --embeddings "$dir/wordllama.bin")
grep -q "pieces: 24720, dim: 128" "$dir/out" || { cat "$dir/out"; echo "the table did not load as made" >&2; exit 1; }
echo "dev recall@1 recall@5: words alone $words, with the table $fused"
awk -v a="$words" -v b="$fused" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] != "" && y[1] >= x[1] && y[2] >= x[2]) }' ||
  { echo "the table made dev recall worse, or the bench printed no dev line" >&2; exit 1; }
