#!/usr/bin/env bash
# A small sweep of the GRPO baseline on world v2's agent suite (#23: choose the baseline's lr,
# PPO mini-batch and steps on the validation split before any method row). Each run is
# configs/world-grpo.toml with one change, 12 steps, greedy validation EM (50 questions) every
# 4 steps into its eval.jsonl; results: bench/results/baseline-sweep.md. Resumable: a finished
# run is skipped, an interrupted one resumes (`knowrl train --resume`).
# Usage: experiments/world-v2/baseline_sweep.sh "lr=1e-4,seed=1" "lr=4e-4,seed=1" ...
set -euo pipefail
cd "$(dirname "$0")/../.."
for spec in "$@"; do
  lr=$(echo "$spec" | sed -n 's/.*lr=\([^,]*\).*/\1/p'); lr=${lr:-2e-4}
  mb=$(echo "$spec" | sed -n 's/.*mb=\([^,]*\).*/\1/p'); mb=${mb:-16}
  seed=$(echo "$spec" | sed -n 's/.*seed=\([^,]*\).*/\1/p'); seed=${seed:-1}
  name="lr$lr-mb$mb-seed$seed"
  out="runs/sweep/$name"
  cfg="runs/sweep/$name.toml"
  mkdir -p runs/sweep
  sed -e "s/^lr = .*/lr = $lr/" -e "s/^ppo_mini_batch = .*/ppo_mini_batch = $mb/" -e "s/^seed = .*/seed = $seed/" \
      -e "s/^steps = .*/steps = 12/" -e "s|^out_dir = .*|out_dir = \"$out\"|" -e "s/^checkpoint_every = .*/checkpoint_every = 4/" \
      configs/world-grpo.toml > "$cfg"
  if [ -f "$out/eval.jsonl" ] && grep -q '"step":12' "$out/eval.jsonl"; then echo "$name: done"; continue; fi
  resume=""; [ -f "$out/checkpoints/latest" ] && resume="--resume"
  target/release/knowrl train --config "$cfg" $resume
  echo "$name: $(tr '\n' ' ' < "$out/eval.jsonl")"
done
