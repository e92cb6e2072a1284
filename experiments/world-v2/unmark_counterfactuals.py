#!/usr/bin/env python3
"""A copy of a world whose scenario contexts state counterfactuals without their made-up source.

The world's counterfactual passages cite a dubious source ("A made-up almanac says X was born in
Y."), as the Knowledgeable-R1 paper describes ConFiQA's wrong contexts. A policy can then learn to
distrust the source's wording instead of weighing the context against what it knows. This copy
rewrites every such passage in `scenarios.jsonl` (those of S2 and of S3's conflicts; S2p, the world's own
plain S2, is copied as it is) the way a correct
passage reads: the entity's intro sentence from its encyclopedia passage, then the claim
("X is a public figure. X was born in Y."). Everything else is linked, not copied.

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


def passages(world):
    """The world's passages by id, and title -> first sentence of the entity's encyclopedia passage."""
    by_id, intro_of = {}, {}
    for line in open(os.path.join(world, "passages.jsonl")):
        p = json.loads(line)
        by_id[p["id"]] = p
        if p["kind"] == "encyclopedia":
            title, body = p["contents"].split("\n", 1)
            intro_of[title] = body.split(". ", 1)[0].rstrip(".") + "."
    return by_id, intro_of


def unmark(passage, intro_of):
    """A counterfactual passage without its source; an error if its source is not one we know."""
    title, body = passage.split("\n", 1)
    for s in SOURCES:
        if body.startswith(s + " "):
            return f"{title}\n{intro_of[title]} {body[len(s) + 1 :]}"
    raise ValueError(f"counterfactual passage with an unknown source (corpus.rs SOURCES changed?): {passage!r}")


def main(world, out):
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(world):
        if name != "scenarios.jsonl" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.abspath(os.path.join(world, name)), os.path.join(out, name))
    by_id, intro_of = passages(world)
    changed = total = 0
    with open(os.path.join(out, "scenarios.jsonl"), "w") as f:
        for line in open(os.path.join(world, "scenarios.jsonl")):
            item = json.loads(line)
            # S2p (the world's own plain S2) is already unmarked.
            if item.get("context") is not None and item["scenario"] != "S2p":
                # Which passages are counterfactual comes from the world's own labels.
                counterfactual = [by_id[i]["kind"] == "counterfactual" for i in item["context_ids"]]
                item["context"] = [unmark(p, intro_of) if cf else p for p, cf in zip(item["context"], counterfactual)]
                changed += sum(counterfactual)
                total += len(counterfactual)
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{out}: {changed} of {total} context passages unmarked", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
