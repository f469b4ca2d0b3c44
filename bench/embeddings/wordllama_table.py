"""Write WordLlama's static token table in the format src/search/embed.rs reads.

WordLlama (the `wordllama` PyPI package, MIT) is a static embedding model: a text's vector is
the mean of its tokens' vectors, trained that way, so unlike distill.py nothing is distilled:
its table (LLaMA-2's 32,000 BPE pieces, 256 dimensions, float16, inside the wheel) is kept
as it is, cut to its first DIM dimensions (the model is trained so that a prefix of the
dimensions is itself an embedding) and quantised to one byte per component. Nothing is
fetched from a model hub.

Format (as distill.py): b"TGE1", u32 pieces, u32 dim; per piece a u8 byte length, its UTF-8
bytes (lower-cased, "▁" marks a word start) and an f32 log-probability; then pieces x dim i8
components and one f32 scale per piece (value = i8 * scale).

BPE has merges, not probabilities. The gateway cuts a word into pieces by the highest total
log-probability (SentencePiece's unigram rule), so each piece is given log(1 / (id + 10))
less log(log(32000)), Zipf's law by piece id: LLaMA's ids follow its merges, frequent pieces
first. That cut prefers few, frequent pieces, as BPE's does, and the gateway's weight for a
piece, a / (a + p), then counts frequent pieces ("the", "s") less.
"""
import json, math, os, struct, sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

DIM = int(os.environ.get("DIM", "128"))
out_path = sys.argv[1]

# Found, not imported: the package's own imports (torch for training, toml, ...) are not needed.
root = Path(find_spec("wordllama").submodule_search_locations[0])
vocab = json.loads((root / "tokenizers" / "l2_supercat_tokenizer_config.json").read_text())["model"]["vocab"]
table = load_file(str(root / "weights" / "l2_supercat_256.safetensors"))["embedding.weight"]
assert table.shape[0] == len(vocab) and DIM <= table.shape[1], (table.shape, DIM)

# Pieces of letters and digits only (the gateway cuts text into words at anything else),
# lower-cased; of two that lower-case alike, the more frequent (lower id) is kept.
best = {}
for piece, i in vocab.items():
    low = piece.lower()
    body = low[1:] if low.startswith("\u2581") else low
    if body and body.isalnum() and (low not in best or i < best[low]):
        best[low] = i
items = sorted(best.items(), key=lambda kv: kv[1])
h = math.log(math.log(len(vocab)))

rows = table[[i for _, i in items], :DIM].astype(np.float32)
scale = np.abs(rows).max(axis=1) / 127.0
scale[scale == 0] = 1.0
q = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)

with open(out_path, "wb") as f:
    f.write(b"TGE1" + struct.pack("<II", len(items), DIM))
    for low, i in items:
        b = low.encode("utf-8")
        f.write(struct.pack("<B", len(b)) + b + struct.pack("<f", -math.log(i + 10) - h))
    f.write(q.tobytes())
    f.write(scale.astype("<f4").tobytes())
print(f"wrote {out_path}: {len(items)} pieces x {DIM}", file=sys.stderr)
