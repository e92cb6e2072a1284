#!/usr/bin/env bash
# S1-S5 EM of a Knowledgeable-R1 reproduce run at its intermediate checkpoints (#23: does the S1
# loss grow with the steps?). Each checkpoint is exported as a plain HF directory (a finished
# copy of the run, resumed with --export) and evaluated as `reproduce` evaluates the final one.
# Usage: experiments/world-v2/kr1_by_step.sh RUN_DIR OUT_DIR STEP...
set -euo pipefail
run=$1; out=$2; shift 2
bin=${KNOWRL_BIN:-target/release/knowrl}
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
  "$bin" eval --model "$tmp/model" --suite world-scenarios --out "$out/$name.json.part" > "$out/$name.md"
  mv "$out/$name.json.part" "$out/$name.json"
  rm -rf "$tmp"
done
