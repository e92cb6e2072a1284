"""The peer side of `knowrl bench engine`: transformers' generate() and a plain PyTorch training
loop on the same model, inputs, threads and settings as knowrl's worker. Prints one JSON line."""
import argparse
import json
import resource
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--task", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--inputs", required=True)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--device", default="cpu")
a = ap.parse_args()
torch.set_num_threads(a.threads)
inputs = json.load(open(a.inputs))
dtype = torch.bfloat16 if a.task.endswith("bf16") else torch.float32
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(a.device)


def sync():
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()


secs = []

if a.task.startswith("generate"):
    model.eval()
    prompts = inputs["generate"]
    n_new = inputs["max_new_tokens"]
    width = max(map(len, prompts))
    pad = model.config.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=a.device)  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=a.device)

    def run(n):
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=n, min_new_tokens=n, pad_token_id=pad)

    run(4)
    for _ in range(a.repeats):
        sync()
        t0 = time.perf_counter()
        out = run(n_new)
        sync()
        secs.append(time.perf_counter() - t0)
        assert out.shape[1] == width + n_new
    count = len(prompts) * n_new
else:
    model.train()
    seqs = torch.tensor(inputs["train"], device=a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for i in range(a.repeats + 1):
        t0 = time.perf_counter()
        logits = model(seqs).logits[:, :-1].float()
        logp = logits.log_softmax(-1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
        loss = -logp.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if i > 0:
            secs.append(time.perf_counter() - t0)
    count = seqs.numel()

med = statistics.median(secs)
print(json.dumps({"task": a.task, "seconds": secs, "median_seconds": med, "tokens": count,
                  "tokens_per_s": count / med, "threads": torch.get_num_threads(),
                  "versions": f"transformers {transformers.__version__}, torch {torch.__version__}",
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
