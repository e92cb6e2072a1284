"""Probe (#23, AKBE): can the 135M policy learn to gate its search decision on what it knows, given
the answer for every question? An upper bound on what AKBE's efficiency targets can teach.

Supervised, per fold: a fresh LoRA (rank 16, every linear layer, as the RL runs') on the merged
knowledge policy is trained with cross-entropy on the agent's first decision token after "<":
"answer" on PK questions (no search needed), "search" on the others, lr 5e-4, AdamW, 6 epochs,
batch 8 (gradient accumulation). One-hop questions of all splits (the template family is the
same, only the entity differs), 3-fold cross-validation with folds grouped by subject entity, so
every held-out question is about an entity the gate never saw in training. Reported: AUROC of
log p(answer) - log p(search) for PK vs the rest, on the training folds (fit) and pooled over the
held-out folds (generalisation), after every epoch (does an early-stopped gate generalise before
it memorises the names?). With --control, the same on the base model without the knowledge
adapter, which can only learn the prompt's surface.
Input: `dump_prompts` JSON lines (experiments/world-v2/dump_prompts.rs).
Usage: learn_search_gate.py prompts.jsonl world_dir adapter_dir base_dir [--control]
"""
import json
import sys
import time

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedGroupKFold
from transformers import AutoModelForCausalLM, AutoTokenizer

prompts_path, world_dir, adapter_dir, base_dir = sys.argv[1:5]
torch.set_num_threads(2)
torch.manual_seed(0)
rows = [json.loads(line) for line in open(prompts_path)]
world = json.load(open(f"{world_dir}/world.json"))
subject = {f["id"]: f["subject"] for f in world["facts"]}
chains = {q["id"]: q["chain"] for q in map(json.loads, open(f"{world_dir}/questions.jsonl"))}
rows = [r for r in rows if r["hops"] == 1]
tok = AutoTokenizer.from_pretrained(base_dir)
LT, ANSWER, SEARCH = (tok.encode(s)[0] for s in ["<", "answer", "search"])
assert tok.encode("<answer>")[:2] == [LT, ANSWER] and tok.encode("<search>")[:2] == [LT, SEARCH]
pk = np.array([r["min_searches"] == 0 for r in rows], dtype=int)
groups = np.array([subject[chains[r["id"]][0]] for r in rows])


def margin(model, r):
    logits = model(input_ids=torch.tensor([r["agent_ids"] + [LT]])).logits[0, -1].float()
    logp = torch.log_softmax(logits, -1)
    return logp[ANSWER] - logp[SEARCH], logp


EPOCHS = 6


def run(name, make):
    held = np.zeros((EPOCHS, len(rows)))
    fit_aucs = np.zeros((EPOCHS, 3))
    t0 = time.time()
    for fold, (tr, te) in enumerate(StratifiedGroupKFold(3, shuffle=True, random_state=0).split(rows, pk, groups)):
        model = get_peft_model(make(), LoraConfig(r=16, lora_alpha=32, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4, weight_decay=0.0)
        for epoch in range(EPOCHS):
            model.train()
            order = np.random.default_rng(epoch + 10 * fold).permutation(tr)
            for i, j in enumerate(order):
                _, logp = margin(model, rows[j])
                (-logp[ANSWER if pk[j] else SEARCH] / 8).backward()
                if i % 8 == 7 or i == len(order) - 1:
                    opt.step()
                    opt.zero_grad()
            model.eval()
            with torch.no_grad():
                fit = [margin(model, rows[j])[0].item() for j in tr]
                for j in te:
                    held[epoch, j] = margin(model, rows[j])[0].item()
            fit_aucs[epoch, fold] = roc_auc_score(pk[tr], fit)
            print(f"  {name} fold {fold} epoch {epoch + 1}: fit AUROC {fit_aucs[epoch, fold]:.3f}, held-out "
                  f"{roc_auc_score(pk[te], held[epoch, te]):.3f} ({len(tr)} / {len(te)} questions, "
                  f"{time.time() - t0:.0f} s)", flush=True)
    for epoch in range(EPOCHS):
        h = held[epoch]
        print(f"| {name} | {epoch + 1} | {fit_aucs[epoch].mean():.3f} | {roc_auc_score(pk, h):.3f} | "
              f"{(h[pk == 1] > 0).mean():.2f} / {(h[pk == 0] > 0).mean():.2f} |", flush=True)


print(f"{len(rows)} one-hop questions ({pk.sum()} PK), {len(set(groups))} subject entities\n")
print("| model | epochs | fit AUROC (training folds) | held-out AUROC (unseen entities) | held-out share answering directly, PK / rest |")
print("|---|---|---|---|---|")
base = lambda: AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
run("knowledge policy (base + knowledge adapter, merged)",
    lambda: PeftModel.from_pretrained(base(), adapter_dir).merge_and_unload())
if "--control" in sys.argv:
    run("base model, no knowledge (surface control)", base)
