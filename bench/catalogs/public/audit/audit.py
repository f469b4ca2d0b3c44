"""A blind audit of the held-out labels: are the ranker's misses real, or are labels too narrow?

  python3 bench/catalogs/public/audit/audit.py pairs OUT   # needs a release search_bench
  python3 bench/catalogs/public/audit/audit.py summary     # the table, from judgments.json

`pairs`: for every `fresh4` and `fresh5` request whose first result (`search_bench --explain`)
is not labelled relevant, three pairs: the request with that first result ("top1-miss"), with
one of its labelled tools ("labelled"), and with a random tool of the first result's group that
is neither labelled nor in the first ten ("random-same-group"). They are shuffled and written
to OUT/pairs.json with only what an assessor sees (request, tool name, description, parameter
names) and to OUT/key.json with each pair's kind. Assessors answer, for each pair alone, "would
calling this tool accomplish the request?"; `judgments.json` holds the 617 pairs of 2026-12-03
with their kind and the answer (two assessors, half each).
"""
import json
import os
import random
import subprocess
import sys
from collections import Counter

here = os.path.dirname(os.path.abspath(__file__))
public = os.path.join(here, "..")
bench = os.path.join(here, "..", "..", "..", "..", "target", "release", "examples", "search_bench")
SETS = ("fresh4", "fresh5")


def pairs(out_dir):
    tools = {t["name"]: t for t in json.load(open(os.path.join(public, "tools.json")))}
    random.seed(7)
    made = []
    for name in SETS:
        for qi, r in enumerate(json.load(open(os.path.join(public, name + ".json")))):
            out = subprocess.run([bench, "--explain", r["query"]], capture_output=True, text=True, check=True).stdout
            ranked = [line.split()[2] for line in out.splitlines()[1:] if line.strip()]
            relevant = set(r["relevant"])
            if not ranked or ranked[0] in relevant:
                continue
            made.append((name, qi, r["query"], ranked[0], "top1-miss"))
            made.append((name, qi, r["query"], random.choice(sorted(relevant)), "labelled"))
            group = ranked[0].split("__")[0]
            others = [n for n in tools if n.split("__")[0] == group and n not in relevant and n not in ranked[:10]]
            if others:
                made.append((name, qi, r["query"], random.choice(others), "random-same-group"))
    random.shuffle(made)
    items, key = [], {}
    for i, (name, qi, query, tool, kind) in enumerate(made):
        t = tools[tool]
        params = sorted((t.get("inputSchema") or {}).get("properties", {}).keys())
        items.append({"id": i, "request": query, "tool": tool, "description": (t.get("description") or "")[:1200], "parameters": params})
        key[i] = {"set": name, "q": qi, "kind": kind}
    os.makedirs(out_dir, exist_ok=True)
    json.dump(items, open(os.path.join(out_dir, "pairs.json"), "w"), ensure_ascii=False, indent=1)
    json.dump(key, open(os.path.join(out_dir, "key.json"), "w"))
    print(len(items), dict(Counter(v["kind"] for v in key.values())))


def summary():
    judged = json.load(open(os.path.join(here, "judgments.json")))
    for kind in ("labelled", "top1-miss", "random-same-group"):
        these = [j for j in judged if j["kind"] == kind]
        yes = sum(j["judged"] == "yes" for j in these)
        print(f"{kind:18} judged yes {yes:3} of {len(these):3} ({100 * yes / len(these):.1f} %)")
    for name in SETS:
        n = len(json.load(open(os.path.join(public, name + ".json"))))
        misses = [j for j in judged if j["set"] == name and j["kind"] == "top1-miss"]
        yes = sum(j["judged"] == "yes" for j in misses)
        print(f"{name}: recall@1 {(n - len(misses)) / n:.3f}, counting accepted first results {(n - len(misses) + yes) / n:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["pairs"] and len(sys.argv) == 3:
        pairs(sys.argv[2])
    elif sys.argv[1:] == ["summary"]:
        summary()
    else:
        sys.exit(__doc__)
