"""Splits requests.json into dev.json and test.json: per language, a seeded shuffle, then the
first half (rounded up) to dev and the rest to test. Rerun to check the committed split:
    python3 bench/catalogs/public/split.py && git diff --exit-code bench/catalogs/public
"""
import json
import pathlib
import random

here = pathlib.Path(__file__).parent
rows = json.loads((here / "requests.json").read_text(encoding="utf-8"))
rng = random.Random(20261201)
dev, test = [], []
for lang in ["en", "fr", "de", "es"]:
    group = [r for r in rows if r["lang"] == lang]
    rng.shuffle(group)
    half = (len(group) + 1) // 2
    dev += group[:half]
    test += group[half:]
for name, part in [("dev.json", dev), ("test.json", test)]:
    (here / name).write_text(json.dumps(part, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
