#!/usr/bin/env bash
# #23 AKBE positive control: does AKBE cut tool calls when the knowledge boundary is readable?
# On the shipped world the search decision carries no boundary feature (akbe-probes/hidden-boundary).
# Here a copy of the world marks every PK-answerable question "[K] " (train, valid and test alike;
# same policy, corpus and retriever), so "answer directly what I know" has a visible feature, and
# AKBE's main rows and its with-tool-teacher arm run on it. If TC falls on the marked questions
# only, AKBE's signal works and what the shipped world lacks is the feature; if nothing moves, the
# limit is AKBE's targets themselves. Resumable (reproduce keeps finished runs).
# Usage: experiments/world-v2/cue-world.sh [seeds]   (env as in the README's manual commands)
set -euo pipefail
SEEDS=${1:-2}
W=runs/cue-world
OUT=bench/results/akbe-probes/cue-world
mkdir -p "$OUT"
if [ ! -f "$W/questions.jsonl" ]; then
  rm -rf "$W" && mkdir -p "$W" && cp -r assets/world/. "$W/"
  python3 - "$W/questions.jsonl" <<'P'
import json, sys
path = sys.argv[1]
rows = [json.loads(l) for l in open(path)]
for q in rows:
    if q["pk_answerable"]:
        q["question"] = "[K] " + q["question"]
with open(path, "w") as f:
    for q in rows:
        f.write(json.dumps(q, separators=(",", ":")) + "\n")
print(f"{sum(q['pk_answerable'] for q in rows)} of {len(rows)} questions marked")
P
fi
[ -f "$OUT/reproduce-akbe.json" ] || target/release/knowrl reproduce akbe --config experiments/world-v2/world-akbe-cue.toml --seeds "$SEEDS" --ablation-seeds "$SEEDS" \
  --arms "GRPO,GRPO + AKBE,AKBE with-tool teacher prompt" \
  --runs runs/akbe-cue --out "$OUT/reproduce-akbe.json" 2>&1 | tee -a "$OUT/reproduce.log"
# The same with 16 questions a step (4x the AKBE targets a step): the with-tool teacher prompt
# against GRPO at the same 16 (equal budget), 3 seeds each: is the number of targets a step what
# keeps the gate from forming? (First run with seeds 1-2 of the teacher arm only; the rerun with
# 3 seeds keeps those runs and adds the rest.)
mkdir -p "$OUT/batch-16"
target/release/knowrl reproduce akbe --config experiments/world-v2/world-akbe-cue-16.toml \
  --seeds 3 --ablation-seeds 3 --arms "GRPO,AKBE with-tool teacher prompt" \
  --runs runs/akbe-cue-16 --out "$OUT/batch-16/reproduce-akbe.json" 2>&1 | tee -a "$OUT/batch-16.log"
# A longer run at the world config's 4 questions a step (32 steps, the with-tool teacher prompt):
# is it the budget? (#23: "whether the learning rate or the budget is the limit").
mkdir -p "$OUT/steps-32"
[ -f "$OUT/steps-32/reproduce-akbe.json" ] || target/release/knowrl reproduce akbe --config experiments/world-v2/world-akbe-cue.toml \
  --steps 32 --seeds 1 --ablation-seeds "$SEEDS" --arms "AKBE with-tool teacher prompt" \
  --runs runs/akbe-cue-32 --out "$OUT/steps-32/reproduce-akbe.json" 2>&1 | tee -a "$OUT/steps-32.log"
# Seed 3 of both 16-question arms continued from step 8 to 16 (constant lr, so the same as a
# 16-step run): does the budget close the EM gap? Evaluated on the marked world's test split.
L=runs/akbe-cue-16-long
mkdir -p "$L" "$OUT/batch-16-steps-16"
for a in akbe-with-tool-teacher-prompt-seed3 grpo-seed3; do
  [ -f "$OUT/batch-16-steps-16/$a.json" ] && continue
  [ -d "$L/$a" ] || { cp -r "runs/akbe-cue-16/reproduce-akbe/$a" "$L/"; \
    sed -i "s|^steps = 8|steps = 16|; s|^out_dir = .*|out_dir = \"$L/$a\"|" "$L/$a/config.toml"; }
  target/release/knowrl train --config "$L/$a/config.toml" --resume --export "$L/$a-export"
  target/release/knowrl eval --model "$L/$a-export" --suite world-agent --world "$W" --out "$OUT/batch-16-steps-16/$a.json"
done
