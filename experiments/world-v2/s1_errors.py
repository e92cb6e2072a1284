"""What a Knowledgeable-R1 checkpoint answers where it fails S1 (the context is correct).

Reads the `<name>.responses.jsonl` files `by_step.sh` writes (one row per scenario item) and
sorts each wrong S1 answer into: no answer; another entity of the world (the gold or context
answer of some item: a name the policy knows), with how many training S2 contexts assert it as
their counterfactual object; or a name the world does not have (a
copying error: pieces of the question's names or of the gold glued together).
Usage: python3 experiments/world-v2/s1_errors.py assets/world FILE.responses.jsonl...
"""
import collections
import json
import sys

world, files = sys.argv[1], sys.argv[2:]
entities, s2_train_ctx = set(), collections.Counter()
for line in open(f"{world}/scenarios.jsonl"):
    r = json.loads(line)
    entities.update(r["golden_answers"])
    if r.get("context_answer"):
        entities.add(r["context_answer"])
        if r["split"] == "train" and r["scenario"] == "S2":
            s2_train_ctx[r["context_answer"]] += 1

typical = sorted(s2_train_ctx.values())[len(s2_train_ctx) // 2]
print(f"train S2 contexts asserting a counterfactual object: median {typical} per object")
print("| file | S1 EM | wrong | PK-answerable wrong | no answer | a world entity | its train S2 contexts (each) | not a world name |")
print("|---|---|---|---|---|---|---|---|")
for f in files:
    rows = [json.loads(l) for l in open(f) if json.loads(l)["scenario"] == "S1"]
    wrong = [r for r in rows if not r["correct"]]
    kinds = collections.defaultdict(int)
    for r in wrong:
        a = r["answer"].strip()
        if not a:
            kinds["none"] += 1
        elif a in entities:
            kinds["entity"] += 1
            kinds["s2cf"] = kinds.get("s2cf", []) + [s2_train_ctx[a]]
        else:
            kinds["new"] += 1
    em = 100 * (len(rows) - len(wrong)) / len(rows)
    pk = sum(r["pk_answerable"] for r in wrong)
    asserted = ", ".join(map(str, sorted(kinds.get("s2cf", []))))
    name = f.rsplit("/", 1)[-1].replace(".responses.jsonl", "")
    print(f"| {name} | {em:.1f} | {len(wrong)} | {pk} | {kinds['none']} | {kinds['entity']} | {asserted} | {kinds['new']} |")
