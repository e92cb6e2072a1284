#!/usr/bin/env python3
"""How often a policy answers against its context, split by whether it knows the fact.

Reads `knowrl eval --suite world-scenarios --trajectories` files and prints, per file, for S1
(correct contexts) and S2 (counterfactual ones) on PK-answerable and other items: the share of
answers that are not the context's answer, how many of those are right, and EM. A policy that
weighs the context against what it knows departs more often on PK-answerable items; one that
reacts to the context's wording departs at the same rate on both.

usage: context_departures.py LABEL=TRAJECTORIES.jsonl[.gz] ...
"""
import gzip
import json
import sys


def rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    return [json.loads(line) for line in opener(path, "rt")]


def main(args):
    print("| policy | scenario | items | departs (PK-ans.) | departs (other) | ratio | departures right (PK / other) | EM (PK / other) |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in args:
        label, path = arg.split("=", 1)
        items = rows(path)
        for scenario in ["S1", "S2"]:
            cells = []
            for pk in [True, False]:
                rs = [r for r in items if r["scenario"] == scenario and r["pk_answerable"] == pk]
                off = [r for r in rs if r["answer"] != r["context_answer"]]
                cells.append((len(rs), len(off) / max(1, len(rs)), sum(r["correct"] for r in off),
                              sum(r["correct"] for r in rs) / max(1, len(rs))))
            (n_pk, d_pk, r_pk, em_pk), (n_o, d_o, r_o, em_o) = cells
            ratio = f"{d_pk / d_o:.1f}" if d_o > 0 else "–"
            print(f"| {label} | {scenario} | {n_pk} / {n_o} | {100 * d_pk:.1f} | {100 * d_o:.1f} | {ratio} | "
                  f"{r_pk} / {r_o} | {100 * em_pk:.1f} / {100 * em_o:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
