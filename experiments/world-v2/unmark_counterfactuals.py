#!/usr/bin/env python3
"""A copy of a world whose scenario contexts state counterfactuals without their made-up source.

The world's counterfactual passages cite a dubious source ("A made-up almanac says X was born in
Y."), as the Knowledgeable-R1 paper describes ConFiQA's wrong contexts. A policy can then learn to
distrust the source's wording instead of weighing the context against what it knows. This copy
rewrites every such passage in `scenarios.jsonl` (S2, S5 and the S2-mc chains) the way a correct
passage reads: the entity's intro sentence from its encyclopedia passage, then the claim
("Y is a city. X was born in Y." style). Everything else is linked, not copied.

usage: unmark_counterfactuals.py WORLD OUT
"""
import json
import os
import sys

# crates/world/src/corpus.rs SOURCES, longest first so "…," variants strip whole.
SOURCES = [
    "A self-published travel blog claims that",
    "An unverified forum post states that",
    "A satirical newsletter reported that",
    "According to an anonymous pamphlet,",
    "According to a fan wiki",
    "A made-up almanac says",
]


def intros(world):
    """title -> first sentence of the entity's encyclopedia passage."""
    out = {}
    for line in open(os.path.join(world, "passages.jsonl")):
        p = json.loads(line)
        if p["kind"] != "encyclopedia":
            continue
        title, body = p["contents"].split("\n", 1)
        out[title] = body.split(". ", 1)[0].rstrip(".") + "."
    return out


def unmark(passage, intro_of):
    title, body = passage.split("\n", 1)
    for s in SOURCES:
        if body.startswith(s + " "):
            claim = body[len(s) + 1 :]
            return f"{title}\n{intro_of[title]} {claim}", True
    return passage, False


def main(world, out):
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(world):
        if name != "scenarios.jsonl" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.abspath(os.path.join(world, name)), os.path.join(out, name))
    intro_of = intros(world)
    changed = total = 0
    with open(os.path.join(out, "scenarios.jsonl"), "w") as f:
        for line in open(os.path.join(world, "scenarios.jsonl")):
            item = json.loads(line)
            ctx = []
            for p in item.get("context") or []:
                q, did = unmark(p, intro_of)
                changed += did
                total += 1
                ctx.append(q)
            if item.get("context") is not None:
                item["context"] = ctx
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{out}: {changed} of {total} context passages unmarked", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
