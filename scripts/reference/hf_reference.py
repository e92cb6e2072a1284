"""Reference computations with transformers / sentence-transformers / torch for knowrl's
parity tests. Called by the Rust tests with a JSON job file; writes safetensors/JSON results.

Jobs (field "kind"):
  logits    per-prompt logits (each prompt run alone, unpadded) + greedy continuations
  template  apply_chat_template(..., tokenize=False) for a model dir or a raw template
  embed     sentence-transformers embeddings
  grads     loss + parameter gradients of token-mean NLL over response tokens, optional LoRA
  adamw     one torch.optim.AdamW step from given params and grads
  peft      per-prompt logits of a base model with a PEFT LoRA adapter directory (peft)
  ppo       the adapters after PPO's clipped-surrogate updates over given mini-batches (π_old
            scored once before the first), each one clip_grad_norm_ + torch.optim.AdamW step
  tensorboard  the scalars TensorBoard's own EventAccumulator reads from a run directory
            (orphaned points of a restarted run purged, as `tensorboard --logdir` shows them)
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file

torch.set_num_threads(int(__import__("os").environ.get("KNOWRL_REF_THREADS", "2")))


def load_lm(path, dtype):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return m.eval()


def job_logits(j):
    m = load_lm(j["model"], torch.float32)
    out = {}
    with torch.no_grad():
        for i, ids in enumerate(j["prompts"]):
            x = torch.tensor([ids])
            out[f"logits.{i}"] = m(x).logits[0].float().contiguous()
            g = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=j["max_new_tokens"], eos_token_id=j["eos"], pad_token_id=j["eos"][0])
            out[f"greedy.{i}"] = g[0, x.shape[1]:].contiguous()
    save_file(out, j["out"])


def job_peft(j):
    from peft import PeftModel

    m = PeftModel.from_pretrained(load_lm(j["base"], torch.float32), j["adapter"]).eval()
    out = {}
    with torch.no_grad():
        for i, ids in enumerate(j["prompts"]):
            out[f"logits.{i}"] = m(torch.tensor([ids])).logits[0].float().contiguous()
    save_file(out, j["out"])


def job_template(j):
    from transformers import AutoTokenizer

    results = []
    if "model" in j:
        tok = AutoTokenizer.from_pretrained(j["model"])
    else:
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer, models

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **j.get("special_tokens", {}))
        tok.chat_template = j["template"]
    for case in j["cases"]:
        results.append(tok.apply_chat_template(case["messages"], tokenize=False,
                                               add_generation_prompt=case["add_generation_prompt"]))
    json.dump(results, open(j["out"], "w"))


def job_embed(j):
    from sentence_transformers import SentenceTransformer

    m = SentenceTransformer(j["model"], device="cpu")
    e = m.encode(j["texts"], convert_to_tensor=True, normalize_embeddings=False)
    save_file({"embeddings": e.float().contiguous()}, j["out"])


class LoraLinear(torch.nn.Module):
    """y = W x + b + (x Aᵀ Bᵀ)·α/r, the PEFT LoRA forward (no dropout)."""

    def __init__(self, base, a, b, scale):
        super().__init__()
        self.base, self.scale = base, scale
        self.lora_A = torch.nn.Parameter(a.clone())
        self.lora_B = torch.nn.Parameter(b.clone())

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale


def lm_with_lora(j):
    """The model in float64; with j["lora"], base frozen and adapters.safetensors attached."""
    m = load_lm(j["model"], torch.float64)
    lora = j.get("lora")
    if lora:
        raw = load_file(j["model"] + "/adapters.safetensors")
        for p in m.parameters():
            p.requires_grad_(False)
        for name, mod in list(m.named_modules()):
            if name.split(".")[-1] in lora["target_modules"]:
                parent = m.get_submodule(name.rsplit(".", 1)[0])
                a, b = raw[f"{name}.lora_A.weight"].double(), raw[f"{name}.lora_B.weight"].double()
                setattr(parent, name.rsplit(".", 1)[1], LoraLinear(mod, a, b, lora["alpha"] / lora["rank"]))
    return m


def knowrl_name(name):
    name = name.replace(".lora_A", ".lora_A.weight").replace(".lora_B", ".lora_B.weight")
    return name.replace(".base.", ".")


def response_logprobs(m, seq):
    ids = torch.tensor([seq["prompt"] + seq["response"]])
    logp = m(ids).logits[0].double().log_softmax(-1)
    p = len(seq["prompt"])
    return torch.stack([logp[p + t - 1, tok] for t, tok in enumerate(seq["response"])])


def job_grads(j):
    m = lm_with_lora(j)
    total, count = 0.0, 0
    for seq in j["batch"]:
        ids = torch.tensor([seq["prompt"] + seq["response"]])
        logp = m(ids).logits[0].double().log_softmax(-1)
        p = len(seq["prompt"])
        for t, tok in enumerate(seq["response"]):
            if seq["mask"][t]:
                total = total + logp[p + t - 1, tok]
                count += 1
    loss = -total / count
    loss.backward()
    out = {"loss": loss.detach().reshape(1)}
    for name, p in m.named_parameters():
        if p.grad is not None:
            out[knowrl_name(name)] = p.grad.contiguous()
    save_file(out, j["out"])


def job_ppo(j):
    m = lm_with_lora(j)
    params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    rows = j["rows"]
    with torch.no_grad():
        old = [response_logprobs(m, r) for r in rows]
    opt = torch.optim.AdamW([p for _, p in params], lr=j["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    lo, hi = 1.0 - j["clip_low"], 1.0 + j["clip_high"]
    for mb in j["minibatches"]:
        opt.zero_grad()
        count = sum(sum(rows[i]["mask"]) for i in mb)
        total = 0.0
        for i in mb:
            r = rows[i]
            ratio = (response_logprobs(m, r) - old[i]).exp()
            a = r["advantage"]
            per_token = -torch.minimum(ratio * a, ratio.clamp(lo, hi) * a)
            total = total + (per_token * torch.tensor(r["mask"], dtype=torch.float64)).sum()
        (total / count).backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], j["max_grad_norm"])
        opt.step()
    save_file({knowrl_name(n): p.detach().contiguous() for n, p in params}, j["out"])


def job_tensorboard(j):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(j["dir"], purge_orphaned_data=True)
    acc.Reload()
    out = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    with open(j["out"], "w") as f:
        json.dump(out, f)


def job_adamw(j):
    t = load_file(j["tensors"])
    params = [torch.nn.Parameter(t[f"param.{n}"].clone()) for n in j["names"]]
    for p, n in zip(params, j["names"]):
        p.grad = t[f"grad.{n}"].clone()
    groups = [{"params": [p], "weight_decay": j["weight_decay"] if d else 0.0} for p, d in zip(params, j["decay"])]
    opt = torch.optim.AdamW(groups, lr=j["lr"], betas=(0.9, 0.999), eps=1e-8)
    for _ in range(j["steps"]):
        opt.step()
    save_file({n: p.detach().contiguous() for n, p in zip(j["names"], params)}, j["out"])


if __name__ == "__main__":
    for job in json.load(open(sys.argv[1])):
        globals()["job_" + job["kind"]](job)
