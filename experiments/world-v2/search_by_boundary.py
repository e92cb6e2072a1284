#!/usr/bin/env python3
"""Search rate and EM by knowledge boundary (min_searches) for agent-suite responses (#23, AKBE).

Asks whether a policy that learns to skip the search skips it where its memory suffices (PK
questions, min_searches 0) before it skips it elsewhere: the discrimination AKBE's efficiency
targets rely on. Usage: search_by_boundary.py assets/world/questions.jsonl RESPONSES.jsonl...
"""
import json
import re
import string
import sys


def norm(s):
    """SQuAD/Search-R1 EM normalisation: lower case, no punctuation, articles or extra spaces."""
    s = "".join(c for c in s.lower() if c not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

questions = {}
for line in open(sys.argv[1]):
    q = json.loads(line)
    if q["split"] == "test":
        questions[q["question"]] = q
print("file | class | n | search rate | mean searches | EM")
for path in sys.argv[2:]:
    rows = [json.loads(l) for l in open(path)]
    by = {}
    for r in rows:
        q = questions[r["question"]]
        cls = "PK (0 needed)" if q["min_searches"] == 0 else f"{min(q['min_searches'], 2)}+ needed"
        searched = len(r["queries"])
        em = norm(r["answer"] or "") in [norm(g) for g in q["golden_answers"]]
        by.setdefault(cls, []).append((searched, em))
    for cls in sorted(by):
        v = by[cls]
        n = len(v)
        print(f"{path.rsplit('/', 1)[-1]} | {cls} | {n} | {sum(s > 0 for s, _ in v) / n:.2f} | "
              f"{sum(s for s, _ in v) / n:.2f} | {sum(e for _, e in v) / n:.2f}")
