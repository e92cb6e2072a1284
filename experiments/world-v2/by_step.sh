#!/usr/bin/env bash
# A reproduce run evaluated at its intermediate checkpoints (#23: does a method's effect or cost
# grow with the steps?). Each checkpoint is exported as a plain HF directory (a finished copy of
# the run, resumed with --export) and evaluated as `reproduce` evaluates the final one; every
# item's response goes to <name>.responses.jsonl beside the report.
# Usage: [SUITE=world-scenarios|world-agent] experiments/world-v2/by_step.sh RUN_DIR OUT_DIR STEP...
# world-scenarios (Knowledgeable-R1) is the default; world-agent (AKBE) takes the world configs'
# agent settings (4 turns, 3 passages, 48 tokens a turn).
set -euo pipefail
run=$1; out=$2; shift 2
bin=${KNOWRL_BIN:-target/release/knowrl}
suite=${SUITE:-world-scenarios}
case $suite in
  world-scenarios) flags=() ;;
  world-agent) flags=(--max-turns 4 --topk 3 --max-new-tokens 48) ;;
  *) echo "by_step.sh: SUITE must be world-scenarios or world-agent, not $suite" >&2; exit 2 ;;
esac
mkdir -p "$out"
for k in "$@"; do
  name=$(basename "$run")-step$k
  [ -f "$out/$name.json" ] && continue
  tmp=$(mktemp -d)
  mkdir -p "$tmp/checkpoints"
  cp -r "$run/checkpoints/step-$(printf %08d "$k")" "$tmp/checkpoints/"
  printf 'step-%08d' "$k" > "$tmp/checkpoints/latest"
  sed -e "s|^steps = .*|steps = $k|" -e "s|^out_dir = .*|out_dir = \"$tmp\"|" "$run/config.toml" > "$tmp/config.toml"
  "$bin" train --config "$tmp/config.toml" --resume --export "$tmp/model" > "$tmp/train.log" 2>&1
  "$bin" eval --model "$tmp/model" --suite "$suite" "${flags[@]}" --trajectories "$out/$name.responses.jsonl" \
    --out "$out/$name.json.part" > "$out/$name.md"
  mv "$out/$name.json.part" "$out/$name.json"
  rm -rf "$tmp"
done
