#!/usr/bin/env bash
# #23 AKBE probe: does AKBE cut tool calls once the pretrained agent explores answering without a
# search? Retrains the knowledge adapter on a copy of the shipped world with `direct = 24`
# (agent-prompt answers without a search per epoch, on any train question: the truth when the
# policy knows it, a guess of the right kind otherwise), calibrates it, and runs AKBE's main rows
# and two ablation arms on it. Resumable: each stage is skipped when its output exists.
# Usage: experiments/world-v2/direct-answers.sh [seeds]   (env as in the README's manual commands)
set -euo pipefail
SEEDS=${1:-1}
W=runs/world-direct
OUT=bench/results/akbe-probes/direct-answers
K=target/release/knowrl
mkdir -p "$OUT"
if [ ! -f "$W/policy/adapter_model.safetensors" ]; then
  rm -rf "$W" && mkdir -p "$W" && cp -r assets/world/. "$W/" && rm -rf "$W/policy"
  echo "direct = 24" >> "$W/implant.toml"
  /usr/bin/time -v $K world pretrain --world "$W" --policy-only 2>&1 | tee "$OUT/pretrain.log"
fi
cp "$W/implant.toml" "$OUT/implant.toml"
[ -f "$OUT/calibration.json" ] || $K world eval --world "$W" --out "$OUT/calibration.json" 2>&1 | tee "$OUT/calibration.log"
# The agent-prompt boundary probe (experiments/README.md: it runs as an example of knowrl-eval).
mkdir -p crates/eval/examples && cp experiments/world-v2/probe_boundary.rs crates/eval/examples/
trap 'rm -rf crates/eval/examples' EXIT
probe() { cargo run --release --example probe_boundary -p knowrl-eval -- "$W" 8 "$1" agent > "$2"; }
[ -f "$OUT/boundary-agent.md" ] || probe "$W/policy" "$OUT/boundary-agent.md"
# A rerun would rewrite the report with this sitting's wall time only: skipped once it exists.
[ -f "$OUT/reproduce-akbe.json" ] || $K reproduce akbe --config experiments/world-v2/world-akbe-direct.toml --seeds "$SEEDS" --ablation-seeds "$SEEDS" \
  --arms "GRPO,GRPO + AKBE,AKBE with-tool teacher prompt,GRPO + OTC reward" \
  --runs runs/akbe-direct --out "$OUT/reproduce-akbe.json" 2>&1 | tee -a "$OUT/reproduce.log"
# Does the search decision read the boundary after training? The same agent-prompt probe on each
# arm's final checkpoint (exported as by_step.sh does).
for arm in grpo grpo-akbe; do
  [ -f "$OUT/boundary-agent-$arm.md" ] && continue
  run=runs/akbe-direct/reproduce-akbe/$arm-seed1
  tmp=$(mktemp -d) && mkdir -p "$tmp/checkpoints"
  cp -r "$run/checkpoints/step-00000008" "$tmp/checkpoints/" && printf 'step-00000008' > "$tmp/checkpoints/latest"
  sed -e "s|^out_dir = .*|out_dir = \"$tmp\"|" "$run/config.toml" > "$tmp/config.toml"
  $K train --config "$tmp/config.toml" --resume --export "$tmp/model" > "$tmp/train.log" 2>&1
  probe "$tmp/model" "$OUT/boundary-agent-$arm.md"
  rm -rf "$tmp"
done
