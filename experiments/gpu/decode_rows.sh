#!/usr/bin/env bash
# Does knowrl's CUDA decode time per step grow with the batch's rows, and is the GPU busy then?
# (bench gpu, 2026-12-04: 135M bf16, 16 rows 14.7 ms/step, 64 rows 64 ms/step.) Runs knowrl's
# 64-row generation (bench gpu, small step shape) and transformers' generate at 16 and 64 rows,
# sampling the GPU's utilisation every 100 ms. Needs KNOWRL_BIN, a model dir ($1), python3.
set -u
model=$1
( while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits)"; sleep 0.1; done ) > /tmp/util &
s=$!
echo "knowrl start $(date +%s.%N | awk "{printf \"%.1f\", \$1 % 1000}")"
"$KNOWRL_BIN" bench gpu --device cuda --model "$model" --shape smollm2-135m --rows 8 --prompt-tokens 32 --new-tokens 8 --out /tmp/g.json
echo "knowrl end $(date +%s.%N | awk "{printf \"%.1f\", \$1 % 1000}")"
python3 - "$model" <<'PY'
import sys, time, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).cuda().eval()
for rows in (16, 64):
    ids = torch.randint(0, 49152, (rows, 40), device="cuda")
    g = lambda n: m.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    with torch.inference_mode():
        g(4); torch.cuda.synchronize(); t = time.perf_counter(); g(128); torch.cuda.synchronize(); dt = time.perf_counter() - t
    print(f"transformers bf16 rows {rows}: {rows*128/dt:.0f} tok/s, {dt/128*1e3:.1f} ms/step  at {time.time() % 1000:.1f}", flush=True)
PY
kill $s
python3 - <<'PY'
rows = [l.split() for l in open("/tmp/util") if len(l.split()) == 2]
vals = [float(u) for _, u in rows]
print(f"utilisation samples {len(vals)}, mean {sum(vals)/max(len(vals),1):.0f}%")
for t, u in rows[::5]: print(f"{float(t) % 1000:.1f} {u}")
PY
