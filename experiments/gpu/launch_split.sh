#!/usr/bin/env bash
# Is knowrl's CUDA decode host-bound, and does the host's thread count matter? (launch vs wait
# split, docs/gpu.md "Second run"). Run on the device machine from the repository root with a
# stripped, xz-compressed knowrl binary at .gpu/knowrl.xz (built here against the same torch
# wheel) and SmolLM2's config and tokenizer files (no weights) in .gpu/smollm2; writes to $OUT.
set -u
xz -dc .gpu/knowrl.xz > /tmp/knowrl && chmod +x /tmp/knowrl
torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib" KNOWRL_PYTHON=python3
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket" > $OUT/host.txt
m=/tmp/smollm2; cp -r .gpu/smollm2 $m
python3 - $m <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.from_pretrained(sys.argv[1]); cfg.initializer_range = 0.1
torch.manual_seed(0); AutoModelForCausalLM.from_config(cfg).float().save_pretrained(sys.argv[1])
PY
( while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits)"; sleep 0.2; done ) > $OUT/util.log &
s=$!
for t in 16 2; do
  echo "== threads $t $(date +%s.%N)"
  timeout 150 /tmp/knowrl bench gpu --device cuda --model $m --threads $t --shape smollm2-135m --rows 64 --prompt-tokens 32 --new-tokens 128 --out $OUT/s135-t$t.json 2>&1 | grep -v "^wrote"
  timeout 150 /tmp/knowrl bench gpu --device cuda --model $m --threads $t --shape qwen2.5-7b --rows 32 --prompt-tokens 256 --new-tokens 64 --out $OUT/q7-t$t.json 2>&1 | grep -E "step|rollout"
done
echo "== threads 16, OMP_WAIT_POLICY=PASSIVE $(date +%s.%N)"
OMP_WAIT_POLICY=PASSIVE timeout 150 /tmp/knowrl bench gpu --device cuda --model $m --threads 16 --shape smollm2-135m --rows 64 --prompt-tokens 32 --new-tokens 128 --out $OUT/s135-t16-passive.json 2>&1 | grep -v "^wrote"
kill $s
echo "end $(date +%s.%N)"
